"""Theory next to measurement (Leviathan et al. 2023): tokens per target pass and the predicted
speedup from the measured acceptance alpha and cost ratio c, beside what was measured.

c is the cost of one draft step relative to one target step. It is taken from the run's own step
times where they can be had: a speculative round (drafting + verification) costs gamma*c + 1
baseline steps, so c = (time per target pass / baseline time per token - 1) / gamma, which counts
a draft model's real round and n-gram lookup + verification alike. Otherwise the engine's bare
forward timing is used, and said so; never an assumed 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GAMMA_SEARCH = 256  # an optimum at this bound is no optimum: the model keeps rising


def expected_tokens(alpha: float, gamma: int) -> float:
    """E = (1 - alpha^(gamma+1)) / (1 - alpha): tokens per target pass (Leviathan et al. 2023)."""
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def predicted_speedup(alpha: float, gamma: int, c: float) -> float:
    """E / (gamma * c + 1), c = cost of a draft step relative to a target step."""
    return expected_tokens(alpha, gamma) / (gamma * c + 1)


def best_gamma(alpha: float, c: float) -> tuple[int | None, str]:
    """The gamma that maximises the predicted speedup, where the cost model has a finite optimum
    (c > 0, alpha < 1); else None and the reason."""
    if c <= 0:
        return None, "n/a (c <= 0: no finite optimum)"
    if alpha >= 1:
        return None, "n/a (alpha = 1: no finite optimum)"
    g = max(range(1, GAMMA_SEARCH + 1), key=lambda k: predicted_speedup(alpha, k, c))
    if g == GAMMA_SEARCH:
        return None, f"n/a (no optimum up to {GAMMA_SEARCH})"
    return g, "optimum of the cost model"


def _time_per_pass(group: Mapping[str, Any]) -> float | None:
    """Seconds per target pass after the first token (the first pass is the prefill)."""
    spec, dec = group.get("spec") or {}, group.get("decode")
    passes = spec.get("target_passes")
    if not dec or passes is None:
        return None
    decode_passes = passes - dec["requests"]
    return dec["seconds"] / decode_passes if decode_passes > 0 else None


def _time_per_token(group: Mapping[str, Any] | None) -> float | None:
    dec = (group or {}).get("decode")
    return dec["seconds"] / dec["tokens"] if dec and dec["tokens"] > 0 else None


# vLLM's per-batch-size K (engines.common.vllm_args.SCHEDULE: analysis imports no engine)
PER_BATCH_SIZE = "num_speculative_tokens_per_batch_size"


def k_at_batch_1(cfg: Mapping[str, Any]) -> int | None:
    """K at a latency point (one request: batch size 1): the schedule's first range's where the
    config has one (a K from a tune: its first range starts at 1), else num_speculative_tokens."""
    schedule = cfg.get(PER_BATCH_SIZE)
    if schedule:
        return min(int(schedule[0][2]), int(cfg.get("num_speculative_tokens") or schedule[0][2]))
    return cfg.get("num_speculative_tokens")


def theory(group: Mapping[str, Any], baseline: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Theory for one speculative configuration at one latency point (None when alpha or gamma
    is unknown). ``baseline``: the same engine's baseline at the same point, if it ran."""
    spec, cfg = group.get("spec"), group.get("spec_config") or {}
    gamma = k_at_batch_1(cfg)
    if not spec or spec.get("alpha") is None or not gamma:
        return None
    alpha, gamma = float(spec["alpha"]), int(gamma)
    pass_s, token_s = _time_per_pass(group), _time_per_token(baseline)
    c: float | None = None
    if pass_s is not None and token_s:
        round_cost = pass_s / token_s
        c = (round_cost - 1) / gamma
        source = "step times"
    elif (group.get("step_costs") or {}).get("c") is not None:
        round_cost = None
        c = float(group["step_costs"]["c"])
        source = "bare forwards"
    else:
        round_cost = None
        source = None  # no target pass count, no baseline to time against
    out: dict[str, Any] = {
        "name": group["name"],
        "point": group["point"],
        "max_new_tokens": group["max_new_tokens"],
        "alpha": alpha,
        "gamma": gamma,
        "expected_tokens_per_pass": expected_tokens(alpha, gamma),
        "tokens_per_target_pass": spec.get("tokens_per_target_pass"),
        "mean_acceptance_length": spec.get("mean_acceptance_length"),
        "s_per_target_pass": pass_s,
        "baseline_s_per_token": token_s,
        "round_cost": round_cost,
        "c": c,
        "c_source": source,
        "predicted_speedup": None,
        "predicted_note": "n/a (c unknown)",
        "best_gamma": None,
        "best_gamma_note": "n/a (c unknown)",
    }
    if c is not None and c < 0:  # a round cheaper than a plain step: the timings drifted apart
        note = "n/a (c < 0: step times drifted between the runs)"
        out["predicted_note"] = out["best_gamma_note"] = note
    elif c is not None:
        out["predicted_speedup"] = predicted_speedup(alpha, gamma, c)
        out["predicted_note"] = None
        out["best_gamma"], out["best_gamma_note"] = best_gamma(alpha, c)
    return out

"""Like with like: the lanes of one engine should differ only in what is compared.

Each engine records what it resolved as it started (``engine_info.resolved_config``: vLLM's
``VllmConfig`` read back, an HF lane's dtype, device, attention and generation config, a managed
server's arguments). Here the lanes of one engine are diffed, every pair once: a difference
outside the speculative configuration and what the engine derives from it means a comparison
measures that difference too (on CUDA, vLLM turns async scheduling on for the baseline and off
for ngram unless it is set for all lanes), so it becomes an answer-block warning."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations
from typing import Any

from harness.core.results import Run

# What a speculative lane may differ in: its speculative configuration, and what vLLM derives
# from it (vLLM 0.32: config/vllm.py:2264 sets the scheduler's max_num_scheduled_tokens when
# speculating; compilation.py:1530 fits the CUDA-graph capture sizes to K + 1); an HF lane's
# generation arguments for its method (assistant model, lookup length). A drafter with layers
# of its own (a draft model, an EAGLE head) holds KV cache in the same memory budget, so the
# target's share in tokens and the concurrency it allows follow from the speculative config too
# (seen on the main job: 11,648 tokens for the baseline, 11,264 with the EAGLE-3 head, 10,880
# with the draft model, in one 0.5 GiB budget).
SPEC_PREFIXES = ("speculative.", "args.speculative_config", "generation.spec.")
DERIVED = frozenset(
    {
        "scheduler.max_num_scheduled_tokens",
        "compilation.cudagraph_capture_sizes",
        "compilation.max_cudagraph_capture_size",
        "compilation.decoder_replay_cudagraph_capture_sizes",
        "args.per_request_spec_decode_metrics",  # acceptance per request: only a spec lane
        "cache.kv_cache_size_tokens",
        "cache.kv_cache_max_concurrency",
    }
)
SHOWN = 4  # differences named in one warning line (all are in results.json)


def allowed(key: str) -> bool:
    """Whether ``key`` may differ between lanes (the speculative setting or derived from it)."""
    return key.startswith(SPEC_PREFIXES) or key in DERIVED


def lane_configs(runs: Sequence[Run]) -> dict[str, dict[str, dict[str, Any]]]:
    """engine -> lane label -> the first resolved configuration recorded for it, in run order."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for run in runs:
        resolved = run.engine_info.get("resolved_config")
        if isinstance(resolved, Mapping):
            out.setdefault(run.cell.engine, {}).setdefault(run.cell.label, dict(resolved))
    return out


def lane_differences(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """Every pair of one engine's lanes that recorded a resolved configuration: the keys on
    which they differ, split into ``differences`` (outside the speculative setting: a
    confound) and ``derived`` (the speculative setting and what the engine derives from it)."""
    out = []
    for engine, lanes in lane_configs(runs).items():
        for a, b in combinations(lanes, 2):
            ca, cb = lanes[a], lanes[b]
            keys = sorted(k for k in set(ca) | set(cb) if ca.get(k) != cb.get(k))
            diffs = [{"key": k, "a": ca.get(k), "b": cb.get(k)} for k in keys if not allowed(k)]
            out.append(
                {
                    "engine": engine,
                    "a": f"{engine}/{a}",
                    "b": f"{engine}/{b}",
                    "differences": diffs,
                    "derived": [k for k in keys if allowed(k)],
                }
            )
    return out


def lane_warnings(pairs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One answer-block warning (kind ``lane difference``) per pair with a difference."""
    return [
        {
            "kind": "lane difference",
            "name": p["b"],
            "baseline": p["a"],
            "differences": list(p["differences"][:SHOWN]),
            "count": len(p["differences"]),
        }
        for p in pairs
        if p.get("differences")
    ]

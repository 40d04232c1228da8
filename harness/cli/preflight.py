"""Checks before anything loads (local model configs, servers that must answer, each engine's
own validation), the per-variant server URLs, and where the run's files go."""

from __future__ import annotations

import argparse
import datetime as dt
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engines.base import EngineConfig, engine_class
from harness.flags.options import UsageError
from harness.run.plan import RunPlan

if TYPE_CHECKING:
    from harness.sizing.memory import Device, Sizes
    from workloads.base import Request


def _model_config(path: str | None) -> dict[str, Any] | None:
    """config.json of a local model directory (read as data, nothing loaded), else None."""
    if not path or not Path(path).is_dir():
        return None
    cfg = Path(path) / "config.json"
    if not cfg.exists():
        raise UsageError(f"{path}: not a model directory (no config.json)")
    try:
        return json.loads(cfg.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{cfg}: invalid JSON ({exc})") from None


def check_models(plan: RunPlan) -> None:
    """Cheap checks of local models before anything loads: lengths and shared vocabularies."""
    cap = plan.max_model_len
    for n in plan.max_new_tokens:
        if cap is not None and n >= cap:  # every vLLM request would fail
            raise UsageError(
                f"--max-new-tokens: {n} does not fit --max-model-len {cap} (a vLLM request's "
                "prompt + output)"
            )
    target = _model_config(plan.model)
    if target is None:
        return
    limit = target.get("max_position_embeddings")
    if limit:
        for n in plan.max_new_tokens:
            if n >= int(limit):
                raise UsageError(
                    f"--max-new-tokens: {n} does not fit the model's context of {limit} tokens"
                    f" ({plan.model})"
                )
    uses_draft = "draft_model" in plan.spec_methods or (
        plan.spec_config is not None and plan.spec_config.get("method") == "draft_model"
    )
    draft = _model_config(plan.draft_model) if uses_draft else None
    if draft is not None and draft.get("vocab_size") != target.get("vocab_size"):
        raise UsageError(
            f"--draft-model: vocabulary of {draft.get('vocab_size')} tokens differs from the "
            f"target's {target.get('vocab_size')}; draft_model speculation needs one vocabulary"
        )


def check_servers(configs: list[tuple[str, EngineConfig]]) -> None:
    """What each engine checks in the outside world before the run (``Engine.probe``: a
    server given by URL must answer; a typo costs seconds, not a run)."""
    seen: set[str] = set()
    for _, c in configs:
        key = json.dumps([c.engine, c.options], sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            engine_class(c.engine).probe(c)


def check_endpoint(configs: list[tuple[str, EngineConfig]], requests: Sequence[Request]) -> None:
    """``--endpoint completions`` sends a text prompt: chat messages are refused before the run
    (each request would fail); ``--endpoint chat`` wraps a plain prompt as one user message."""
    if not any(c.options.get("endpoint") == "completions" for _, c in configs):
        return
    chat = next((r for r in requests if r.messages is not None), None)
    if chat is not None:
        raise UsageError(
            f"{chat.source or chat.id}: messages: --endpoint completions sends a text prompt and "
            "this workload holds chat messages; use --endpoint chat (or leave --endpoint unset)"
        )


def variant_servers(configs: list[tuple[str, EngineConfig]]) -> list[tuple[str, EngineConfig]]:
    """Each engine's configs as its variants run them (``Engine.for_variants``: with
    ``--base-url baseline=URL ngram=URL`` each variant talks to its own server)."""
    out: list[tuple[str, EngineConfig]] = []
    for engine in dict.fromkeys(c.engine for _, c in configs):
        out += engine_class(engine).for_variants(
            [(lb, c) for lb, c in configs if c.engine == engine]
        )
    return out


def engine_methods(plan: RunPlan) -> dict[str, tuple[str, ...]]:
    return {e: engine_class(e).spec_methods for e in plan.engines}


def validate_configs(plan: RunPlan, configs: list[tuple[str, EngineConfig]]) -> None:
    methods = engine_methods(plan)
    for engine in plan.engines:
        wanted = set(plan.spec_methods)
        if plan.spec_methods and not wanted & set(methods[engine]) and plan.spec_config is None:
            raise UsageError(
                f"--spec: engine {engine} supports none of {', '.join(sorted(wanted)) or 'them'}"
                f" (it supports: {', '.join(methods[engine]) or 'no speculative method'})"
            )
    from harness.run.session import unsupported_method

    for _, config in configs:
        if not unsupported_method(config):
            engine_class(config.engine).validate(config)


def check_resume(
    plan: RunPlan, out: Path, device: Device | None = None, sizes: Sizes | None = None
) -> None:
    """``--resume`` continues a run only with the settings it was recorded with: a journal of
    another temperature, model, prompt set, ... would merge runs that are not comparable. A
    journal written before ``resolved_dtype`` was recorded gets it as its ``dtype`` resolves
    now (on ``device``, the run's: float32 on CPU, what those runs loaded)."""
    from harness.cli.plan_view import NO_DEVICE, dtype_for
    from harness.run.journal import recorded_config
    from harness.run.plan import config_differences, lookup
    from harness.sizing.memory import Sizes

    if not plan.resume:
        return
    path = out / "journal.jsonl"
    recorded = recorded_config(path)
    if recorded is None:
        raise UsageError(
            f"resume: journal {path} records no config (written by an older harness), so it "
            "cannot be checked; start a new --output-dir"
        )
    if "resolved_dtype" not in recorded:  # the old form: read, never rewritten
        old = _as_paths(recorded)
        engines, model, flag = old.get("engines") or (), str(old.get("model")), old.get("dtype")
        dtype = dtype_for(
            engines, model, str(flag or "auto"), device or NO_DEVICE, sizes or Sizes()
        )
        recorded = {**recorded, "resolved_dtype": dtype[0]}
    asked = plan.to_json()
    keys = config_differences(_as_paths(recorded), _as_paths(asked))
    if keys:
        was = ", ".join(f"{k}={_short(lookup(recorded, k))}" for k in keys)
        now = ", ".join(f"{k}={_short(lookup(asked, k))}" for k in keys)
        raise UsageError(
            f"resume: journal {path} was recorded with {was}, this run asks {now}; "
            "start a new --output-dir or use the same flags"
        )


def _as_paths(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config with shipped model names ("embedded", "tiny") as their directories: a run
    against a remote server no longer resolves the default name, its older journals hold the
    path; both mean one model."""
    from harness.models import registry as models

    out = dict(config)
    for key in ("model", "draft_model", "eagle3_model"):
        name = out.get(key)
        try:
            if isinstance(name, str) and models.parse_name(name) is not None:
                out[key] = models.resolve_model(name)
        except ValueError:  # not a shipped model's kind: compared as written
            pass
    return out


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def output_dir(args: argparse.Namespace) -> Path:
    if args.resume:
        d = Path(args.resume)
        if not (d / "journal.jsonl").exists():
            raise UsageError(f"--resume: {d}: no journal.jsonl there to resume from")
        return d
    if args.output_dir:
        return Path(args.output_dir)
    return Path("results") / dt.datetime.now().strftime("%Y%m%d-%H%M%S")

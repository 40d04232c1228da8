"""Checks before anything loads (local model configs, servers that must answer, each engine's
own validation), the per-variant server URLs, and where the run's files go."""

from __future__ import annotations

import argparse
import datetime as dt
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from engines.base import EngineConfig, engine_class
from harness.options import UsageError
from harness.plan import RunPlan


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


def check_servers(plan: RunPlan) -> None:
    """Each --base-url must answer before the run starts (a typo costs seconds, not a run)."""
    import urllib.error
    import urllib.request

    for url in (
        plan.options.get("openai", {}).get("base_urls", []) if "openai" in plan.engines else []
    ):
        probe = url.rstrip("/") + "/models"
        try:
            with urllib.request.urlopen(probe, timeout=10):
                pass
        except urllib.error.HTTPError:
            pass  # it answers (an auth error is the engine's to report with the key)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise UsageError(f"--base-url: {url} does not answer ({reason})") from None


def variant_servers(configs: list[tuple[str, EngineConfig]]) -> list[tuple[str, EngineConfig]]:
    """``--base-url baseline=URL ngram=URL``: each openai variant talks to its own server."""
    out = []
    for label, c in configs:
        opts = dict(c.options)
        urls = opts.pop("variant_urls", None)
        if c.engine == "openai" and urls is not None:
            if label not in urls:
                given = " ".join(f"{k}=URL" for k in urls)
                raise UsageError(f"--base-url: no URL for variant {label!r} (given: {given})")
            opts["base_urls"] = urls[label]
        out.append((label, replace(c, options=opts)))
    labels = {label for label, c in configs if c.engine == "openai"}
    for c in (c for _, c in configs if c.engine == "openai"):
        extra = sorted(set(c.options.get("variant_urls") or ()) - labels)
        if extra:
            raise UsageError(f"--base-url: {extra[0]}=URL names no variant of this run")
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
    from harness.session import unsupported_method

    for _, config in configs:
        if not unsupported_method(config):
            engine_class(config.engine).validate(config)


def check_resume(plan: RunPlan, out: Path) -> None:
    """``--resume`` continues a run only with the settings it was recorded with: a journal of
    another temperature, model, prompt set, ... would merge runs that are not comparable."""
    from harness.journal import recorded_config
    from harness.plan import config_differences, lookup

    if not plan.resume:
        return
    path = out / "journal.jsonl"
    recorded = recorded_config(path)
    if recorded is None:
        raise UsageError(
            f"resume: journal {path} records no config (written by an older harness), so it "
            "cannot be checked; start a new --output-dir"
        )
    asked = plan.to_json()
    keys = config_differences(recorded, asked)
    if keys:
        was = ", ".join(f"{k}={_short(lookup(recorded, k))}" for k in keys)
        now = ", ".join(f"{k}={_short(lookup(asked, k))}" for k in keys)
        raise UsageError(
            f"resume: journal {path} was recorded with {was}, this run asks {now}; "
            "start a new --output-dir or use the same flags"
        )


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

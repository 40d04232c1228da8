"""Flags -> a validated :class:`~harness.run.plan.RunPlan`: the models a name stands for, the
dataset, the speculative variants and the per-engine options; every check that needs no model."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engines.base import REGISTRY, engine_class
from harness.core.design import PER_BLOCK
from harness.flags import capacity, workload
from harness.flags.engine_args import check_max_model_len
from harness.flags.engine_args import resolve as resolve_engine_args
from harness.flags.inputs import resolve_dataset
from harness.flags.options import UsageError, goodput, json_arg, prices, variant_urls
from harness.flags.stop import DEFAULT_BUDGET_MIN, DEFAULT_REPEATS
from harness.flags.vllm_bench import api_root
from harness.run.lanes import can_rebuild
from harness.run.plan import GRACE_S, RunPlan, check_engines, parse_methods
from harness.tune import committed

# 4 prompts x 32 tokens: with a fresh engine per block (every variant built and closed each
# block) a longer default took the CPU main job past its 10 minutes (docs/measurements.md)
DEFAULT_MAX_NEW_TOKENS = 32
DEFAULT_CONCURRENCY = 4  # one load point: 4 in flight (the main job must fit 10 min on 2 cores)

# --token-ids: forced on, forced off, or (None) as the run needs: when it compares outputs or a
# speculative variant streams several tokens per event
TOKEN_IDS = {"on": True, "off": False, "auto": None}
GRACE_ENV = "HARNESS_STOP_GRACE_S"  # seconds in-flight requests get after a stop (default 5)


def stop_grace_s() -> float:
    """The stop's grace period (docs/reliability.md): ``$HARNESS_STOP_GRACE_S`` (a test or a
    scheduler with a shorter kill timeout sets it), else 5 s."""
    raw = os.environ.get(GRACE_ENV)
    if raw is None:
        return GRACE_S
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"${GRACE_ENV}: not a number of seconds: {raw!r}") from None
    if not value >= 0:
        raise UsageError(f"${GRACE_ENV}: must be >= 0 seconds, got {raw!r}")
    return value


def build_plan(
    args: argparse.Namespace, model: str, draft: str | None, eagle3: str | None = None
) -> RunPlan:
    """The plan of the run (``args.dataset`` from :func:`resolve_dataset`, called if need be)."""
    if getattr(args, "dataset", None) is None:
        resolve_dataset(args)
    engines = tuple(e.strip() for e in args.engine.split(",") if e.strip())
    check_engines(engines)
    if args.instances == PER_BLOCK:
        fixed = [e for e in engines if not can_rebuild(e)]
        if fixed:
            raise UsageError(
                f"--instances per-block: --engine {fixed[0]} cannot start a fresh instance per "
                "block (its server keeps running); use --instances one"
            )
    methods = parse_methods(args.spec)
    spec_config = spec_config_arg(args.spec_config)
    if spec_config is not None and "method" not in spec_config:
        raise UsageError('--spec-config: the object needs a "method" key (e.g. "ngram")')
    if args.aa and (methods or spec_config or args.no_baseline):
        raise UsageError(
            "--aa compares the baseline with itself; drop --spec, --spec-config and --no-baseline"
        )
    if args.no_baseline and not (methods or spec_config):
        raise UsageError("--no-baseline needs --spec or --spec-config: nothing would run")
    if args.spec is not None and args.spec != "all" and "draft_model" in methods and not draft:
        raise UsageError(
            "--spec draft_model needs --draft-model (no shipped draft for this --model)"
        )
    if args.spec is not None and args.spec != "all" and "eagle3" in methods and not eagle3:
        raise UsageError(
            "--spec eagle3 needs a head: --spec-config "
            '\'{"method": "eagle3", "model": PATH, "num_speculative_tokens": 4}\' '
            "(the shipped family has one: --model embedded)"
        )
    engine_args, by_engine = resolve_engine_args(args.engine_args, args.engine_arg, engines)
    check_max_model_len(getattr(args, "max_model_len", None), engines, engine_args, by_engine)
    modes = ("latency", "throughput") if args.mode == "both" else (args.mode,)
    if args.concurrency and args.mode == "latency":
        raise UsageError("--concurrency applies to throughput mode; use --mode throughput or both")
    if args.request_rate and args.mode == "latency":
        raise UsageError("--request-rate applies to throughput mode; use --mode throughput or both")
    if args.duration and args.mode == "latency":
        raise UsageError("--duration applies to throughput mode; use --mode throughput or both")
    if args.min_effect < 0 or args.min_effect >= 1:
        raise UsageError("--min-effect: expected a fraction in [0, 1), e.g. 0.02")
    if args.max_error_rate is not None and not 0 <= args.max_error_rate <= 1:
        raise UsageError("--max-error-rate: expected a fraction in [0, 1]")
    workers = getattr(args, "client_workers", 1)
    ray_address = getattr(args, "ray_address", None)
    if workers > 1 or ray_address:
        from harness.run.clients.workers import refusal

        why = refusal(engines, workers, ray=bool(ray_address))
        if why:
            raise UsageError(why)
    if ray_address:
        import importlib.util

        from harness.run.clients.ray_actors import INSTALL

        if importlib.util.find_spec("ray") is None:
            raise UsageError(f"--ray-address needs Ray: {INSTALL}")
    speculative = bool(methods or spec_config)
    compares = speculative or args.aa or len(engines) > 1
    stopping = _stopping(args, compares)
    options = engine_options(args, engines, speculative, compares)
    concurrency = tuple(
        args.concurrency
        or (
            []
            if args.request_rate or args.slo or workload.is_trace(args)
            else [DEFAULT_CONCURRENCY]
        )
    )
    ks = args.num_spec_tokens
    try:
        spec_k = committed.spec_k(
            methods, main_loads(modes, concurrency), ks, committed.family_of(args.model)
        )
    except committed.TuneFileError as exc:
        raise UsageError(str(exc)) from None
    return RunPlan(
        engines=engines,
        model=model,
        draft_model=draft,
        tokenizer=args.tokenizer,
        spec_methods=methods,
        num_spec_tokens=tuple(ks or [committed.DEFAULT_K]),
        spec_k=spec_k,
        spec_config=spec_config,
        baseline=not args.no_baseline,
        modes=modes,
        concurrency=concurrency,
        request_rates=tuple(args.request_rate or ()),
        burstiness=args.burstiness,
        max_new_tokens=tuple(args.max_new_tokens or [_default_length(args)]),
        lengths_from_workload=args.max_new_tokens is None,
        duration=args.duration,
        fill_concurrency=args.num_prompts is None and args.duration is None,
        metric_percentiles=tuple(args.metric_percentiles or (50.0, 90.0, 99.0)),
        percentile_metrics=_percentile_table(args),
        metadata=dict(args.metadata),
        warmup=args.warmup,
        warmup_tokens=args.warmup_tokens,
        target_ci=args.target_ci,
        **stopping,
        seed=args.seed,
        workload=args.dataset.workload,
        dtype=args.dtype,
        device=args.device,
        max_model_len=getattr(args, "max_model_len", None),
        engine_args=engine_args,
        engine_args_by_engine=by_engine,
        options=options,
        prefix_cache=args.prefix_cache,
        aa=args.aa,
        eagle3_model=eagle3,
        client_workers=workers,
        ray_address=ray_address,
        temperature=args.temperature,
        ignore_eos=args.ignore_eos,
        token_ids=getattr(args, "token_ids", "auto"),
        num_prompts=args.num_prompts,
        turn=args.turn,
        interleave=not args.sequential,
        instances=args.instances,
        sample_load_s=args.sample_server_load,
        max_error_rate=args.max_error_rate,
        stop_grace_s=stop_grace_s(),
        min_effect=args.min_effect,
        goodput=goodput(args.goodput),
        price_per_hour=prices(args.price_per_hour, engines),
        plots=not args.no_plots,
        progress=not args.quiet,
        save_vllm_json=args.save_vllm_json,
        result_filename=args.result_filename,
        resume=args.resume is not None,
        **capacity.settings(args),
    )


def main_loads(modes: Sequence[str], concurrency: Sequence[int]) -> list[int]:
    """The loads a run's speculative variants meet, as a tune's loads: 1 in latency mode, each
    --concurrency in throughput mode; none where arrivals set it (then every load tuned)."""
    loads = [1] if "latency" in modes else []
    if "throughput" in modes:
        if not concurrency:
            return []
        loads += concurrency
    return sorted(set(loads))


def _stopping(args: argparse.Namespace, compares: bool) -> dict[str, Any]:
    """repeats, max_repeats, stopping and budget_s of the plan: the sequential design where the
    run compares and neither --repeats nor --target-ci fixes n (nor --sequential, whose
    comparisons get no interval to decide with, nor --slo, a search over rates whose capacities
    have their CI over repeats: ``capacity.SLO_REPEATS``); else the fixed n (--target-ci: from
    --repeats up to --max-repeats, default 20)."""
    from harness.analysis.comparisons.sequential import DEFAULT_CAP, Rule

    if args.budget is not None and args.budget < 0:
        raise UsageError("--budget: expected minutes >= 0 (0: no budget)")
    sequential = compares and not (args.sequential or args.slo)  # --slo: its CI is over repeats
    if args.repeats is None and args.target_ci is None and sequential:
        cap = args.max_repeats or DEFAULT_CAP
        first = Rule().first
        if cap < first:
            raise UsageError(f"--max-repeats: the sequential design looks from {first} blocks")
        budget = DEFAULT_BUDGET_MIN if args.budget is None else args.budget
        return {"repeats": first, "max_repeats": cap, "stopping": "sequential",
                "budget_s": budget * 60.0 if budget else None}  # fmt: skip
    if args.budget is not None:
        raise UsageError("--budget is for the sequential design (a run that compares, without "
                         "--repeats, --target-ci or --sequential)")  # fmt: skip
    repeats = args.repeats or (capacity.SLO_REPEATS if args.slo else DEFAULT_REPEATS)
    cap = max(args.max_repeats or 20, repeats) if args.target_ci else repeats
    return {"repeats": repeats, "max_repeats": cap, "stopping": "fixed", "budget_s": None}


def engine_options(
    args: argparse.Namespace, engines: tuple[str, ...], speculative: bool, compares: bool = False
) -> dict[str, dict[str, Any]]:
    """Each engine's options from the run-level flags it declares (``Engine.run_flags``; what
    they mean is the engine's: ``Engine.options_from``); --base-url only where one takes it.
    ``compares``: the run compares outputs (several variants or engines), so ``--token-ids
    auto`` asks for the ids."""
    urls = [api_root(u) for u in args.base_url] if args.base_url else None  # vLLM bench's root: /v1
    flags = {
        "base_url": urls,
        "variant_urls": variant_urls(urls),
        "request_timeout": args.request_timeout,
        "max_concurrency": max(args.concurrency or [DEFAULT_CONCURRENCY]),
        "endpoint": args.endpoint,
        "api_key_env": args.api_key_env,
        "api_key_file": args.api_key_file,
        "served_model": args.served_model,
        "server_start_timeout": args.server_start_timeout,
        "model_named": getattr(args, "model_named", False),
        "ignore_eos": args.ignore_eos,
        "extra_body": json_arg("--extra-body", getattr(args, "extra_body", None)),
        "async_scheduling": getattr(args, "async_scheduling", "auto"),
    }
    flags["token_ids"], flags["token_ids_why"] = _token_ids(
        getattr(args, "token_ids", "auto"), compares or speculative
    )
    options = {e: engine_class(e).options_from(flags, speculative) for e in engines}
    if urls and not _takers("base_url", engines):
        own = [n for n in REGISTRY if engine_class(n).capabilities.managed]
        raise UsageError(
            f"--base-url is for --engine {' or '.join(_takers('base_url'))} "
            f"({', '.join(own)} start their own)"
        )
    if flags["extra_body"] is not None and not _takers("extra_body", engines):
        raise UsageError(
            f"--extra-body is for the HTTP engines ({', '.join(_takers('extra_body'))})"
        )
    return {e: o for e, o in options.items() if o}


def _takers(flag: str, engines: Sequence[str] | None = None) -> list[str]:
    """The engines (of ``engines``, default every registered one) whose run flags take ``flag``."""
    return [
        n for n in (REGISTRY if engines is None else engines) if flag in engine_class(n).run_flags
    ]


def _token_ids(flag: str, needed: bool) -> tuple[bool | None, str | None]:
    """(whether to ask for ids, why): on/off as forced; auto: True when the run compares outputs
    (a speculative variant, --aa, several engines), else None: the engine asks for ids only if
    its server speculates (several tokens per event) and says why itself."""
    forced = TOKEN_IDS[flag]
    if forced is not None:
        return forced, f"--token-ids {flag}"
    if needed:
        return True, "--token-ids auto: the run compares outputs"
    return None, None


def spec_config_arg(value: str | None) -> dict[str, Any] | None:
    """``--spec-config``: inline JSON, ``@file.json`` or a path (what ``harness tune`` emits)."""
    if value is None or value.lstrip().startswith("{"):
        return json_arg("--spec-config", value)
    path = Path(value[1:] if value.startswith("@") else value).expanduser()
    if not value.startswith("@") and not path.exists():
        return json_arg("--spec-config", value)  # neither JSON nor a file: say why as JSON
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise UsageError(f"--spec-config: {path}: {reason}") from None
    return json_arg(f"--spec-config: {path}", text)


def _percentile_table(args: argparse.Namespace) -> tuple[str, ...]:
    """The metrics of the percentile table: asked for by either vLLM flag, else none."""
    from harness.flags.vllm_bench import PERCENTILE_METRICS

    if args.percentile_metrics is None and args.metric_percentiles is None:
        return ()
    return tuple(args.percentile_metrics or PERCENTILE_METRICS)


def _default_length(args: argparse.Namespace) -> int:
    """A synthetic dataset's output length names its points; else the default."""
    if args.dataset.workload == "random":
        return args.random_output_len
    if args.dataset.workload == "prefix_repetition":
        return args.prefix_repetition_output_len
    return DEFAULT_MAX_NEW_TOKENS

"""The main job: flags -> validated plan -> session -> results.json, summary.md, plots."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from engines.base import EngineConfig, EngineError, engine_class
from harness.cli import UsageError, _goodput, _json_arg, _kv_args, _variant_urls
from harness.journal import Journal, atomic_write, runs_from_journal
from harness.plan import PlanError, RunPlan, check_engines, parse_methods
from harness.results import SCHEMA_VERSION, Run, environment
from harness.vllm_flags import api_root

DEFAULT_MAX_NEW_TOKENS = 64
GRACE_S = 5.0  # in-flight requests get this long after Ctrl-C before they are cancelled


def build_plan(
    args: argparse.Namespace, model: str, draft: str | None, eagle3: str | None = None
) -> RunPlan:
    """The plan of the run (``args.dataset`` from :func:`resolve_dataset`, called if need be)."""
    if getattr(args, "dataset", None) is None:
        resolve_dataset(args)
    engines = tuple(e.strip() for e in args.engine.split(",") if e.strip())
    check_engines(engines)
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
    engine_args = {
        **(_json_arg("--engine-args", args.engine_args) or {}),
        **_kv_args(args.engine_arg),
    }
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
    if any(e in ("openai",) for e in engines) and not args.base_url:
        raise UsageError("--engine openai needs --base-url (e.g. http://127.0.0.1:8000/v1)")
    if args.base_url and not any(e == "openai" for e in engines):
        raise UsageError(
            "--base-url is for --engine openai (vllm-server and transformers-server start their own)"
        )
    if args.base_url:  # vllm bench serve's server root (http://host:8000) means .../v1 here
        args.base_url = [api_root(u) for u in args.base_url]
    per_variant = _variant_urls(args.base_url)
    if "openai" in engines and (methods or spec_config) and per_variant is None:
        raise UsageError(
            "--engine openai --spec: one server cannot be compared with itself; give one URL per "
            "variant (--base-url baseline=URL ngram=URL) or let --engine vllm-server start them"
        )
    http = {
        "request_timeout": args.request_timeout,
        "max_concurrency": max(args.concurrency or [16]),
    }
    if args.endpoint is not None:
        http["endpoint"] = args.endpoint
    openai = {**http, "api_key_env": args.api_key_env}
    for key, value in (
        (
            "base_urls",
            [u for us in per_variant.values() for u in us] if per_variant else args.base_url,
        ),
        ("variant_urls", per_variant),
        ("api_key_file", args.api_key_file),
        ("served_model", args.served_model),
    ):
        if value is not None:
            openai[key] = value
    options: dict[str, dict[str, Any]] = {"openai": openai}
    for e in engines:  # servers the harness starts itself
        if getattr(engine_class(e), "managed", False):
            options[e] = {**http, "start_timeout": args.server_start_timeout}
    return RunPlan(
        engines=engines,
        model=model,
        draft_model=draft,
        tokenizer=args.tokenizer,
        spec_methods=methods,
        num_spec_tokens=tuple(args.num_spec_tokens),
        spec_config=spec_config,
        baseline=not args.no_baseline,
        modes=modes,
        concurrency=tuple(args.concurrency or ([] if args.request_rate else [16])),
        request_rates=tuple(args.request_rate or ()),
        burstiness=args.burstiness,
        max_new_tokens=tuple(args.max_new_tokens or [_default_length(args)]),
        lengths_from_workload=args.max_new_tokens is None,
        duration=args.duration,
        fill_concurrency=args.num_prompts is None and args.duration is None,
        metric_percentiles=tuple(args.metric_percentiles or (50.0, 90.0, 99.0)),
        percentile_metrics=_percentile_table(args),
        metadata=dict(args.metadata),
        repeats=args.repeats,
        warmup=args.warmup,
        target_ci=args.target_ci,
        max_repeats=max(args.max_repeats, args.repeats) if args.target_ci else args.repeats,
        seed=args.seed,
        workload=args.dataset.workload,
        dtype=args.dtype,
        device=args.device,
        engine_args=engine_args,
        options=options,
        prefix_cache=args.prefix_cache,
        aa=args.aa,
        eagle3_model=eagle3,
    )


def spec_config_arg(value: str | None) -> dict[str, Any] | None:
    """``--spec-config``: inline JSON, ``@file.json`` or a path (what ``harness tune`` emits)."""
    if value is None or value.lstrip().startswith("{"):
        return _json_arg("--spec-config", value)
    path = Path(value[1:] if value.startswith("@") else value).expanduser()
    if not value.startswith("@") and not path.exists():
        return _json_arg("--spec-config", value)  # neither JSON nor a file: say why as JSON
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise UsageError(f"--spec-config: {path}: {reason}") from None
    return _json_arg(f"--spec-config: {path}", text)


def _percentile_table(args: argparse.Namespace) -> tuple[str, ...]:
    """The metrics of the percentile table: asked for by either vLLM flag, else none."""
    from harness.vllm_flags import PERCENTILE_METRICS

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


def resolve_dataset(args: argparse.Namespace) -> None:
    """--dataset-name/--dataset-path (vllm bench serve's) or --workload, into ``args.dataset``;
    a synthetic dataset implies --ignore-eos and vLLM's default of 1000 prompts."""
    from harness.vllm_flags import dataset_choice

    try:
        args.dataset = dataset_choice(
            args.workload,
            args.workload != "default",
            args.workload_format,
            args.dataset_name,
            args.dataset_path,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.dataset.synthetic:
        from workloads.synthetic import parse_range_ratio

        parse_range_ratio(args.random_range_ratio)  # a bad ratio is reported before loading
        args.ignore_eos = True
        if args.num_prompts is None and args.duration is None:
            args.num_prompts = 1000


def load_dataset(args: argparse.Namespace, model: str) -> Any:
    """The workload: a file (shipped or the user's) or prompts made with the target's tokenizer."""
    from workloads import load_workload, synthetic_workload
    from workloads.synthetic import PrefixRepetitionSpec, RandomSpec, parse_range_ratio

    choice = args.dataset
    if not choice.synthetic:
        return load_workload(
            choice.workload,
            fmt=choice.fmt,
            num_prompts=args.num_prompts,
            seed=args.seed,
            turn=args.turn,
        )
    if choice.workload == "random":
        spec: Any = RandomSpec(
            args.random_input_len,
            args.random_output_len,
            parse_range_ratio(args.random_range_ratio),
            args.random_prefix_len,
        )
    else:
        spec = PrefixRepetitionSpec(
            args.prefix_repetition_prefix_len,
            args.prefix_repetition_suffix_len,
            args.prefix_repetition_num_prefixes,
            args.prefix_repetition_output_len,
        )
    n = args.num_prompts or 1000
    return synthetic_workload(choice.workload, args.tokenizer or model, n, spec, args.seed)


def resolve_models(args: argparse.Namespace) -> tuple[str, str | None, str | None]:
    """(target, draft, EAGLE-3 head): a shipped family's directories when --model names one
    ("embedded" = SmolLM2, "tiny"), assembled on first use; else the user's ids/paths unchanged."""
    from harness import models

    model, draft = args.model, args.draft_model
    try:
        parsed = models.parse_name(model)
        if draft is None:
            draft = models.companion(model, "draft")
        head = models.companion(model, "eagle3")
        for name in (model, draft, head):
            fam = models.parse_name(name) if name else None
            if fam is not None:
                models.ensure_family(fam[0], progress=not args.quiet)
        model = models.resolve_model(model)
        draft = models.resolve_model(draft) if draft else None
        head = models.resolve_model(head) if head and parsed else None
    except (ValueError, models.EmbeddedModelMissing) as exc:
        raise UsageError(str(exc)) from None
    for flag, value in (("--model", model), ("--draft-model", draft)):
        if value and _looks_like_path(value) and not Path(value).exists():
            raise UsageError(f"{flag}: {value}: no such file or directory")
    return model, draft, head


def _looks_like_path(value: str) -> bool:
    return value.startswith((".", "/", "~")) or Path(value).exists() or value.count("/") > 1


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
    return {e: tuple(getattr(engine_class(e), "spec_methods", ())) for e in plan.engines}


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


def output_dir(args: argparse.Namespace) -> Path:
    if args.resume:
        d = Path(args.resume)
        if not (d / "journal.jsonl").exists():
            raise UsageError(f"--resume: {d}: no journal.jsonl there to resume from")
        return d
    if args.output_dir:
        return Path(args.output_dir)
    return Path("results") / dt.datetime.now().strftime("%Y%m%d-%H%M%S")


def run_main(args: argparse.Namespace) -> int:
    from workloads import WorkloadError

    if args.quiet:  # before any engine imports vLLM: its INFO lines are progress, not results
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

    try:
        goodput = _goodput(args.goodput)
        resolve_dataset(args)
        if not args.dataset.synthetic:  # a bad file is reported before anything loads
            workload = load_dataset(args, args.model)
        from harness.models import companion

        draft = args.draft_model or companion(args.model, "draft")
        build_plan(args, args.model, draft, companion(args.model, "eagle3"))  # flags first
        out = output_dir(args)
        model, draft, eagle3 = resolve_models(args)
        if args.dataset.synthetic:  # made with the target's tokenizer
            workload = load_dataset(args, model)
        plan = build_plan(args, model, draft, eagle3)
        configs = variant_servers(plan.engine_configs(engine_methods(plan)))
        check_models(plan)
        check_servers(plan)
        validate_configs(plan, configs)
    except (UsageError, PlanError, EngineError, WorkloadError) as exc:
        raise UsageError(str(exc)) from None
    return asyncio.run(_execute(args, plan, configs, workload, out, goodput))


async def _execute(args, plan, configs, workload, out: Path, goodput) -> int:
    from harness.session import Session

    out.mkdir(parents=True, exist_ok=True)
    configs = [  # a managed server's log is saved beside the results
        (
            label,
            replace(c, options={**c.options, "log_path": str(out / f"{c.engine}-{label}.log")}),
        )
        if getattr(engine_class(c.engine), "managed", False)
        else (label, c)
        for label, c in configs
    ]
    previous, done = runs_from_journal(out / "journal.jsonl") if args.resume else ([], set())
    journal = Journal(out / "journal.jsonl")
    session = Session(
        plan,
        workload.requests,
        journal=journal,
        done=done,
        progress=not args.quiet,
        max_error_rate=args.max_error_rate,
        interleave=not args.sequential,
        temperature=args.temperature,
        ignore_eos=args.ignore_eos,
        sample_load_s=args.sample_server_load,
    )
    session.runs.extend(r for r in previous if r.cell.key in done)
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()
    interrupted: list[str] = []

    def on_signal(name: str) -> None:
        if interrupted:  # second signal: stop now
            main_task.cancel()
            return
        interrupted.append(name)
        session.stop.set(f"{name} received")
        print(
            f"\n[harness] {name}: stopping; in-flight requests get {GRACE_S:g} s", file=sys.stderr
        )
        loop.call_later(GRACE_S, lambda: exec_task.cancel())

    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal, sig.name)
    exec_task = asyncio.ensure_future(session.execute(configs))
    error: str | None = None
    try:
        await exec_task
    except asyncio.CancelledError:
        pass
    except Exception as exc:  # finish writing whatever finished, then report
        from harness.runner import error_line

        error = error_line(exc)
    finally:
        journal.close()
    runs = session.runs
    if interrupted or error:
        # the journal holds every record that finished, including cells cut mid-way
        journaled, _ = runs_from_journal(out / "journal.jsonl")
        have = {r.cell.key for r in runs}
        runs = runs + [r for r in journaled if r.cell.key not in have]
    status = "complete"
    if interrupted:
        status = f"interrupted ({interrupted[0]})"
    elif error:
        status = f"failed: {error}"
    elif session.stop:
        status = f"stopped: {session.stop.reason}"
    design = session.design_record([f"{c.engine}/{label}" for label, c in configs])
    results = finalize(
        out,
        plan,
        workload,
        runs,
        status,
        args.min_effect,
        goodput,
        plots=not args.no_plots,
        temperature=args.temperature,
        design=design,
        ignore_eos=args.ignore_eos,
    )
    if args.save_vllm_json:
        from harness.vllm_json import export_dir

        written = export_dir(results, out / "vllm", args.result_filename)
        print(f"[harness] vllm bench result files: {written}", file=sys.stderr)
    summary = (out / "summary.md").read_text()
    if not interrupted:
        print(summary)
    print(
        f"[harness] results: {out / 'results.json'}  summary: {out / 'summary.md'}", file=sys.stderr
    )
    if interrupted:
        print(f"error: interrupted by {interrupted[0]}; partial results in {out}", file=sys.stderr)
        return 130
    if error:
        print(f"error: {error}; partial results in {out}", file=sys.stderr)
        return 1
    why = run_failure(runs)
    if why:
        print(f"error: {why}; results in {out}", file=sys.stderr)
        return 1
    return 0 if results["status"] == "complete" else 1


def run_failure(runs: list[Run]) -> str | None:
    """Why the run as a whole failed (an engine did not start, or no request succeeded), else
    None; some failed requests are not a failed run (the table counts them)."""
    for r in runs:
        if r.status.startswith("failed: engine did not start"):
            return f"{r.cell.engine} [{r.cell.label}] {r.status.removeprefix('failed: ')}"
    tried = [r for r in runs if not r.status.startswith("unsupported")]
    records = [rec for r in tried for rec in r.records if not rec.warmup]
    if tried and not any(rec.ok for rec in records):
        first = next((rec.error for rec in records if rec.error), None)
        return f"no request succeeded ({len(records)} failed{f', e.g. {first}' if first else ''})"
    return None


def _speed_of_light(plan: RunPlan, runs: list[Run]) -> dict[str, Any] | None:
    """Batch-1 decode bound of a local target (weights read once per token), or None."""
    from harness.sol import bound_for, count_params, measure_bandwidth

    if not any(r.cell.mode == "latency" for r in runs) or count_params(plan.model) is None:
        return None
    dtype = next((str(r.engine_info.get("dtype", "")) for r in runs if r.engine_info), "")
    bandwidth = measure_bandwidth(mib=256, reps=5)["best"]
    return bound_for(plan.model, dtype.removeprefix("torch."), bandwidth)


def finalize(
    out: Path,
    plan: RunPlan,
    workload,
    runs: list[Run],
    status: str,
    min_effect: float,
    goodput: dict[str, float] | None,
    plots: bool = True,
    temperature: float = 0.0,
    design: dict[str, Any] | None = None,
    ignore_eos: bool = False,
) -> dict[str, Any]:
    """Derive every number once (:func:`harness.derived.analyze`), write results.json
    (atomically), then summary.md and plots from it alone."""
    from harness.derived import analyze, run_summaries
    from harness.markdown import render

    summaries = run_summaries(runs, goodput, plan.metric_percentiles)
    results = {
        "schema_version": SCHEMA_VERSION,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "status": status,
        "environment": environment(),
        "config": {
            **plan.to_json(),
            "min_effect": min_effect,
            "goodput": goodput,
            "temperature": temperature,
            "ignore_eos": ignore_eos,
        },
        "metadata": dict(plan.metadata),
        "workload": {
            "name": workload.name,
            "path": str(workload.path),
            "format": workload.fmt,
            "num_requests": len(workload.requests),
            "fingerprint": workload.fingerprint,
            "params": None if workload.params is None else dict(workload.params),
            "categories": {r.id: r.category for r in workload.requests if r.category},
        },
        "design": design,  # harness.design: which variant ran when, and the cache policy
        "runs": [r.to_json(s) for r, s in zip(runs, summaries)],
    }
    results |= analyze(
        runs,
        min_effect=min_effect,
        seed=plan.seed,
        temperature=temperature,
        goodput=goodput,
        bound=_speed_of_light(plan, runs),
        percentiles=plan.metric_percentiles,
        summaries=summaries,
        categories=results["workload"]["categories"],
    )
    atomic_write(out / "results.json", json.dumps(results, indent=1))
    from harness.table_csv import to_csv

    atomic_write(out / "summary.csv", to_csv(results))
    md = render(results)
    if plots:
        from harness.plots import draw

        md += draw(results, out)
    atomic_write(out / "summary.md", md)
    return results

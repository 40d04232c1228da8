"""The main job: flags -> validated plan (``harness.cli.pipeline``, ``harness.cli.preflight``) ->
session -> results (``harness.cli.finalize``); Ctrl-C and failures still write what finished."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from engines.base import EngineConfig, EngineError
from harness.cli.device_defaults import follow_device
from harness.cli.finalize import finalize
from harness.cli.pipeline import prepare, with_log
from harness.cli.plan_view import plan_before_loading, resolve_device_and_dtype
from harness.cli.preflight import (
    check_endpoint,
    check_models,
    check_resume,
    check_servers,
    engine_methods,
    validate_configs,
    variant_servers,
)
from harness.core.columns import RecordColumns
from harness.core.records_file import RECORDS_FILE
from harness.core.results import Run
from harness.flags.options import UsageError
from harness.run.journal import (
    Journal,
    compact,
    new_session_id,
    recorded_session,
    runs_from_journal,
)
from harness.run.plan import PlanError, RunPlan
from harness.run.runner import settle
from harness.sizing.memory import Sizes
from harness.sizing.preview import not_run_records

if TYPE_CHECKING:
    from workloads import Workload

EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143}  # 128 + the signal's number, as a shell reports


def run_main(args: argparse.Namespace) -> int:
    """Flags -> one validated, frozen plan (every setting; nothing below reads ``args``) -> run."""
    from workloads import WorkloadError

    try:
        said = follow_device(args)  # CUDA: a realistic default set (CPU: nothing changes)
        prepared = prepare(args)
        plan, workload, out = prepared.plan, prepared.workload, prepared.out
        sizes = Sizes()  # each model's config.json read once (harness.sizing.memory)
        plan, device, dtype_why = resolve_device_and_dtype(plan, sizes)
        if not args.dry_run:
            check_resume(plan, out, device, sizes)
        configs = variant_servers(plan.engine_configs(engine_methods(plan)))
        check_models(plan)
        check_endpoint(configs, workload.requests)
        if not args.dry_run:
            check_servers(configs)
        validate_configs(plan, configs)
        view, configs = plan_before_loading(
            plan, configs, workload.requests, device, dtype_why, engine_methods(plan), sizes,
            args.dry_run, said,
        )  # fmt: skip
    except (UsageError, PlanError, EngineError, WorkloadError) as exc:
        raise UsageError(str(exc)) from None
    if args.dry_run:
        return 0
    return asyncio.run(
        _execute(plan, configs, workload, out, view.to_json(), not_run_records(view))
    )


async def _execute(
    plan: RunPlan,
    configs: list[tuple[str, EngineConfig]],
    workload: Workload,
    out: Path,
    preview: dict | None = None,
    not_run: list | None = None,
) -> int:
    from harness.run.capacity import bind, search_plan
    from harness.run.session import Session

    plan = search_plan(plan)  # --slo: the rates are chosen as the session runs
    out.mkdir(parents=True, exist_ok=True)
    configs = [(label, with_log(label, c, out)) for label, c in configs]
    previous, done = runs_from_journal(out / "journal.jsonl") if plan.resume else ([], set())
    journal = Journal(out / "journal.jsonl")
    if not plan.resume:  # what --resume compares with (harness.cli.preflight.check_resume)
        journal.write("config", {"config": plan.to_json()})
    # one session marker for the run and every --resume of it: compare pairs within it only
    session_id = recorded_session(out / "journal.jsonl") if plan.resume else None
    if session_id is None:
        session_id = new_session_id()
        journal.write("session", {"session": session_id})
    session = Session(
        plan,
        workload.requests,
        journal=journal,
        done=done,
        progress=plan.progress,
    )
    session.runs.extend(r for r in previous if r.cell.key in done)
    session.stop.grace_s = grace = plan.stop_grace_s
    bind(plan, session.runs)
    loop = asyncio.get_running_loop()
    interrupted: list[str] = []

    def end_grace() -> None:  # cancel what is still in flight, and a start or a warm-up
        session.stop.expire()
        exec_task.cancel()

    def on_signal(name: str) -> None:
        if interrupted:  # a second signal: no more grace
            print(f"\n[harness] {name} again: cancelling now", file=sys.stderr)
            end_grace()
            return
        interrupted.append(name)
        session.stop.set(f"{name} received")
        print(f"\n[harness] {name}: stopping; in-flight requests get {grace:g} s", file=sys.stderr)
        loop.call_later(grace, end_grace)

    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal, sig.name)
    exec_task = asyncio.ensure_future(session.execute(configs))
    error: str | None = None
    try:
        await settle([exec_task])  # a signal now cancels exec_task, never this function
        exec_task.result()
    except asyncio.CancelledError:
        pass
    except Exception as exc:  # finish writing whatever finished, then report
        from harness.run.runner import error_line

        error = error_line(exc)
    finally:
        await _settle_rest(grace)
        journal.close()  # after the last record: every task that could write one is done
    if journal.late:
        print(
            f"[harness] warning: {journal.late} journal entries came after its close",
            file=sys.stderr,
        )
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
    if plan.conversations is not None and design.get("prefix_cache_description"):
        from harness.run.conversations import CACHE_POLICY

        design["prefix_cache_description"] += f"; {CACHE_POLICY}"
    if session.stopper is not None:  # the sequential design: each point's blocks and stop
        design["stopping"] = session.stopper.record(runs)
    results = finalize(
        out, plan, workload, runs, status, design=design, session=session_id,
        extra={"plan": preview}, skipped=not_run,
    )  # fmt: skip
    if status == "complete":  # each record once on disk: the journal keeps the rest
        compact(out / "journal.jsonl", RECORDS_FILE)
    if plan.save_vllm_json:
        from harness.core.records_file import with_records
        from harness.report.vllm_json import export_dir

        written = export_dir(with_records(results, out), out, plan.result_filename)
        print(f"[harness] vLLM bench result files: {written}", file=sys.stderr)
    if not interrupted:  # summary.md without its image links: a terminal shows none
        from harness.report.markdown import render

        print(render(results))
    print(
        f"[harness] results: {out / 'results.json'}  summary: {out / 'summary.md'}  "
        f"report: {out / 'report.html'}",
        file=sys.stderr,
    )
    if interrupted:
        print(f"error: interrupted by {interrupted[0]}; partial results in {out}", file=sys.stderr)
        return EXIT_CODES.get(interrupted[0], 130)
    if error:
        print(f"error: {error}; partial results in {out}", file=sys.stderr)
        return 1
    why = run_failure(runs) or (
        None if results["status"] == "complete" else f"run {results['status']}"
    )
    if why:  # e.g. "run stopped: error rate 50% > --max-error-rate 20%"
        print(f"error: {why}; results in {out}", file=sys.stderr)
        return 1
    return 0


async def _settle_rest(grace: float) -> None:
    """Cancel and await every task the run left behind (an engine's helper, a stream's
    finalizer), for at most ``grace`` more seconds, so that none writes after the journal's close."""
    rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for t in rest:
        t.cancel()
    if rest:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait(rest, timeout=max(grace, 1.0))


def run_failure(runs: list[Run]) -> str | None:
    """Why the run as a whole failed, else None: an engine did not start, or one engine/variant
    that ran had no successful request (a comparison with one side at 0/N is no comparison).
    Some failed requests are not a failed run (the table counts them)."""
    for r in runs:
        if r.status.startswith("failed: engine did not start"):
            return f"{r.cell.engine} [{r.cell.label}] {r.status.removeprefix('failed: ')}"
    sides: dict[str, list[Run]] = {}
    for r in runs:
        if not r.status.startswith("unsupported"):
            sides.setdefault(f"{r.cell.engine} [{r.cell.label}]", []).append(r)
    for side, tried in sides.items():
        records = RecordColumns.join(r.records for r in tried)  # columns: no copy per record
        measured = ~records.warmup()
        if (records.ok() & measured).any():
            continue
        n = int(measured.sum())
        if not n and not any(r.status.startswith("failed") for r in tried):
            continue  # stopped or interrupted before it sent anything: it did not run
        errors = records.errors()
        first = next((errors[i] for i in sorted(errors) if measured[i]), None)
        if first is None and not n:
            first = next(
                (r.status.removeprefix("failed: ") for r in tried if r.status.startswith("failed")),
                None,
            )
        e_g = f", e.g. {first}" if first else ""
        return f"{side}: no request succeeded ({n} failed{e_g})"
    return None

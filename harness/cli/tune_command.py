"""`python -m harness tune`: the best speculative configuration per load on vLLM, emitted as a
``speculative_config`` file, then verified against the best fixed K and the baseline.

The flags of a normal run choose the workload, model and engine; the search (harness/tune/search.py)
gets a measurement callback that runs the workload once per arm through the harness's own
session (runner, clock, counters, journal), one engine per arm, kept warm across loads.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from engines.base import REGISTRY, EngineConfig, EngineError, engine_class
from harness.cli.tune_variants import spec_config_for
from harness.core.load import Concurrent
from harness.core.results import Run
from harness.flags.help import actions, hide, refuse_given
from harness.flags.options import UsageError, positive_int
from harness.flags.parser import build_parser
from harness.run.lanes import close_lanes
from harness.run.plan import PlanError, Point, RunPlan
from harness.tune.budget import FILES_MARGIN_S, TimeBudget, worst_case
from harness.tune.committed import provenance
from harness.tune.report import markdown, to_json
from harness.tune.schedule import RULE, describe
from harness.tune.search import BASELINE, Arm, LoadResult, Sample, Settings, tune
from harness.tune.verify import answer

DEFAULT_KS = (1, 2, 3, 4, 6)
MIN_REQUESTS, PER_LOAD = 4, 2  # requests per run: max(4, 2 x load), so batches stay full


def round_requests(requests: Sequence[Any], load: int, rnd: int) -> list[Any]:
    """The requests of one round at one load: max(4, 2 x load) of the workload, starting where
    the previous round stopped (every round a new slice, all arms of a round the same one), so
    over the rounds every prompt counts; cycled with new ids when the workload is shorter."""
    n = max(MIN_REQUESTS, PER_LOAD * load)
    start = max(rnd, 0) * n
    out = []
    for i in range(start, start + n):
        r = requests[i % len(requests)]
        lap = (i - start) // len(requests)
        out.append(replace(r, id=f"{r.id}#{lap}") if lap else r)
    return out


# Run flags tune has no use for (it decides rounds, K, loads and the design itself): hidden from
# `tune --help` and refused when given, rather than silently ignored. --request-rate has its own
# message (loads are concurrencies).
NOT_FOR_TUNE = (
    "--mode", "--repeats", "--target-ci", "--max-repeats", "--sequential", "--instances", "--aa",
    "--no-baseline", "--num-spec-tokens", "--resume", "--burstiness", "--goodput", "--no-plots",
    "--save-result", "--result-filename", "--save-detailed", "--percentile-metrics",
    "--metric-percentiles", "--request-rate",
)  # fmt: skip
TUNE_FIRST = (
    "--engine", "--model", "--spec", "--spec-config", "--workload", "--num-prompts",
    "--concurrency", "--max-new-tokens", "--output-dir",
)  # fmt: skip


TUNE_EPILOG = """\
examples:
  python -m harness tune                       every method that applies, loads 1 2 4 8, 15 minutes
  python -m harness tune --spec ngram --concurrency 1 4 16
  python -m harness --spec-config @results/<ts>/speculative_config.json   use the answer
"""


def parser() -> argparse.ArgumentParser:
    p = build_parser()
    p.prog = "python -m harness tune"
    hide(p, NOT_FOR_TUNE)
    p.first_run, p.full_groups = TUNE_FIRST, ("tune",)  # type: ignore[attr-defined]
    p.epilog = TUNE_EPILOG
    said = {
        "engine": "the engine to tune: "
        + ", ".join(e for e in REGISTRY if engine_class(e).capabilities.tunable),
        "spec": "the methods to tune (default: every method that applies)",
        "concurrency": "the loads to tune (default: the doubling sweep 1, 2, 4, ... up to "
        "--max-load)",
    }
    for action in actions(p):
        action.help = said.get(action.dest, action.help)
    p.description = (
        "Find the best speculative configuration (method, K) per load with paired CIs, write it "
        "as a speculative_config vLLM accepts (num_speculative_tokens_per_batch_size), verify it."
    )
    t = p.add_argument_group("tune")
    t.add_argument(
        "--tune-k", type=positive_int, nargs="+", default=list(DEFAULT_KS), metavar="K",
        help="draft lengths to consider per method (default 1 2 3 4 6)",
    )  # fmt: skip
    t.add_argument(
        "--max-load", type=positive_int, default=8,
        help="without --concurrency: the doubling sweep 1, 2, 4, ... stops here at the latest "
        "(else where the baseline's tokens/s gains < 10%% per doubling); default 8",
    )  # fmt: skip
    t.add_argument(
        "--max-rounds", type=positive_int, default=6,
        help="rounds per load before the search stops undecided (default 6; rounds past a "
        "load's minimum are run only while the later loads' minimum and the verification fit)",
    )  # fmt: skip
    t.add_argument(
        "--verify-rounds", type=positive_int, default=3,
        help="interleaved rounds per load of schedule vs fixed K vs baseline (default 3)",
    )  # fmt: skip
    t.add_argument(
        "--budget-min", type=float, default=15.0,
        help="the whole tune's wall time in minutes, from the tune's start (engine starts, "
        f"search, verification; its last {FILES_MARGIN_S:.0f} s kept for closing engines and "
        "writing files): a race stops undecided, or the sweep stops, where the next round would "
        "leave too little for the verification and the later loads (from the times measured "
        "in this tune); default 15",
    )  # fmt: skip
    t.add_argument("--no-verify", action="store_true", help="emit without verifying")
    return p


def main(argv: Sequence[str]) -> int:
    started = time.monotonic()  # the budget's start: this tune's, not the process's (budget.py)
    from harness.cli.pipeline import prepare
    from harness.cli.preflight import check_models, engine_methods
    from harness.cli.tune_variants import tuned_methods
    from workloads import WorkloadError

    p = parser()
    args = p.parse_args(list(argv))
    args.argv = list(argv)  # tune.json's provenance
    try:
        engines = [e.strip() for e in args.engine.split(",") if e.strip()]
        tunable = [e for e in REGISTRY if engine_class(e).capabilities.tunable]
        if len(engines) != 1 or engines[0] not in tunable:
            raise UsageError(f"tune: --engine must be one of {', '.join(tunable)}")
        if args.request_rate:
            raise UsageError("tune: loads are concurrencies (--concurrency), not --request-rate")
        refuse_given(p, args, [f for f in NOT_FOR_TUNE if f != "--request-rate"], "tune")
        args.mode = "throughput"
        if not args.budget_min > 0:
            raise UsageError(f"tune: --budget-min: expected minutes > 0, got {args.budget_min}")
        args.spec = args.spec or (None if args.spec_config else "all")  # a head: tune it alone
        prepared = prepare(args)  # the run pipeline's front: the dataset once, the plan, models
        # its arms set their own K: not a committed tune's (config.spec_k)
        plan, workload, out = replace(prepared.plan, spec_k={}), prepared.workload, prepared.out
        check_models(plan)  # --max-new-tokens at or past --max-model-len, vocabularies
        methods = tuned_methods(plan, engine_methods(plan)[engines[0]])  # with --spec-config's
        if not methods:
            raise UsageError(f"tune: no speculative method applies to {engines[0]}")
        ks = tuple(sorted(set(args.tune_k)))
        configs = {m: _spec_config(plan, m, max(ks)) for m in methods}
        methods = [m for m in methods if configs[m] is not None]
        plan = _one_async_value(plan, engines[0], [configs[m] for m in methods])
        for m in methods:
            engine_class(engines[0]).validate(_engine_config(plan, configs[m]))
    except (UsageError, PlanError, EngineError, WorkloadError) as exc:
        raise UsageError(str(exc)) from None
    settings = Settings(tolerance=args.min_effect, max_rounds=args.max_rounds, seed=args.seed)
    return asyncio.run(_run(args, plan, workload, out, {m: ks for m in methods}, settings, started))


def _one_async_value(plan: RunPlan, engine: str, specs: list[Mapping[str, Any] | None]) -> RunPlan:
    """``--async-scheduling`` resolved once for the baseline and every arm, as for a run's lanes."""
    if "async_scheduling" not in (plan.options.get(engine) or {}):
        return plan
    lanes = [(str(i), _engine_config(plan, s)) for i, s in enumerate([None, *specs])]
    options = dict(engine_class(engine).for_variants(lanes)[0][1].options)
    if plan.progress and options.get("async_scheduling_why"):
        print(f"[harness] {engine}: async scheduling {options['async_scheduling_why']}",
              file=sys.stderr)  # fmt: skip
    return replace(plan, options={**plan.options, engine: options})


def _spec_config(plan: RunPlan, method: str, k: int) -> dict[str, Any] | None:
    """The speculative_config a normal run builds for (method, K), --spec-config's included."""
    return spec_config_for(plan, method, k)


def _engine_config(plan: RunPlan, spec: Mapping[str, Any] | None) -> EngineConfig:
    """The EngineConfig a normal run builds for this speculative_config (None: the baseline)."""
    one = replace(
        plan, spec_methods=(), spec_config=None if spec is None else dict(spec),
        baseline=spec is None,
    )  # fmt: skip
    return one.engine_configs({})[0][1]


class Bench:
    """The measurement callback: one engine per arm (started on first use, kept warm), each
    arm's run through the session; runs are kept per phase for results.json."""

    def __init__(
        self, plan: RunPlan, requests: Sequence[Any], out: Path, quiet: bool, share: int = 1,
        budget: TimeBudget | None = None,
    ):  # fmt: skip
        from harness.run.session import Session

        self.plan, self.out, self.requests = plan, out, list(requests)
        self.session = Session(plan, requests, journal=None, progress=not quiet)
        self.share = share  # engines alive at once, at most (a GPU's memory is split by it)
        self.fraction: float | None = None  # each engine's device share (plan_view.tune_fraction)
        self.lanes: dict[Arm, Any] = {}
        self.configs: dict[Arm, dict[str, Any] | None] = {BASELINE: None}
        self.warm: set[Arm] = set()  # --warmup requests once per engine, not per load
        self.phase = "search"
        self.runs: dict[str, list[Run]] = {"search": [], "verify": []}
        self.budget = budget

    def add(self, arm: Arm, spec: Mapping[str, Any] | None) -> None:
        self.configs[arm] = None if spec is None else dict(spec)

    async def _lane(self, arm: Arm) -> Any:
        from harness.cli.pipeline import with_log
        from harness.run.lanes import Lane

        if arm not in self.lanes:
            if arm not in self.configs:
                self.add(arm, _spec_config(self.plan, str(arm.method), arm.k))
            config = with_log(arm.label, _engine_config(self.plan, self.configs[arm]), self.out)
            if self.fraction is not None:
                config = replace(config, memory_fraction=self.fraction)
            lane = Lane(arm.label, config).with_share(self.share)
            before, t = len(self.session.runs), time.monotonic()
            await self.session.start_lane(lane)
            if self.budget is not None:
                self.budget.engine_started(arm, time.monotonic() - t)
            if lane.engine is None:  # said even with --quiet: the tables will show n/a
                new = self.session.runs[before:]
                why = new[0].status if new else "engine did not start"
                print(f"[harness] tune: {arm.label}: {why}", file=sys.stderr, flush=True)
            self.lanes[arm] = lane
        return self.lanes[arm]

    async def __call__(self, load: int, arms: Sequence[Arm], rnd: int) -> dict[Arm, Sample]:
        out: dict[Arm, Sample] = {}
        point = Point("throughput", Concurrent(load), self.plan.max_new_tokens[0])
        phase = self.phase
        self.session.requests = round_requests(self.requests, load, rnd)  # lengths: run_cell
        for position, arm in enumerate(arms):
            lane = await self._lane(arm)
            if lane.engine is None:
                continue  # did not start: the session recorded why
            cell = self.plan.cell(lane.config.engine, arm.label, point, max(rnd, 0))
            first = arm not in self.warm
            self.warm.add(arm)
            t = time.monotonic()
            # the round is the block (pairing unit); index = the load
            run = await self.session.run_cell(
                lane, cell, point, warmup=first, block=max(rnd, 0), index=load, position=position
            )
            wall = time.monotonic() - t
            self.runs[phase].append(run)
            sample = _sample(run)
            if self.budget is not None:  # a warm-up is a one-off cost of the engine, not the run's
                took = min(wall, sample.seconds) if first and sample else wall
                self.budget.ran(arm, load, took, once=wall - took)
            if sample is not None:
                out[arm] = sample
        return out

    async def close(self) -> None:
        """Every lane's client workers and engine closed (the run's own rule: close_lanes)."""
        await close_lanes(list(self.lanes.values()))


def _sample(run: Run) -> Sample | None:
    rs = [r for r in run.counted if r.ok]
    if run.status != "ok" or not rs:
        return None
    span = max(r.t_end for r in rs) - min(r.t_send for r in rs)
    acc = (run.spec_metrics or {}).get("acceptance_per_pos") or []
    return Sample(
        tokens=float(sum(r.output_tokens for r in rs)),
        seconds=span,
        acceptance_per_pos=tuple(float(a) for a in acc if a is not None),
    )


async def _run(
    args, plan: RunPlan, workload, out: Path, methods, settings: Settings, started: float
) -> int:
    from harness.cli.finalize import finalize
    from harness.cli.plan_view import tune_fraction

    out.mkdir(parents=True, exist_ok=True)
    requests = workload.requests
    if args.concurrency:
        loads, sweep = sorted(set(args.concurrency)), False
    else:
        loads = [2**i for i in range(args.max_load.bit_length()) if 2**i <= args.max_load]
        sweep = True
    worst = worst_case(loads, methods, settings, args.verify_rounds)
    plan_lines: list[str] = []

    def say(line: str) -> None:
        plan_lines.append(line)
        print(f"[harness] tune: {line}", file=sys.stderr, flush=True)

    budget = TimeBudget(
        args.budget_min * 60, settings, args.verify_rounds,
        lambda load: max(MIN_REQUESTS, PER_LOAD * load), t0=started, say=say,
    )  # fmt: skip
    plan_lines.append(worst.line(loads, methods, budget.budget_s, args.verify_rounds))
    bench = Bench(plan, requests, out, args.quiet, worst.engines, budget)
    arms = [_engine_config(plan, _spec_config(plan, m, max(ks))) for m, ks in methods.items()]
    bench.fraction = tune_fraction(plan, [_engine_config(plan, None), *arms], worst.engines)
    note: list[str] = []
    try:
        if sweep:
            note.append(
                f"loads: 1, 2, 4, ... up to --max-load {args.max_load}, stopping where the "
                f"baseline's tokens/s (its search rounds) gained < "
                f"{settings.saturation_gain - 1:.0%} over the previous load"
            )
        note.append(
            f"each run: max({MIN_REQUESTS}, {PER_LOAD} x load) requests, a new slice of the "
            f"{len(requests)}-prompt workload every round (all arms of a round the same slice)"
        )
        print(f"[harness] tune: {plan_lines[0]}", file=sys.stderr, flush=True)

        def said(r: LoadResult) -> None:
            print(f"[harness] tune: load {r.load}: {r.verdict} ({r.rounds} rounds, "
                  f"{budget.elapsed:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
            live = [c.arm for c in r.candidates if c.rounds]
            later = [lo for lo in loads if lo > r.load and not r.note]
            plan_lines.append(budget.line(r.load, live, later))
            print(f"[harness] tune: {plan_lines[-1]}", file=sys.stderr, flush=True)
            if r.note:
                print(f"[harness] tune: {r.note}", file=sys.stderr, flush=True)

        results = await tune(loads, methods, bench, settings, said, sweep, budget)
        loads = [r.load for r in results]
        note += [r.note for r in results if r.note]
        method_cfgs = {m: bench.configs.get(Arm(m, max(ks))) or {} for m, ks in methods.items()}
        bench.phase = "verify"
        got = await answer(results, list(methods), method_cfgs, bench, settings,
                           args.verify_rounds, budget, bench.add, lambda a: a in bench.lanes,
                           check=not args.no_verify)  # fmt: skip
        note += got.notes
        chosen, config, schedule = got.picks, got.config, got.schedule
        verification = got.verification
    finally:
        await bench.close()
    if config is not None:
        (out / "speculative_config.json").write_text(json.dumps(config, indent=1) + "\n")
    elapsed = budget.elapsed  # the tune's wall time so far: what the budget counts
    md = markdown(results, config, schedule, verification, note, elapsed, out, chosen)
    (out / "tune.md").write_text(md)
    (out / "tune.json").write_text(
        json.dumps(
            {
                "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                "provenance": provenance(args.model, args.argv),
                "loads": loads,
                "settings": settings.__dict__,
                "plan": plan_lines,
                "budget": {
                    "budget_s": budget.budget_s,
                    "covers": "the tune's wall time from the tune command's start: engine starts, "
                    "search, verification, closing engines, files",
                    "margin_s": budget.margin_s,
                    "wall_s_before_files": budget.elapsed,
                },
                "emit_rule": RULE,
                "engines_started": len(bench.lanes),
                "runs": {k: len(v) for k, v in bench.runs.items()},
                "speculative_config": config,
                "schedule": describe(schedule) if schedule else None,
                "search": to_json(results, chosen),
                "verification": verification.to_json() if verification else None,
                "corrections": [c.to_json() for c in verification.corrections]
                if verification
                else [],
                "fallback": verification.to_json()["fallback"] if verification else None,
                "notes": note,
                "elapsed_s": elapsed,
            },
            indent=1,
        )
    )
    for phase in ("search", "verify"):
        if bench.runs[phase]:
            sub = replace(plan, concurrency=tuple(loads), modes=("throughput",))
            (out / phase).mkdir(exist_ok=True)
            finalize(
                out / phase, replace(sub, goodput=None, plots=False), workload, bench.runs[phase],
                "complete", design=bench.session.design_record(sorted({r.cell.label for r in bench.runs[phase]})),
            )  # fmt: skip
    print(md)
    print(f"[harness] tune: {out / 'tune.md'}  config: {out / 'speculative_config.json'}",
          file=sys.stderr)  # fmt: skip
    return 0 if verification is None or verification.passed else 1

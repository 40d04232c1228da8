"""`python -m harness tune`: the best speculative configuration per load on vLLM, emitted as a
``speculative_config`` file, then verified against the best fixed K and the baseline.

The flags of a normal run choose the workload, model and engine; the search (harness/tune.py)
gets a measurement callback that runs the workload once per arm through the harness's own
session (runner, clock, counters, journal), one engine per arm, kept warm across loads.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import math
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from engines.base import EngineConfig, EngineError, engine_class
from harness.design import INTERLEAVED, Slot
from harness.flags import build_parser
from harness.load import Concurrent
from harness.options import UsageError, positive_int
from harness.plan import PlanError, Point, RunPlan
from harness.results import Run
from harness.schedule import Pick, build_config, describe, fixed_config
from harness.tune import (
    BASELINE,
    Arm,
    LoadResult,
    Sample,
    Settings,
    Verification,
    saturation_loads,
    tune,
    verify,
)
from harness.tune_report import fmt, markdown, to_json

ENGINES = ("vllm", "vllm-server")
DEFAULT_KS = (1, 2, 3, 4, 6)
MIN_REQUESTS, PER_LOAD = 8, 2  # requests per run: max(8, 2 x load), so batches stay full


def round_requests(requests: Sequence[Any], load: int, rnd: int) -> list[Any]:
    """The requests of one round at one load: max(8, 2 x load) of the workload, starting where
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


def parser() -> argparse.ArgumentParser:
    p = build_parser()
    p.prog = "python -m harness tune"
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
        "--max-load", type=positive_int, default=32,
        help="without --concurrency: the doubling sweep 1, 2, 4, ... stops here at the latest "
        "(else where the baseline's tokens/s gains < 10%% per doubling); default 32",
    )  # fmt: skip
    t.add_argument(
        "--max-rounds", type=positive_int, default=6,
        help="rounds per load before the search stops undecided (default 6)",
    )  # fmt: skip
    t.add_argument(
        "--verify-rounds", type=positive_int, default=4,
        help="interleaved rounds per load of schedule vs fixed K vs baseline (default 4)",
    )  # fmt: skip
    t.add_argument("--no-verify", action="store_true", help="emit without verifying")
    return p


def main(argv: Sequence[str]) -> int:
    from harness.plan_flags import build_plan, model_names, resolve_models
    from harness.preflight import engine_methods, output_dir
    from workloads import WorkloadError, load_workload

    args = parser().parse_args(list(argv))
    args.mode, args.quiet = "throughput", args.quiet
    try:
        engines = [e.strip() for e in args.engine.split(",") if e.strip()]
        if len(engines) != 1 or engines[0] not in ENGINES:
            raise UsageError(f"tune: --engine must be one of {', '.join(ENGINES)}")
        if args.request_rate:
            raise UsageError("tune: loads are concurrencies (--concurrency), not --request-rate")
        workload = load_workload(
            args.workload, fmt=args.workload_format, num_prompts=args.num_prompts,
            seed=args.seed, turn=args.turn,
        )  # fmt: skip
        args.spec = args.spec or "all"
        plan = build_plan(args, *model_names(args))  # every flag checked before models load
        out = output_dir(args)
        plan = resolve_models(plan)
        methods = [m for m in plan.spec_methods if m in engine_methods(plan)[engines[0]]]
        if not methods:
            raise UsageError(f"tune: no speculative method applies to {engines[0]}")
        ks = tuple(sorted(set(args.tune_k)))
        configs = {m: _spec_config(plan, m, max(ks)) for m in methods}
        methods = [m for m in methods if configs[m] is not None]
        for m in methods:
            engine_class(engines[0]).validate(_engine_config(plan, configs[m]))
    except (UsageError, PlanError, EngineError, WorkloadError) as exc:
        raise UsageError(str(exc)) from None
    settings = Settings(tolerance=args.min_effect, max_rounds=args.max_rounds, seed=args.seed)
    return asyncio.run(_run(args, plan, workload, out, {m: ks for m in methods}, settings))


def _spec_config(plan: RunPlan, method: str, k: int) -> dict[str, Any] | None:
    """The speculative_config a normal run builds for (method, K): draft paths, n-gram sizes."""
    one = replace(plan, spec_config=None, spec_methods=(method,), num_spec_tokens=(k,))
    got = one.spec_configs((method,))
    return dict(got[0][1]) if got else None


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
        self, plan: RunPlan, requests: Sequence[Any], out: Path, quiet: bool, share: int = 1
    ):
        from harness.session import Session

        self.plan, self.out, self.requests = plan, out, list(requests)
        self.session = Session(plan, requests, journal=None, progress=not quiet)
        self.session._t0 = self.session.clock()
        self.share = share  # engines alive at once, at most (a GPU's memory is split by it)
        self.lanes: dict[Arm, Any] = {}
        self.configs: dict[Arm, dict[str, Any] | None] = {BASELINE: None}
        self.warm: set[tuple[Arm, int]] = set()
        self.phase = "search"
        self.runs: dict[str, list[Run]] = {"probe": [], "search": [], "verify": []}

    def add(self, arm: Arm, spec: Mapping[str, Any] | None) -> None:
        self.configs[arm] = None if spec is None else dict(spec)

    async def _lane(self, arm: Arm) -> Any:
        from harness.session import Lane

        if arm not in self.lanes:
            if arm not in self.configs:
                self.add(arm, _spec_config(self.plan, str(arm.method), arm.k))
            config = _engine_config(self.plan, self.configs[arm])
            if engine_class(config.engine).capabilities.managed:  # its log beside the results
                log = self.out / f"{config.engine}-{arm.label}.log"
                config = replace(config, options={**config.options, "log_path": str(log)})
            lane = Lane(arm.label, config).with_share(self.share)
            before = len(self.session.runs)
            await self.session._start(lane)
            if lane.engine is None:  # said even with --quiet: the tables will show n/a
                new = self.session.runs[before:]
                why = new[0].status if new else "engine did not start"
                print(f"[harness] tune: {arm.label}: {why}", file=sys.stderr, flush=True)
            self.lanes[arm] = lane
        return self.lanes[arm]

    async def __call__(self, load: int, arms: Sequence[Arm], rnd: int) -> dict[Arm, Sample]:
        out: dict[Arm, Sample] = {}
        point = Point("throughput", Concurrent(load), self.plan.max_new_tokens[0])
        phase = "probe" if rnd < 0 else self.phase
        reqs = round_requests(self.requests, load, rnd)
        if not self.plan.lengths_from_workload:  # an explicit --max-new-tokens wins
            reqs = [replace(r, max_new_tokens=None) for r in reqs]
        self.session.requests = reqs
        for position, arm in enumerate(arms):
            lane = await self._lane(arm)
            if lane.engine is None:
                continue  # did not start: the session recorded why
            cell = self.plan.cell(lane.config.engine, arm.label, point, max(rnd, 0))
            first = (arm, load) not in self.warm
            self.warm.add((arm, load))
            # the round is the block (pairing unit); point = the load's place in the sweep
            slot = Slot(INTERLEAVED, load, max(rnd, 0), position, self.session._seq)
            self.session._seq += 1
            run = await self.session._run_point(lane, cell, point, first, slot)
            self.runs[phase].append(run)
            sample = _sample(run)
            if sample is not None:
                out[arm] = sample
        return out

    async def close(self) -> None:
        for lane in self.lanes.values():
            if lane.engine is not None:
                with contextlib.suppress(Exception):
                    await lane.engine.close()
                lane.engine = None


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


def picks(results: Sequence[LoadResult]) -> list[Pick]:
    """Per load: the chosen arm where it was shown to pay (its CI against the baseline above 1),
    else speculation off; and for each method its best K that was shown to pay there (none:
    off): what a one-method schedule can use at that load."""
    out = []
    for r in results:
        by_method: dict[str, tuple[int, float | None]] = {}
        for c in r.candidates:
            m, v = c.arm.method, c.vs_baseline
            if m is None or v is None or v.estimate is None or c.status == "pruned":
                continue
            pays = v.verdict == "faster"
            if pays and v.estimate > (by_method.get(m, (0, 0.0))[1] or 0.0):
                by_method[m] = (c.arm.k, v.estimate)
        chosen = r.candidate(r.chosen)
        v = chosen.vs_baseline if chosen else None
        if r.chosen.method is None or v is None or v.verdict != "faster":
            out.append(Pick(r.load, None, 0, 1.0, by_method))  # on only where shown to pay
        else:
            out.append(Pick(r.load, r.chosen.method, r.chosen.k, v.estimate, by_method))
    return out


def best_fixed_k(results: Sequence[LoadResult], method: str) -> int:
    """The single K of ``method`` with the best summed log speedup over the loads (measured
    where it raced, else predicted)."""
    score: dict[int, float] = {}
    for r in results:
        for c in r.candidates:
            if c.arm.method != method:
                continue
            v = c.vs_baseline
            s = v.estimate if v is not None and v.estimate and c.status != "pruned" else None
            s = s or c.predicted
            if s and s > 0:
                score[c.arm.k] = score.get(c.arm.k, 0.0) + math.log(s)
    return max(sorted(score), key=lambda k: score[k]) if score else 1


async def _run(args, plan: RunPlan, workload, out: Path, methods, settings: Settings) -> int:
    from harness.finalize import finalize

    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    requests = workload.requests
    share = 3 + len(methods) * (settings.keep_per_method + 1)
    bench = Bench(plan, requests, out, args.quiet, share)
    note: list[str] = []
    try:
        if args.concurrency:
            loads = sorted(set(args.concurrency))
        else:
            loads = await saturation_loads(bench, args.max_load)
            note.append(
                f"loads: the baseline's tokens/s at 1, 2, 4, ... in flight (one run each) "
                f"gained < 10% per doubling from {loads[-1]} (or --max-load {args.max_load})"
            )
        note.append(
            f"each run: max({MIN_REQUESTS}, {PER_LOAD} x load) requests, a new slice of the "
            f"{len(requests)}-prompt workload every round (all arms of a round the same slice)"
        )

        def said(r: LoadResult) -> None:
            print(f"[harness] tune: load {r.load}: {r.verdict} ({r.rounds} rounds, "
                  f"{time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip

        print(f"[harness] tune: loads {loads}", file=sys.stderr, flush=True)
        results = await tune(loads, methods, bench, settings, said)
        method_cfgs = {m: bench.configs.get(Arm(m, max(ks))) or {} for m, ks in methods.items()}
        chosen = picks(results)
        for r, p in zip(results, chosen):
            if r.chosen.method is not None and p.method is None:
                c = r.candidate(r.chosen)
                note.append(
                    f"load {r.load}: {r.chosen.label} led but was not shown to pay "
                    f"({fmt(c.vs_baseline if c else None)} vs the baseline): speculation off there"
                )
        config, schedule, notes = build_config(chosen, method_cfgs)
        note += notes
        verification: Verification | None = None
        if config is not None and not args.no_verify:
            bench.phase = "verify"
            k = best_fixed_k(results, config["method"])
            sched = Arm(config["method"], config["num_speculative_tokens"], schedule)
            fixed = Arm(config["method"], k)
            bench.add(sched, config)
            bench.add(fixed, fixed_config(config, k))
            verification = await verify(
                loads, [BASELINE, sched, fixed], bench, args.verify_rounds, settings
            )
    finally:
        await bench.close()
    if config is not None:
        (out / "speculative_config.json").write_text(json.dumps(config, indent=1) + "\n")
    elapsed = time.monotonic() - t0
    md = markdown(results, config, schedule, verification, note, elapsed, out)
    (out / "tune.md").write_text(md)
    (out / "tune.json").write_text(
        json.dumps(
            {
                "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                "loads": loads,
                "settings": settings.__dict__,
                "speculative_config": config,
                "schedule": describe(schedule) if schedule else None,
                "search": to_json(results),
                "verification": verification.to_json() if verification else None,
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

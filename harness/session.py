"""Executes a plan: one engine per configuration, every point of the plan through the runner,
records journalled as they finish."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from engines.base import (
    Engine,
    EngineConfig,
    EngineError,
    GenParams,
    Request,
    SpecCounters,
    UnsupportedError,
)
from harness.analysis import precise_enough
from harness.design import (
    INTERLEAVED,
    SEQUENTIAL,
    Slot,
    build_order,
    design_record,
    lane_order,
    warmup_requests,
)
from harness.journal import Journal
from harness.plan import Point, RunPlan
from harness.records import RequestRecord
from harness.results import Cell, Run
from harness.runner import Runner, error_line


def unsupported_method(config: EngineConfig) -> str | None:
    """ "unsupported (...)" when the engine cannot run the config's speculative method at all
    (the plan keeps such variants so that the table says so), else None."""
    from engines.base import engine_class

    method = config.spec_method
    if method is None or method in engine_class(config.engine).spec_methods:
        return None
    return f"unsupported ({config.engine} has no {method})"


@dataclass
class StopFlag:
    """Set by a signal or by --max-error-rate: stop sending, keep what finished."""

    reason: str | None = None

    def set(self, reason: str) -> None:
        self.reason = self.reason or reason

    def __bool__(self) -> bool:
        return self.reason is not None


@dataclass(eq=False)
class Lane:
    """One engine configuration and, while it runs, its started engine."""

    label: str
    config: EngineConfig
    engine: Engine | None = None
    info: dict[str, Any] = field(default_factory=dict)
    clients: Any = None  # harness.client_workers.ClientPool under --client-workers N > 1

    def with_share(self, n: int) -> Lane:
        """The lane told that ``n`` engines share the process and device (memory budgets)."""
        return Lane(self.label, replace(self.config, share=n))

    @property
    def coexist(self) -> bool:
        from engines.base import engine_class

        return engine_class(self.config.engine).capabilities.coexist


@dataclass
class Session:
    plan: RunPlan
    requests: Sequence[Request]
    journal: Journal | None = None
    done: set[str] = field(default_factory=set)  # keys of finished runs (--resume)
    progress: bool = True
    clock: Callable[[], float] = time.perf_counter
    stop: StopFlag = field(default_factory=StopFlag)
    runs: list[Run] = field(default_factory=list)
    engine_factory: Callable[[EngineConfig], Engine] | None = None
    design: str = INTERLEAVED  # what execute() chose (harness.design)
    built: list[str] = field(default_factory=list)  # engine/label in the order engines were built
    _t0: float = 0.0
    _seq: int = 0  # runs so far
    _blocks: int = 0  # blocks (one repeat of every lane) so far: the rotation

    def __post_init__(self) -> None:
        if not self.plan.lengths_from_workload:  # an explicit --max-new-tokens wins
            self.requests = [replace(r, max_new_tokens=None) for r in self.requests]

    async def execute(self, configs: Sequence[tuple[str, EngineConfig]]) -> list[Run]:
        """Run every configuration. When every engine can live in one process (``coexist``),
        all lanes are started and their runs interleaved in a rotated order (see
        :mod:`harness.design`), so that drift of the machine hits every variant alike; else (or
        with ``interleave=False``) one configuration runs after the other."""
        self._t0 = self.clock()
        lanes = [Lane(label, config) for label, config in configs]
        if self.plan.interleave and len(lanes) > 1 and all(lane.coexist for lane in lanes):
            self.design = INTERLEAVED
            lanes = [lane.with_share(len(lanes)) for lane in lanes]
            await self._run_lanes(lanes)
        else:
            self.design = SEQUENTIAL if len(lanes) > 1 else INTERLEAVED
            for lane in lanes:
                if self.stop:
                    break
                await self._run_lanes([lane])
        return self.runs

    def design_record(self, labels: Sequence[str]) -> dict[str, Any]:
        return design_record(
            self.design, self.plan.seed, self.plan.prefix_cache, labels, self.built
        )

    def _todo(self, lane: Lane) -> list[Point]:
        def done(p: Point) -> bool:
            return all(
                self.plan.cell(lane.config.engine, lane.label, p, r).key in self.done
                for r in range(self.plan.repeats)
            )

        return [p for p in self.plan.points() if not done(p)]

    async def _run_lanes(self, lanes: list[Lane]) -> None:
        lanes = [lane for lane in lanes if self._todo(lane)]
        try:
            for i in build_order(len(lanes), self.plan.seed):  # seeded, recorded (design.py)
                self.built.append(f"{lanes[i].config.engine}/{lanes[i].label}")
                await self._start(lanes[i])
            live = [lane for lane in lanes if lane.engine is not None]
            for index, p in enumerate(self.plan.points()):
                if self.stop or not live:
                    break
                await self._repeat_point([lane for lane in live if p in self._todo(lane)], p, index)
        finally:
            for lane in lanes:
                if lane.clients is not None:
                    with contextlib.suppress(Exception):
                        await lane.clients.close()
                    lane.clients = None
                if lane.engine is not None:
                    with contextlib.suppress(Exception):
                        await lane.engine.close()
                    lane.engine = None

    async def _start(self, lane: Lane) -> None:
        from engines.base import create_engine

        config = lane.config
        missing = unsupported_method(config)
        if missing:
            for p in self._todo(lane):
                cell = self.plan.cell(config.engine, lane.label, p, 0)
                self._finish(Run(cell, config.spec_config, (), status=missing), missing)
            return
        engine = (self.engine_factory or create_engine)(config)
        self._say(f"starting {config.engine} [{lane.label}]")
        try:
            await engine.start()
            if self.plan.client_workers > 1:
                from harness.client_workers import ClientPool

                lane.clients = await ClientPool.start(engine, self.plan.client_workers, self.clock)
        except Exception as exc:
            status = f"failed: engine did not start: {error_line(exc)}"
            self._say(status)
            for p in self._todo(lane):
                cell = self.plan.cell(config.engine, lane.label, p, 0)
                self._finish(Run(cell, config.spec_config, (), status=status), status)
            with contextlib.suppress(Exception):
                await engine.close()
            return
        lane.engine = engine
        lane.info = dict(engine.describe())
        if lane.clients is not None:
            lane.info["client_workers"] = lane.clients.describe()
        if config.spec_config is not None:
            with contextlib.suppress(Exception):
                costs = await asyncio.to_thread(engine.step_costs)
                if costs is not None:
                    lane.info["step_costs"] = costs

    async def _repeat_point(self, lanes: list[Lane], p: Point, index: int) -> None:
        """Repeats of one point, every lane once per repeat in the design's rotated order:
        --repeats, then more (up to --max-repeats) until the CI of every deciding comparison at
        this point is under --target-ci (analysis.precise_enough)."""
        warm: set[int] = set()
        active = list(lanes)
        repeat = 0
        while active and not self.stop:
            order = [lanes[k] for k in lane_order(len(lanes), self._blocks, self.plan.seed)]
            self._blocks += 1
            position = 0
            for lane in order:
                if self.stop:
                    break
                if lane not in active:
                    continue
                cell = self.plan.cell(lane.config.engine, lane.label, p, repeat)
                if cell.key in self.done:
                    continue
                slot = Slot(self.design, index, repeat, position, self._seq)
                self._seq += 1
                position += 1
                run = await self._run_point(lane, cell, p, id(lane) not in warm, slot)
                warm.add(id(lane))
                if run.status != "ok":
                    active.remove(lane)
            repeat += 1
            if repeat >= self.plan.max_repeats:
                break
            if repeat >= self.plan.repeats:
                target = self.plan.target_ci
                group = self.plan.cell(lanes[0].config.engine, lanes[0].label, p, 0).group
                here = [r for r in self.runs if r.cell.group == group]
                if target is None or precise_enough(here, target):
                    break

    async def _reset_cache(self, engine: Engine) -> str:
        """Apply the prefix-cache policy before a measured run; say what was done."""
        if self.plan.prefix_cache != "reset":
            return self.plan.prefix_cache
        try:
            return str(await engine.reset_prefix_cache())
        except Exception as exc:  # noqa: BLE001 - recorded with the run; the run still counts
            return f"reset failed: {error_line(exc)}"

    async def _run_point(self, lane: Lane, cell: Cell, p: Point, warmup: bool, slot: Slot) -> Run:
        engine, config, info = lane.engine, lane.config, lane.info
        assert engine is not None
        params = GenParams(
            max_new_tokens=p.max_new_tokens,
            temperature=self.plan.temperature,
            ignore_eos=self.plan.ignore_eos,
            seed=self.plan.seed,
        )
        records: list[RequestRecord] = []
        t0 = self.clock()
        if self.journal:
            head = Run(cell, config.spec_config, (), engine_info=info, schedule=slot).to_json({})
            self.journal.write("run", {"key": cell.key, "run": head})

        requests = self.plan.point_requests(p, self.requests)
        bar = self._bar(cell.name, None if self.plan.duration else len(requests))

        def on_record(rec: RequestRecord) -> None:
            records.append(rec)
            if self.journal:
                self.journal.write("record", {"key": cell.key, "record": rec.to_json(t0)})
            if bar is not None and not rec.warmup:
                bar.update(1)
            counted = [r for r in records if not r.warmup]
            if self.plan.max_error_rate is not None and len(counted) >= 5:
                rate = sum(not r.ok for r in counted) / len(counted)
                if rate > self.plan.max_error_rate:
                    self.stop.set(
                        f"error rate {rate:.0%} > --max-error-rate {self.plan.max_error_rate:.0%}"
                    )

        runner = Runner(
            engine,
            clock=self.clock,
            on_record=on_record,
            should_stop=lambda: bool(self.stop),
            clients=lane.clients,
        )
        status, spec_metrics, extra = "ok", None, {}
        try:
            if warmup and self.plan.warmup:  # unmeasured prompts: they warm no measured prompt
                warm = warmup_requests(self.requests, self.plan.warmup)
                await runner.run(warm, params, p.strategy, warmup=True)
            slot = replace(slot, cache=await self._reset_cache(engine))
            slot = replace(slot, t_start_s=self.clock() - self._t0)
            before, cache_before = await _counters(engine), _cache_counters(engine)
            sampler = _LoadSampler(engine, self.plan.sample_load_s)
            async with sampler:
                await runner.run(requests, params, p.strategy, duration=self.plan.duration)
            after, cache_after = await _counters(engine), _cache_counters(engine)
            if before is not None and after is not None:
                spec_metrics = (after - before).to_metrics()
            extra = sampler.summary()
            if cache_before is not None and cache_after is not None:
                extra["prefix_cache"] = {k: cache_after[k] - cache_before[k] for k in cache_after}
        except UnsupportedError as exc:
            status = str(exc)
        except EngineError as exc:
            status = f"failed: {error_line(exc)}"
        except asyncio.CancelledError:
            status = "interrupted"
        finally:
            if bar is not None:
                bar.close()
        if self.stop and status == "ok":
            status = f"stopped: {self.stop.reason}"
        slot = replace(slot, t_end_s=self.clock() - self._t0)
        run = Run(
            cell, config.spec_config, tuple(records), t0, spec_metrics, info, status, extra, slot
        )
        self._finish(run, status)
        return run

    def _finish(self, run: Run, status: str) -> None:
        self.runs.append(run)
        if self.journal:
            self.journal.write(
                "end",
                {
                    "key": run.cell.key,
                    "status": status,
                    "spec_metrics": run.spec_metrics,
                    "extra": dict(run.extra),
                    "schedule": None if run.schedule is None else run.schedule.to_json(),
                },
            )

    def _bar(self, desc: str, total: int | None) -> Any:
        if not self.progress:
            return None
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True)

    def _say(self, msg: str) -> None:
        if self.progress:
            print(f"[harness] {msg}", file=sys.stderr, flush=True)


async def _counters(engine: Engine) -> SpecCounters | None:
    await engine.refresh_metrics()
    return engine.spec_counters()


def _cache_counters(engine: Engine) -> dict[str, int] | None:
    """The engine's cumulative prefix-cache queries/hits (tokens), where it counts them."""
    return engine.prefix_cache_counters()


class _LoadSampler:
    """Samples the server's own running/waiting gauges during a run (HTTP engines), only when
    asked: each scrape makes the server render its /metrics page (vLLM: the whole Prometheus
    text) while it is being measured. Counters are read at the run's start and end anyway."""

    def __init__(self, engine: Engine, every: float | None = None):
        self.sample = engine.sample_load if engine.capabilities.load_gauges else None
        self.every = every
        self.samples: list[dict[str, float]] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> _LoadSampler:
        if self.sample is not None and self.every:
            self._task = asyncio.ensure_future(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _loop(self) -> None:
        assert self.sample is not None and self.every
        while True:
            with contextlib.suppress(Exception):
                s = await self.sample()
                if s:
                    self.samples.append(s)
            await asyncio.sleep(self.every)

    def summary(self) -> dict[str, Any]:
        """``{"server_load": {"sample_interval_s": None}}`` when not sampled (engines that could)."""
        if self.sample is None:
            return {}
        out: dict[str, Any] = {"sample_interval_s": self.every, "samples": len(self.samples)}
        for k in self.samples[0] if self.samples else ():
            xs = [s[k] for s in self.samples if s.get(k) is not None]
            if xs:
                out[f"server_{k}_peak"] = max(xs)
                out[f"server_{k}_mean"] = sum(xs) / len(xs)
        return {"server_load": out}

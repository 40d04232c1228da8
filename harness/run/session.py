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

from engines.base import Engine, EngineConfig, EngineError, GenParams, Request, UnsupportedError
from harness.core.columns import RecordColumns
from harness.core.design import (
    INTERLEAVED,
    ONE,
    PER_BLOCK,
    SEQUENTIAL,
    Slot,
    build_order,
    design_record,
    warmup_cap,
    warmup_requests,
)
from harness.core.records import RequestRecord
from harness.core.results import Cell, Run
from harness.run.blocks import BlockSchedule
from harness.run.clients.ray_actors import start_pool
from harness.run.conversations import sender
from harness.run.counters import RunCounters
from harness.run.energy import EnergyMeter, Reading, energy_meter
from harness.run.journal import Journal
from harness.run.lanes import (
    Lane,
    StopFlag,
    close_lanes,
    measured,
    progress_bar,
    reset_cache,
    unsupported_method,
)
from harness.run.plan import Point, RunPlan
from harness.run.runner import Runner, error_line
from harness.run.saturation import monitor_for
from harness.run.stopping import Stopper, stopper_for


@dataclass
class Session:
    """A plan's lanes started, run and closed, every run journalled; the order of the runs is
    its :class:`harness.run.blocks.BlockSchedule`'s (``schedule``)."""

    plan: RunPlan
    requests: Sequence[Request]
    journal: Journal | None = None
    done: set[str] = field(default_factory=set)  # keys of finished runs (--resume)
    progress: bool = True
    clock: Callable[[], float] = time.perf_counter
    stop: StopFlag = field(default_factory=StopFlag)
    runs: list[Run] = field(default_factory=list)
    engine_factory: Callable[[EngineConfig], Engine] | None = None
    design: str = INTERLEAVED  # what execute() chose (harness.core.design)
    built: list[list[str]] = field(default_factory=list)  # per block: engine/label, build order
    instances: dict[str, str] = field(default_factory=dict)  # engine/label -> PER_BLOCK | ONE
    rss_after_block_mb: list[float | None] = field(default_factory=list)  # per-block instances
    heap_trimmed_mb: list[float | None] = field(default_factory=list)  # returned after each block
    _t0: float = 0.0
    _seq: int = 0  # runs so far
    stopper: Stopper | None = None  # the sequential design's stops (harness.run.stopping)
    # each measured run's energy (NVML, RAPL; harness.run.energy), None where nothing reads it
    energy: EnergyMeter | None = field(default_factory=energy_meter)
    schedule: BlockSchedule = field(init=False)  # which run goes in which block

    def __post_init__(self) -> None:
        self._t0 = self.clock()  # the schedule's times count from here (execute() restarts it)
        self.schedule = BlockSchedule(self.plan, self)

    def elapsed(self) -> float:
        """Seconds on the session's clock since execute() began."""
        return self.clock() - self._t0

    def runs_of(self, p: Point, before: float = float("inf")) -> list[Run]:
        """The point's runs, any lane, of blocks before ``before`` (a --resume holds later ones)."""
        group = self.plan.cell("", "", p, 0).group
        return [r for r in self.runs if r.cell.group == group and r.cell.repeat < before]

    def built_in(self, block: int) -> list[str]:
        """The engines built in ``block`` so far (engine/label, in build order; recorded)."""
        while len(self.built) <= block:
            self.built.append([])
        return self.built[block]

    async def execute(self, configs: Sequence[tuple[str, EngineConfig]]) -> list[Run]:
        """Run every configuration. When every engine can live in one process (``coexist``),
        all lanes are started and their runs interleaved in a rotated order (see
        :mod:`harness.core.design`), so that drift of the machine hits every variant alike; else (or
        with ``interleave=False``) one configuration runs after the other."""
        self._t0 = self.clock()
        lanes = [Lane(label, config) for label, config in configs]
        if self.plan.interleave and len(lanes) > 1 and all(lane.coexist for lane in lanes):
            self.design = INTERLEAVED
            self.stopper = stopper_for(self.plan)
            lanes = [lane.with_share(len(lanes)) for lane in lanes]
            await self._run_lanes(lanes)
        else:
            self.design = SEQUENTIAL if len(lanes) > 1 else INTERLEAVED
            for lane in lanes:
                if self.stop:
                    break
                await self._run_lanes([lane])
        return self.runs

    async def run_cell(
        self, lane: Lane, cell: Cell, p: Point, warmup: bool, index: int, block: int, position: int
    ) -> Run:
        """One run of a started lane (execute()'s, harness tune's): ``p``'s requests, numbered next
        in the schedule at (point ``index``, ``block``, ``position``), after --warmup if ``warmup``."""
        self._seq += 1
        slot = Slot(self.design, index, block, position, self._seq - 1)
        return await self._run_point(lane, cell, p, warmup, slot)

    def design_record(self, labels: Sequence[str]) -> dict[str, Any]:
        caps = {k: warmup_cap(self.plan.warmup_tokens, v) for k, v in self.instances.items()}
        record = design_record(
            self.design, self.plan.seed, self.plan.prefix_cache, labels, self.built,
            self.instances, caps if self.plan.warmup else None,
        )  # fmt: skip
        if self.rss_after_block_mb:  # a leak from rebuilding engines would show here
            record["rss_after_block_mb"] = list(self.rss_after_block_mb)
            record["heap_trimmed_mb"] = list(self.heap_trimmed_mb)  # engines/common/heap.py
        return record

    def _todo(self, lane: Lane) -> list[Point]:
        """The points with cells of this lane left (--resume: not journaled as finished); under
        the sequential design blocks to the cap, unless the journaled ones decided the point."""
        n, stopper = self.plan.max_repeats if self.stopper else self.plan.repeats, self.stopper

        def done(p: Point) -> bool:
            keys = {self.plan.cell(lane.config.engine, lane.label, p, r).key for r in range(n)}
            return keys <= self.done or (stopper is not None and stopper.settled(self.runs_of(p)))

        return [p for p in self.plan.points() if not done(p)]

    async def _run_lanes(self, lanes: list[Lane]) -> None:
        per_block = all(lane.instances(self.plan.instances) == PER_BLOCK for lane in lanes)
        for lane in lanes:
            self.instances[lane.name] = PER_BLOCK if per_block else ONE
        lanes = await self._drop_unsupported(lanes)
        if per_block:
            await self.schedule.run_blocks(lanes)
            return
        lanes = [lane for lane in lanes if self._todo(lane)]
        built = self.built_in(0)
        try:
            for i in build_order(len(lanes), self.plan.seed):  # seeded, recorded (core/design.py)
                await self.start_lane(lanes[i])
                if lanes[i].engine is not None:  # the record lists only engines built
                    built.append(lanes[i].name)
            live = [lane for lane in lanes if lane.engine is not None]
            for index, p in enumerate(self.plan.points()):
                if self.stop or not live:
                    break
                here = [lane for lane in live if p in self._todo(lane)]
                await self.schedule.repeat_point(here, p, index)
        finally:
            await close_lanes(lanes)

    async def _drop_unsupported(self, lanes: list[Lane]) -> list[Lane]:
        """The lanes whose engine runs their method; the others' cells are recorded once (repeat
        0 of each point), so the build and run orders balance over the lanes that run."""
        for lane in lanes:
            if unsupported_method(lane.config) and self._todo(lane):
                await self.start_lane(lane)
        return [lane for lane in lanes if not unsupported_method(lane.config)]

    async def start_lane(self, lane: Lane, cells: Sequence[Cell] | None = None) -> None:
        """Start the lane's engine; if it cannot start, ``cells`` get the reason as status
        (default: repeat 0 of every point it has to run)."""
        from engines.base import create_engine

        config = lane.config
        if cells is None:
            cells = [self.plan.cell(config.engine, lane.label, p, 0) for p in self._todo(lane)]
        missing = unsupported_method(config)
        if missing:
            for cell in cells:
                self._finish(Run(cell, config.spec_config, (), status=missing), missing)
            return
        engine = (self.engine_factory or create_engine)(config)
        self._say(f"starting {config.engine} [{lane.label}]")
        t_build = time.perf_counter()  # wall time of the build (real, not the session clock)
        try:
            await engine.start()
            if self.plan.client_workers > 1 or self.plan.ray_address:
                lane.clients = await start_pool(engine, self.plan, self.clock)
        except BaseException as exc:  # stopped while starting too: no server outlives us
            with contextlib.suppress(Exception):
                await engine.close()
            if not isinstance(exc, Exception):
                raise
            status = f"failed: engine did not start: {error_line(exc)}"
            self._say(status)
            for cell in cells:
                self._finish(Run(cell, config.spec_config, (), status=status), status)
            return
        lane.engine = engine
        lane.info = {**engine.describe(), "start_s": round(time.perf_counter() - t_build, 3)}
        if lane.clients is not None:
            lane.info["client_workers"] = lane.clients.describe()
        if config.spec_config is not None and lane.step_costs is None:  # once per lane
            with contextlib.suppress(Exception):
                lane.step_costs = await asyncio.to_thread(engine.step_costs)
        if lane.step_costs is not None:
            lane.info["step_costs"] = lane.step_costs

    async def _run_point(self, lane: Lane, cell: Cell, p: Point, warmup: bool, slot: Slot) -> Run:
        engine, config, info = lane.engine, lane.config, lane.info
        assert engine is not None
        plan = self.plan  # no length in params: each request carries its own (resolve_lengths)
        params = GenParams(temperature=plan.temperature, ignore_eos=plan.ignore_eos, seed=plan.seed)
        records = RecordColumns()  # columns, not an object per request (issue 38)
        counts = RunCounters()  # the hot path's questions, constant time per record
        t0 = self.clock()
        if self.journal:
            head = Run(cell, config.spec_config, (), engine_info=info, schedule=slot).to_json({})
            self.journal.write("run", {"key": cell.key, "run": head})

        requests = self.plan.point_requests(p, self.requests)
        bar = progress_bar(self.progress, cell.name, None if self.plan.duration else len(requests))
        monitor = monitor_for(self.plan, p.strategy, len(requests), self.clock)  # saturation

        def on_record(rec: RequestRecord) -> None:
            records.append(rec)
            if self.journal:
                self.journal.write("record", {"key": cell.key, "record": rec.to_json(t0)})
            if bar is not None and not rec.warmup:
                bar.update(1)
            if why := counts.add(rec.ok, rec.warmup, self.plan.max_error_rate, rec.error):
                self.stop.set(why)

        runner = Runner(
            engine,
            clock=self.clock,
            on_record=monitor.watching(on_record),  # then the monitor sees each record
            should_stop=lambda: bool(self.stop) or monitor.should_stop(),
            cancel_now=lambda: self.stop.expired,
            clients=lane.clients,
            keep=False,  # records are kept above, as columns
        )
        status, spec_metrics, extra = "ok", None, {}
        try:
            if warmup and self.plan.warmup:  # unmeasured prompts: they warm no measured prompt
                cap = warmup_cap(self.plan.warmup_tokens, self.instances.get(lane.name, ONE))
                own = self.plan.resolve_lengths(p, self.requests)
                warm = warmup_requests(own, self.plan.warmup, cap)
                await runner.run(warm, params, p.strategy, warmup=True)
            slot = replace(slot, cache=await reset_cache(engine, self.plan.prefix_cache))
            slot = replace(slot, t_start_s=self.elapsed())
            send = sender(runner, self.plan.conversations)  # conversations: turn by turn
            spec_metrics, extra = await measured(
                lane,
                self.plan.sample_load_s,
                send(requests, params, p.strategy, duration=self.plan.duration),
                self._energy_reading(engine),
            )
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
        status, extra = monitor.outcome(status, extra)  # "saturated: ..." when it was
        slot = replace(slot, t_end_s=self.elapsed())
        run = Run(cell, config.spec_config, records, t0, spec_metrics, info, status, extra, slot)
        self._finish(run, status)
        return run

    def _energy_reading(self, engine: Engine) -> Reading | None:
        """The run's energy reading, where this machine's devices serve it: none for a remote
        server (``device_memory`` "": its device is elsewhere)."""
        if self.energy is None or not engine.capabilities.device_memory:
            return None
        return self.energy.reading(self.clock)

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

    def _say(self, msg: str) -> None:
        if self.progress:
            print(f"[harness] {msg}", file=sys.stderr, flush=True)

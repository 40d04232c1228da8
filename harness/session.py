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
from harness.plan import Point, RunPlan
from harness.records import RequestRecord
from harness.results import Cell, Journal, Run
from harness.runner import Runner, error_line
from harness.stats import ci_half_width, summarize


@dataclass
class StopFlag:
    """Set by a signal or by --max-error-rate: stop sending, keep what finished."""

    reason: str | None = None

    def set(self, reason: str) -> None:
        self.reason = self.reason or reason

    def __bool__(self) -> bool:
        return self.reason is not None


@dataclass
class Session:
    plan: RunPlan
    requests: Sequence[Request]
    journal: Journal | None = None
    done: set[str] = field(default_factory=set)  # keys of finished runs (--resume)
    progress: bool = True
    max_error_rate: float | None = None
    temperature: float = 0.0
    ignore_eos: bool = False
    clock: Callable[[], float] = time.perf_counter
    stop: StopFlag = field(default_factory=StopFlag)
    runs: list[Run] = field(default_factory=list)
    engine_factory: Callable[[EngineConfig], Engine] | None = None

    def __post_init__(self) -> None:
        if not self.plan.lengths_from_workload:  # an explicit --max-new-tokens wins
            self.requests = [replace(r, max_new_tokens=None) for r in self.requests]

    async def execute(self, configs: Sequence[tuple[str, EngineConfig]]) -> list[Run]:
        for label, config in configs:
            if self.stop:
                break
            points = [p for p in self.plan.points() if not self._point_done(config, label, p)]
            if not points:
                continue
            await self._run_config(label, config, points)
        return self.runs

    def _point_done(self, config: EngineConfig, label: str, point: Point) -> bool:
        return self.plan.cell(config.engine, label, point, 0).key in self.done and all(
            self.plan.cell(config.engine, label, point, r).key in self.done
            for r in range(self.plan.repeats)
        )

    async def _run_config(self, label: str, config: EngineConfig, points: list[Point]) -> None:
        from engines.base import create_engine

        engine = (self.engine_factory or create_engine)(config)
        self._say(f"starting {config.engine} [{label}]")
        try:
            await engine.start()
        except Exception as exc:
            status = f"failed: engine did not start: {error_line(exc)}"
            self._say(status)
            for p in points:
                self._finish(
                    Run(self.plan.cell(config.engine, label, p), config.spec_config, ()), status
                )
            with contextlib.suppress(Exception):
                await engine.close()
            return
        try:
            info = dict(engine.describe())
            costs = getattr(engine, "step_costs", None)
            if costs is not None and config.spec_config is not None:
                with contextlib.suppress(Exception):
                    info["step_costs"] = await asyncio.to_thread(costs)
            for p in points:
                await self._repeat_point(engine, label, config, p, info)
        finally:
            await engine.close()

    async def _repeat_point(
        self, engine: Engine, label: str, config: EngineConfig, p: Point, info: dict
    ) -> None:
        """Repeats of one point: --repeats, then more (up to --max-repeats) until --target-ci."""
        rates: list[float] = []
        repeat = 0
        while not self.stop:
            cell = self.plan.cell(config.engine, label, p, repeat)
            if cell.key not in self.done:
                run = await self._run_point(engine, config, cell, p, info, warmup=not rates)
                tok_s = summarize(run.records).get("output_tok_s")
                if tok_s is not None:
                    rates.append(tok_s)
                if run.status != "ok":
                    break
            repeat += 1
            if repeat >= self.plan.max_repeats:
                break
            if repeat >= self.plan.repeats:
                width = ci_half_width(rates)
                if self.plan.target_ci is None or (
                    width is not None and width <= self.plan.target_ci
                ):
                    break

    async def _run_point(
        self, engine: Engine, config: EngineConfig, cell: Cell, p: Point, info: dict, warmup: bool
    ) -> Run:
        params = GenParams(
            max_new_tokens=p.max_new_tokens,
            temperature=self.temperature,
            ignore_eos=self.ignore_eos,
            seed=self.plan.seed,
        )
        records: list[RequestRecord] = []
        t0 = self.clock()
        if self.journal:
            head = Run(cell, config.spec_config, (), engine_info=info).to_json({})
            self.journal.write("run", {"key": cell.key, "run": head})

        bar = self._bar(cell.key, len(self.requests))

        def on_record(rec: RequestRecord) -> None:
            records.append(rec)
            if self.journal:
                self.journal.write("record", {"key": cell.key, "record": rec.to_json(t0)})
            if bar is not None and not rec.warmup:
                bar.update(1)
            counted = [r for r in records if not r.warmup]
            if self.max_error_rate is not None and len(counted) >= 5:
                rate = sum(not r.ok for r in counted) / len(counted)
                if rate > self.max_error_rate:
                    self.stop.set(
                        f"error rate {rate:.0%} > --max-error-rate {self.max_error_rate:.0%}"
                    )

        runner = Runner(
            engine, clock=self.clock, on_record=on_record, should_stop=lambda: bool(self.stop)
        )
        status, spec_metrics, extra = "ok", None, {}
        try:
            if warmup and self.plan.warmup:
                await runner.run(self.requests[: self.plan.warmup], params, p.strategy, warmup=True)
            before = await _counters(engine)
            sampler = _LoadSampler(engine)
            async with sampler:
                await runner.run(self.requests, params, p.strategy)
            after = await _counters(engine)
            if before is not None and after is not None:
                spec_metrics = (after - before).to_metrics()
            extra = sampler.summary()
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
        run = Run(cell, config.spec_config, tuple(records), t0, spec_metrics, info, status, extra)
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
                },
            )

    def _bar(self, desc: str, total: int) -> Any:
        if not self.progress:
            return None
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True)

    def _say(self, msg: str) -> None:
        if self.progress:
            print(f"[harness] {msg}", file=sys.stderr, flush=True)


async def _counters(engine: Engine) -> Any:
    refresh = getattr(engine, "refresh_metrics", None)
    if refresh is not None:
        await refresh()
    return engine.spec_counters()


class _LoadSampler:
    """Samples the server's own running/waiting gauges during a run (HTTP engines)."""

    def __init__(self, engine: Engine, every: float = 0.5):
        self.sample = getattr(engine, "sample_load", None)
        self.every = every
        self.samples: list[dict[str, float]] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> _LoadSampler:
        if self.sample is not None:
            self._task = asyncio.ensure_future(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                s = await self.sample()
                if s:
                    self.samples.append(s)
            await asyncio.sleep(self.every)

    def summary(self) -> dict[str, Any]:
        if not self.samples:
            return {}
        out: dict[str, Any] = {}
        for k in self.samples[0]:
            xs = [s[k] for s in self.samples if s.get(k) is not None]
            if xs:
                out[f"server_{k}_peak"] = max(xs)
                out[f"server_{k}_mean"] = sum(xs) / len(xs)
        return {"server_load": out}

"""Samples an HTTP server's own running/waiting gauges during a run, when asked."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from engines.base import Engine


class LoadSampler:
    """Samples the server's own running/waiting gauges during a run (HTTP engines), only when
    asked: each scrape makes the server render its /metrics page (vLLM: the whole Prometheus
    text) while it is being measured. Counters are read at the run's start and end anyway."""

    def __init__(self, engine: Engine, every: float | None = None):
        self.sample = engine.sample_load if engine.capabilities.load_gauges else None
        self.every = every
        self.samples: list[dict[str, float]] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LoadSampler:
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

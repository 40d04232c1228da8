"""A fake clock and a scripted engine for timing tests: the runner reads only the injected clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any, ClassVar

from engines.base import Chunk, Engine, EngineConfig, GenParams, Request, SpecCounters


class FakeClock:
    """Virtual time: advances only when the scripted engine or the runner's sleep says so."""

    def __init__(self) -> None:
        self.now = 100.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.0)
        await asyncio.sleep(0)


class ScriptedEngine(Engine):
    """Yields chunks after scripted virtual delays: ``script[id] = [(delay_s, n_tokens), ...]``.

    With ``concurrent=True`` virtual time is shared: each chunk waits on a real event loop turn,
    so many requests progress together while the clock only moves forward.
    """

    name: ClassVar[str] = "scripted"
    spec_methods: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        clock: FakeClock,
        script: dict[str, Sequence[tuple[float, int]]],
        fail: dict[str, str] | None = None,
        max_batch: int | None = None,
        delivery_lag: float | None = None,
    ):
        self.clock = clock
        self.script = script
        self.fail = fail or {}
        self._max_batch = max_batch
        # set: chunks are stamped with the runner's clock when made, then reach the runner this
        # much later (an in-process engine's batched hand-over to the event loop)
        self.delivery_lag = delivery_lag
        self.in_flight = 0
        self.peak = 0
        self.config = EngineConfig(engine="scripted", model="none")

    @classmethod
    def validate(cls, config: EngineConfig) -> None:
        return None

    async def start(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"engine": "scripted"}

    async def stream(
        self, request: Request, params: GenParams, clock: Any = None
    ) -> AsyncIterator[Chunk]:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            next_id = 0
            for i, (delay, n) in enumerate(self.script[request.id]):
                self.clock.now += delay
                await asyncio.sleep(0)
                stamp = None
                if self.delivery_lag is not None:
                    stamp = clock()
                    self.clock.now += self.delivery_lag
                yield Chunk(
                    token_ids=tuple(range(next_id, next_id + n)),
                    prompt_tokens=5 if i == 0 else None,
                    t=stamp,
                )
                next_id += n
            if request.id in self.fail:
                raise ConnectionResetError(self.fail[request.id])
        finally:
            self.in_flight -= 1

    async def close(self) -> None:
        return None

    def spec_counters(self) -> SpecCounters | None:
        return None

    def max_batch(self) -> int | None:
        return self._max_batch

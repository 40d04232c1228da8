"""A fake clock and a scripted engine for timing tests: the runner reads only the injected clock."""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import AsyncIterator, Coroutine, Sequence
from typing import Any, ClassVar, TypeVar

from engines.base import Chunk, Engine, EngineConfig, GenParams, Request, SpecCounters

T = TypeVar("T")


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


class _JumpingSelector(selectors.DefaultSelector):
    """Never waits on a timer: where the loop would sleep ``timeout`` seconds for its next timer,
    it polls once and moves the virtual clock forward by that much instead."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout is None:  # no timer at all: only another thread or a socket can wake it
            return super().select(None)
        events = super().select(0)
        if not events and timeout > 0:
            self.clock.now += timeout
        return events


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time: ``time()`` is ``clock``'s, and whenever no callback is ready
    it jumps to the next timer. Code under test (``asyncio.sleep``, ``call_later``, a runner
    given ``clock=loop.time``) runs unchanged; its timing depends on the awaits alone, never on
    the machine's speed (CPU work takes no virtual time). A thread the loop waits on without a
    timer pending is waited for in real time; with one pending, virtual time runs ahead."""

    def __init__(self, clock: FakeClock | None = None) -> None:
        self.clock = clock or FakeClock()
        super().__init__(_JumpingSelector(self.clock))

    def time(self) -> float:
        return self.clock.now


def run_virtual(main: Coroutine[Any, Any, T], clock: FakeClock | None = None) -> T:
    """``asyncio.run(main)`` on a :class:`VirtualLoop`."""
    loop = VirtualLoop(clock)
    try:
        return loop.run_until_complete(main)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

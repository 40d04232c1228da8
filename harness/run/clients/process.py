"""One client process of ``--client-workers`` (see :mod:`harness.run.clients.workers`): the messages
it exchanges with the parent over one duplex pipe, and its loop: start an ``openai`` engine, then
for each job run the same :class:`harness.run.runner.Runner` over its share of the schedule from the
parent's ``t0``, on the clock the parent names, and send the records back in batches."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

from engines.base import EngineConfig, GenParams, Request
from harness.core.records import RequestRecord
from harness.run.runner import Runner, error_line

# clocks every process on the host reads alike (Linux: clock_gettime(CLOCK_MONOTONIC))
SHARED_CLOCKS: dict[str, Callable[[], float]] = {
    "perf_counter": time.perf_counter,
    "monotonic": time.monotonic,
}
FLUSH_S = 0.05  # a worker sends its finished records at most this often


# ---- the schedule, dealt ---------------------------------------------------------------------
@dataclass(frozen=True)
class Share:
    """Worker ``index``'s part of one schedule: positions in the run's request list, their send
    offsets (seconds after ``t0``) and its cap on requests in flight (None: none)."""

    index: int
    positions: tuple[int, ...]
    offsets: tuple[float, ...]
    cap: int | None


def split(offsets: Sequence[float], cap: int | None, workers: int) -> list[Share]:
    """Deal one schedule to ``workers`` clients (at most ``cap``: each needs a slot). Caps are
    ``cap // n`` plus one for the first ``cap % n``; request j goes to worker (j mod cap) mod n
    (j mod n without a cap), so each worker gets requests in proportion to its slots and every
    request keeps its offset."""
    n = workers if cap is None else max(1, min(workers, cap))
    cycle = n if cap is None else cap
    positions: list[list[int]] = [[] for _ in range(n)]
    for j in range(len(offsets)):
        positions[(j % cycle) % n].append(j)
    caps = [None if cap is None else cap // n + (i < cap % n) for i in range(n)]
    return [
        Share(i, tuple(p), tuple(offsets[j] for j in p), caps[i]) for i, p in enumerate(positions)
    ]


@dataclass(frozen=True)
class _Given:
    """A worker's load strategy: the offsets its parent dealt it, and its share of the cap."""

    given: tuple[float, ...]
    max_concurrency: int | None
    open_loop: bool = False  # the parent's strategy was a schedule: records keep it

    def offsets(self, n: int) -> list[float]:
        return list(self.given[:n])

    def to_json(self) -> dict[str, Any]:
        return {"concurrency": self.max_concurrency, "dealt": len(self.given)}

    @property
    def label(self) -> str:
        return f"{len(self.given)} dealt requests"


class _Picked(Sequence[Request]):
    """``base[positions[k]]``, lazily: a ``--duration`` run's cycled requests stay unmade."""

    def __init__(self, base: Sequence[Request], positions: Sequence[int]) -> None:
        self.base, self.positions = base, positions

    def __len__(self) -> int:
        return len(self.positions)

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return [self.base[j] for j in self.positions[k]]
        return self.base[self.positions[k]]

    def __iter__(self) -> Iterator[Request]:
        return (self.base[j] for j in self.positions)


# ---- messages (pickled over one duplex pipe per worker) ----------------------------------------
@dataclass(frozen=True)
class Job:
    job: int
    requests: Sequence[Request]  # the share's requests, or the whole lazy list with ``positions``
    positions: tuple[int, ...] | None
    share: Share
    params: GenParams
    t0: float
    duration: float | None
    warmup: bool
    scheduled: bool = False  # the offsets are an open loop's due instants (records keep them)


@dataclass(frozen=True)
class Stop:
    job: int
    cancel: bool = False  # True: cancel in-flight requests too (a second Ctrl-C)


@dataclass(frozen=True)
class Ping:
    pass


@dataclass(frozen=True)
class Close:
    pass


@dataclass(frozen=True)
class Ready:
    pid: int


@dataclass(frozen=True)
class Pong:
    t: float


@dataclass(frozen=True)
class Records:
    job: int
    records: tuple[RequestRecord, ...]


@dataclass(frozen=True)
class Done:
    job: int
    error: str | None
    cpu_s: float  # the worker's process CPU time during the job


@dataclass(frozen=True)
class Failed:
    error: str


@dataclass(frozen=True)
class Exited:
    """Parent side: the pipe closed (the worker died)."""


def reader(conn: Connection, put: Callable[[Any], None]) -> Callable[[], None]:
    """An event-loop reader callback: every whole message on ``conn`` into ``put``; EOF once."""
    loop = asyncio.get_running_loop()

    def readable() -> None:
        try:
            while conn.poll():
                put(conn.recv())
        except (EOFError, OSError):
            loop.remove_reader(conn.fileno())
            put(Exited())

    return readable


# ---- the worker process ----------------------------------------------------------------------
def worker_main(conn: Connection, config: EngineConfig, clock_name: str) -> None:
    """Entry point of one client process (spawned). Ctrl-C goes to the parent, which stops the
    run and tells the workers; a closed pipe (the parent died) ends the worker. The parent's
    engine has already said its warnings (a server's /v1/models failing): not N times more."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.getLogger("engines").setLevel(logging.ERROR)
    with contextlib.suppress(EOFError, BrokenPipeError, ConnectionResetError):
        asyncio.run(WorkerLoop(conn, config, SHARED_CLOCKS[clock_name]).serve())


class WorkerLoop:
    """One client process's loop. ``clock`` and ``sleep`` are the runner's (tests hand it a fake
    clock and its sleep, in this process)."""

    def __init__(
        self,
        conn: Connection,
        config: EngineConfig,
        clock: Callable[[], float],
        sleep: Callable[[float], Any] = asyncio.sleep,
        inbox: asyncio.Queue[Any] | None = None,
    ):
        """``inbox``: messages put there by the host (a Ray actor), not read from ``conn``, which
        then only needs ``send``."""
        self.conn, self.config, self.clock, self.sleep = conn, config, clock, sleep
        self.inbox = inbox
        self.stop_job: int | None = None

    async def serve(self) -> None:
        from engines.base import create_engine

        loop = asyncio.get_running_loop()
        piped = self.inbox is None
        inbox: asyncio.Queue[Any] = asyncio.Queue() if self.inbox is None else self.inbox
        if piped:
            loop.add_reader(self.conn.fileno(), reader(self.conn, inbox.put_nowait))
        engine = None
        try:
            engine = create_engine(self.config)
            await engine.start()
        except Exception as exc:  # noqa: BLE001 - reported to the parent in one line
            self.conn.send(Failed(error_line(exc)))
            with contextlib.suppress(Exception):
                await engine.close()  # type: ignore[union-attr]
            return
        self.conn.send(Ready(os.getpid()))
        task: asyncio.Task[None] | None = None
        try:
            while True:
                msg = await inbox.get()
                if isinstance(msg, Ping):
                    self.conn.send(Pong(self.clock()))
                elif isinstance(msg, Job):
                    task = asyncio.ensure_future(self._job(engine, msg))
                elif isinstance(msg, Stop):
                    self.stop_job = msg.job
                    if msg.cancel and task is not None:
                        task.cancel()
                elif isinstance(msg, (Close, Exited)):
                    break
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            if piped:
                loop.remove_reader(self.conn.fileno())
            await engine.close()

    async def _job(self, engine: Any, job: Job) -> None:
        cpu0 = time.process_time()
        done: list[RequestRecord] = []

        def flush() -> None:
            if done:
                self.conn.send(Records(job.job, tuple(done)))
                done.clear()

        async def flusher() -> None:
            while True:
                await asyncio.sleep(FLUSH_S)
                flush()

        requests = job.requests
        if job.positions is not None:
            requests = _Picked(requests, job.positions)

        def on_record(rec: RequestRecord) -> None:
            done.append(replace(rec, info={**rec.info, "client_worker": job.share.index}))

        runner = Runner(
            engine,
            clock=self.clock,
            sleep=self.sleep,
            on_record=on_record,
            should_stop=lambda: self.stop_job == job.job,
        )
        strategy = _Given(job.share.offsets, job.share.cap, job.scheduled)
        error = None
        ticker = asyncio.ensure_future(flusher())
        try:
            await runner.run(
                requests,
                job.params,
                strategy,
                warmup=job.warmup,
                duration=job.duration,
                t0=job.t0,
            )
        except asyncio.CancelledError:
            error = "cancelled"
        except Exception as exc:  # noqa: BLE001 - the parent turns it into the run's status
            error = error_line(exc)
        finally:
            ticker.cancel()
            flush()
            self.conn.send(Done(job.job, error, time.process_time() - cpu0))

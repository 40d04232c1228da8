"""``--client-workers N``: an HTTP engine's requests sent from N client processes on this host.

Why: one asyncio process is the ceiling of the HTTP client (one core: its CPU per request and
per SSE event, bench/README.md); a server with many replicas needs more.

How: the parent's :class:`harness.run.runner.Runner` still owns the schedule and the clock. For each
run it computes the send offsets of every request once (the same seed, so the same Poisson or
closed-loop schedule as with one client), deals them to the workers (:func:`split`: request j to
worker (j mod cap) mod n, the cap split as evenly as it goes), reads the start instant ``t0``
and hands each worker its share, ``t0`` and ``duration``. Each worker runs the same Runner over
its share with its own engine (an ``openai`` config from the started engine's
``client_config()``: same servers, model name and request shape) and its own event loop, and
sends its frozen records back in batches; the parent journals them as they come and returns
them merged in send order, as if one client had sent them. Server-side work (/metrics counters,
prefix-cache resets, load gauges) stays with the parent's engine.

Clock convention: the runner's clock must be one every process on the host reads alike:
``time.perf_counter`` (or ``time.monotonic``), on Linux ``clock_gettime(CLOCK_MONOTONIC)``, one
clock for the whole machine, not per process; a worker reads the same named function, so its
stamps need no conversion. This is checked, not assumed: at start-up each worker's reading must
fall between two of the parent's (a handshake); the offset and round trip are recorded with the
run (``engine_info.client_workers``). An injected clock (tests' fake clock) cannot be shared and
is refused; so are other hosts (monotonic clocks are per host).

A cap on requests in flight is split across workers (caps 3 + 2 for ``--concurrency 5`` on 2):
the same total in flight, but a worker's free slot is not lent to another, so with very uneven
request lengths the closed loop differs slightly from one client's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

from engines.base import EngineError, GenParams, Request
from harness.core.load import LoadStrategy, open_loop
from harness.core.records import RequestRecord
from harness.run.clients.process import (
    SHARED_CLOCKS,
    Close,
    Done,
    Exited,
    Failed,
    Job,
    Ping,
    Pong,
    Ready,
    Records,
    Share,
    Stop,
    reader,
    split,
    worker_main,
)
from harness.run.runner import Runner

__all__ = ["ClientPool", "Share", "lost_records", "refusal", "shifted", "split", "supports"]

START_TIMEOUT_S = 120.0
POLL_S = 0.05  # the parent checks the run's stop flag this often
DRAIN_S = 5.0  # a cancelled or failed run still takes the workers' records this long
PINGS = 3


def supports(engine: str) -> bool:
    """Whether ``engine`` talks to its server over HTTP, so other processes can send for it."""
    from engines.base import engine_class

    return engine_class(engine).capabilities.client_workers


def refusal(engines: Sequence[str], workers: int, ray: bool = False) -> str | None:
    """The one-line reason ``--client-workers`` (or ``--ray-address``) cannot apply to these
    engines, else None."""
    if workers <= 1 and not ray:
        return None
    flag = "--ray-address" if ray else f"--client-workers {workers}"
    for e in engines:
        if not supports(e):
            return (
                f"{flag}: engine {e} runs in this process; only engines "
                "that talk to a server over HTTP can send from several processes"
            )
    return None


@dataclass
class WorkerHandle:
    """One worker as the pool sees it. ``offset_s``: the worker's clock minus the runner's
    (0 on one host: one clock; estimated per host for Ray workers, harness.run.clients.ray_actors)."""

    index: int
    proc: Any
    conn: Connection
    pid: int = 0
    offset_s: float = 0.0
    gone: bool = False  # died during a run (survive_deaths): no more shares

    def send(self, msg: Any) -> None:
        self.conn.send(msg)

    def exit_reason(self) -> str:
        self.proc.join(1)
        return f"exited (code {self.proc.exitcode})"


class ClientPool:
    """N started client processes for one started HTTP engine (one lane of a run)."""

    def __init__(self, clock: Callable[[], float], handles: list[WorkerHandle]) -> None:
        self.clock = clock
        self.handles = handles
        self.inbox: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self.clock_check: list[dict[str, float]] = []
        self.last_cpu_s: list[float] = []  # each worker's CPU time in the last run (bench)
        self.survive_deaths = False  # Ray: a dead worker loses only its share's unfinished requests
        self.deaths: list[dict[str, Any]] = []
        self._job = 0

    @classmethod
    async def start(cls, engine: Any, workers: int, clock: Callable[[], float]) -> ClientPool:
        """Spawn ``workers`` processes, each starting an ``openai`` engine on ``engine``'s
        servers, and check that they read the runner's clock (see the module docstring)."""
        import multiprocessing

        name = next((k for k, c in SHARED_CLOCKS.items() if c is clock), None)
        if name is None:
            raise EngineError(
                f"--client-workers: the runner's clock {clock!r} cannot be read by other "
                f"processes; use one of time.{', time.'.join(SHARED_CLOCKS)}"
            )
        config = engine.client_config()
        ctx = multiprocessing.get_context("spawn")  # no copy of this process's loop or threads
        handles = []
        for i in range(workers):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(
                target=worker_main, args=(theirs, config, name), daemon=True, name=f"client-{i}"
            )
            proc.start()
            theirs.close()
            handles.append(WorkerHandle(i, proc, mine))
        pool = cls(clock, handles)
        try:
            await pool._handshake()
        except BaseException:
            await pool.close()
            raise
        return pool

    async def _handshake(self) -> None:
        loop = asyncio.get_running_loop()
        for h in self.handles:
            put = (lambda i: lambda msg: self.inbox.put_nowait((i, msg)))(h.index)
            loop.add_reader(h.conn.fileno(), reader(h.conn, put))
        for _ in self.handles:  # ready in any order
            i, msg = await asyncio.wait_for(self.inbox.get(), START_TIMEOUT_S)
            if not isinstance(msg, Ready):
                raise EngineError(f"client worker {i}: {_why(msg, self.handles[i])}")
            self.handles[i].pid = msg.pid
        for h in self.handles:
            best = None
            for _ in range(PINGS):
                a = self.clock()
                h.send(Ping())
                msg = await self._next(h.index, START_TIMEOUT_S)
                b = self.clock()
                if not isinstance(msg, Pong):
                    raise EngineError(f"client worker {h.index}: {_why(msg, h)}")
                if not a <= msg.t <= b:
                    raise EngineError(
                        f"--client-workers: worker {h.index} read {msg.t:.6f} s, outside the "
                        f"runner's [{a:.6f}, {b:.6f}]: not one clock for both processes"
                    )
                if best is None or b - a < best["rtt_s"]:
                    best = {"offset_s": msg.t - (a + b) / 2, "rtt_s": b - a}
            assert best is not None
            self.clock_check.append(best)

    async def _next(self, index: int, timeout: float) -> Any:
        """The next message, from worker ``index`` (pings: one worker at a time)."""
        i, msg = await asyncio.wait_for(self.inbox.get(), timeout)
        assert i == index, (i, index)
        return msg

    def describe(self) -> dict[str, Any]:
        """What the run records (``engine_info.client_workers``)."""
        name = next(k for k, c in SHARED_CLOCKS.items() if c is self.clock)
        return {
            "workers": len(self.handles),
            "clock": f"time.{name} ({time.get_clock_info(name).implementation}), read by every "
            "worker process",
            "max_abs_offset_s": max(abs(c["offset_s"]) for c in self.clock_check),
            "max_handshake_rtt_s": max(c["rtt_s"] for c in self.clock_check),
        }

    @property
    def pids(self) -> list[int]:
        return [h.pid for h in self.handles]

    async def run(
        self,
        runner: Runner,
        requests: Sequence[Request],
        params: GenParams,
        strategy: LoadStrategy,
        *,
        warmup: bool,
        duration: float | None,
    ) -> list[RequestRecord]:
        """One run through the workers: deal the schedule, hand over ``t0``, merge the records
        (journalled through ``runner.on_record`` as they arrive) in send order."""
        if runner.clock is not self.clock:
            raise EngineError("--client-workers: the runner's clock is not the pool's")
        alive = [h for h in self.handles if not h.gone]  # a dead worker gets no more shares
        if not alive:
            raise EngineError("--client-workers: every client worker has died")
        shares = split(strategy.offsets(len(requests)), strategy.max_concurrency, len(alive))
        due_at = open_loop(strategy)
        self._job += 1
        job = self._job
        lazy = not isinstance(requests, (list, tuple))
        t0 = runner.clock()
        targets: dict[int, Share] = {}  # worker index -> its share
        for share in shares:
            picked = requests if lazy else [requests[j] for j in share.positions]
            positions = share.positions if lazy else None
            h = alive[share.index]  # t0 on the worker's clock
            targets[h.index] = share
            h.send(
                Job(
                    job, picked, positions, share, params, t0 + h.offset_s, duration, warmup,
                    due_at,
                )
            )  # fmt: skip
        records: list[tuple[float, int, int, RequestRecord]] = []
        cpu = [0.0] * len(self.handles)
        pending = set(targets)
        got: dict[int, set[str]] = {i: set() for i in targets}

        def take(i: int, msg: Any) -> None:
            """One message of worker ``i``: its records journalled as they come, its end."""
            if isinstance(msg, Records) and msg.job == job:
                for rec in msg.records:
                    rec = shifted(rec, -self.handles[i].offset_s)  # onto the runner's clock
                    got[i].add(rec.request_id)
                    records.append((rec.t_send, i, len(records), rec))
                    if runner.on_record is not None:
                        runner.on_record(rec)
            elif isinstance(msg, Done) and msg.job == job:
                pending.discard(i)
                cpu[i] = msg.cpu_s
                if msg.error is not None and msg.error != "cancelled":
                    raise EngineError(f"client worker {i}: {msg.error}")
            elif isinstance(msg, (Exited, Failed)):
                why = f"client worker {i}: {_why(msg, self.handles[i])}"
                if not self.survive_deaths:
                    raise EngineError(why)
                self.handles[i].gone = True
                if i not in pending:
                    return
                pending.discard(i)
                lost = lost_records(
                    requests, targets[i], i, got[i], t0, runner.clock(), why, warmup, duration,
                    due_at,
                )  # fmt: skip
                self.deaths.append({"worker": i, "job": job, "lost": len(lost), "why": why})
                for rec in lost:
                    records.append((rec.t_send, i, len(records), rec))
                    if runner.on_record is not None:
                        runner.on_record(rec)

        stopped = cancelled = interrupted = False
        failure: EngineError | None = None
        drain_until: float | None = None  # cancelled or failed: the others' records still come
        while pending and (drain_until is None or time.monotonic() < drain_until):
            if not stopped and runner.should_stop():
                stopped = True
                self.send_all(Stop(job))
            if not cancelled and runner.cancel_now():  # the stop's grace is over
                cancelled = True
                self.send_all(Stop(job, cancel=True))
            try:
                i, msg = await asyncio.wait_for(self.inbox.get(), POLL_S)
            except asyncio.TimeoutError:
                continue
            except asyncio.CancelledError:  # the workers' cancelled records first, then go
                if interrupted:
                    raise
                interrupted = True
            else:
                try:
                    take(i, msg)
                    continue
                except EngineError as exc:
                    failure = failure or exc
                    pending.discard(i)
            if drain_until is None:
                self.send_all(Stop(job, cancel=True))
                cancelled, drain_until = True, time.monotonic() + DRAIN_S
        if interrupted:
            raise asyncio.CancelledError
        if failure is not None:
            raise failure
        self.last_cpu_s = cpu
        return [rec for *_, rec in sorted(records, key=lambda r: r[:3])]

    def send_all(self, msg: Any) -> None:
        for h in self.handles:
            with contextlib.suppress(Exception):
                h.send(msg)

    async def close(self) -> None:
        """Ask every worker to close its engine and exit; kill any that does not within 10 s."""
        self.send_all(Close())
        loop = asyncio.get_running_loop()
        for h in self.handles:
            with contextlib.suppress(Exception):
                loop.remove_reader(h.conn.fileno())
        for h in self.handles:
            await asyncio.to_thread(h.proc.join, 10)
            if h.proc.is_alive():
                h.proc.kill()
                await asyncio.to_thread(h.proc.join, 5)
            h.conn.close()


def shifted(rec: RequestRecord, dt: float) -> RequestRecord:
    """``rec`` with every stamp moved by ``dt`` seconds (another host's clock onto ours): its
    schedule too, so the schedule and the stamps stay on one clock."""
    if not dt:
        return rec
    return replace(
        rec,
        t_scheduled=None if rec.t_scheduled is None else rec.t_scheduled + dt,
        t_send=rec.t_send + dt,
        t_end=rec.t_end + dt,
        chunk_times=tuple(t + dt for t in rec.chunk_times),
    )


def lost_records(
    requests: Sequence[Request],
    share: Share,
    worker: int,
    received: set[str],
    t0: float,
    now: float,
    why: str,
    warmup: bool,
    duration: float | None = None,
    due_at: bool = False,
) -> list[RequestRecord]:
    """A dead worker's requests in flight when it died, as failed records with the reason: those
    due by ``now`` (and before ``duration``) that never came back, at most its share's cap of
    them in a closed loop (it sends in order, one per free slot). What it had not sent yet is
    not a record: the run ends with the records it has."""
    out: list[RequestRecord] = []
    elapsed = now - t0
    for j, offset in zip(share.positions, share.offsets):
        if offset > elapsed or (duration is not None and offset >= duration):
            break  # offsets ascend: the rest were not due
        if share.cap is not None and len(out) >= share.cap:
            break
        rid = requests[j].id
        if rid not in received:
            info = {"client_worker": worker}
            due = t0 + offset if due_at else None
            out.append(
                RequestRecord(
                    rid, t0 + offset, now, ok=False, error=why, warmup=warmup, info=info,
                    t_scheduled=due,
                )
            )  # fmt: skip
    return out


def _why(msg: Any, h: WorkerHandle) -> str:
    if isinstance(msg, Failed):
        return msg.error
    if isinstance(msg, Exited):
        return h.exit_reason()
    return f"unexpected message {type(msg).__name__}"

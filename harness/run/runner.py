"""The runner: sends requests as the load strategy says and times every chunk.

It owns the clock (``clock``, default ``time.perf_counter``; tests inject a fake one) and reads it
at send, at the end, and at each token-carrying chunk that arrives unstamped. Engines are handed
the same clock and stamp chunks where the tokens first exist (``Chunk.t``: the host for
in-process models, the socket read for HTTP): the runner keeps those stamps, so an engine that
batches its hand-over to the event loop moves no timestamp.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from engines.base import Chunk, Clock, Engine, GenParams, Request, UnsupportedError
from harness.core.load import LoadStrategy, open_loop
from harness.core.records import NOT_SENT, RequestRecord

OnRecord = Callable[[RequestRecord], None]
CANCELLED = "cancelled at stop"  # the error of a request still in flight when the grace ended
POLL_S = 0.05  # how often a run checks whether its in-flight requests must be cancelled


class Clients(Protocol):
    """Client processes that send a run's requests for the runner (``--client-workers``,
    :mod:`harness.run.clients.workers`): the runner still reads the start instant and hands it over."""

    async def run(
        self,
        runner: Runner,
        requests: Sequence[Request],
        params: GenParams,
        strategy: LoadStrategy,
        *,
        warmup: bool,
        duration: float | None,
    ) -> list[RequestRecord]: ...


def error_line(exc: BaseException) -> str:
    """One line naming what went wrong."""
    msg = " ".join(str(exc).split()) or exc.__class__.__name__
    return msg if ":" in msg[:40] else f"{exc.__class__.__name__}: {msg}"


@dataclass
class _Timing:
    """Mutable scratch space of one request while it streams."""

    request: Request
    t_send: float
    warmup: bool
    t_scheduled: float | None = None  # an open loop's due instant (the same clock)
    times: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    ids_known: bool = True
    text: list[str] = field(default_factory=list)
    prompt_tokens: int | None = None
    usage_output: int | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def add(self, chunk: Chunk, t: float) -> None:
        if chunk.prompt_tokens is not None:
            self.prompt_tokens = chunk.prompt_tokens
        if chunk.usage_output_tokens is not None:
            self.usage_output = chunk.usage_output_tokens
        if chunk.info:
            self.info.update(chunk.info)
        if chunk.text:
            self.text.append(chunk.text)
        n = chunk.size
        if n <= 0:
            return
        if chunk.times:  # several steps handed over at once, each with its stamp
            self.times.extend(chunk.times)
            self.sizes.extend(chunk.sizes)
        else:
            self.times.append(t)
            self.sizes.append(n)
        if len(chunk.token_ids) == n:
            self.ids.extend(chunk.token_ids)
        else:
            self.ids_known = False

    def finish(self, t_end: float, error: str | None) -> RequestRecord:
        """The record; one that fails its check (output without a first token) is kept as a
        failed record with the reason, never counted as a success."""
        try:
            return self._record(t_end, error)
        except ValueError as exc:
            return self._record(t_end, str(exc).split(": ", 1)[-1])

    def _record(self, t_end: float, error: str | None) -> RequestRecord:
        return RequestRecord(
            request_id=self.request.id,
            t_send=self.t_send,
            t_end=t_end,
            chunk_times=tuple(self.times),
            chunk_tokens=tuple(self.sizes),
            output_token_ids=tuple(self.ids) if self.ids_known else None,
            prompt_tokens=self.prompt_tokens,
            usage_output_tokens=self.usage_output,
            output_text="".join(self.text) if self.text else None,
            ok=error is None,
            error=error,
            warmup=self.warmup,
            info=self.info,
            t_scheduled=self.t_scheduled,
        )


@dataclass
class Runner:
    """Runs one cell: a list of requests through one engine under one load strategy."""

    engine: Engine
    clock: Clock = time.perf_counter
    sleep: Callable[[float], Any] = asyncio.sleep
    on_record: OnRecord | None = None
    should_stop: Callable[[], bool] = lambda: False
    # True once the stop's grace is over: requests still in flight are cancelled and recorded
    cancel_now: Callable[[], bool] = lambda: False
    clients: Clients | None = None  # set: other processes send the requests (HTTP engines)
    # False: a run returns no records (on_record has each; a million held twice: issue 38)
    keep: bool = True

    async def run(
        self,
        requests: Sequence[Request],
        params: GenParams,
        strategy: LoadStrategy,
        *,
        warmup: bool = False,
        duration: float | None = None,
        t0: float | None = None,
    ) -> list[RequestRecord]:
        """Send every request as ``strategy`` says, none after ``duration`` seconds (those in
        flight then finish); return the records in send order. ``t0``: the schedule's start on
        this runner's clock (default now; a client worker is handed its parent's)."""
        cap = strategy.max_concurrency
        limit = self.engine.max_batch()
        if cap != 1 and limit == 1:
            raise UnsupportedError("unsupported (batch size 1 only)")
        if cap != 1 and self.engine.capabilities.static_batching:
            if strategy.offsets(2)[-1] != 0.0 or cap is None:
                raise UnsupportedError("unsupported (static batching needs --concurrency N)")
            return await self._run_static(requests, params, cap, warmup, duration)
        if self.clients is not None:
            return await self.clients.run(
                self, requests, params, strategy, warmup=warmup, duration=duration
            )
        return await self._run_streams(requests, params, strategy, warmup, duration, t0)

    async def send(
        self, request: Request, params: GenParams, *, warmup: bool = False,
        due: float | None = None,
    ) -> RequestRecord:  # fmt: skip
        """One request sent now, its record returned (a conversation's turn:
        harness.run.conversations). ``due``: when an open loop scheduled it, on this clock (a
        conversation's first turn), kept in the record so that the wait before this send is in
        its client queue; None: no schedule. Cancelled at the stop's grace like a run's."""
        task = asyncio.ensure_future(self._one(request, params, warmup, self.clock(), None, due))
        watch = asyncio.ensure_future(self._cancel_at_stop([task]))
        try:
            await settle([task])
        finally:
            watch.cancel()
            if task.cancelled():  # cancelled before it ran: its record is made here
                made = _Timing(request, self.clock(), warmup, due).finish(self.clock(), CANCELLED)
                self._emit(made)
        return made if task.cancelled() else task.result()

    def _emit(self, record: RequestRecord) -> RequestRecord:
        if self.on_record is not None:
            self.on_record(record)
        return record

    async def _one(
        self, request: Request, params: GenParams, warmup: bool, t_send: float,
        rate: float | None = None, due: float | None = None,
    ) -> RequestRecord:  # fmt: skip
        timing = _Timing(request, t_send, warmup, due)
        if rate is not None:  # a ramp: the asked rate at this request's send (harness.core.ramp)
            timing.info["request_rate"] = rate
        error = None
        try:
            async for chunk in self.engine.stream(request, params, self.clock):
                timing.add(chunk, self.clock() if chunk.t is None else chunk.t)
        except asyncio.CancelledError:
            error = CANCELLED
        except Exception as exc:  # recorded per request, never raised
            error = error_line(exc)
        return self._emit(timing.finish(self.clock(), error))

    async def _run_streams(
        self,
        requests: Sequence[Request],
        params: GenParams,
        strategy: LoadStrategy,
        warmup: bool,
        duration: float | None = None,
        t0: float | None = None,
    ) -> list[RequestRecord]:
        offsets = strategy.offsets(len(requests))
        rates = strategy.rates(len(requests)) if hasattr(strategy, "rates") else None
        slots = asyncio.Semaphore(strategy.max_concurrency) if strategy.max_concurrency else None
        t0 = self.clock() if t0 is None else t0
        due_at = open_loop(strategy)  # the offsets are due instants: records keep them
        keep = self.keep
        # only the requests in flight are held (a finished one's task is dropped as it ends:
        # ~600 bytes a request, a million in a soak run: issue 38); records in send order
        tasks: dict[asyncio.Task[RequestRecord], tuple[int, Request, float, float | None]] = {}
        records: list[RequestRecord | None] = []

        def finished(t: asyncio.Task[RequestRecord]) -> None:
            if t in tasks and not t.cancelled() and t.exception() is None:
                i = tasks.pop(t)[0]  # the rest: handled below, as they were
                if keep:
                    records[i] = t.result()

        async def go(
            req: Request, t_send: float, rate: float | None, due: float | None
        ) -> RequestRecord:
            try:
                return await self._one(req, params, warmup, t_send, rate, due)
            finally:
                if slots is not None:
                    slots.release()

        watch = asyncio.ensure_future(self._cancel_at_stop(tasks))
        unsent: list[RequestRecord] = []
        try:
            end = None if duration is None else t0 + duration
            for i, (req, offset) in enumerate(zip(requests, offsets)):
                if end is not None and t0 + offset >= end:
                    break
                if self.should_stop():
                    break
                delay = t0 + offset - self.clock()
                if delay > 0:
                    await self.sleep(delay)
                if slots is not None:
                    await slots.acquire()
                stop = self.should_stop()
                if stop or (end is not None and self.clock() >= end):
                    if slots is not None:
                        slots.release()
                    if due_at and end is not None and not stop:
                        unsent = self._not_sent(requests, offsets, i, t0, end, warmup)
                    break
                t_send = self.clock()
                rate = None if rates is None else rates[i]
                due = t0 + offset if due_at else None
                task = asyncio.ensure_future(go(req, t_send, rate, due))
                tasks[task] = (i, req, t_send, due)
                if keep:
                    records.append(None)
                task.add_done_callback(finished)
            await settle(list(tasks))
        except BaseException:
            for t in list(tasks):
                t.cancel()
            raise
        finally:  # every request sent has recorded itself before the run returns or raises
            watch.cancel()
            await settle(list(tasks))
            for t, (i, req, t_send, due) in list(tasks.items()):
                if t.cancelled():  # cancelled before it ran: its record is made here
                    del tasks[t]
                    made = _Timing(req, t_send, warmup, due).finish(self.clock(), CANCELLED)
                    self._emit(made)
                    if keep:
                        records[i] = made
        for t, (i, *_) in list(tasks.items()):  # done, its callback not yet run, or raised
            made = t.result()
            if keep:
                records[i] = made
        if not keep:
            return []
        return records + unsent  # type: ignore[operator]  # every slot filled above

    def _not_sent(
        self, requests: Sequence[Request], offsets: Sequence[float], first: int, t0: float,
        end: float, warmup: bool,
    ) -> list[RequestRecord]:  # fmt: skip
        """Requests ``first``.. due before ``end`` that the client still held when the run
        ended: each a failed record (:data:`NOT_SENT`) with its schedule, sent and ended when
        the runner gave up (its client queue is the whole wait), so no due request vanishes."""
        now = self.clock()
        out = []
        for j in range(first, len(offsets)):
            if t0 + offsets[j] >= end:
                break  # offsets ascend: the rest were not due
            rec = RequestRecord(
                requests[j].id, now, now, ok=False, error=NOT_SENT, warmup=warmup,
                t_scheduled=t0 + offsets[j],
            )  # fmt: skip
            out.append(self._emit(rec))
        return out

    async def _cancel_at_stop(self, tasks: Collection[asyncio.Task[Any]]) -> None:
        """Once the stop's grace is over, cancel the requests in flight: each records itself as
        failed (:data:`CANCELLED`), and a send blocked on a concurrency slot gets it back."""
        while not self.cancel_now():
            await asyncio.sleep(POLL_S)
        for t in list(tasks):
            t.cancel()

    async def _run_static(
        self,
        requests: Sequence[Request],
        params: GenParams,
        size: int,
        warmup: bool,
        duration: float | None = None,
    ) -> list[RequestRecord]:
        """Fixed batches of ``size`` through ``engine.stream_batch`` (HF ``generate``)."""
        out: list[RequestRecord] = []
        t0 = self.clock()
        for start in range(0, len(requests), size):
            if self.should_stop() or (duration is not None and self.clock() - t0 >= duration):
                break
            batch = list(requests[start : start + size])
            t_send = self.clock()
            timings = [_Timing(r, t_send, warmup) for r in batch]
            error = None

            async def consume(batch: list[Request] = batch, timings: list = timings) -> None:
                chunks = self.engine.stream_batch(batch, params, self.clock)
                async for index, chunk in chunks:
                    timings[index].add(chunk, self.clock() if chunk.t is None else chunk.t)

            job = asyncio.ensure_future(consume())
            watch = asyncio.ensure_future(self._cancel_at_stop([job]))
            interrupted = False
            try:
                await settle([job])
            except asyncio.CancelledError:  # this run was cancelled: record the batch, re-raise
                interrupted = True
            finally:
                watch.cancel()
            if job.cancelled():
                error = CANCELLED
            elif isinstance(job.exception(), Exception):
                error = error_line(job.exception())  # type: ignore[arg-type]
            t_end = self.clock()
            out.extend(self._emit(t.finish(t_end, error)) for t in timings)
            if interrupted:
                raise asyncio.CancelledError
        return out


async def settle(tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Wait until every task is done, even through cancellations of the caller: each is
    cancelled again and awaited (a request records itself as it ends), then the caller's
    cancellation is raised. Nothing a run started outlives it."""
    cancelled = False
    pending = [t for t in tasks if not t.done()]
    while pending:
        try:
            await asyncio.wait(pending)
        except asyncio.CancelledError:
            cancelled = True
            for t in pending:
                t.cancel()
        pending = [t for t in pending if not t.done()]
    if cancelled:
        raise asyncio.CancelledError

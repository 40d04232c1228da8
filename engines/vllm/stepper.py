"""The one thread that builds and steps every in-process vLLM engine of this process.

Why one: an engine stepped by a thread of its own runs wherever the OS keeps that thread. On a
2-vCPU VM shared with other tenants one vCPU can be slower than the other for minutes, and the
scheduler leaves a busy thread on one vCPU for tens of seconds: an A/A run (the same configuration as two
lanes) saw one of two identical engines faster in every block of a phase, because the effect
belonged to the lane's own thread, which block rotation cannot move. With one thread for every
engine, the lanes share its placement at each moment, and rotation spreads drift in time over
them alike.

The thread serves one queue of (engine, message) pairs in arrival order: that queue is also the
one wake-up of the thread, which blocks on it while no engine has unfinished requests (no
polling). Otherwise it serves what is queued, then steps each engine with unfinished requests
once (round-robin: correct if slower when several are busy; the interleaved design runs one lane
at a time). An exception raised by one engine's open/handle/busy/step/idle ends that engine
alone; the others go on. A fault of the thread's own (its loop, not an engine's call) ends every
engine and answers every queued message with it, outside the lock (ending an engine shuts vLLM
down and collects garbage), so no waiter hangs and the next start gets a new thread. A waiter
that gave up (a cancelled ``start()`` or call) is skipped: its future is claimed with
``set_running_or_notify_cancel`` before it is answered, and an engine built for a cancelled start
is ended, not leaked. The thread ends when its last engine has ended and nothing is queued; the
next engine to start starts a new one (so engines alive at the same time always share one
thread). OpenMP's thread count is per OS thread: on CPU, unless the user set OMP_NUM_THREADS,
each build sets this thread's to 1, a failed one too (engines/vllm/setup.py: one_thread_stepping).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass
from typing import Any, Protocol

from engines.vllm.messages import Command, Stop


class Lane(Protocol):
    """What the thread asks of an engine (engines/vllm/engine.py); every method runs on the thread."""

    def open(self) -> None:
        """Build the engine; an exception fails its start."""

    def handle(self, cmd: Command) -> None:
        """Serve one command (not Stop) between steps."""

    def busy(self) -> bool:
        """Whether the engine has unfinished requests."""

    def step(self) -> None:
        """One engine step, its outputs stamped and handed over."""

    def idle(self) -> None:
        """Not busy this round: hand over any outputs still held."""

    def end(self, cause: BaseException | None, stop: Future[None] | None) -> None:
        """Fail the open streams and shut down (``cause`` None: closed by ``stop``)."""

    def late(self, cmd: Command) -> None:
        """A command that reached the engine after it ended."""


@dataclass(frozen=True)
class Open:
    """Build the engine and add it to the stepped ones; ``ready`` says when (or why not)."""

    ready: Future[None]


class Stepper:
    """The process's stepping thread (see module docstring); use the module's ``STEPPER``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # a message is never queued to a thread that is ending
        self._queue: queue.SimpleQueue[tuple[Lane, Command | Open]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lanes: list[Lane] = []  # the thread's own: engines built and not ended

    def send(self, lane: Lane, msg: Command | Open) -> None:
        """Queue ``msg`` for ``lane`` (thread-safe); starts the thread if none runs."""
        with self._lock:
            if self._thread is None:
                # held only once it runs: a thread that failed to start would leave every later
                # message queued for nobody (the caller hears the failure instead)
                thread = threading.Thread(target=self._run, name="vllm-stepper", daemon=True)
                thread.start()
                self._thread = thread
            self._queue.put((lane, msg))

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # noqa: BLE001 - a fault of the thread's own, not an engine's
            # every engine ends with it and every waiter hears (none hangs). Engines end outside
            # the lock (a shutdown that reaches send() must not deadlock, nor block the event
            # loop's sends); what they send meanwhile is queued here and answered below
            lanes, self._lanes = self._lanes, []
            for lane in lanes:
                with contextlib.suppress(BaseException):
                    lane.end(e, None)
            with self._lock:  # from here on, send() starts a new thread
                self._thread = None
                items = []
                while not self._queue.empty():
                    items.append(self._queue.get_nowait())
            for lane, msg in items:
                with contextlib.suppress(BaseException):
                    if not isinstance(msg, Open):
                        lane.late(msg)
                    elif msg.ready.set_running_or_notify_cancel():
                        msg.ready.set_exception(e)

    def _loop(self) -> None:
        lanes = self._lanes
        while True:
            busy = [lane for lane in list(lanes) if self._guard(lane, lane.busy)]
            for lane in list(lanes):
                if lane not in busy:
                    self._guard(lane, lane.idle)
            item: tuple[Lane, Command | Open] | None = None
            if not busy:
                if not lanes:
                    with self._lock:
                        if self._queue.empty():
                            self._thread = None
                            return
                item = self._queue.get()  # idle: block until a message comes
            while True:
                if item is None:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                self._serve(*item)
                item = None
            for lane in list(lanes):  # round-robin: one step of each busy engine
                if lane in lanes and self._guard(lane, lane.busy):
                    self._guard(lane, lane.step)

    def _serve(self, lane: Lane, msg: Command | Open) -> None:
        lanes = self._lanes
        if isinstance(msg, Open):
            if lane in lanes:  # a second start() of a running engine: it must not build twice
                if msg.ready.set_running_or_notify_cancel():
                    msg.ready.set_exception(RuntimeError("engine already started"))
                return
            try:
                lane.open()
            except BaseException as e:  # noqa: BLE001 - reported to the engine's start()
                if msg.ready.set_running_or_notify_cancel():
                    msg.ready.set_exception(e)
                return
            if not msg.ready.set_running_or_notify_cancel():  # start() was cancelled meanwhile:
                with contextlib.suppress(BaseException):  # nobody will close this engine
                    lane.end(CancelledError(), None)
                return
            lanes.append(lane)
            msg.ready.set_result(None)
        elif lane not in lanes:
            self._guard(lane, lambda: lane.late(msg))
        elif isinstance(msg, Stop):
            lanes.remove(lane)
            with contextlib.suppress(BaseException):  # end() reports to msg.done itself
                lane.end(None, msg.done)
        else:
            self._guard(lane, lambda: lane.handle(msg))

    def _guard(self, lane: Lane, fn: Any) -> Any:
        """``fn()``; if it raises, ``lane`` ends with that cause (the others go on)."""
        try:
            return fn()
        except BaseException as e:  # noqa: BLE001 - one engine's failure, not the thread's
            if lane in self._lanes:
                self._lanes.remove(lane)
                with contextlib.suppress(BaseException):
                    lane.end(e, None)
            return None


STEPPER = Stepper()

"""The one long-lived thread that runs HF ``generate`` and ``step_costs`` for every HF engine of
a process.

Why one thread for the process's life, not one per request: a thread's first forwards on CUDA
are several times slower than its later ones (CPU time of that thread), so with a thread per
request every request was a first one and the harness read a fraction of plain ``generate``'s
rate (``python -m bench.gpu_check``; the figures: docs/measurements.md). One thread shared by every engine also spares each
fresh engine of a block (``rebuild_per_block``) its own warm-up of the thread. Engines never
generate at the same time (the runner interleaves variants, a static batch is one ``generate``,
each engine holds a lock around it), so one worker serializes nothing that ran in parallel.

A daemon thread, not a ``ThreadPoolExecutor`` (whose worker the interpreter joins at exit: a
``generate`` still running after an interrupt would hold the process open).
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")
NAME = "hf-generate"


class GenerationThread:
    """Runs submitted calls one at a time, in submission order, on one daemon thread."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future, Callable[..., Any], tuple]] = (
            queue.SimpleQueue()
        )
        self.thread = threading.Thread(target=self._loop, name=NAME, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            fut, fn, args = self._jobs.get()
            if not fut.set_running_or_notify_cancel():
                continue  # cancelled while queued
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # handed to whoever waits on the future
                fut.set_exception(e)

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        fut: Future[T] = Future()
        self._jobs.put((fut, fn, args))
        return fut

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Blocking: ``fn(*args)`` on the thread (directly when already on it)."""
        if threading.current_thread() is self.thread:
            return fn(*args)
        return self.submit(fn, *args).result()


_lock = threading.Lock()
_current: tuple[int, GenerationThread] | None = None


def generation_thread() -> GenerationThread:
    """The process's generation thread, started on first use (again in a forked child)."""
    global _current
    with _lock:
        if _current is None or _current[0] != os.getpid():
            _current = (os.getpid(), GenerationThread())
        return _current[1]

"""The OpenMP thread count of the thread that steps in-process vLLM engines, kept step by step."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any


def omp_threads_asked() -> int | None:
    """The user's ``OMP_NUM_THREADS`` as a count, if it is one (numba ignores it: its OpenMP
    layer sets the calling thread's count to the number of cores after every parallel call)."""
    try:
        n = int(os.environ.get("OMP_NUM_THREADS", ""))
    except ValueError:
        return None
    return n if n > 0 else None


class StepThreads:
    """Gives the stepping thread back the OpenMP count it steps with after every step.

    vLLM's ngram drafter runs numba, whose OpenMP layer (libiomp5, the runtime torch uses here
    too) restores numba's own count, the number of cores, with ``omp_set_num_threads`` after
    every proposal: on this thread, so every later step of every engine (the ngram one included)
    would run its torch ops with one OpenMP thread per core, beside the event loop and the other
    processes (it more than doubled the time per token: docs/measurements.md). The count kept is the policy's (1 on CPU, or
    the user's ``OMP_NUM_THREADS``), else what the thread had once the engine was built.
    """

    def __init__(self, want: int, get: Callable[[], int], set_: Callable[[int], None]) -> None:
        self.want, self._get, self._set = want, get, set_
        self.restored = 0  # steps that left the count changed

    @classmethod
    def for_engine(cls, defaults: Mapping[str, Any]) -> StepThreads:
        """Called on the stepping thread once the engine is built (``defaults``: what
        engines/vllm/setup.py chose, ``stepping_torch_threads`` among them)."""
        import torch

        get, set_ = torch._C.get_num_threads, torch._C.set_num_threads  # noqa: SLF001 - torch._C: the original set/get_num_threads (vLLM's CPU worker no-ops torch's)
        want = defaults.get("stepping_torch_threads") or omp_threads_asked() or get()
        return cls(want, get, set_)

    def keep(self) -> None:
        if self._get() != self.want:
            self._set(self.want)
            self.restored += 1

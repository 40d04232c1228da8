"""The messages between the event loop and the in-process vLLM engine's stepping thread.

Commands go to the thread through one queue (:class:`Add`, :class:`Abort`, :class:`Call`,
:class:`Stop`); each step's outputs come back as a :class:`Step`. Small frozen records, so each
side reads fields by name, never a tuple by position.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from workloads.base import Request


@dataclass(frozen=True)
class Add:
    """Add a request to the engine before the next step."""

    rid: str
    request: Request
    sampling: Any  # vllm.SamplingParams


@dataclass(frozen=True)
class Abort:
    """Abort a request its stream no longer waits for (the consumer stopped reading)."""

    rid: str


@dataclass(frozen=True)
class Call:
    """Run ``fn(llm)`` between steps; its result or exception goes to ``done``."""

    fn: Callable[[Any], Any]
    done: concurrent.futures.Future[Any]


@dataclass(frozen=True)
class Stop:
    """Shut the engine down (the thread ends with its last engine); ``done`` says when (or
    why not)."""

    done: concurrent.futures.Future[None]


Command = Add | Abort | Call | Stop


@dataclass(frozen=True)
class Step:
    """One step's ``RequestOutput`` deltas and the clock reading right after the step."""

    outputs: Sequence[Any]
    t: float | None

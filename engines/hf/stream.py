"""HF ``generate``'s side of streaming: a streamer that runs on the generating thread, stamps each
step's ids with the runner's clock as soon as they are on the host, and hands them to the event
loop at most every ``DELIVERY_S`` (one cross-thread wake-up per token cost 10-15% of a tiny
model's decode speed on 2 cores: bench/RESULTS.md, section 1); and the chunk one request gets
from one hand-over, with a stamp per step."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from engines.base import Chunk, Clock
from engines.common.handover import DELIVERY_S

END, TOKENS, ERROR = "end", "tokens", "error"
Steps = list[tuple[list[int], "float | None"]]  # a hand-over: each step's ids and its stamp


class QueueStreamer:
    """A ``BaseStreamer``: skips the prompt, stamps each put's token ids, and hands them to the
    event loop as lists of ``(ids, t)``: at once when unstamped (no clock), else at most every
    ``DELIVERY_S`` and before the end or an error."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, clock: Clock | None
    ) -> None:
        self._loop, self._queue, self._clock = loop, queue, clock
        self._prompt_seen = False
        self._pending: list[tuple[list[int], float | None]] = []
        self._sent_at: float | None = None

    def push(self, kind: str, value: Any = None) -> None:
        if kind != TOKENS:
            self._flush()  # tokens before the end or the error
        with contextlib.suppress(RuntimeError):  # the consumer's loop is gone: nobody listens
            self._loop.call_soon_threadsafe(self._queue.put_nowait, (kind, value))

    def put(self, value: Any) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        # .tolist() materializes the ids on the host (a device sync on CUDA) before the stamp.
        # Shapes: (B,) per plain step, (1, n) per assisted step.
        ids = value.tolist()
        t = self._clock() if self._clock is not None else None
        self._pending.append((ids[0] if value.dim() == 2 else ids, t))
        if t is None or self._sent_at is None or t - self._sent_at >= DELIVERY_S:
            self._sent_at = t
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            batch, self._pending = self._pending, []
            self.push(TOKENS, batch)

    def end(self) -> None:
        self.push(END)


def streamer_class() -> type:
    from transformers.generation.streamers import BaseStreamer

    return type("QueueStreamer", (QueueStreamer, BaseStreamer), {})


def request_chunk(
    ids: list[int],
    times: list[float],
    sizes: list[int],
    prompt: int | None,
    chat: bool,
    first: bool,
) -> Chunk:
    """One request's tokens of one hand-over: a stamp per step when there are several."""
    many = len(times) > 1
    return Chunk(
        tuple(ids),
        t=times[-1],
        times=tuple(times) if many else (),
        sizes=tuple(sizes) if many else (),
        prompt_tokens=prompt,
        info={"chat_template": chat} if first else None,
    )

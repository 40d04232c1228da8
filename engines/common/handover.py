"""A request's stamped step outputs on their way from an engine's stepping thread to its stream.

An in-process engine makes one token for each of many requests per step, on a thread other than
the event loop's (vLLM's: the process's one stepping thread, engines/vllm/stepper.py). One
Python object and one event-loop wake-up per token cost microseconds of interpreter time per
token (bench/RESULTS.md, section 5): at GPU rates (20,000+ tokens/s) a large share of a core,
taking the GIL from the engine's own loop. So the engine hands a step over as one object (its
outputs and one clock reading), the event loop files each output into its request's
:class:`Pending`, and a request's stream wakes at most every ``DELIVERY_S`` (at once when it
ends) and takes everything filed as one :class:`Chunk` whose ``times``/``sizes`` keep each
step's stamp: batching moves no timestamp.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

from engines.base import Chunk

# A request's stream wakes at most this often while it runs, and at once when it ends (its
# concurrency slot frees). Stamps make the hand-over's lateness invisible in the records.
DELIVERY_S = 0.5


class Pending:
    """One request's outputs filed on the event loop and not yet taken by its stream.

    ``times`` holds one stamp per step that gave the request tokens (None: unstamped, the runner
    stamps on arrival), ``sizes`` the tokens of each. Only the event loop's thread touches it.
    """

    __slots__ = ("ids", "times", "sizes", "text", "prompt_tokens", "finish_reason", "done")
    __slots__ += ("error", "waiter", "info")

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.times: list[float | None] = []
        self.sizes: list[int] = []
        self.text: list[str] = []
        self.prompt_tokens: int | None = None
        self.finish_reason: str | None = None
        self.done = False
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.info: Mapping[str, Any] | None = None  # joins the last chunk's info (at the end)

    def wake(self) -> None:
        w, self.waiter = self.waiter, None
        if w is not None and not w.done():
            w.set_result(None)

    def fail(self, exc: BaseException) -> None:
        """The request failed: its stream yields what was filed, then raises ``exc``."""
        self.error = exc
        self.wake()

    async def chunks(self, info: Mapping[str, Any] | None = None) -> AsyncIterator[Chunk]:
        """Wait for outputs and yield them until the request is done (or raise its error).

        Stamped outputs come as one chunk per wake-up with a stamp per step; unstamped ones as
        one chunk per step, so that the runner's arrival stamp is per step too."""
        loop = asyncio.get_running_loop()
        first = True
        while True:
            if not (self.times or self.done or self.error):
                self.waiter = loop.create_future()
                await self.waiter
            if self.times or self.done:
                for chunk in self._take(info if first else None, first):
                    yield chunk
                first = False
            if self.error is not None:
                raise self.error
            if self.done:
                return

    def _take(self, info: Mapping[str, Any] | None, first: bool) -> list[Chunk]:
        ids, times, sizes, text = self.ids, self.times, self.sizes, self.text
        self.ids, self.times, self.sizes, self.text = [], [], [], []
        reason = self.finish_reason if self.done else None
        prompt = self.prompt_tokens if first else None
        end = self.info if self.done else None
        joined = "".join(text)
        if len(times) <= 1 or times[0] is not None:
            last = times[-1] if times else None
            many = len(times) > 1
            if end:
                info = {**(info or {}), **end}
            return [
                Chunk(
                    token_ids=tuple(ids),
                    text=joined,
                    t=last,
                    times=tuple(times) if many else (),  # type: ignore[arg-type]
                    sizes=tuple(sizes) if many else (),
                    prompt_tokens=prompt,
                    finish_reason=reason,
                    info=info,
                )
            ]
        out = []
        pos = 0
        for k, n in enumerate(sizes):  # unstamped: a chunk per step, the runner stamps each
            last_one = k == len(sizes) - 1
            out.append(
                Chunk(
                    token_ids=tuple(ids[pos : pos + n]),
                    text=joined if last_one else "",
                    prompt_tokens=prompt if k == 0 else None,
                    finish_reason=reason if last_one else None,
                    info={**(info if k == 0 and info else {}), **(end if last_one and end else {})}
                    or None,
                )
            )
            pos += n
        return out

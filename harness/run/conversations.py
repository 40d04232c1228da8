"""The conversation driver: whole conversations through the runner, each turn sent once the
previous one's answer is in, with the variant's own answers in its history.

Why not a load strategy: a strategy says only when a request goes, and turn k's prompt does not
exist until turn k-1 has been answered by this very variant. So the driver builds each turn and
hands it to the runner (which owns the clock and times it like any request), and the strategy
still says when each conversation starts and how many are in flight (``max_concurrency``:
latency mode = one conversation at a time; ``--concurrency N`` = N). Under ``--request-rate``
a conversation's first turn is due at its scheduled start: its record keeps it, so the wait
for a conversation slot is its client queue (later turns go on the answer: no schedule).

Prefix cache: every conversation gets its own cache salt (vLLM's ``cache_salt``), so no
conversation reuses blocks another one cached (the effect of a reset between conversations, also
with N in flight), while the turns of one conversation share it: turn k reuses what turns
1..k-1 cached, as a served conversation does. The runner's record of turn k of conversation C
has the id ``C@tk`` (:func:`workloads.conversations.turn_id`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from engines.base import GenParams, Request, UnsupportedError
from harness.core.load import LoadStrategy, open_loop
from harness.core.records import RequestRecord
from harness.run.runner import Runner
from workloads.conversations import turn_id

CACHE_POLICY = (
    "conversations: each its own cache salt (none reuses another's blocks: a reset between "
    "conversations, never inside one); turn k reuses the blocks of turns 1..k-1"
)


def history(first: Request, answers: Sequence[str], turns: int) -> tuple[dict[str, str], ...]:
    """The messages of turn ``turns`` (1-based): turn 1's messages, then per later turn the
    variant's own answer to the previous turn and the next user turn."""
    msgs = [dict(m) for m in first.messages or ({"role": "user", "content": first.prompt or ""},)]
    for k in range(1, turns):
        msgs.append({"role": "assistant", "content": answers[k - 1]})
        msgs.append({"role": "user", "content": first.next_turns[k - 1]})
    return tuple(msgs)


def sender(runner: Runner, settings: Mapping[str, Any] | None) -> Any:
    """What sends a run's requests: the runner itself, or (``settings``: the plan's
    ``conversations``) the conversation driver over it."""
    return runner.run if settings is None else Conversations(runner, settings).run


class Conversations:
    """Sends a run's conversations through ``runner``; ``think_time_s`` between an answer and
    the next turn (the runner's sleep: the fake clock in tests)."""

    def __init__(self, runner: Runner, settings: Mapping[str, Any] | None = None) -> None:
        self.runner = runner
        self.think_time = float((settings or {}).get("think_time_s") or 0.0)

    async def run(
        self,
        requests: Sequence[Request],
        params: GenParams,
        strategy: LoadStrategy,
        *,
        warmup: bool = False,
        duration: float | None = None,
    ) -> list[RequestRecord]:
        """Every conversation to its end (or to the first failed turn: its answer is missing);
        conversation i starts at ``strategy.offsets(n)[i]``; records in finishing order."""
        del duration  # refused for conversations (harness.flags.workload.check)
        runner = self.runner
        cap = strategy.max_concurrency
        if cap != 1 and runner.engine.max_batch() == 1:
            raise UnsupportedError("unsupported (batch size 1 only: one conversation at a time)")
        slots = asyncio.Semaphore(cap) if cap else None
        offsets = strategy.offsets(len(requests))
        t0 = runner.clock()
        out: list[RequestRecord] = []

        due_at = open_loop(strategy)  # a rate: each conversation's first turn is due then

        async def one(conv: Request, offset: float) -> None:
            delay = t0 + offset - runner.clock()
            if delay > 0:
                await runner.sleep(delay)
            if slots is not None:
                await slots.acquire()
            try:
                due = t0 + offset if due_at else None
                await self._conversation(conv, params, warmup, out, due)
            finally:
                if slots is not None:
                    slots.release()

        tasks = [asyncio.ensure_future(one(c, o)) for c, o in zip(requests, offsets)]
        try:
            await asyncio.gather(*tasks)
        except asyncio.CancelledError:
            for t in tasks:
                t.cancel()
            raise
        return out

    async def _conversation(
        self, conv: Request, params: GenParams, warmup: bool, out: list[RequestRecord],
        due: float | None = None,
    ) -> None:  # fmt: skip
        """Turn by turn; turn 1 keeps the conversation's scheduled arrival ``due`` (the wait for
        a slot is its client queue), later turns go on the answer (no schedule)."""
        runner = self.runner
        salt = f"conversation-{conv.id}" + (f"/{conv.cache_salt}" if conv.cache_salt else "")
        answers: list[str] = []
        for k in range(1, 2 + len(conv.next_turns)):
            if runner.should_stop():
                return
            if k > 1 and self.think_time > 0:
                await runner.sleep(self.think_time)
            turn = Request(
                turn_id(conv.id, k),
                messages=history(conv, answers, k),
                max_new_tokens=conv.max_new_tokens,
                category=conv.category,
                source=conv.source,
                cache_salt=salt,
            )
            record = await runner.send(turn, params, warmup=warmup, due=due if k == 1 else None)
            out.append(record)
            if not record.ok:
                return  # turn k+1 needs this answer
            answers.append(record.output_text or "")

"""The OpenAI streaming wire format: server-sent events in, :class:`~engines.base.Chunk` out.

Lines are split by hand over aiohttp's ``iter_any`` (no line-length limit); each event's ``data``
is decoded by the engine and turned into chunks by :func:`parse_event`; :class:`StreamEnd` says
whether the stream was complete. Servers differ here: vLLM, SGLang and llama.cpp end with
``data: [DONE]``; transformers serve ends with a chunk carrying ``finish_reason`` and ``usage``
and closes the body. Both are complete; a body that ends before either was cut.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from engines.base import Chunk, Clock

MAX_EVENT = 1 << 28  # 256 MiB: a "line" longer than this is a broken server, not a token


class RequestFailed(Exception):
    """One request failed; ``str(exc)`` is one line starting with ``kind`` (e.g. ``http 429: ...``).

    Kinds: ``http`` (with ``status``), ``connection refused``, ``connection reset``,
    ``incomplete stream``, ``bad sse``, ``server error`` (an error event in the stream),
    ``timeout``, ``unsupported``, ``client error``.
    """

    def __init__(self, kind: str, detail: str = "", status: int | None = None) -> None:
        self.kind = kind
        self.status = status
        head = f"{kind} {status}" if status is not None else kind
        text = f"{head}: {detail}" if detail else head
        super().__init__(" ".join(text.split())[:500])


async def sse_events(
    resp: aiohttp.ClientResponse, clock: Clock | None = None
) -> AsyncIterator[tuple[str, float | None]]:
    """The ``data`` of each SSE event (multi-line data joined by newlines), in order, with the
    time its last bytes were read (``clock()`` as the read returned; None without a clock).

    Lines are split by hand over ``iter_any`` so no line-length limit applies (aiohttp's
    ``readline`` fails on lines above its buffer; vLLM issue #39963).
    """
    buf = b""
    data: list[str] = []
    t = None
    async for piece in resp.content.iter_any():
        if clock is not None:
            t = clock()  # as vllm bench does: the read, before any parsing
            # then let the other streams whose reads are ready take their stamps before this
            # one parses: under load a stamp waits for reads, not for other streams' parsing
            await asyncio.sleep(0)
        buf += piece
        if b"\n" not in piece:
            if len(buf) > MAX_EVENT:
                raise RequestFailed("bad sse", f"line longer than {MAX_EVENT} bytes")
            continue
        *lines, buf = buf.split(b"\n")  # every complete line of this read, in one pass
        for line in lines:
            if line[-1:] == b"\r":
                line = line[:-1]
            if not line:
                if data:
                    yield "\n".join(data), t
                    data = []
            elif line[:5] == b"data:":
                value = line[5:]
                data.append((value[1:] if value[:1] == b" " else value).decode())
            # comments (":...") and other fields (event, id, retry) carry nothing we use
    tail = buf.rstrip(b"\r")
    if tail.startswith(b"data:"):
        data.append(tail[5:].lstrip(b" ").decode())
    if data:
        yield "\n".join(data), t


def _choice_text(choice: Mapping[str, Any], chat: bool) -> str:
    if not chat:
        return str(choice.get("text") or "")
    delta = choice.get("delta") or {}
    text = str(delta.get("content") or "")
    text += str(delta.get("reasoning_content") or delta.get("reasoning") or "")
    for call in delta.get("tool_calls") or ():
        text += str(((call or {}).get("function") or {}).get("arguments") or "")
    return text


def parse_event(obj: Any, chat: bool, t: float | None = None, steps: bool = False) -> list[Chunk]:
    """The chunks one decoded SSE event carries (choice 0 only; usage as a zero-token chunk),
    stamped ``t`` (when the event was read). Without token ids an event counts one token when it
    has text; with ``steps`` (a vLLM server: an event per engine step, or several steps merged
    when its API process read them late; ``vllm bench serve`` counts each event as one) also
    when its text is empty (a special token, bytes of a split character), a chat role-only
    delta aside."""
    if not isinstance(obj, dict):
        raise RequestFailed("bad sse", f"event is not a JSON object: {str(obj)[:80]}")
    if obj.get("error"):
        err = obj["error"]
        msg = err.get("message", err) if isinstance(err, dict) else err
        raise RequestFailed("server error", str(msg))
    out: list[Chunk] = []
    for choice in obj.get("choices") or ():
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            continue
        text = _choice_text(choice, chat)
        raw = choice.get("token_ids")
        ids = tuple(map(int, raw)) if isinstance(raw, list) else None
        n = len(ids) if ids is not None else (1 if text or (steps and _step(choice)) else 0)
        finish = choice.get("finish_reason")
        if n or finish:
            out.append(Chunk(ids or (), n, text=text, finish_reason=finish, t=t))
    usage = obj.get("usage")
    if isinstance(usage, dict):
        # vLLM's --per-request-spec-decode-metrics: this request's acceptance, beside its usage
        spec = (obj.get("metrics") or {}).get("speculative_decoding")
        out.append(
            Chunk(
                num_tokens=0,
                prompt_tokens=usage.get("prompt_tokens"),
                usage_output_tokens=usage.get("completion_tokens"),
                info={"spec_decode": spec} if isinstance(spec, dict) else None,
            )
        )
    return out


def answer_event(obj: Any, chat: bool) -> bool:
    """Whether a decoded event carries choice 0 of the answer (a chat role-only delta aside),
    text or not: the event ``vllm bench serve`` takes as the first token on completions even
    when its text is empty (a special token). A stream whose only token had no text then still
    has a first-token time (engines.openai.engine, ``info.first_token_from``)."""
    if not isinstance(obj, dict):
        return False
    for choice in obj.get("choices") or ():
        if isinstance(choice, dict) and choice.get("index", 0) == 0:
            return not chat or _step(choice)
    return False


def _step(choice: Mapping[str, Any]) -> bool:
    """A vLLM event that carried a step's tokens: not chat's first, role-only delta."""
    return "role" not in (choice.get("delta") or {})


DONE = "[DONE]"
FINISH_CLOSE = "finish_reason, close"  # a chunk with finish_reason, then a clean end of the body
# a record's info.first_token_from: where its first-token time (TTFT) came from
TOKEN_CHUNK = "token chunk"  # the first event that carried a token (text, ids, a vLLM step)
FIRST_EVENT = "first answer event (no text)"  # none did, usage counts output: answer_event()


@dataclass
class StreamEnd:
    """What a stream has said about its end so far; :meth:`close` names the ending,
    :meth:`first_token` where its TTFT comes from."""

    done: bool = False
    finish_reason: str | None = None
    usage: bool = False
    usage_output: int | None = None  # the server's count of output tokens
    answered: bool = False  # an event of the answer came (answer_event), text or not
    t_answer: float | None = None  # when the first one was read

    def see(self, chunks: Iterable[Chunk], event: Any = None, chat: bool = False) -> None:
        """``chunks`` parsed from the decoded ``event``."""
        if not self.answered and answer_event(event, chat):
            self.answered = True
            self.t_answer = next((c.t for c in chunks if c.t is not None), None)
        for c in chunks:
            if c.finish_reason:
                self.finish_reason = c.finish_reason
            if c.usage_output_tokens is not None or c.prompt_tokens is not None:
                self.usage = True
            if c.usage_output_tokens is not None:
                self.usage_output = c.usage_output_tokens

    def first_token(self, token_seen: bool, replica: str) -> tuple[str | None, Chunk | None]:
        """``info.first_token_from`` for the record, and the one-token chunk to yield when no
        event carried a token yet the server counts output (the answer's first event, stamped
        when it was read: as ``vllm bench serve`` takes it)."""
        if token_seen:
            return TOKEN_CHUNK, None
        if (self.usage_output or 0) >= 1 and self.answered:
            return FIRST_EVENT, Chunk(num_tokens=1, t=self.t_answer, info={"replica": replica})
        return None, None

    def close(self) -> str:
        """The ending once the body ended cleanly: :data:`DONE` or :data:`FINISH_CLOSE`.

        Raises ``incomplete stream`` when neither came: the server stopped mid-answer.
        """
        if self.done:
            return DONE
        if self.finish_reason is not None:
            return FINISH_CLOSE
        raise RequestFailed("incomplete stream", "body ended before [DONE] or a finish_reason")

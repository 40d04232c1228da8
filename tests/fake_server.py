"""A scripted local OpenAI-compatible SSE server for timing and fault tests.

Only what a real server cannot produce on demand is faked: known per-token delays, HTTP errors,
resets, stalls, broken SSE. Usage::

    server = FakeServer(lambda i: Behaviour(tokens=8, delay=0.01))   # i = arrival index
    async with server as base_url:                                   # "http://127.0.0.1:P/v1"
        ...                                                          # server.requests: what came

A script may also be a single :class:`Behaviour` (every request gets it). Token ``k`` of a
stream has id ``TOKEN_BASE + k`` and text ``f"t{k} "``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from aiohttp import web

TOKEN_BASE = 1000
FAULTS = ("reset", "stall", "bad_json", "no_done", "error_event")


@dataclass(frozen=True)
class Behaviour:
    """How the server answers one request.

    ``first_delay`` (default ``delay``) is slept before the first event, ``delay`` before each
    later one. ``fault`` strikes after ``fault_after`` token events: ``reset`` aborts the TCP
    connection, ``stall`` goes silent for ``stall_s``, ``bad_json`` sends an unparsable event,
    ``no_done`` ends the stream cleanly without ``[DONE]``, ``error_event`` sends vLLM's
    in-stream error object then ``[DONE]``. ``status`` answers an HTTP error instead.

    Other servers' shapes: ``preamble`` sends a role-only delta (chat) or an empty text (completions)
    at once, before the first token; ``finish_apart`` puts ``finish_reason`` in an empty chunk of
    its own after the tokens; ``usage_in_last`` attaches usage to the last chunk instead of a
    separate one; ``done=False`` ends the body without ``[DONE]`` (transformers serve:
    ``preamble, finish_apart, usage_in_last, done=False``).
    """

    tokens: int = 8
    obey_max_tokens: bool = False  # as a real server: at most the body's max_tokens tokens
    per_chunk: int = 1
    delay: float = 0.0
    first_delay: float | None = None
    token_ids: bool = True  # include choices[0].token_ids (vLLM's return_token_ids)
    ids_if_asked: bool = False  # as vLLM: token ids only when the body has return_token_ids
    blank: tuple[int, ...] = ()  # tokens whose text is empty (a special token, part of a char)
    usage: bool = True
    big_line: int = 0  # > 0: the first event's text is this many bytes (one huge SSE line)
    multiline: bool = False  # split each event's JSON over two ``data:`` lines
    crlf: bool = False  # end lines with CRLF
    comments: bool = False  # send ``: ping`` comment lines between events
    status: int | None = None
    fault: str | None = None
    fault_after: int = 0
    stall_s: float = 3600.0
    preamble: bool = False
    finish_apart: bool = False
    usage_in_last: bool = False
    done: bool = True

    def __post_init__(self) -> None:
        if self.fault not in (None, *FAULTS):
            raise ValueError(f"unknown fault {self.fault!r}; choose from {FAULTS}")


@dataclass(frozen=True)
class Received:
    """One request the server saw."""

    index: int
    path: str
    headers: Mapping[str, str]
    body: Mapping[str, Any]


def render_metrics(
    num_drafts: int = 0,
    num_draft_tokens: int = 0,
    num_accepted_tokens: int = 0,
    accepted_per_pos: tuple[int, ...] = (),
    running: int = 0,
    waiting: int = 0,
    model: str = "fake-model",
) -> str:
    """A /metrics page in vLLM's exposition format (counters with ``_total`` and ``_created``)."""
    lab = f'engine="0",model_name="{model}"'
    lines = []
    for name, value in (("running", running), ("waiting", waiting)):
        lines += [
            f"# HELP vllm:num_requests_{name} Number of requests.",
            f"# TYPE vllm:num_requests_{name} gauge",
            f"vllm:num_requests_{name}{{{lab}}} {float(value)}",
        ]
    counters = (
        ("num_drafts", num_drafts),
        ("num_draft_tokens", num_draft_tokens),
        ("num_accepted_tokens", num_accepted_tokens),
    )
    for name, value in counters:
        full = f"vllm:spec_decode_{name}"
        lines += [
            f"# HELP {full} Spec decode counter.",
            f"# TYPE {full} counter",
            f"{full}_total{{{lab}}} {float(value)}",
            f"{full}_created{{{lab}}} 1.7e9",
        ]
    full = "vllm:spec_decode_num_accepted_tokens_per_pos"
    lines += [f"# HELP {full} Accepted tokens per draft position.", f"# TYPE {full} counter"]
    for pos, value in enumerate(accepted_per_pos):
        lines.append(f'{full}_total{{{lab},position="{pos}"}} {float(value)}')
    return "\n".join(lines) + "\n"


@dataclass
class FakeServer:
    """An aiohttp server on 127.0.0.1 and a free port, answering each request per ``script``."""

    script: Callable[[int], Behaviour] | Behaviour = field(default_factory=Behaviour)
    model: str = "fake-model"
    vllm: bool = True  # serve /version and say ``owned_by: vllm`` (so vLLM extras are sent)
    metrics: str | Callable[[], str] | None = None  # /metrics text; None -> 404
    api_key: str | None = None  # when set, other bearer tokens get 401
    models_status: int | None = None  # /v1/models answers this error (transformers serve: 500)
    models_reset: bool = False  # /v1/models drops the connection without an answer
    listed: list[str] | None = None  # what /v1/models lists (default: [model])
    models_body: Any = None  # when set, /v1/models answers this JSON as it is
    owned_by: str | None = None  # the model cards' owned_by (default: "vllm" if vllm else "fake")
    version: bool | None = None  # serve /version (default: as vllm; SGLang serves it too)
    requests: list[Received] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._runner: web.AppRunner | None = None
        self._closing = asyncio.Event()
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def __aenter__(self) -> str:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/version", self._version)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_post("/v1/chat/completions", self._generate)
        self._runner = web.AppRunner(
            app, handle_signals=False, access_log=None, shutdown_timeout=0.5
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, backlog=4096)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self.base_url

    async def __aexit__(self, *exc: object) -> None:
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ---- handlers --------------------------------------------------------------------------
    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _models(self, request: web.Request) -> web.Response:
        if self.models_reset and request.transport is not None:
            request.transport.abort()
        if self.models_status is not None:
            return web.Response(text="Internal Server Error", status=self.models_status)
        if self.models_body is not None:
            return web.json_response(self.models_body)
        owner = self.owned_by or ("vllm" if self.vllm else "fake")
        names = [self.model] if self.listed is None else self.listed
        data = [{"id": m, "object": "model", "owned_by": owner} for m in names]
        return web.json_response({"object": "list", "data": data})

    async def _version(self, request: web.Request) -> web.Response:
        if not (self.vllm if self.version is None else self.version):
            raise web.HTTPNotFound()
        return web.json_response({"version": "0.0.0-fake"})

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.metrics is None:
            raise web.HTTPNotFound()
        text = self.metrics() if callable(self.metrics) else self.metrics
        return web.Response(text=text, content_type="text/plain")

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        index = len(self.requests)
        self.requests.append(Received(index, request.path, dict(request.headers), body))
        auth = request.headers.get("Authorization")
        if self.api_key is not None and auth != f"Bearer {self.api_key}":
            return web.json_response({"error": {"message": "bad key"}}, status=401)
        b = self.script(index) if callable(self.script) else self.script
        if b.obey_max_tokens and isinstance(body.get("max_tokens"), int):
            b = replace(b, tokens=min(b.tokens, body["max_tokens"]))
        if b.status is not None:
            return web.json_response(
                {"error": {"message": f"scripted {b.status}"}}, status=b.status
            )
        chat = request.path.endswith("/chat/completions")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        eol = b"\r\n" if b.crlf else b"\n"
        try:
            await self._stream(request, resp, b, chat, body, eol)
        except (ConnectionResetError, asyncio.CancelledError):
            return resp
        return resp

    async def _stream(
        self,
        request: web.Request,
        resp: web.StreamResponse,
        b: Behaviour,
        chat: bool,
        body: Mapping[str, Any],
        eol: bytes,
    ) -> None:
        async def send(obj: Any) -> None:
            data = obj if isinstance(obj, str) else json.dumps(obj)
            if b.comments:
                await resp.write(b": ping" + eol)
            if b.multiline and data.startswith("{") and "," in data:
                cut = data.index(",") + 1
                lines = [data[:cut], data[cut:]]
            else:
                lines = [data]
            await resp.write(b"".join(b"data: " + ln.encode() + eol for ln in lines) + eol)

        def event(text: str, ks: range, finish: str | None) -> dict[str, Any]:
            choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
            if chat:
                choice["delta"] = {"content": text} if text else {}
            else:
                choice["text"] = text
            if b.token_ids and (body.get("return_token_ids") or not b.ids_if_asked):
                choice["token_ids"] = [TOKEN_BASE + k for k in ks]
            return {"id": "x", "model": self.model, "choices": [choice]}

        prompt = body.get("prompt") or json.dumps(body.get("messages"))
        n_prompt = len(str(prompt).split())
        usage = {
            "prompt_tokens": n_prompt,
            "completion_tokens": b.tokens,
            "total_tokens": n_prompt + b.tokens,
        }
        if b.preamble:
            pre = event("", range(0), None)
            if chat:
                pre["choices"][0]["delta"] = {"role": "assistant"}
            await send(pre)
        sent, events = 0, 0
        while sent < b.tokens:
            if events == b.fault_after and await self._fault(request, resp, b, send):
                return
            first = events == 0
            await asyncio.sleep(b.first_delay if first and b.first_delay is not None else b.delay)
            n = min(b.per_chunk, b.tokens - sent)
            ks = range(sent, sent + n)
            text = "".join(f"t{k} " for k in ks if k not in b.blank)
            if first and b.big_line:
                text = "x" * b.big_line
            last = sent + n == b.tokens
            obj = event(text, ks, "length" if last and not b.finish_apart else None)
            if last and b.usage and b.usage_in_last and not b.finish_apart:
                obj["usage"] = usage
            await send(obj)
            sent, events = sent + n, events + 1
        if events == b.fault_after and await self._fault(request, resp, b, send):
            return
        if b.finish_apart:
            obj = event("", range(0), "length")
            if b.usage and b.usage_in_last:
                obj["usage"] = usage
            await send(obj)
        if b.usage and not b.usage_in_last:
            await send({"id": "x", "model": self.model, "choices": [], "usage": usage})
        if b.done:
            await send("[DONE]")

    async def _fault(
        self, request: web.Request, resp: web.StreamResponse, b: Behaviour, send
    ) -> bool:
        """Apply ``b.fault`` now; True when the stream must end here."""
        if b.fault is None:
            return False
        if b.fault == "reset":
            if request.transport is not None:
                request.transport.abort()
            return True
        if b.fault == "stall":
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._closing.wait(), b.stall_s)
            return True
        if b.fault == "bad_json":
            await send('{"choices": [ this is not json')
            await send("[DONE]")
            return True
        if b.fault == "error_event":
            await send({"error": {"message": "EngineCore died", "type": "Internal", "code": 500}})
            await send("[DONE]")
            return True
        return True  # no_done: end the chunked body cleanly, no [DONE]

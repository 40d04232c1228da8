"""A recording pass-through in front of a server: every request is forwarded as it came and its
answer streamed back as it arrives, and each JSON request body is kept. The fidelity benchmark
puts it between each client and ``vllm serve`` for the untimed warm-up only, to compare what
the clients asked the server to do (never while timing: the extra hop costs time)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from aiohttp import web

HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}

# Request fields that cost a vLLM server nothing at these values: vLLM's own defaults.
DEFAULTS: dict[str, Any] = {"top_p": 1.0, "repetition_penalty": 1.0, "logprobs": None}
CONTENT = ("prompt", "messages")  # what is asked, not how: the same prompt file on both sides


class Recorder:
    """``async with Recorder(target_root) as root:`` send to ``root``; ``bodies`` holds what came."""

    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")
        self.bodies: list[dict[str, Any]] = []
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> str:
        app = web.Application(client_max_size=1 << 26)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._http = aiohttp.ClientSession(auto_decompress=False)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._http is not None:
            await self._http.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._http is not None
        data = await request.read()
        if data and request.content_type == "application/json":
            self.bodies.append(json.loads(data))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        url = self.target + request.path_qs
        async with self._http.request(request.method, url, data=data, headers=headers) as up:
            out = {k: v for k, v in up.headers.items() if k.lower() not in HOP}
            resp = web.StreamResponse(status=up.status, headers=out)
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp


def generation_bodies(bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [b for b in bodies if any(k in b for k in CONTENT)]


def costly_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The fields on which two request bodies differ in work asked of a vLLM server (the prompt
    itself aside): not a field
    that is vLLM's default in both (absent counts as default), nor ``seed`` at temperature 0 in
    both (a seed gives a request its own random generator only when it samples)."""
    greedy = a.get("temperature") == 0 == b.get("temperature")
    out = []
    for k in sorted((set(a) | set(b)) - set(CONTENT)):
        x, y = a.get(k, DEFAULTS.get(k)), b.get(k, DEFAULTS.get(k))
        if x == y or (k == "seed" and greedy):
            continue
        out.append(k)
    return out

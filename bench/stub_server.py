"""A minimal OpenAI-completions SSE server with known timing, for client benchmarks.

``POST /v1/completions`` streams ``max_tokens`` one-token events. The first goes ``stub_ttft_ms``
after the request arrived, each next one ``stub_itl_ms`` after the previous one's schedule
(absolute deadlines, so sleep overshoot does not accumulate); both come from the request body
(``extra_body``) and default to 0. With ``--log`` the server appends, per request, the first
prompt line (the key), the arrival time and the send time of every token, all on
``time.perf_counter`` (CLOCK_MONOTONIC, shared by every process on the machine).

Run: ``python -m bench.stub_server --port 8123 [--log FILE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from aiohttp import web

MODEL = "stub"


def _event(i: int, n: int, model: str) -> bytes:
    choice: dict[str, Any] = {"index": 0, "text": f" t{i}", "finish_reason": None}
    if i == n - 1:
        choice["finish_reason"] = "length"
    obj = {"id": "cmpl-stub", "object": "text_completion", "model": model, "choices": [choice]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


class Stub:
    def __init__(self, log_path: str | None) -> None:
        self.log = open(log_path, "a", buffering=1 << 16) if log_path else None  # noqa: SIM115

    async def models(self, _: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "stub"}]}
        )

    async def health(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        t_recv = time.perf_counter()
        body = await request.json()
        n = int(body.get("max_tokens") or 16)
        ttft = float(body.get("stub_ttft_ms", 0)) / 1e3
        itl = float(body.get("stub_itl_ms", 0)) / 1e3
        prompt = body.get("prompt") or ""
        prompt = prompt if isinstance(prompt, str) else str(prompt)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        sends: list[float] = []
        for i in range(n):
            deadline = t_recv + ttft + i * itl
            delay = deadline - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await resp.write(_event(i, n, MODEL))
            sends.append(time.perf_counter())
        usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": n}
        tail = {"id": "cmpl-stub", "object": "text_completion", "choices": [], "usage": usage}
        await resp.write(b"data: " + json.dumps(tail).encode() + b"\n\ndata: [DONE]\n\n")
        await resp.write_eof()
        if self.log is not None:
            key = prompt.split("\n", 1)[0]
            self.log.write(json.dumps({"key": key, "recv": t_recv, "sends": sends}) + "\n")
        return resp

    async def flush(self, _: web.Request) -> web.Response:
        if self.log is not None:
            self.log.flush()
        return web.Response(text="ok")


def app(log_path: str | None = None) -> web.Application:
    stub = Stub(log_path)
    a = web.Application()
    a.router.add_get("/v1/models", stub.models)
    a.router.add_get("/health", stub.health)
    a.router.add_post("/v1/completions", stub.completions)
    a.router.add_post("/flush", stub.flush)
    return a


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--log", default=None)
    args = ap.parse_args()
    web.run_app(app(args.log), host="127.0.0.1", port=args.port, print=None, backlog=1024)


if __name__ == "__main__":
    main()

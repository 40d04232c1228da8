"""The OpenAI-compatible engine against the scripted fake server (tests/fake_server.py).

Each test plays the runner: it drives ``stream`` itself and owns the clock.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import pytest

from engines.base import Chunk, EngineConfig, EngineError, GenParams, SpecCounters
from engines.openai import prom
from engines.openai.engine import OpenAIEngine
from engines.openai.prom import parse_metrics
from engines.openai.sse import RequestFailed, sse_events
from tests.fake_server import TOKEN_BASE, Behaviour, FakeServer, render_metrics
from workloads.base import Request

PROMPT = Request(id="r0", prompt="one two three", max_new_tokens=8)
CHAT = Request(id="c0", messages=({"role": "user", "content": "hello there"},), max_new_tokens=8)
PARAMS = GenParams(ignore_eos=True)  # the length: each request carries its own


def _config(*urls: str, **options: Any) -> EngineConfig:
    return EngineConfig(engine="openai", model="m", options={"base_urls": list(urls), **options})


async def _collect(engine: OpenAIEngine, req: Request = PROMPT, params: GenParams = PARAMS):
    return [c async for c in engine.stream(req, params)]


def _run(
    script: Callable[[int], Behaviour] | Behaviour,
    body: Callable[[OpenAIEngine, FakeServer], Awaitable[Any]],
    server_kw: dict[str, Any] | None = None,
    **options: Any,
) -> Any:
    """Start a fake server and an engine on it, run ``body(engine, server)``, close both."""

    async def main() -> Any:
        server = FakeServer(script, **(server_kw or {}))
        async with server as url:
            engine = OpenAIEngine(_config(url, **options))
            await engine.start()
            try:
                return await body(engine, server)
            finally:
                await engine.close()

    return asyncio.run(main())


def _tokens(chunks: list[Chunk]) -> int:
    return sum(c.size for c in chunks)


# ---- happy path ------------------------------------------------------------------------------
def test_token_ids_per_chunk_and_usage() -> None:
    async def body(engine: OpenAIEngine, server: FakeServer) -> None:
        chunks = await _collect(engine)
        timed = [c for c in chunks if c.size]
        assert [c.size for c in timed] == [3, 3, 3, 1]
        ids = [t for c in timed for t in c.token_ids]
        assert ids == [TOKEN_BASE + k for k in range(10)]
        assert timed[0].text == "t0 t1 t2 " and timed[-1].finish_reason == "length"
        assert timed[0].info == {"replica": server.base_url}
        usage, end = chunks[-2:]
        assert usage.size == 0 and usage.usage_output_tokens == 10 and usage.prompt_tokens == 3
        assert end.size == 0 and end.info == {
            "stream_end": "[DONE]",
            "output_tokens_from": "server usage",
            "first_token_from": "token chunk",
        }
        sent = server.requests[0]
        assert sent.path == "/v1/completions"
        assert sent.body["stream"] is True and sent.body["stream_options"] == {
            "include_usage": True
        }
        # ignore_eos alone reaches max_tokens on vLLM; min_tokens would add its logits processor
        assert sent.body["max_tokens"] == 8 and "min_tokens" not in sent.body
        assert sent.body["ignore_eos"] is True and sent.body["return_token_ids"] is True
        assert sent.body["model"] == "fake-model" and sent.body["seed"] == 0
        assert engine.describe()["token_ids_asked"] is True

    _run(Behaviour(tokens=10, per_chunk=3, ids_if_asked=True), body)


def test_without_token_ids_counts_come_from_usage() -> None:
    """Option token_ids=False (a run that compares nothing): a vLLM server is not asked for ids;
    each event counts one token, the server's usage gives the total."""

    async def body(engine: OpenAIEngine, server: FakeServer) -> None:
        chunks = await _collect(engine)
        timed = [c for c in chunks if c.size]
        assert all(not c.token_ids for c in timed) and _tokens(timed) == 10  # blank ones too
        assert [c.usage_output_tokens for c in chunks if c.usage_output_tokens] == [10]
        assert chunks[-1].info["output_tokens_from"] == "server usage"
        sent = server.requests[0].body
        assert "return_token_ids" not in sent and "min_tokens" not in sent
        assert sent["ignore_eos"] is True
        assert engine.describe()["token_ids_asked"] is False
        assert engine.client_config().options["token_ids"] is False  # client workers too

    _run(Behaviour(tokens=10, ids_if_asked=True, blank=(0, 4)), body, token_ids=False)


def test_chat_multiline_crlf_comments_and_text_only_server() -> None:
    """A plain OpenAI server (no /version): no vLLM extras, one token per text event."""
    b = Behaviour(tokens=5, token_ids=False, multiline=True, crlf=True, comments=True)

    async def body(engine: OpenAIEngine, server: FakeServer) -> None:
        chunks = await _collect(engine, replace(CHAT, max_new_tokens=5), GenParams())
        timed = [c for c in chunks if c.size]
        assert [c.num_tokens for c in timed] == [1] * 5 and all(not c.token_ids for c in timed)
        assert "".join(c.text for c in timed) == "t0 t1 t2 t3 t4 "
        sent = server.requests[0]
        assert sent.path == "/v1/chat/completions"
        assert sent.body["messages"] == [{"role": "user", "content": "hello there"}]
        assert not {"return_token_ids", "ignore_eos", "min_tokens"} & set(sent.body)
        assert engine.describe()["vllm_extras"] is False
        assert engine.describe()["token_ids_asked"] is False

    _run(b, body, {"vllm": False})


def test_round_robin_over_two_replicas() -> None:
    async def main() -> None:
        a, b = FakeServer(Behaviour(tokens=2)), FakeServer(Behaviour(tokens=2))
        async with a as url_a, b as url_b:
            engine = OpenAIEngine(_config(url_a, url_b))
            await engine.start()
            replicas = [(await _collect(engine))[0].info["replica"] for _ in range(6)]
            await engine.close()
        assert replicas == [url_a, url_b] * 3
        assert len(a.requests) == len(b.requests) == 3

    asyncio.run(main())


def test_one_megabyte_sse_line() -> None:
    async def body(engine: OpenAIEngine, server: FakeServer) -> None:
        chunks = await _collect(engine)
        assert len(chunks[0].text) == 1 << 20 and chunks[0].token_ids == (TOKEN_BASE,)
        assert _tokens(chunks) == 3

    _run(Behaviour(tokens=3, big_line=1 << 20), body)


def test_chunk_timing_follows_injected_delays() -> None:
    first, gap = 0.15, 0.1

    async def body(engine: OpenAIEngine, server: FakeServer) -> None:
        t_send = time.perf_counter()
        times = [time.perf_counter() async for c in engine.stream(PROMPT, PARAMS) if c.size]
        assert len(times) == 6
        ttft, gaps = times[0] - t_send, [b - a for a, b in zip(times, times[1:])]
        assert ttft >= first - 0.005 and min(gaps) >= gap - 0.005  # never early
        # late by the machine's scheduling only: within one gap more (a machine 3x slower than
        # a loaded 2-core one adds tens of ms, not 100); 20 ms was a bet on the load
        assert statistics.median(gaps) < 2 * gap, gaps

    _run(Behaviour(tokens=6, delay=gap, first_delay=first), body)


def test_chunks_are_stamped_when_read_given_a_clock() -> None:
    """With the runner's clock, each chunk carries the time its bytes were read: after the send,
    before the consumer sees it, and the gaps follow the server's delays."""
    gap = 0.05

    async def body(engine: OpenAIEngine, server: FakeServer) -> None:
        t_send = time.perf_counter()
        seen = []
        async for c in engine.stream(PROMPT, PARAMS, time.perf_counter):
            if c.size:
                seen.append((c.t, time.perf_counter()))
        stamps = [t for t, _ in seen]
        assert len(stamps) == 4 and None not in stamps
        assert t_send < stamps[0] and all(t <= arrived for t, arrived in seen)
        gaps = [b - a for a, b in zip(stamps, stamps[1:])]
        assert min(gaps) >= gap - 0.005 and statistics.median(gaps) < 2 * gap, gaps  # as above
        plain = [c.t for c in await _collect(engine) if c.size]
        assert plain == [None] * 4  # no clock: the runner times arrival

    _run(Behaviour(tokens=4, delay=gap), body)


def test_api_key_sent_as_bearer_and_never_described(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-test-0123456789"
    monkeypatch.setenv("MY_KEY", secret)

    async def body(engine: OpenAIEngine, server: FakeServer) -> None:
        await _collect(engine)
        assert server.requests[0].headers["Authorization"] == f"Bearer {secret}"
        assert secret not in repr(engine.describe())
        assert engine.describe()["api_key_set"] is True

    _run(Behaviour(tokens=2), body, {"api_key": secret}, api_key_env="MY_KEY")


def test_api_key_file(tmp_path) -> None:
    (tmp_path / "key").write_text("sk-file\n")

    async def body(engine: OpenAIEngine, server: FakeServer) -> None:
        assert _tokens(await _collect(engine)) == 2

    _run(Behaviour(tokens=2), body, {"api_key": "sk-file"}, api_key_file=str(tmp_path / "key"))


def test_two_hundred_concurrent_streams() -> None:
    async def body(engine: OpenAIEngine, server: FakeServer) -> None:
        reqs = [Request(id=str(i), prompt=f"p {i}", max_new_tokens=8) for i in range(200)]
        results = await asyncio.gather(*(_collect(engine, r) for r in reqs))
        assert [_tokens(c) for c in results] == [16] * 200
        assert len(server.requests) == 200

    _run(Behaviour(tokens=16, per_chunk=2, delay=0.01), body, max_concurrency=200)


# ---- faults ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("behaviour", "kind", "start"),
    [
        (Behaviour(status=500), "http", "http 500: "),
        (Behaviour(status=503), "http", "http 503: "),
        (Behaviour(status=429), "http", "http 429: "),
        (
            Behaviour(tokens=6, fault="reset", fault_after=2),
            "connection reset",
            "connection reset:",
        ),
        (Behaviour(tokens=6, fault="no_done", fault_after=3), "incomplete stream", "incomplete"),
        (Behaviour(tokens=6, fault="bad_json", fault_after=1), "bad sse", "bad sse: "),
        (Behaviour(tokens=6, fault="error_event", fault_after=1), "server error", "server error:"),
    ],
)
def test_fault_raises_request_failed(behaviour: Behaviour, kind: str, start: str) -> None:
    seen: list[Chunk] = []

    async def body(engine: OpenAIEngine, server: FakeServer) -> None:
        with pytest.raises(RequestFailed) as info:
            async for c in engine.stream(PROMPT, PARAMS):
                seen.append(c)
        assert info.value.kind == kind
        assert str(info.value).startswith(start) and "\n" not in str(info.value)
        if behaviour.status is not None:
            assert info.value.status == behaviour.status and "scripted" in str(info.value)
        # the engine survives a failed request
        assert _tokens(await _collect(engine)) == behaviour.tokens

    _run(lambda i: behaviour if i == 0 else Behaviour(tokens=behaviour.tokens), body)
    assert _tokens(seen) == behaviour.fault_after if behaviour.fault else not seen


def test_stalled_stream_hits_request_timeout() -> None:
    async def body(engine: OpenAIEngine, server: FakeServer) -> None:
        chunks: list[Chunk] = []
        with pytest.raises(RequestFailed) as info:
            async for c in engine.stream(PROMPT, PARAMS):
                chunks.append(c)
        assert info.value.kind == "timeout" and str(info.value) == "timeout: after 0.5 s"
        assert _tokens(chunks) == 2

    _run(Behaviour(tokens=6, fault="stall", fault_after=2), body, request_timeout=0.5)


def test_connection_refused_mid_run_and_unreachable_start() -> None:
    async def main() -> None:
        server = FakeServer(Behaviour(tokens=2))
        async with server as url:
            engine = OpenAIEngine(_config(url))
            await engine.start()
        await asyncio.sleep(0.2)  # let the client see the pooled connection close
        try:  # the server is gone now
            with pytest.raises(RequestFailed) as info:
                await _collect(engine)
            assert info.value.kind == "connection refused", str(info.value)
        finally:
            await engine.close()
        with pytest.raises(EngineError, match="does not answer"):
            await OpenAIEngine(_config(url)).start()

    asyncio.run(main())


# ---- metrics, validation, imports ------------------------------------------------------------
def test_spec_counters_and_load_from_metrics() -> None:
    pages = iter(
        [render_metrics(2, 6, 3, (2, 1), running=4, waiting=1), render_metrics(5, 15, 9, (5, 3, 1))]
    )

    async def body(engine: OpenAIEngine, server: FakeServer) -> None:
        assert engine.spec_counters() is None
        server.metrics = lambda: next(pages)
        before = await engine.refresh_metrics()
        assert engine.spec_counters() == before == SpecCounters(2, 6, 3, (2, 1))
        after = await engine.refresh_metrics()
        assert after - before == SpecCounters(3, 9, 6, (3, 2, 1))
        server.metrics = render_metrics(running=4, waiting=1)
        assert await engine.sample_load() == {"num_requests_running": 4, "num_requests_waiting": 1}

    _run(Behaviour(), body)


def test_no_metrics_endpoint_means_no_counters() -> None:
    async def body(engine: OpenAIEngine, server: FakeServer) -> None:
        assert await engine.refresh_metrics() is None and engine.spec_counters() is None
        load = await engine.sample_load()
        assert load == {"num_requests_running": None, "num_requests_waiting": None}

    _run(Behaviour(), body)


def test_server_latency_histograms_give_means_between_scrapes() -> None:
    def page(total: float, n: int) -> str:
        name = "vllm:inter_token_latency_seconds"
        return "\n".join(
            [
                f"# HELP {name} Histogram of inter-token latency in seconds.",
                f"# TYPE {name} histogram",
                f'{name}_bucket{{engine="0",le="0.01"}} {n}',
                f'{name}_bucket{{engine="0",le="+Inf"}} {n}',
                f'{name}_count{{engine="0"}} {n}',
                f'{name}_sum{{engine="0"}} {total}',
                f'{name}_created{{engine="0"}} 1.7e9',
                "",
            ]
        )

    before, after = parse_metrics(page(0.5, 100)), parse_metrics(page(1.7, 300))
    assert before.hist == {"itl": (0.5, 100.0)}
    assert prom.mean_between(before, after, "itl") == pytest.approx(1.2 / 200)
    assert prom.mean_between(before, before, "itl") is None
    assert prom.mean_between(before, after, "ttft") is None
    both = prom.combine([after, after])
    assert both.hist == {"itl": (3.4, 600.0)}


def test_prefix_cache_reset_is_recorded_as_not_done_without_the_endpoint() -> None:
    async def body(engine: OpenAIEngine, server: FakeServer) -> None:
        assert await engine.reset_prefix_cache() == "not reset: server has no /reset_prefix_cache"

    _run(Behaviour(), body)


def test_parse_metrics_sums_label_sets() -> None:
    page = render_metrics(1, 3, 2, (1, 1), model="a") + render_metrics(2, 6, 1, (1,), model="b")
    page = "\n".join(ln for ln in page.splitlines() if not ln.startswith("#"))  # untyped
    assert parse_metrics(page).spec == SpecCounters(3, 9, 3, (2, 1))


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({}, "base_urls is required"),
        ({"base_urls": ["ftp://x"]}, "not an http"),
        ({"base_urls": ["http://x"], "endpoint": "embeddings"}, "endpoint"),
        ({"base_urls": ["http://x"], "request_timeout": "10"}, "wrong type"),
        ({"base_urls": ["http://x"], "max_concurrency": True}, "wrong type"),
        ({"base_urls": ["http://x"], "bogus": 1}, "unknown options"),
    ],
)
def test_validate_rejects(options: dict[str, Any], match: str) -> None:
    with pytest.raises(EngineError, match=match):
        OpenAIEngine.validate(EngineConfig(engine="openai", model="m", options=options))


# ---- other servers' shapes: endings, usage, first token, model listing ----------------------
TRANSFORMERS = {"preamble": True, "finish_apart": True, "usage_in_last": True, "done": False}


@pytest.mark.parametrize(
    ("behaviour", "request_", "end", "counted_by"),
    [
        (Behaviour(tokens=6), PROMPT, "[DONE]", "server usage"),
        (Behaviour(tokens=6, token_ids=False, **TRANSFORMERS), CHAT, "finish_reason, close", "server usage"),
        (Behaviour(tokens=6, token_ids=False, **TRANSFORMERS), PROMPT, "finish_reason, close", "server usage"),
        (Behaviour(tokens=6, usage_in_last=True, done=False), PROMPT, "finish_reason, close", "server usage"),
        (Behaviour(tokens=6, usage=False, done=False), CHAT, "finish_reason, close", "token ids"),
        (Behaviour(tokens=6, fault="no_done", fault_after=6), PROMPT, "finish_reason, close", "token ids"),
    ],
)  # fmt: skip
def test_complete_endings_are_recorded(
    behaviour: Behaviour, request_: Request, end: str, counted_by: str
) -> None:
    """[DONE], or a finish_reason then a clean close (transformers serve), is complete."""

    async def body(engine: OpenAIEngine, server: FakeServer) -> None:
        chunks = await _collect(engine, request_)
        timed = [c for c in chunks if c.size]
        assert _tokens(timed) == 6 and "".join(c.text for c in timed) == "".join(
            f"t{k} " for k in range(6)
        )
        assert chunks[-1].info["stream_end"] == end
        assert chunks[-1].info["output_tokens_from"] == counted_by
        usage = [c.usage_output_tokens for c in chunks if c.usage_output_tokens is not None]
        assert usage == ([6] if counted_by == "server usage" else [])

    _run(behaviour, body, {"vllm": False})


@pytest.mark.parametrize(
    ("behaviour", "kind"),
    [
        (Behaviour(tokens=6, fault="no_done", fault_after=3), "incomplete stream"),
        (Behaviour(tokens=6, finish_apart=True, fault="no_done", fault_after=6), "incomplete stream"),
        (Behaviour(tokens=6, fault="reset", fault_after=6), "connection reset"),
    ],
)  # fmt: skip
def test_cut_streams_stay_failures(behaviour: Behaviour, kind: str) -> None:
    """Cut before [DONE] and before any finish_reason, or not closed cleanly: a failure."""

    async def body(engine: OpenAIEngine, server: FakeServer) -> None:
        with pytest.raises(RequestFailed) as info:
            await _collect(engine)
        assert info.value.kind == kind

    _run(behaviour, body)


def test_first_token_is_the_first_chunk_with_output() -> None:
    """A role-only delta sent at once is not the first token; multi-token text chunks count as
    one event each, and the server's usage gives the total."""
    first = 0.2

    async def body(engine: OpenAIEngine, server: FakeServer) -> None:
        t_send = time.perf_counter()
        chunks = [c async for c in engine.stream(CHAT, PARAMS, time.perf_counter)]
        timed = [c for c in chunks if c.size]
        assert timed[0].t - t_send >= first - 0.005  # not the preamble's arrival
        assert [c.size for c in timed] == [1, 1, 1] and timed[0].text == "t0 t1 t2 "
        assert [c.usage_output_tokens for c in chunks if c.usage_output_tokens] == [8]

    b = Behaviour(tokens=8, per_chunk=3, first_delay=first, token_ids=False, **TRANSFORMERS)
    _run(b, body, {"vllm": False})


@pytest.mark.parametrize(
    ("server_kw", "served", "warned"),
    [
        ({"models_status": 500}, "m1", "answered 500"),
        ({"listed": []}, "m1", "(lists: nothing)"),
        ({"listed": ["m1"]}, "m1", None),
        ({}, "other", "does not list 'other'"),
    ],
)
def test_model_listing_is_a_convenience_with_served_model(
    server_kw: dict[str, Any], served: str, warned: str | None
) -> None:
    async def main() -> None:
        async with FakeServer(Behaviour(tokens=2), **server_kw) as url:
            engine = OpenAIEngine(_config(url, served_model=served))
            await engine.start()
            try:
                assert _tokens(await _collect(engine)) == 2
            finally:
                await engine.close()
        warnings = engine.describe()["warnings"]
        assert warnings == [] if warned is None else warned in warnings[0]

    asyncio.run(main())


@pytest.mark.parametrize("server_kw", [{"models_status": 500}, {"listed": []}])
def test_model_listing_failure_without_served_model_says_what_to_pass(
    server_kw: dict[str, Any],
) -> None:
    async def main() -> None:
        async with FakeServer(**server_kw) as url:
            with pytest.raises(EngineError, match="pass --served-model"):
                await OpenAIEngine(_config(url)).start()

    asyncio.run(main())


def test_sse_parser_handles_split_reads() -> None:
    class Content:
        async def iter_any(self):
            data = b'data: {"a":\ndata: 1}\n\n: c\r\ndata: [DONE]'
            for i in range(len(data)):
                yield data[i : i + 1]

    class Resp:
        content = Content()

    async def main() -> list[str]:
        return [e async for e, _ in sse_events(Resp())]  # type: ignore[arg-type]

    assert asyncio.run(main()) == ['{"a":\n1}', "[DONE]"]


def test_http_modules_do_not_import_torch_or_vllm() -> None:
    code = (
        "import sys, engines.openai.engine, engines.servers.vllm_serve, engines.openai.prom\n"
        "bad = {'torch', 'transformers', 'vllm'} & set(sys.modules)\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_without_ids_a_vllm_event_is_one_step_even_with_empty_text() -> None:
    """vLLM sends an event per engine step, its text empty for a special token or part of a
    character; without ids each is a token (as ``vllm bench serve`` counts), chat's role-only
    first delta aside. Other servers: only events with text count (an empty preamble is not)."""
    from engines.openai.sse import parse_event

    def sizes(events: list[dict[str, Any]], chat: bool, steps: bool) -> list[int]:
        return [c.size for e in events for c in parse_event(e, chat, 0.0, steps) if c.size]

    text = [{"choices": [{"index": 0, "text": t, "finish_reason": None}]} for t in ("a", "", "b")]
    chat = [{"choices": [{"index": 0, "delta": d}]} for d in
            ({"role": "assistant", "content": ""}, {"content": "a"}, {"content": ""})]  # fmt: skip
    assert sizes(text, chat=False, steps=True) == [1, 1, 1]
    assert sizes(chat, chat=True, steps=True) == [1, 1]
    assert sizes(text, chat=False, steps=False) == [1, 1]
    assert sizes(chat, chat=True, steps=False) == [1]

"""A second real server: ``transformers serve`` started by TransformersServerEngine on the tiny
pair's target, over loopback, driven by the plain ``openai`` engine through the runner.

One server of each kind (without and with continuous batching), from the session's shared pool
(tests/servers.py: "ts-plain", "ts-cb"). Their ``/v1/models`` answers 500 here for real (the
Hugging Face cache directory it scans is pointed at a path that does not exist), so every test
also runs "with the model listing failing and the model named".
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from engines.base import EngineConfig, EngineError, GenParams
from engines.openai.engine import OpenAIEngine
from engines.servers.transformers_serve import TransformersServerCBEngine, TransformersServerEngine
from harness.core.load import Concurrent, Synchronous
from harness.run.runner import Runner
from tests.servers import ServerPool
from workloads.base import Request

PROMPTS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "import os\nimport sys\n\n",
    "class Point:\n    def __init__(self, x, y):\n",
    "for i in range(10):\n",
]
N = 8


@pytest.fixture(scope="module")
def servers(managed_servers: ServerPool) -> dict[str, TransformersServerEngine]:
    """Without and with continuous batching, started concurrently."""
    pool = managed_servers.get("ts-plain", "ts-cb")
    return {"plain": pool["ts-plain"], "cb": pool["ts-cb"]}  # type: ignore[dict-item]


@pytest.fixture(scope="module")
def server(servers: dict[str, TransformersServerEngine]) -> TransformersServerEngine:
    return servers["plain"]


def _openai(server: TransformersServerEngine, **options: Any) -> OpenAIEngine:
    opts = {"base_urls": [server.base_url], "max_concurrency": 4, **options}
    return OpenAIEngine(EngineConfig(engine="openai", model=server.config.model, options=opts))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("which", "mode", "endpoint"),
    [
        ("plain", "latency", "chat"),
        ("plain", "latency", "completions"),
        ("plain", "throughput", "chat"),
        ("plain", "throughput", "completions"),
        ("cb", "throughput", "chat"),
        ("cb", "throughput", "completions"),
    ],
)
def test_every_request_ok_with_the_servers_token_counts(
    loop: asyncio.AbstractEventLoop,
    servers: dict[str, TransformersServerEngine],
    which: str,
    mode: str,
    endpoint: str,
) -> None:
    server = servers[which]
    engine = _openai(server, endpoint=endpoint, served_model=server.config.model)
    strategy = Synchronous() if mode == "latency" else Concurrent(4)
    reqs = [Request(id=f"r{i}", prompt=p, max_new_tokens=N) for i, p in enumerate(PROMPTS)]

    async def main() -> list[Any]:
        await engine.start()
        try:
            return await Runner(engine).run(reqs, GenParams(), strategy)
        finally:
            await engine.close()

    records = loop.run_until_complete(main())
    assert [r.error for r in records] == [None] * len(PROMPTS)
    for r in records:
        assert r.ok and r.ttft is not None and r.ttft > 0
        # the record counts what the server's usage says; each text event carried >= 1 token
        assert r.usage_output_tokens is not None and 0 < r.output_tokens <= N
        assert r.output_tokens == r.usage_output_tokens >= sum(r.chunk_tokens)
        assert r.info["stream_end"] == "finish_reason, close"  # this server sends no [DONE]
        assert r.info["output_tokens_from"] == "server usage"
        assert r.chunk_times[0] > r.t_send and r.output_text
    warnings = engine.describe()["warnings"]
    assert len(warnings) == 1 and "models answered 500" in warnings[0]


@pytest.mark.slow
def test_a_one_token_answer_without_text_has_a_first_token(
    loop: asyncio.AbstractEventLoop, server: TransformersServerEngine
) -> None:
    """On the tiny target, "<|eos|>" (after the BOS the server prepends) is answered greedily by
    <|bos|>: one special token, so one event with empty text, finish_reason and usage. The record
    still has a first-token time (the answer's first event), says so, and the TTFT counts it."""
    from engines.openai.sse import FIRST_EVENT, TOKEN_CHUNK
    from harness.analysis.summary import summarize

    engine = _openai(server, endpoint="completions", served_model=server.config.model)
    reqs = [
        Request(id="one", prompt="<|eos|>", max_new_tokens=1),
        Request(id="n", prompt=PROMPTS[0], max_new_tokens=N),
    ]

    async def main() -> list[Any]:
        await engine.start()
        try:
            return await Runner(engine).run(reqs, GenParams(), Synchronous())
        finally:
            await engine.close()

    one, text = loop.run_until_complete(main())
    assert one.ok and one.output_tokens == 1 and not one.output_text, one
    assert one.ttft is not None and 0 < one.ttft <= one.e2e
    assert one.info["first_token_from"] == FIRST_EVENT
    assert text.ok and text.info["first_token_from"] == TOKEN_CHUNK
    assert summarize([one, text])["ttft_s"]["n"] == 2


@pytest.mark.slow
def test_failing_listing_without_a_model_name_says_what_to_pass(
    loop: asyncio.AbstractEventLoop, server: TransformersServerEngine
) -> None:
    with pytest.raises(EngineError, match="answered 500.*pass --served-model"):
        loop.run_until_complete(_openai(server).start())


@pytest.mark.slow
def test_managed_engine_describes_what_ran(server: TransformersServerEngine) -> None:
    info = server.describe()
    assert info["argv"][2:5] == ["transformers.cli.transformers", "serve", server.config.model]
    assert "--no-continuous-batching" in info["argv"] and info["served_model"]


def test_argv_and_validation(tiny_pair: tuple[str, str]) -> None:
    cb = TransformersServerCBEngine(
        EngineConfig(engine="transformers-server-cb", model=tiny_pair[0], device="cpu")
    )
    assert "--continuous-batching" in cb.argv and "--device" in cb.argv
    share = float(cb.argv[cb.argv.index("--cb-max-memory-percent") + 1])
    assert 0 < share <= 0.9  # ~1 GiB of RAM for the paged cache, not 90% of it
    spec = EngineConfig(engine="transformers-server", model="m", spec_config={"method": "ngram"})
    with pytest.raises(EngineError, match="no speculative method"):
        TransformersServerEngine.validate(spec)
    with pytest.raises(EngineError, match="engine_args.port is set by the harness"):
        TransformersServerEngine(
            EngineConfig(engine="transformers-server", model="m", engine_args={"port": 1})
        )


def test_cli_gives_managed_servers_their_options(tmp_path) -> None:
    from engines.openai.options import ignore_eos_unsent
    from harness.flags.parser import build_parser
    from harness.flags.plan import build_plan

    engines = "vllm-server,transformers-server-cb"
    extra = ("--ignore-eos", "--extra-body", '{"top_k": 1}')
    args = build_parser().parse_args(["--engine", engines, "--server-start-timeout", "77", *extra])
    plan = build_plan(args, "m", None)
    for engine in ("vllm-server", "transformers-server-cb"):
        assert plan.options[engine]["start_timeout"] == 77
        assert plan.options[engine]["extra_body"] == {"top_k": 1}
    (cfg,) = [c for _, c in plan.engine_configs({e: () for e in plan.engines})
              if c.engine == "transformers-server-cb"]  # fmt: skip
    TransformersServerCBEngine.validate(cfg)
    # its client is not vLLM: --ignore-eos is not sent, said at start; --extra-body is sent
    inner = TransformersServerCBEngine._inner_config(cfg, "http://127.0.0.1:1/v1").options
    assert inner["extra_body"] == {"top_k": 1} and inner["vllm_extras"] is False
    assert ignore_eos_unsent(inner, inner["vllm_extras"], inner["extra_body"])

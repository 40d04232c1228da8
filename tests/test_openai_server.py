"""Any OpenAI-compatible server, not only vLLM: which model the ``openai`` engine requests, when
it takes a server for vLLM, why it asks for token ids, and what counts tokens when the server
sends no usage. Against tests/fake_server.py (shapes of other servers) and pure rules."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from typing import Any

import pytest

from engines.base import Chunk, EngineConfig, EngineError, GenParams
from engines.common.local_model import counting_tokenizer
from engines.openai.engine import OpenAIEngine
from engines.openai.server_info import is_vllm, listed_models, pick_model
from harness.flags.inputs import needs_local_models
from harness.flags.parser import build_parser
from harness.flags.plan import build_plan
from tests.fake_server import Behaviour, FakeServer, render_metrics
from tests.test_faults import ServerThread, workload
from workloads.base import Request

PROMPT = Request(id="r0", prompt="one two three", max_new_tokens=4)
PARAMS = GenParams(ignore_eos=True)
URL = "http://127.0.0.1:9/v1"
SENT: list[Chunk] = []  # the chunks of the last request _start sent


def _start(
    server: FakeServer, model: str = "embedded", tokenizer: str | None = None, **options: Any
) -> OpenAIEngine:
    """An engine started on ``server``, one request sent (its chunks in ``SENT``), closed."""

    async def main() -> OpenAIEngine:
        async with server as url:
            opts = {"base_urls": [url], **options}
            cfg = EngineConfig("openai", model, tokenizer=tokenizer, options=opts)
            engine = OpenAIEngine(cfg)
            await engine.start()
            try:
                SENT[:] = [c async for c in engine.stream(PROMPT, PARAMS)]
            finally:
                await engine.close()
            return engine

    return asyncio.run(main())


# ---- which model ---------------------------------------------------------------------------
def test_pick_model_guesses_only_when_one_model_is_listed() -> None:
    assert pick_model("m", ["a", "m"], URL) == ("m", "--model (listed by the server)")
    assert pick_model("embedded", ["llama3"], URL) == ("llama3", "the only model the server lists")
    with pytest.raises(EngineError, match="lists no model; pass --served-model NAME"):
        pick_model("m", [], URL)
    listed = [f"model-{i}" for i in range(7)]
    with pytest.raises(EngineError) as info:
        pick_model("embedded", listed, URL)
    line = str(info.value)
    assert "\n" not in line and line.endswith("pass --served-model NAME")
    assert "lists 7 models (model-0, model-1, model-2, model-3, model-4, ... (7 in all))" in line
    assert "model-5" not in line


def test_several_listed_models_stop_the_engine_unless_one_is_named() -> None:
    """Ollama lists every model it has pulled: benchmarking the first would be a silent lie."""
    listed = ["qwen2:0.5b", "llama3:8b", "fake-model"]
    with pytest.raises(EngineError, match=r"lists 3 models \(qwen2:0.5b, llama3:8b, fake-model\)"):
        _start(FakeServer(Behaviour(tokens=2), listed=listed, vllm=False))
    engine = _start(FakeServer(Behaviour(tokens=2), listed=listed, vllm=False), model="llama3:8b")
    assert engine.describe()["served_model"] == "llama3:8b"
    assert engine.describe()["served_model_from"] == "--model (listed by the server)"
    server = FakeServer(Behaviour(tokens=2), listed=listed, vllm=False)
    engine = _start(server, served_model="qwen2:0.5b")
    assert server.requests[0].body["model"] == "qwen2:0.5b"
    assert engine.describe()["served_model_from"] == "--served-model"


def test_the_only_listed_model_is_requested_and_said(caplog: pytest.LogCaptureFixture) -> None:
    server = FakeServer(Behaviour(tokens=2), listed=["llama3:8b"], vllm=False)
    with caplog.at_level(logging.WARNING, logger="engines.openai"):
        engine = _start(server)
    assert server.requests[0].body["model"] == "llama3:8b"
    assert engine.describe()["served_model_from"] == "the only model the server lists"
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == "openai: requesting 'llama3:8b', the only model the server lists"


@pytest.mark.parametrize("served", [None, "m1"])
def test_model_entries_that_are_not_objects_are_skipped(served: str | None) -> None:
    body = {"data": ["junk", 3, None, {"object": "model"}, {"id": "m1", "owned_by": "vllm"}]}
    assert listed_models(body) == (["m1"], True)
    assert listed_models(["not", "an", "object"]) == ([], False)
    options = {} if served is None else {"served_model": served}
    engine = _start(FakeServer(Behaviour(tokens=2), models_body=body), **options)
    assert engine.describe()["served_model"] == "m1" and engine.describe()["warnings"] == []


# ---- is it vLLM? -----------------------------------------------------------------------------
def test_is_vllm_needs_version_and_a_second_sign() -> None:
    assert is_vllm("0.11", owned_by_vllm=True, vllm_metrics=False)
    assert is_vllm("0.11", owned_by_vllm=False, vllm_metrics=True)
    assert not is_vllm("0.5.4", owned_by_vllm=False, vllm_metrics=False)  # SGLang's /version
    assert not is_vllm(None, owned_by_vllm=True, vllm_metrics=True)


@pytest.mark.parametrize(
    ("server_kw", "options", "vllm"),
    [
        ({}, {}, True),  # vllm serve: /version and owned_by vllm
        ({"vllm": False, "version": True, "owned_by": "sglang"}, {}, False),
        ({"vllm": False, "version": True, "metrics": render_metrics()}, {}, True),
        ({"vllm": False, "owned_by": "vllm"}, {}, False),  # no /version: not sure enough
        ({"models_status": 500, "metrics": render_metrics()}, {"served_model": "m"}, True),
    ],
)
def test_vllm_fields_go_only_to_a_server_that_is_surely_vllm(
    server_kw: dict[str, Any], options: dict[str, Any], vllm: bool
) -> None:
    server = FakeServer(Behaviour(tokens=2), **server_kw)
    engine = _start(server, token_ids=True, **options)
    assert engine.describe()["vllm_extras"] is vllm
    sent = server.requests[0].body
    assert ("ignore_eos" in sent) is vllm and ("return_token_ids" in sent) is vllm


# ---- why token ids -------------------------------------------------------------------------
def test_token_ids_reason_is_recorded_and_workers_do_not_decide_again() -> None:
    scrapes: list[int] = []

    def page() -> str:
        scrapes.append(1)
        return render_metrics(num_drafts=1, num_draft_tokens=3, num_accepted_tokens=2)

    async def main() -> None:
        async with FakeServer(Behaviour(tokens=2, ids_if_asked=True), metrics=page) as url:
            engine = OpenAIEngine(
                EngineConfig(
                    "openai", "fake-model", options={"base_urls": [url], "token_ids": None}
                )
            )
            await engine.start()
            await engine.close()
            info = engine.describe()
            assert info["token_ids_asked"] is True
            assert info["token_ids_decided"] == (
                "--token-ids auto: the server's /metrics shows spec-decode counters"
            )
            assert len(scrapes) == 1
            worker = OpenAIEngine(engine.client_config())
            await worker.start()
            await worker.close()
            assert len(scrapes) == 1  # the worker took the decision as made
            assert worker.describe()["token_ids_asked"] is True
            assert worker.describe()["token_ids_decided"] == info["token_ids_decided"]

    asyncio.run(main())


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        ((), None),  # decided by the engine at start
        (("--aa",), "--token-ids auto: the run compares outputs"),
        (("--token-ids", "on"), "--token-ids on"),
        (("--aa", "--token-ids", "off"), "--token-ids off"),
    ],
)
def test_plan_says_why_token_ids_are_asked(flags: tuple[str, ...], why: str | None) -> None:
    args = build_parser().parse_args(["--engine", "openai", "--base-url", URL, *flags])
    plan = build_plan(args, "m", None)
    assert plan.options["openai"].get("token_ids_why") == why


# ---- counting without usage ------------------------------------------------------------------
def _no_usage(model: str, tokenizer: str | None = None, **options: Any) -> OpenAIEngine:
    server = FakeServer(Behaviour(tokens=5, token_ids=False, usage=False))
    return _start(server, model, tokenizer, **options)


def test_tokens_are_counted_only_with_a_tokenizer_the_user_named(tiny_pair) -> None:
    from tokenizers import Tokenizer

    target = tiny_pair[0]
    tok = Tokenizer.from_file(f"{target}/tokenizer.json")
    expected = len(tok.encode("".join(f"t{k} " for k in range(5)), add_special_tokens=False).ids)
    assert expected != 5
    named = _no_usage(target, count_with_model=True)
    assert SENT[-1].usage_output_tokens == expected
    assert SENT[-1].info["output_tokens_from"] == "tokenizer (the server sent no usage)"
    assert named.describe()["tokenizer_for_counts"] == target
    assert named.client_config().tokenizer == target  # workers count the same way
    # the default --model (resolved or not) is not what a foreign server serves: no guess
    default = _no_usage(target)
    assert SENT[-1].usage_output_tokens is None and sum(c.size for c in SENT) == 5
    assert SENT[-1].info["output_tokens_from"] == "text events (no usage, no tokenizer)"
    assert default.describe()["tokenizer_for_counts"] is None
    assert _no_usage("m", tokenizer=target).describe()["tokenizer_for_counts"] == target


def test_counting_tokenizer_reads_the_hub_cache_never_the_network(
    tiny_pair, tmp_path, monkeypatch
) -> None:
    from huggingface_hub import constants

    snap = tmp_path / "models--org--tiny" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    shutil.copy(f"{tiny_pair[0]}/tokenizer.json", snap / "tokenizer.json")
    (tmp_path / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "models--org--tiny" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    assert counting_tokenizer("org/tiny") is not None
    assert counting_tokenizer("org/absent") is None
    assert counting_tokenizer("not a repo id!") is None
    assert counting_tokenizer(str(tmp_path / "nothing")) is None


# ---- the harness: no embedded model for a remote-only run -----------------------------------
@pytest.mark.parametrize(
    ("flags", "needed"),
    [
        (("--engine", "openai", "--base-url", URL), False),
        (("--engine", "openai", "--base-url", URL, "--model", "embedded"), True),  # named
        (("--engine", "openai", "--base-url", URL, "--dataset-name", "random"), True),
        (("--engine", "openai,vllm-server", "--base-url", URL), True),
        (("--engine", "vllm"), True),
    ],
)
def test_only_a_remote_run_with_the_default_model_skips_the_local_model(
    flags: tuple[str, ...], needed: bool
) -> None:
    args = build_parser().parse_args([*flags, "--mode", "latency"])
    plan = build_plan(args, args.model, None)
    assert needs_local_models(plan, args.dataset.synthetic, args.model_named) is needed
    opts = plan.options.get("openai", {})
    assert opts.get("count_with_model", False) is ("--model" in flags)


def test_remote_run_with_the_default_model_neither_builds_it_nor_counts_with_it(
    tmp_path, monkeypatch, capsys, caplog
) -> None:
    """`--engine openai --base-url URL` alone: the one listed model is requested (one stderr
    line), the embedded model is never resolved, the run records what it did."""
    from harness.cli import pipeline as app
    from harness.cli.main import main

    def no(plan: Any) -> Any:
        raise AssertionError("the embedded model was resolved for a remote-only run")

    monkeypatch.setattr(app, "resolve_models", no)
    out = tmp_path / "out"
    server = FakeServer(Behaviour(tokens=3), listed=["llama3:8b"], vllm=False)
    argv = ["--engine", "openai", "--workload", workload(tmp_path, 2), "--num-prompts", "2",
            "--mode", "latency", "--repeats", "1", "--warmup", "0", "--max-new-tokens", "3",
            "--output-dir", str(out), "--quiet", "--no-plots"]  # fmt: skip
    with ServerThread(server) as url:
        code = main([*argv, "--base-url", url])
    err = capsys.readouterr().err
    assert code == 0, err
    said = [r.getMessage() for r in caplog.records if r.name == "engines.openai"]
    assert said == ["openai: requesting 'llama3:8b', the only model the server lists"]
    res = json.loads((out / "results.json").read_text())
    (run,) = res["runs"]
    assert run["engine_info"]["served_model"] == "llama3:8b"
    assert run["engine_info"]["tokenizer_for_counts"] is None
    assert {q.body["model"] for q in server.requests} == {"llama3:8b"}
    with ServerThread(FakeServer(listed=["a", "b"], vllm=False)) as url:
        code = main([*argv, "--base-url", url, "--output-dir", str(tmp_path / "two")])
    line = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert code == 1 and len(line) == 1 and "lists 2 models (a, b)" in line[0]
    assert "pass --served-model NAME" in line[0]

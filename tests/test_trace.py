"""Mooncake-format trace replay: prompts built block by block from hash ids (equal id = equal
block), the fitting options, located errors for bad lines, and the schedule the runner follows
with its send lags recorded (fake clock: no time is asserted on the real machine)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from engines.base import GenParams
from harness.analysis.workload.replay import replay_tables
from harness.core.replay import TraceReplay
from harness.core.results import Cell, Run
from harness.run.runner import Runner
from tests.clock import FakeClock, ScriptedEngine
from tests.inprocess import run_harness
from workloads import WorkloadError, check_trace, trace_workload
from workloads.trace import BlockTokens, TraceSpec, shared_prefix_tokens, trace_requests

TINY = str(Path(__file__).resolve().parents[1] / "harness/models/tiny/target")


def write(tmp_path: Path, lines: list[dict] | list[str], name: str = "t.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return p


def line(ts: float, n: int, out: int, ids: list[int]) -> dict:
    return {"timestamp": ts, "input_length": n, "output_length": out, "hash_ids": ids}


def test_equal_hash_ids_give_equal_blocks_and_lengths_as_asked(tmp_path: Path) -> None:
    """A block is a function of its hash id alone: requests sharing leading ids share exactly
    those tokens, a different id gives different tokens, and the last block is cut."""
    p = write(
        tmp_path,
        [
            line(0, 20, 4, [7, 8]),
            line(5, 30, 4, [7, 8, 9]),
            line(9, 12, 2, [5, 8]),
            line(9, 3, 1, [7]),
            line(9, 10, 1, [8]),
        ],
    )
    w = trace_workload(p, TINY, TraceSpec(block_size=10))
    a, b, c, d, e = (r.prompt_token_ids for r in w.requests)
    assert [len(x) for x in (a, b, c, d, e)] == [20, 30, 12, 3, 10]  # cut to input_length
    assert b[:20] == a and d == a[:3]  # equal leading ids: equal tokens
    assert c[10:12] == a[10:12] and e == a[10:20]  # hash id 8: one block wherever it sits
    assert c[:10] != a[:10]  # another id, another block
    assert [r.max_new_tokens for r in w.requests] == [4, 4, 2, 1, 1]
    assert all(r.prompt is None and r.messages is None for r in w.requests)  # ids, no text
    blocks = BlockTokens(list(range(3, 100)), seed=0)
    assert blocks.block(8, 10) == BlockTokens(list(range(3, 100)), seed=0).block(8, 10)
    assert blocks.block(8, 10) != BlockTokens(list(range(3, 100)), seed=1).block(8, 10)
    # shared prefix: what each request shares with an earlier one (known by construction)
    assert shared_prefix_tokens(w.requests, 10) == [0, 20, 0, 3, 0]  # a prefix, not a block
    assert w.params["shared_prefix_by_request"] == {"0": 0, "1": 20, "2": 0, "3": 3, "4": 0}


def test_fitting_options_time_scale_input_cap_slices(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        [line(1000, 700, 4, [0, 1]), line(1500, 1200, 4, [0, 1, 2]), line(3000, 100, 4, [3])],
    )
    vocab = list(range(3, 500))
    from workloads.trace import read_trace

    lines = read_trace(p, str(p), TraceSpec())
    assert [x.t_s for x in lines] == [0.0, 0.5, 2.0]  # seconds after the first line
    fast = trace_requests(lines, vocab, TraceSpec(time_scale=0.5))
    assert [r.send_s for r in fast] == [0.0, 0.25, 1.0]
    capped = trace_requests(lines, vocab, TraceSpec(max_input_len=1100))
    assert [len(r.prompt_token_ids) for r in capped] == [700, 1024, 100]  # whole blocks kept
    assert capped[1].block_ids == (0, 1)
    half = trace_requests(lines, vocab, TraceSpec(input_scale=0.5))
    assert [len(r.prompt_token_ids) for r in half] == [350, 600, 50]
    assert half[1].prompt_token_ids[:350] == half[0].prompt_token_ids  # still shared
    assert len(read_trace(p, str(p), TraceSpec(first=2))) == 2
    win = read_trace(p, str(p), TraceSpec(window=(0.4, 5.0)))
    assert [x.input_length for x in win] == [1200, 100]
    w = trace_workload(p, TINY, TraceSpec(window=(0.4, 5.0)))
    assert [r.send_s for r in w.requests] == [0.0, 1.5]  # the slice starts at its first line
    assert w.params["window"] == [0.4, 5.0] and w.params["time_scale"] == 1.0


BAD = {
    "not json": ("{oops", "t.jsonl:2: invalid JSON"),
    "missing hash_ids": (
        {"timestamp": 1, "input_length": 5, "output_length": 1},
        "t.jsonl:2: hash_ids: missing",
    ),
    "zero output": (line(1, 5, 0, [1]), "t.jsonl:2: output_length: must be >= 1"),
    "string input": (
        {**line(1, 5, 1, [1]), "input_length": "5"},
        "t.jsonl:2: input_length: must be an integer",
    ),
    "negative id": (line(1, 5, 1, [1, -2]), "t.jsonl:2: hash_ids[1]: must be an integer >= 0"),
    "too long": (
        line(1, 1500, 1, [1, 2]),
        "t.jsonl:2: input_length: 1500 tokens need more than the 2 blocks",
    ),
    "backwards": (line(-1, 5, 1, [1]), "t.jsonl:2: timestamp: must be >= 0"),
    "before previous": (line(0.5, 5, 1, [1]), "t.jsonl:2: timestamp: 0.5 is before the previous"),
    "typo": ({**line(1, 5, 1, [1]), "hash_id": [1]}, "t.jsonl:2: hash_id: unknown field"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_lines_one_located_line(tmp_path: Path, case: str) -> None:
    bad, want = BAD[case]
    p = write(tmp_path, [line(1, 5, 1, [1]), bad])
    with pytest.raises(WorkloadError) as e:
        check_trace(p, TraceSpec())
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(str(p)[: -len("t.jsonl")]) and want in msg


def test_bad_trace_line_through_the_cli_exits_2_with_one_line(tmp_path, capsys) -> None:
    p = write(tmp_path, [line(1, 5, 1, [1]), line(2, 5, 1, [])])
    ran = run_harness(
        [
            "--engine",
            "vllm",
            "--model",
            "tiny",
            "--dataset-name",
            "mooncake",
            "--dataset-path",
            str(p),
        ],
        capsys,
    )
    assert ran.returncode == 2
    err = [x for x in ran.stderr.splitlines() if x.strip()]
    assert len(err) == 1 and f"{p}:2: hash_ids: must be a non-empty list" in err[0]
    assert "Traceback" not in ran.stderr


def test_runner_follows_the_schedule_and_the_lags_are_recorded() -> None:
    """Fake clock: each request goes at its scheduled offset (lag 0); with a cap of 1 in flight
    a request that finds the cap full goes late, and its record says by how much."""
    from workloads.base import Request

    def replay(schedule: tuple[float, ...], delay: float, cap: int | None) -> dict:
        clock = FakeClock()
        ids = [str(i) for i in range(len(schedule))]
        engine = ScriptedEngine(clock, {i: [(delay, 1)] for i in ids})
        runner = Runner(engine, clock=clock, sleep=clock.sleep)
        strategy = TraceReplay(schedule, 1.0, cap)
        reqs = [Request(i, prompt_token_ids=(1, 2, 3), max_new_tokens=1) for i in ids]
        records = asyncio.run(runner.run(reqs, GenParams(), strategy))
        cell = Cell("scripted", "baseline", "throughput", strategy.to_json(), 1, 0, "t")
        asked = {i: (3, 1) for i in ids}
        (entry,) = replay_tables([Run(cell, None, tuple(records))], schedule, asked, {})
        return entry

    free = replay((0.0, 0.1, 0.1, 1.0), 0.0, None)
    assert free["sent"] == free["scheduled"] == 4
    lags = free["send_lag_ms_by_request"]
    assert lags == pytest.approx({"0": 0, "1": 0, "2": 0, "3": 0}, abs=1e-6)
    assert free["late"] == 0 and free["send_lag_ms"]["p99"] == pytest.approx(0, abs=1e-6)
    # request 0 holds the one slot for 0.3 s of virtual time; the fake clock adds the runner's
    # 0.1 s sleep before it, so request 1 goes at 0.4 s: 300 ms after its 0.1 s
    capped = replay((0.0, 0.1), 0.3, 1)
    assert capped["send_lag_ms_by_request"]["1"] == pytest.approx(300) and capped["late"] == 1
    assert TraceReplay((0.0, 0.1)).to_json() == {
        "arrivals": "trace", "time_scale": 1.0, "requests": 2, "concurrency": None,
    }  # fmt: skip


@pytest.mark.slow
def test_replay_through_vllm_records_schedule_lengths_and_cache_hits(
    tiny_pair, tmp_path, capsys
) -> None:
    """The shipped trace on the tiny pair, in-process vLLM: every line sent, at input and output
    lengths as asked, the schedule in the plan and a send lag per request in results.json (not
    asserted: timing on a shared machine), and the prefix-cache hits equal the trace's shared
    blocks rounded to vLLM's KV block (prefix cache reset before the run)."""
    out = tmp_path / "out"
    ran = run_harness(
        ["--engine", "vllm", "--model", "tiny", "--dataset-name", "mooncake", "--dataset-path",
         "trace_tiny", "--repeats", "1", "--warmup", "1", "--output-dir", str(out), "--no-plots",
         "--quiet"],
        capsys,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    text = check_trace_path().read_text().splitlines()
    times = [json.loads(x)["timestamp"] / 1000 for x in text]
    assert res["config"]["trace_schedule"] == pytest.approx(times)
    (entry,) = res["replay"]
    assert entry["sent"] == entry["scheduled"] == 16
    assert set(entry["send_lag_ms_by_request"]) == {str(i) for i in range(16)}
    assert entry["input_as_asked"] == entry["output_as_asked"] == 16
    pc = entry["prefix_cache"]
    assert pc["policy"] == "reset" and pc["within_block_size"] is True
    assert pc["hits"] == pc["expected_hits"]
    assert "## Trace replay" in ran.stdout and "lag p99 ms" in ran.stdout


def check_trace_path() -> Path:
    from workloads import DATA_DIR, SHIPPED_TRACES

    return DATA_DIR / SHIPPED_TRACES["trace_tiny"][0]


def test_http_body_sends_a_traces_ids_as_the_prompt() -> None:
    """/v1/completions takes a list of ids: a trace's request (ids, no text) sends them as they
    are; a synthetic request (text and ids) keeps sending its text; chat cannot carry ids."""
    from engines.openai.options import prompt_fields
    from engines.openai.sse import RequestFailed
    from workloads.base import Request

    trace = Request("0", prompt_token_ids=(5, 6, 7))
    assert prompt_fields(trace, "completions") == {"prompt": [5, 6, 7]}
    with pytest.raises(RequestFailed, match="token-id prompts need endpoint 'completions'"):
        prompt_fields(trace, "chat")
    synthetic = Request("1", prompt="text", prompt_token_ids=(1, 2))
    assert prompt_fields(synthetic, "completions") == {"prompt": "text"}


@pytest.mark.slow
def test_replay_through_vllm_server_sends_ids_and_reads_its_cache_hits(
    tiny_pair, tmp_path, capsys
) -> None:
    """The same trace through a vLLM server the harness starts: the ids reach it (its prompt
    token counts are the trace's lengths), and its /metrics prefix-cache hits are the trace's
    shared prefix rounded to the KV block its /metrics names."""
    out = tmp_path / "out"
    ran = run_harness(
        ["--engine", "vllm-server", "--model", "tiny", "--dataset-name", "timed_trace",
         "--dataset-path", "trace_tiny", "--timed-trace-sec-multiplier", "0.001", "--repeats",
         "1", "--warmup", "1", "--output-dir", str(out), "--no-plots", "--quiet"],
        capsys,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    assert res["config"]["trace"]["time_scale"] == 1.0
    (entry,) = res["replay"]
    assert entry["sent"] == 16 and entry["input_as_asked"] == entry["output_as_asked"] == 16
    assert len(entry["send_lag_ms_by_request"]) == 16
    pc = entry["prefix_cache"]
    assert pc["kv_block_size"] and pc["within_block_size"] is True
    assert pc["hits"] == pc["expected_hits"] and pc["policy"] == "reset"


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--mode", "latency"], "a trace replay is open loop"),
        (["--request-rate", "2"], "drop --request-rate/--duration"),
        (["--max-new-tokens", "8"], "output lengths are its own"),
        (["--multi-turn"], "--multi-turn takes conversations, not a trace"),
        (["--trace-window", "5:1"], "--trace-window: expected 0 <= START < END"),
        (["--trace-time-scale", "2", "--timed-trace-sec-multiplier", "0.001"], "not both"),
    ],
)
def test_replay_flag_clashes_are_one_line(flags, says, capsys) -> None:
    ran = run_harness(
        ["--engine", "vllm", "--model", "tiny", "--dataset-name", "mooncake", "--dataset-path",
         "trace_tiny", *flags],
        capsys,
    )  # fmt: skip
    err = [x for x in ran.stderr.splitlines() if x.strip()]
    assert ran.returncode == 2 and len(err) == 1 and says in err[0]


def test_trace_and_turn_flags_without_their_workload_are_refused(capsys) -> None:
    for flags, says in (
        (["--trace-time-scale", "0.5"], "--trace-time-scale applies to --dataset-name mooncake"),
        (["--think-time", "1"], "--think-time applies to --multi-turn"),
    ):
        ran = run_harness(["--engine", "vllm", "--model", "tiny", *flags], capsys)
        err = [x for x in ran.stderr.splitlines() if x.strip()]
        assert ran.returncode == 2 and len(err) == 1 and says in err[0]


def test_server_metrics_give_prefix_cache_tokens_and_the_kv_block() -> None:
    """vLLM's /metrics: prefix-cache queries and hits (summed over engines and replicas) and
    the KV block size from cache_config_info, which a replay over HTTP compares against."""
    from engines.openai.prom import combine, parse_metrics

    page = (
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="128",engine="0"} 1.0\n'
        "# TYPE vllm:prefix_cache_queries counter\n"
        'vllm:prefix_cache_queries_total{engine="0"} 1000.0\n'
        'vllm:prefix_cache_queries_total{engine="1"} 500.0\n'
        "# TYPE vllm:prefix_cache_hits counter\n"
        'vllm:prefix_cache_hits_total{engine="0"} 256.0\n'
    )
    s = parse_metrics(page)
    assert s.kv_block_size == 128 and s.prefix == {"queries": 1500, "hits": 256}
    assert combine([s, s]).prefix == {"queries": 3000, "hits": 512}
    assert (
        parse_metrics(
            "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n"
        ).prefix
        == {}
    )

"""A first-token time for every request that produced output: a one-token answer whose only
event has no text (a special token such as end-of-sequence) still has a TTFT, its rule is in
``info.first_token_from``, and the TTFT statistics count it; a record with output but no first
token inside the request is refused (the record's own check)."""

from __future__ import annotations

import asyncio
import statistics

import pytest

from engines.base import Chunk, GenParams, Request
from engines.openai.sse import FIRST_EVENT, TOKEN_CHUNK
from harness.core.load import Concurrent
from harness.core.records import RequestRecord
from harness.core.records_file import load_with_records
from harness.run.runner import Runner
from tests.clock import FakeClock, ScriptedEngine
from tests.fake_server import Behaviour, FakeServer
from tests.test_faults import ServerThread, run_harness

# transformers serve's one-token answer: one event, empty text, finish_reason and usage, no [DONE]
EMPTY_ONE = Behaviour(tokens=1, blank=(0,), token_ids=False, usage_in_last=True, done=False)
TEXT = Behaviour(tokens=4, delay=0.001, token_ids=False, usage_in_last=True, done=False)


def test_a_one_token_answer_without_text_has_a_ttft_and_counts(tmp_path, capsys):
    server = FakeServer(lambda i: EMPTY_ONE if i % 2 else TEXT, vllm=False)
    with ServerThread(server) as url:
        code, out = run_harness(tmp_path, url, 6, "--concurrency", "2")
    assert code == 0, capsys.readouterr().err
    (run,) = load_with_records(out / "results.json")["runs"]
    records = {r["id"]: r for r in run["records"]}
    assert len(records) == 6 and all(r["ok"] for r in records.values())
    for i in range(6):
        r = records[f"r{i}"]
        assert r["output_tokens"] == (1 if i % 2 else 4)
        assert r["ttft_s"] is not None and 0 < r["ttft_s"] <= r["e2e_s"], r
        assert r["info"]["first_token_from"] == (FIRST_EVENT if i % 2 else TOKEN_CHUNK)
    ttft = run["summary"]["ttft_s"]
    assert ttft["n"] == 6  # the one-token answers are in the distribution
    assert ttft["median"] == pytest.approx(statistics.median(r["ttft_s"] for r in records.values()))


def test_no_answer_event_no_first_token():
    """A stream with usage but no event of the answer (nothing the rule can take) is no ok record
    with output: the check refuses it, the runner keeps it as failed with the reason."""

    class UsageOnly(ScriptedEngine):
        async def stream(self, request, params, clock=None):
            yield Chunk(num_tokens=0, usage_output_tokens=3)

    clock = FakeClock()
    engine = UsageOnly(clock, {"a": []})
    (rec,) = asyncio.run(
        Runner(engine, clock=clock).run([Request("a", "x")], GenParams(), Concurrent(1))
    )
    assert not rec.ok and rec.error.startswith("record check: 3 output tokens but no first-token")


@pytest.mark.parametrize(
    "times, why",
    [((), "but no first-token time"), ((10.0,), "outside"), ((12.0,), "outside")],
)
def test_the_record_refuses_output_without_a_first_token_inside_the_request(times, why):
    with pytest.raises(ValueError, match=why):
        RequestRecord("x", 10.0, 11.0, times, (1,) * len(times), usage_output_tokens=1)
    # a failed record, or one without output, has no such promise to keep
    RequestRecord("x", 10.0, 11.0, times, (1,) * len(times), usage_output_tokens=1, ok=False)
    RequestRecord("x", 10.0, 11.0, (), (), usage_output_tokens=0)
    RequestRecord("x", 10.0, 11.0, (11.0,), (1,))  # ttft == e2e: the only token came at the end


def test_a_stored_record_that_fails_the_check_reads_back_as_failed():
    good = RequestRecord("x", 10.0, 11.0, (10.5,), (1,)).to_json(10.0)
    bad = {**good, "ttft_s": None, "itl_s": [], "chunk_tokens": [], "usage_output_tokens": 1}
    back = RequestRecord.from_json(bad)
    assert not back.ok and back.error.startswith("record check: 1 output tokens")
    assert RequestRecord.from_json(good).ok

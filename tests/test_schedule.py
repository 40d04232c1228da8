"""Latency from the schedule (harness.analysis.schedule): a client made to fall behind its Poisson
schedule on purpose, on the fake clock (no wall time), shows the wait in the from-schedule
latencies, in the client queue, and in the answer block; a closed loop has no schedule."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import pytest

from engines.base import Chunk, Engine, EngineConfig, GenParams, Request
from harness.analysis.derived import analyze
from harness.core.load import Concurrent, Poisson
from harness.core.records import RequestRecord
from harness.core.results import Cell, Run
from harness.flags.vllm_bench import percentile_metrics
from harness.report.answer_text import warning_line
from harness.report.columns import MAIN, Line, percentile_columns
from harness.report.markdown import schedule_lines
from harness.report.table_csv import to_csv
from harness.run.runner import Runner
from tests.clock import FakeClock

BLOCK_S = 0.1  # the event loop is blocked this long ...
EVERY = 20  # ... after every this many requests
SERVICE_S = 1e-5  # each request's own time (one token; serial: the loop runs one at a time)
RATE = 100.0  # req/s: gaps of 10 ms, so a block holds back about ten requests


class DeadlineClock(FakeClock):
    """The fake clock whose sleep wakes at its deadline, or later when the loop was blocked
    past it (as asyncio's does): what ran meanwhile moved the clock, the sleeper is late."""

    async def sleep(self, seconds: float) -> None:
        until = self.now + max(seconds, 0.0)
        await asyncio.sleep(0)  # the tasks just started run (and may block the loop)
        await asyncio.sleep(0)
        self.now = max(self.now, until)
        await asyncio.sleep(0)


class BlockingEngine(Engine):
    """One token after SERVICE_S of its own; after every EVERY-th request a callback blocks the
    event loop for BLOCK_S (a CPU-bound neighbour: the time passes outside every request)."""

    name: ClassVar[str] = "blocking"
    spec_methods: ClassVar[tuple[str, ...]] = ()

    def __init__(self, clock: FakeClock, every: int = EVERY) -> None:
        self.clock, self.every = clock, every
        self.seen = 0
        self.config = EngineConfig(engine="blocking", model="none")

    @classmethod
    def validate(cls, config: EngineConfig) -> None:
        return None

    async def start(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"engine": "blocking"}

    def _block(self) -> None:
        self.clock.now += BLOCK_S

    async def stream(
        self, request: Request, params: GenParams, clock: Any = None
    ) -> AsyncIterator[Chunk]:
        self.seen += 1
        self.clock.now += SERVICE_S
        yield Chunk(token_ids=(1,), prompt_tokens=3)
        if self.seen % self.every == 0:
            asyncio.get_running_loop().call_soon(self._block)

    async def close(self) -> None:
        return None

    def max_batch(self) -> int | None:
        return None


def _records(strategy: Any, n: int = 400, every: int = EVERY) -> tuple[RequestRecord, ...]:
    clock = DeadlineClock()
    runner = Runner(BlockingEngine(clock, every), clock=clock, sleep=clock.sleep)
    reqs = [Request(str(i), "x") for i in range(n)]
    return tuple(asyncio.run(runner.run(reqs, GenParams(), strategy)))


def _analysis(records: tuple[RequestRecord, ...], load: dict) -> dict:
    runs = [Run(Cell("blocking", "baseline", "throughput", load, 1, b, "w"), None, records)
            for b in range(3)]  # fmt: skip
    return analyze(runs, min_effect=0.02)


def test_a_client_that_falls_behind_shows_it_from_the_schedule() -> None:
    """From the send every request took SERVICE_S; from the schedule the ones held back by a
    block waited up to BLOCK_S more: the E2E p99 from the schedule is above the one from the
    send by about BLOCK_S, the client queue's p99 and max hold it, the answer block warns."""
    strategy = Poisson(RATE, seed=3)
    records = _records(strategy)
    assert all(r.t_scheduled is not None and r.client_queue >= -1e-12 for r in records)
    assert sum(r.client_queue > 0.05 for r in records) >= 40  # the blocks held requests back
    out = _analysis(records, strategy.to_json())
    (row,) = out["rows"]
    s = row["summary"]
    assert s["e2e_s"]["p99"] < 0.001  # from the send: the wait is left out
    gap = s["e2e_from_schedule_s"]["p99"] - s["e2e_s"]["p99"]
    assert 0.8 * BLOCK_S <= gap <= 1.1 * BLOCK_S, gap
    assert (
        0.8 * BLOCK_S <= s["client_queue_s"]["p99"] <= s["client_queue_s"]["max"] <= 1.1 * BLOCK_S
    )
    assert s["behind"]["metric"] in ("ttft", "e2e") and s["behind"]["difference_s"] >= 0.08
    (warn,) = [w for w in out["answer"]["warnings"] if w["kind"] == "client behind"]
    assert warn["name"] == "blocking/baseline" and warn["point"] == row["point"]
    assert warn["load"]["request_rate"] == RATE
    line = warning_line(warn)
    assert line.startswith("blocking/baseline, 100 req/s: the client fell behind its schedule")
    results = {**out, "config": {}, "status": "complete"}
    assert "client queue p99 9" in "\n".join(schedule_lines(out["rows"]))  # ~99 ms
    assert "e2e_from_schedule_s_p99" in to_csv(results).splitlines()[0].split(",")
    asked = percentile_metrics("ttft,client_queue_time,e2el_including_client_queue")
    cols = percentile_columns({"percentile_metrics": asked, "metric_percentiles": (99,)})
    cells = [c.fmt(c.get(Line(row))) for c in cols[1:]]  # vllm bench serve's names, in ms
    assert float(cells[0]) < 1 and all(80 <= float(x) <= 110 for x in cells[1:]), cells


def test_a_client_that_keeps_up_is_not_warned() -> None:
    """The same engine without blocks: both clocks agree, no warning."""
    records = _records(Poisson(RATE, seed=3), every=10**9)
    out = _analysis(records, Poisson(RATE, seed=3).to_json())
    s = out["rows"][0]["summary"]
    assert s["client_queue_s"]["max"] < 1e-4  # a few requests' own SERVICE_S at most
    assert s["behind"] is None
    assert not [w for w in out["answer"]["warnings"] if w["kind"] == "client behind"]


def test_a_closed_loop_has_no_schedule() -> None:
    records = _records(Concurrent(4), n=40)
    assert all(r.t_scheduled is None and r.client_queue is None for r in records)
    assert all(r.user_e2e == r.e2e for r in records)
    out = _analysis(records, Concurrent(4).to_json())
    s = out["rows"][0]["summary"]
    assert s["client_queue_s"] is None and s["e2e_from_schedule_s"] is None
    assert s["behind"] is None
    line = Line(out["rows"][0])
    cells = {c.name: c.fmt(c.get(line)) for c in MAIN}
    assert cells["queue_p99"] == cells["e2e_sched_p99"] == "closed loop: no schedule"
    assert schedule_lines(out["rows"]) == []


def test_which_loads_have_a_schedule() -> None:
    from harness.core.load import Constant, Synchronous, scheduled
    from harness.core.ramp import Ramp
    from harness.core.replay import TraceReplay

    assert all(map(scheduled, (Constant(2.0), Poisson(2.0, max_concurrency=1))))
    assert scheduled(Ramp("linear", 1.0, 5.0)) and scheduled(TraceReplay((0.0, 1.0)))
    assert not scheduled(Synchronous()) and not scheduled(Concurrent(4))


def test_the_schedule_survives_the_record_json() -> None:
    rec = RequestRecord("a", 10.5, 11.0, (10.7,), (1,), t_scheduled=10.25)
    back = RequestRecord.from_json(rec.to_json(t0=10.0))
    assert back.t_scheduled == 0.25 and abs(back.e2e_from_schedule - 0.75) < 1e-12
    old = {k: v for k, v in rec.to_json().items() if k != "scheduled_s"}  # a file before it
    assert RequestRecord.from_json(old).t_scheduled is None


def test_capacity_search_with_a_client_that_cannot_keep_up(tmp_path, capsys) -> None:
    """The search on a fake OpenAI server that serves every request in 20 ms side by side (no
    queue of its own), through a client capped at one request in flight (--concurrency 1: at
    most 50 req/s). From the send TTFT stays 20 ms at every rate; from the schedule the capped
    client's queue breaks --slo ttft:100: the capacity from the schedule is lower than from the
    send, and the summary says why."""
    import json

    from harness.cli.main import main
    from tests.fake_server import Behaviour, FakeServer
    from tests.test_faults import ServerThread, workload

    out = tmp_path / "out"
    argv = ["--engine", "openai", "--workload", workload(tmp_path, 8), "--max-new-tokens", "3",
            "--repeats", "3", "--warmup", "0", "--duration", "0.6", "--slo", "ttft:100",
            "--slo-start-rate", "8", "--slo-max-probes", "4", "--concurrency", "1",
            "--output-dir", str(out), "--quiet", "--no-plots"]  # fmt: skip
    server = FakeServer(lambda i: Behaviour(tokens=3, first_delay=0.02, delay=0.001))
    with ServerThread(server) as url:
        code = main([*argv, "--base-url", url])
    printed = capsys.readouterr().out
    assert code == 0
    cap = json.loads((out / "results.json").read_text())["capacity"]
    (row,) = cap["variants"]
    assert row["status"] == "bracketed", cap["curves"]
    (sent,) = cap["from_send"]["variants"]
    assert sent["status"] == "holds at every probed rate" or sent["capacity"] > row["capacity"]
    (behind,) = cap["from_send"]["behind"]
    assert behind["client_queue_s"] > 0.05  # its p90 where the schedule failed (TTFT 20 ms + it)
    assert "judged from the send it would " in printed
    assert "the client fell behind its schedule (client queue p90" in printed


def test_a_client_worker_keeps_the_schedule_on_the_runners_clock() -> None:
    """A worker handed an open loop stamps each record's scheduled arrival (``t0`` + its dealt
    offset) on its own clock, and the parent's shift (a Ray worker's estimated offset) moves it
    with the other stamps: planted 7 s, the schedule lands on the runner's time line and the
    client queue is unchanged; the job arrived 2 s late, so the overdue requests queued."""
    from multiprocessing import Pipe

    from harness.run.client_process import Job, Records, Share, WorkerLoop
    from harness.run.client_workers import lost_records, shifted
    from tests.clock import ScriptedEngine

    offsets, planted = (0.0, 0.5, 1.25, 3.0), 7.0
    clock = FakeClock()  # the worker's clock: the runner's + planted
    t0_runner = clock.now - 2.0 - planted  # the job arrives 2 s after the schedule's start
    reqs = [Request(id=f"r{j}", prompt="x") for j in range(len(offsets))]
    engine = ScriptedEngine(clock, {r.id: [(1e-12, 1)] for r in reqs})
    share = Share(0, tuple(range(len(offsets))), offsets, None)
    for open_loop in (True, False):
        parent, child = Pipe()
        worker = WorkerLoop(child, engine.config, clock, sleep=clock.sleep)
        job = Job(1, reqs, None, share, GenParams(), t0_runner + planted, None, False, open_loop)
        asyncio.run(worker._job(engine, job))
        records = []
        while parent.poll():
            msg = parent.recv()
            records += msg.records if isinstance(msg, Records) else ()
        back = {r.request_id: shifted(r, -planted) for r in records}
        if not open_loop:
            assert all(r.t_scheduled is None for r in back.values())
            continue
        due = [back[r.id].t_scheduled - t0_runner for r in reqs]
        assert due == pytest.approx(offsets, abs=1e-9)
        queue = [back[r.id].client_queue for r in reqs]
        assert queue == pytest.approx([2.0, 1.5, 0.75, 0.0], abs=1e-9)
    (lost,) = lost_records(reqs, share, 0, {"r0"}, 5.0, 6.0, "died", False, None, True)
    assert (lost.request_id, lost.t_scheduled, lost.client_queue) == ("r1", 5.5, 0.0)


def test_goodput_judges_from_the_schedule_and_one_token_passes_tpot() -> None:
    """--goodput under an open loop counts a request as good when every bound holds on the
    latency from its scheduled arrival (the requests held back by the blocks miss e2e:50 ms,
    though from the send every one took 10 us); a one-token request has no TPOT and passes a
    TPOT bound (as vLLM bench serve, which counts it as 0)."""
    from harness.analysis.summary import summarize

    records = _records(Poisson(RATE, seed=3))
    duration = summarize(records)["duration_s"]
    held = sum(r.e2e_from_schedule > 0.05 for r in records)
    assert held >= 20 and all(r.e2e <= 0.05 for r in records)
    good = summarize(records, {"e2e": 50.0})["goodput"] * duration
    assert round(good) == len(records) - held
    assert summarize(records, {"tpot": 0.001})["goodput"] * duration == pytest.approx(len(records))

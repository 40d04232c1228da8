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
    """One rule (core.load.open_loop) on a strategy and on its stored form alike: a rate, a
    capped rate, a ramp, a trace (and vllm bench's rate) are open loops; one at a time and a
    closed loop are not. Every reader follows it: the deciding metric at an open loop is E2E
    (a ramp too: the load controls the arrivals, DESIGN rule 5), and the tables read what the
    analysis stored (``open_loop``), not the load's keys."""
    from harness.analysis.comparisons.paired import deciding_metric
    from harness.core.load import Constant, Synchronous, open_loop
    from harness.core.ramp import Ramp
    from harness.core.replay import TraceReplay
    from harness.report.vllm_json import to_run

    opens = (Constant(2.0), Poisson(2.0, max_concurrency=1), Ramp("linear", 1.0, 5.0),
             TraceReplay((0.0, 1.0)))  # fmt: skip
    for s, want in [*((s, True) for s in opens), (Synchronous(), False), (Concurrent(4), False)]:
        assert open_loop(s) is want and open_loop(s.to_json()) is want, s
        mode = "latency" if isinstance(s, Synchronous) else "throughput"
        assert deciding_metric(mode, s.to_json()) == ("e2e" if want else "output_tok_s"), s
    vllm = {"completed": 1, "duration": 1.0, "output_throughput": 1.0, "backend": "x"}
    assert open_loop(to_run({**vllm, "request_rate": 4.0})["load"])
    assert not open_loop(to_run({**vllm, "max_concurrency": 4})["load"])
    records = _records(Poisson(RATE, seed=3), n=40)
    out = _analysis(records, Poisson(RATE, seed=3).to_json())
    row = out["rows"][0]
    assert row["open_loop"] is True
    (queue,) = [c for c in MAIN if c.name == "queue_p99"]
    closed = {**row, "summary": {}, "open_loop": False}  # what the analysis said, not the load
    assert queue.fmt(queue.get(Line(closed))) == "closed loop: no schedule"
    old = {k: v for k, v in row.items() if k != "open_loop"}  # a file before the key: n/a
    assert queue.fmt(queue.get(Line({**old, "summary": {}}))) == "n/a"


def test_the_schedule_survives_the_record_json() -> None:
    rec = RequestRecord("a", 10.5, 11.0, (10.7,), (1,), t_scheduled=10.25)
    back = RequestRecord.from_json(rec.to_json(t0=10.0))
    assert back.t_scheduled == 0.25 and abs(back.e2e_from_schedule - 0.75) < 1e-12
    old = {k: v for k, v in rec.to_json().items() if k != "scheduled_s"}  # a file before it
    assert RequestRecord.from_json(old).t_scheduled is None


def test_capacity_search_with_a_client_that_cannot_keep_up() -> None:
    """The search (next_rate choosing each probed rate, 3 repeats of 0.6 s each) against an
    engine that serves every request in 20 ms (3 tokens), through a client capped at one
    request in flight (at most 50 req/s), all on the fake clock: from the send TTFT stays 20 ms
    at every rate; from the schedule the capped client's queue (and the requests it never sent
    by the end) breaks --slo ttft:100: the capacity from the schedule is lower than from the
    send, and the summary says why. No wall time: the outcome cannot depend on the machine."""
    from harness.analysis.capacity.slo import capacity_analysis, next_rate, probe_entry
    from harness.report.capacity_plot import capacity_markdown
    from tests.clock import ScriptedEngine

    slo, q = {"ttft": 100.0}, 0.9
    runs: list[Run] = []
    rate = next_rate([], ["scripted/baseline"], 8.0, 4)
    while rate is not None:
        for b in range(3):
            strategy = Poisson(rate, seed=b, max_concurrency=1)
            clock = DeadlineClock()
            reqs = [Request(f"{b}-{i}", "x") for i in range(200)]
            engine = ScriptedEngine(
                clock, {r.id: [(0.02, 1), (0.001, 1), (0.001, 1)] for r in reqs}
            )
            runner = Runner(engine, clock=clock, sleep=clock.sleep)
            records = asyncio.run(runner.run(reqs, GenParams(), strategy, duration=0.6))
            cell = Cell("scripted", "baseline", "throughput", strategy.to_json(), 3, b, "w")
            runs.append(Run(cell, None, tuple(records)))
        probes = [e for r in runs if (e := probe_entry(r, slo, q)) is not None]
        rate = next_rate(probes, ["scripted/baseline"], 8.0, 4)
    cap = capacity_analysis(runs, slo, q, 0.02)
    (row,) = cap["variants"]
    assert row["status"] == "bracketed", cap["curves"]
    (sent,) = cap["from_send"]["variants"]
    assert sent["status"] == "holds at every probed rate" or sent["capacity"] > row["capacity"]
    (behind,) = cap["from_send"]["behind"]
    assert behind["client_queue_s"] > 0.05  # its p90 where the schedule failed (TTFT 20 ms + it)
    text = capacity_markdown({"capacity": cap})
    assert "judged from the send it would " in text
    assert "the client fell behind its schedule (client queue p90" in text


def test_a_client_worker_keeps_the_schedule_on_the_runners_clock() -> None:
    """A worker handed an open loop stamps each record's scheduled arrival (``t0`` + its dealt
    offset) on its own clock, and the parent's shift (a Ray worker's estimated offset) moves it
    with the other stamps: planted 7 s, the schedule lands on the runner's time line and the
    client queue is unchanged; the job arrived 2 s late, so the overdue requests queued."""
    from multiprocessing import Pipe

    from harness.run.clients.process import Job, Records, Share, WorkerLoop
    from harness.run.clients.workers import lost_records, shifted
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


def test_requests_due_but_not_sent_by_the_end_are_recorded() -> None:
    """Poisson 100 req/s through a client capped at one in flight, 20 ms a request, --duration
    1 s (the fake clock): about 95 requests are due before the end, the client sends about 50.
    Every one due gets a record: the unsent ones failed with the reason and their schedule, the
    summary counts them, the client-behind warning names them."""
    from harness.analysis.capacity.slo import probe_entry
    from harness.analysis.summary import summarize
    from harness.core.records import NOT_SENT
    from harness.run.counters import RunCounters
    from tests.clock import ScriptedEngine

    strategy = Poisson(RATE, seed=3, max_concurrency=1)
    clock = DeadlineClock()
    reqs = [Request(str(i), "x") for i in range(400)]
    engine = ScriptedEngine(clock, {r.id: [(0.02, 1)] for r in reqs})
    runner = Runner(engine, clock=clock, sleep=clock.sleep)
    t0 = clock.now
    records = asyncio.run(runner.run(reqs, GenParams(), strategy, duration=1.0, t0=t0))
    due = sum(off < 1.0 for off in strategy.offsets(len(reqs)))
    unsent = [r for r in records if r.error == NOT_SENT]
    sent = [r for r in records if r.ok]
    assert 80 <= due <= 110 and len(records) == due, (due, len(records))
    assert len(sent) + len(unsent) == due and 40 <= len(sent) <= 55
    assert all(not r.ok and r.t_scheduled < t0 + 1.0 <= r.t_send for r in unsent)
    assert {r.request_id for r in records} == {str(i) for i in range(due)}
    out = _analysis(tuple(records), strategy.to_json())
    (row,) = out["rows"]
    assert row["summary"]["not_sent"] == 3 * len(unsent)  # three repeats pooled
    rate = summarize(sent)["achieved_rate"]  # the rate the client sent at: the unsent not in it
    assert summarize(records)["achieved_rate"] == pytest.approx(rate)
    (warn,) = [w for w in out["answer"]["warnings"] if w["kind"] == "client behind"]
    assert warn["not_sent"] == 3 * len(unsent)
    assert f"{3 * len(unsent)} requests due were not sent" in warning_line(warn)
    run = Run(Cell("scripted", "baseline", "throughput", strategy.to_json(), 1, 0, "w"), None,
              tuple(records))  # fmt: skip
    probe = probe_entry(run, {"e2e": 1000.0}, 0.9)  # every request sent took well under 1 s
    assert probe["not_sent"] == len(unsent) and probe["attainment"] <= len(sent) / due + 1e-9
    assert probe["margin"] > 0 > probe["margin_from_send"]  # the unsent miss it
    counts = RunCounters()  # --max-error-rate counts the engine's failures, not the client's
    assert not any(counts.add(r.ok, r.warmup, 0.1, r.error) for r in records)


def test_the_deciding_e2e_is_from_the_schedule_in_comparisons_and_capacity_alike() -> None:
    """One clock for "E2E at a rate" (DESIGN rule 11): a candidate as fast as the baseline from
    the send whose client held every request 100 ms is 0.5x on the paired E2E and on the
    capacity probes' E2E quantile that the rate crossover is built on; in a closed loop (no
    schedule) both are from the send."""
    import math

    from harness.analysis.capacity.slo import probe_entry
    from harness.analysis.comparisons.paired import comparisons

    load = Poisson(RATE, seed=3).to_json()

    def run(label: str, repeat: int, queue: float, sched: bool = True) -> Run:
        recs = tuple(
            RequestRecord(str(i), i + queue, i + queue + 0.1, (i + queue + 0.05,), (1,),
                          t_scheduled=float(i) if sched else None)
            for i in range(10)
        )  # fmt: skip
        cell_load = load if sched else Concurrent(4).to_json()
        return Run(Cell("e", label, "throughput", cell_load, 1, repeat, "w"), None, recs)

    runs = [run(label, b, q) for b in range(3) for label, q in (("baseline", 0.0), ("x", 0.1))]
    (e2e,) = [c for c in comparisons(runs) if c["metric"] == "e2e"]
    assert e2e["decides"] and e2e["estimate"] == pytest.approx(0.5)
    probes = {r.cell.label: probe_entry(r, {"e2e": 1000.0}, 0.9) for r in runs[:2]}
    ratio = probes["baseline"]["quantiles_s"]["e2e"] / probes["x"]["quantiles_s"]["e2e"]
    assert math.isclose(ratio, e2e["estimate"], rel_tol=0.05)
    closed = [
        run(label, b, q, False) for b in range(3) for label, q in (("baseline", 0), ("x", 0.1))
    ]
    (e2e,) = [c for c in comparisons(closed) if c["metric"] == "e2e"]
    assert e2e["estimate"] == pytest.approx(1.0)

"""``--client-workers``: requests sent from several client processes, merged as if one client had
sent them (harness.run.clients.workers). The end-to-end tests run the whole CLI against the scripted
fake server (tests/fake_server.py, known delays) once with one client and once with two."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from harness.cli.main import main
from harness.core.records_file import load_with_records
from harness.run.clients.workers import ClientPool, split
from tests.clock import FakeClock
from tests.fake_server import Behaviour, FakeServer
from tests.test_faults import ServerThread, run_harness

FIRST_S, ITL_S, TOKENS = 0.04, 0.01, 6


@pytest.mark.parametrize("cap", [None, 1, 3, 5, 16])
@pytest.mark.parametrize("workers", [1, 2, 3, 4])
def test_split_deals_every_request_once_with_its_offset(cap, workers) -> None:
    offsets = [0.01 * j for j in range(37)]
    shares = split(offsets, cap, workers)
    assert len(shares) == (workers if cap is None else min(workers, cap))
    dealt = sorted(j for s in shares for j in s.positions)
    assert dealt == list(range(len(offsets)))  # each request once, none dropped
    for s in shares:
        assert list(s.offsets) == [offsets[j] for j in s.positions]  # the same schedule
        assert list(s.positions) == sorted(s.positions)
    if cap is not None:  # the cap is split, in total the same; requests follow the slots
        assert sum(s.cap for s in shares) == cap
        for s in shares:
            assert abs(len(s.positions) / len(offsets) - s.cap / cap) <= cap / len(offsets)


def test_an_injected_clock_is_refused() -> None:
    """A fake clock cannot be read by another process: the pool says so before spawning."""
    import asyncio

    from engines.base import EngineError

    with pytest.raises(EngineError, match="cannot be read by other processes"):
        asyncio.run(ClientPool.start(object(), 2, FakeClock()))


def test_a_worker_that_cannot_start_is_one_line() -> None:
    """A worker whose engine fails says why through the pool (the lane then did not start)."""
    import asyncio
    from dataclasses import replace

    from engines.base import EngineConfig, EngineError
    from engines.openai.engine import OpenAIEngine

    async def body() -> None:
        async with FakeServer(Behaviour(tokens=2)) as url:
            opts = {"base_urls": [url]}
            engine = OpenAIEngine(EngineConfig(engine="openai", model="fake-model", options=opts))
            await engine.start()
            good = engine.client_config()
            bad = replace(good, options={**good.options, "request_timeout": -1})
            engine.client_config = lambda: bad  # type: ignore[method-assign]
            try:
                with pytest.raises(EngineError, match=r"client worker \d: openai: request_timeout"):
                    await ClientPool.start(engine, 2, time.perf_counter)
            finally:
                await engine.close()

    asyncio.run(body())


def test_in_process_engine_refuses_client_workers(tmp_path, capsys) -> None:
    code = main(["--engine", "vllm", "--client-workers", "2", "--model", "tiny", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0, err
    assert "--client-workers 2: engine vllm runs in this process" in err


def _run(tmp_path, url, n, workers, *load):
    code, out = run_harness(
        tmp_path / f"w{workers}", url, n, *load, "--client-workers", str(workers)
    )
    assert code == 0
    return load_with_records(out / "results.json")


@pytest.mark.parametrize(
    "load", [("--concurrency", "4"), ("--request-rate", "20")], ids=["closed", "poisson"]
)
def test_two_workers_match_one(tmp_path, capsys, load) -> None:
    """The same records, ids and timing statistics (within tolerance) from 2 client processes as
    from 1, against a server with known delays; the records say which process sent them."""
    n = 24
    server = FakeServer(Behaviour(tokens=TOKENS, first_delay=FIRST_S, delay=ITL_S))
    for w in (1, 2):
        (tmp_path / f"w{w}").mkdir()
    with ServerThread(server) as url:
        one = _run(tmp_path, url, n, 1, *load)
        two = _run(tmp_path, url, n, 2, *load)
    assert len(server.requests) == 2 * n
    assert two["config"]["client_workers"] == 2 and one["config"]["client_workers"] == 1
    (r1,), (r2,) = one["runs"], two["runs"]
    assert len(r1["records"]) == len(r2["records"]) == n
    assert sorted(r["id"] for r in r1["records"]) == sorted(r["id"] for r in r2["records"])
    assert r2["summary"]["completed"] == n and r2["summary"]["failed"] == 0
    senders = [r["info"]["client_worker"] for r in r2["records"]]
    assert sorted(set(senders)) == [0, 1] and senders.count(0) == senders.count(1) == n // 2
    assert "client_worker" not in r1["records"][0]["info"]
    info = r2["engine_info"]["client_workers"]
    assert info["workers"] == 2 and "CLOCK_MONOTONIC" in info["clock"]
    assert info["max_abs_offset_s"] <= info["max_handshake_rtt_s"]
    for key, truth in (("ttft_s", FIRST_S), ("tpot_s", ITL_S)):
        # a token cannot be seen before the server sent it (one clock); the rest is this
        # shared machine's scheduling, hence the loose upper bound
        a, b = r1["summary"][key]["median"], r2["summary"][key]["median"]
        assert truth <= a < truth + 0.2 and truth <= b < truth + 0.2, (key, a, b)
    sends = []
    for run in (r1, r2):  # the workers' stamps are on the runner's time line
        t = {r["id"]: r["send_s"] for r in run["records"]}
        assert all(0 <= v < 30 for v in t.values()), t
        sends.append({k: v - min(t.values()) for k, v in t.items()})
    if load[0] == "--request-rate":  # open loop: each request keeps its seeded Poisson offset
        # the schedule itself is the same (seeded) in both runs, to the clock's resolution; how
        # late each send is depends on the machine (a first send 60 ms late shifted every other
        # one at load 3), so only its sign is asserted: never before its scheduled arrival
        sched = [{r["id"]: r["scheduled_s"] for r in run["records"]} for run in (r1, r2)]
        rel = [{k: v - min(s.values()) for k, v in s.items()} for s in sched]
        assert all(abs(rel[0][k] - rel[1][k]) < 1e-6 for k in rel[0]), rel
        assert max(rel[0].values()) > 0.3  # 24 arrivals at 20 req/s: spread over ~1 s
        for run in (r1, r2):  # ... and its scheduled arrival, on the records' clock
            assert all(r["send_s"] - r["scheduled_s"] >= -1e-6 for r in run["records"])
    else:  # closed loop at 4: the first wave is the same 4 requests (2 + 2 slots)
        assert all(r["scheduled_s"] is None for run in (r1, r2) for r in run["records"])
        first = [sorted(s, key=s.get)[:4] for s in sends]
        assert set(first[0]) == set(first[1]), first


@pytest.mark.parametrize(
    "ahead, sent",
    [(7.0, (0.0, 0.5, 1.25, 3.0)), (-2.0, (2.0, 2.0, 2.0, 3.0))],
    ids=["early", "late"],
)
def test_a_worker_sends_on_the_parents_t0(ahead, sent) -> None:
    """A worker sends request j at the parent's ``t0`` + its dealt offset, on the shared clock,
    not at its own start + offset: planted offsets, a fake clock (in this process, with its
    sleep) whose "now" is ``ahead`` s before the handed ``t0``. Early: every send exactly at
    t0 + offset. Late (the job arrived 2 s after ``t0``): what is overdue goes at once, the rest
    on time. A worker ignoring ``t0`` would be off by 7 s (early) or send at 2.5, 3.25, 5 (late)."""
    import asyncio
    from multiprocessing import Pipe

    from engines.base import GenParams, Request
    from harness.run.clients.process import Job, Records, Share, WorkerLoop
    from tests.clock import ScriptedEngine

    offsets = (0.0, 0.5, 1.25, 3.0)
    clock = FakeClock()
    t0 = clock.now + ahead
    reqs = [Request(id=f"r{j}", prompt="x") for j in range(len(offsets))]
    engine = ScriptedEngine(clock, {r.id: [(1e-12, 1)] for r in reqs})  # ~no virtual time
    parent, child = Pipe()
    worker = WorkerLoop(child, engine.config, clock, sleep=clock.sleep)
    share = Share(0, tuple(range(len(offsets))), offsets, None)
    asyncio.run(worker._job(engine, Job(1, reqs, None, share, GenParams(), t0, None, False)))
    records = []
    while parent.poll():
        msg = parent.recv()
        records += msg.records if isinstance(msg, Records) else ()
    sends = {r.request_id: r.t_send - t0 for r in records}
    assert [sends[r.id] for r in reqs] == pytest.approx(sent, abs=1e-9), sends


def test_ray_address_without_ray_is_one_line() -> None:
    """Without the extra installed: exit 2, one line saying how to install it."""
    code = (
        "import sys, importlib.util as u; real = u.find_spec\n"
        "u.find_spec = lambda name, *a: None if name == 'ray' else real(name, *a)\n"
        "from harness.cli.main import main\n"
        "sys.exit(main(['--engine', 'openai', '--base-url', 'http://127.0.0.1:9/v1',"
        " '--ray-address', 'auto', '--quiet']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    err = proc.stderr.strip()
    assert proc.returncode == 2 and err.count("\n") == 0, err
    assert "--ray-address needs Ray" in err and "pip install" in err


def test_a_clock_uncertainty_above_a_tenth_of_the_ttft_is_said() -> None:
    """harness.analysis.clocks: 2 ms of uncertainty against a 10 ms median TTFT is a warning of
    the answer block, formatted as one line naming the run; 0.5 ms is not; a run without client
    workers is not."""
    from harness.analysis.clocks import clock_warnings
    from harness.core.records import RequestRecord
    from harness.core.results import Cell, Run
    from harness.report.answer_text import warning_line

    cell = Cell("openai", "baseline", "throughput", {"concurrency": 4}, 8, 0, "w")
    recs = tuple(RequestRecord(f"r{i}", 0.0, 0.05, (0.010,), (1,)) for i in range(3))

    def run(worst: float | None) -> Run:
        extra = {} if worst is None else {"client_workers": {"max_uncertainty_s": worst}}
        return Run(cell, None, recs, extra=extra)

    said = clock_warnings([run(0.002), run(0.0005), run(None)])
    assert len(said) == 1 and said[0]["kind"] == "clock", said
    line = warning_line(said[0])
    assert "2.0 ms" in line and "10.0 ms" in line and cell.name in line, line

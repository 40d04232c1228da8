"""Saturation detection (harness.analysis.capacity.saturation via harness.run.saturation): against a
server whose service rate is known, points above it are stopped as saturated within a bounded
number of requests, points below it are not (false alarms <= 5% over seeds)."""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
import pytest

from engines import base as engines_base
from engines.base import Capabilities, Chunk, EngineConfig, GenParams, Request
from harness.core.load import Poisson
from harness.core.records import RequestRecord
from harness.run.saturation import monitor_for
from tests.clock import FakeClock, ScriptedEngine, run_virtual
from tests.test_design import _plan

ASKED = SimpleNamespace(detect_saturation=True, slo=None, ramp_up_strategy=None)
MU = 10.0  # the simulated server's service rate (requests/s)
N = 300


def simulate(rate: float, seed: int, servers: int = 4) -> tuple[Poisson, list[RequestRecord]]:
    """A FIFO queue with ``servers`` slots and gamma service times of mean servers / MU (so it
    serves MU requests/s), fed Poisson arrivals: the records in completion order."""
    rng = np.random.default_rng(seed)
    strategy = Poisson(rate, 1.0, seed)
    arrive = np.asarray(strategy.offsets(N)) + 100.0
    service = rng.gamma(4.0, servers / MU / 4.0, N)
    free = [100.0] * servers
    out = []
    for i in range(N):
        begin = max(arrive[i], heapq.heappop(free))
        end = begin + service[i]
        heapq.heappush(free, end)
        out.append(RequestRecord(str(i), arrive[i], end, (begin + 0.1 * service[i], end), (1, 7)))
    return strategy, sorted(out, key=lambda r: r.t_end)


def batching(rate: float, seed: int) -> tuple[Poisson, list[RequestRecord]]:
    """A batching server (processor sharing: every request in flight is admitted at once, its
    first token 20 ms later, and they share MU requests/s of decode): under overload TTFT stays
    flat while every request slows down."""
    rng = np.random.default_rng(seed)
    strategy = Poisson(rate, 1.0, seed)
    arrive = np.asarray(strategy.offsets(N)) + 100.0
    work = rng.gamma(4.0, 1.0 / MU / 4.0, N)  # seconds of the whole server per request
    left = np.full(N, np.inf)  # work still to do; inf: not in flight (not yet, or done)
    ends = np.zeros(N)
    t, i = 100.0, 0
    while i < N or np.isfinite(left).any():
        act = np.isfinite(left)
        k = int(act.sum())
        finish = t + (float(left[act].min()) * k if k else np.inf)
        nxt = arrive[i] if i < N else np.inf
        step = min(finish, nxt)
        if k:
            left[act] -= (step - t) / k
        t = step
        if nxt <= finish:
            left[i] = work[i]
            i += 1
        else:
            gone = act & (left <= 1e-12)
            ends[gone] = t
            left[gone] = np.inf
    out = [RequestRecord(str(j), arrive[j], ends[j], (min(arrive[j] + 0.02, ends[j]), ends[j]), (1, 7))
           for j in range(N)]  # fmt: skip
    return strategy, sorted(out, key=lambda r: r.t_end)


def stopped_after(rate: float, seed: int, server=simulate) -> int | None:
    """How many requests were sent when the monitor said saturated (None: never): the runner's
    question before each send and each record as it finishes, in time order."""
    strategy, records = server(rate, seed)
    now = [100.0]
    monitor = monitor_for(ASKED, strategy, N, lambda: now[0])
    events = sorted(
        [(r.t_send, 0, r) for r in records] + [(r.t_end, 1, r) for r in records],
        key=lambda e: (e[0], e[1]),
    )
    for t, kind, r in events:
        now[0] = t
        if kind == 1:
            monitor.add(r)
        elif monitor.should_stop():
            break
    if monitor.verdict is None:
        return None
    return int(monitor.verdict["sent"])


@pytest.mark.parametrize("server", [simulate, batching])
@pytest.mark.parametrize("load", [0.5, 0.7])
def test_below_the_service_rate_false_alarms_are_rare(load: float, server) -> None:
    alarms = [stopped_after(load * MU, seed, server) for seed in range(200)]
    assert sum(a is not None for a in alarms) / 200 <= 0.05


@pytest.mark.parametrize(
    "server, load, share",
    [(simulate, 1.5, 0.95), (simulate, 2.0, 0.95), (simulate, 4.0, 0.95),
     (batching, 1.5, 0.95), (batching, 2.0, 0.95),
     # processor sharing at 4x slows even the first requests, whose E2E sets the window the
     # queue's filling needs: 41/50 caught (median 185 sent); FIFO at 4x: 50/50 (median 79)
     (batching, 4.0, 0.70)],
)  # fmt: skip
def test_above_the_service_rate_stopped_within_a_bound(server, load: float, share: float) -> None:
    stops = [stopped_after(load * MU, seed, server) for seed in range(50)]
    caught = [s for s in stops if s is not None]
    assert len(caught) / 50 >= share
    assert np.median(caught) <= 200  # of 300: stopped well before the point's end


class QueueEngine(ScriptedEngine):
    """A server with two slots, each serving a request in 10 ms (200 requests/s). Its waits are
    ``asyncio.sleep``: on :func:`tests.clock.run_virtual`'s loop they take virtual time, so the
    queue (and the saturation it shows) is the same on any machine under any load."""

    capabilities: ClassVar[Capabilities] = Capabilities(coexist=True)

    def __init__(self, clock: Any = None) -> None:
        super().__init__(FakeClock(), {})
        self.slots = asyncio.Semaphore(2)

    async def stream(
        self, request: Request, params: GenParams, clock: Any = None
    ) -> AsyncIterator[Chunk]:
        async with self.slots:
            await asyncio.sleep(0.002)
            yield Chunk(token_ids=(0,))
            await asyncio.sleep(0.008)
            yield Chunk(token_ids=(1, 2))


@pytest.fixture
def queue_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(engines_base.REGISTRY, "scripted", "tests.test_saturation:QueueEngine")


def run_queue(plan: Any, n: int) -> Any:
    """One lane of ``plan`` against the :class:`QueueEngine` on virtual time (the session's
    clock is the loop's): its one run."""
    from harness.run.session import Session

    clock = FakeClock()
    prompts = [Request(f"p{i}", "x") for i in range(n)]
    session = Session(plan, prompts, progress=False, clock=clock,
                      engine_factory=lambda c: QueueEngine())  # fmt: skip
    (run,) = run_virtual(session.execute([("baseline", EngineConfig("scripted", "m"))]), clock)
    return run


# on virtual time: neither outcome depends on the machine (on real time, at load 8-12, 800 req/s
# once finished "ok", and 50 req/s once raised a false alarm)
@pytest.mark.parametrize("rate, saturated", [(800.0, True), (50.0, False)])
def test_session_stops_a_saturated_point_and_marks_it(queue_engine: None, rate: float,
                                                      saturated: bool) -> None:  # fmt: skip
    plan = dataclasses.replace(
        _plan(), modes=("throughput",), concurrency=(), request_rates=(rate,), repeats=1,
        max_repeats=1, warmup=0, detect_saturation=True,
    )  # fmt: skip
    run = run_queue(plan, 300)
    if saturated:
        assert run.status.startswith("saturated: stopped after")
        assert run.extra["saturation"]["sent"] < 300 and len(run.records) < 300
    else:
        assert run.status == "ok" and len(run.records) == 300


class RebuiltQueue(QueueEngine):
    """The same queue, rebuilt as a fresh instance every block."""

    capabilities: ClassVar[Capabilities] = Capabilities(coexist=True, rebuild_per_block=True)


def test_per_block_instances_keep_running_a_point_whose_runs_saturate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Saturated is a finding, not a failure: with fresh instances per block, a point whose
    runs saturate in block 0 still runs in blocks 1 and 2 on every lane (a failed run halts
    its lane there: tests/test_instances.py). The monitor's verdict comes after 5 sends
    whatever the machine's speed (detecting a real overload: the test above)."""
    import harness.run.session as session_module
    from harness.core.design import PER_BLOCK
    from harness.run.session import Session

    def saturating(*args: Any) -> Any:
        monitor = monitor_for(*args)
        ask = monitor.should_stop

        def should_stop() -> bool:
            if monitor.asked >= 5 and monitor.verdict is None:
                monitor.verdict = {"sent": monitor.asked, "completed": monitor.done}
            return ask()

        monitor.should_stop = should_stop  # type: ignore[method-assign]
        return monitor

    monkeypatch.setattr(session_module, "monitor_for", saturating)
    monkeypatch.setitem(engines_base.REGISTRY, "scripted", "tests.test_saturation:RebuiltQueue")
    plan = dataclasses.replace(
        _plan(), modes=("throughput",), concurrency=(), request_rates=(100.0,), repeats=3,
        max_repeats=3, warmup=0, detect_saturation=True, instances=PER_BLOCK,
    )  # fmt: skip
    prompts = [Request(f"p{i}", "x") for i in range(30)]
    made: list[RebuiltQueue] = []

    def factory(config: EngineConfig) -> RebuiltQueue:
        made.append(RebuiltQueue())
        return made[-1]

    session = Session(plan, prompts, progress=False, engine_factory=factory)
    configs = [(lb, EngineConfig("scripted", "m")) for lb in ("baseline", "baseline-aa")]
    runs = asyncio.run(session.execute(configs))
    assert set(session.instances.values()) == {PER_BLOCK}
    assert sorted((r.cell.label, r.cell.repeat) for r in runs) == [
        (lb, b) for lb in ("baseline", "baseline-aa") for b in range(3)
    ]
    assert all(r.status.startswith("saturated: stopped after") for r in runs), [
        r.status for r in runs
    ]
    assert all(0 < len(r.records) < 30 for r in runs)
    assert len(made) == 2 * 3  # a fresh pair of instances in every block


def test_capacity_search_through_an_openai_endpoint(tmp_path, capsys) -> None:
    """The search on an HTTP engine: a fake OpenAI server that queues (one slot, 100 ms a
    request: 10 requests/s); --slo ttft:1500 is bracketed, stored in results.json, printed. The
    bound leaves 1.4 s for the client's own overhead at the low rates (a 50 ms service under a
    500 ms bound failed at every rate on a loaded 2-core machine), while 32 req/s for a second
    queues 3 s of work: the bracket does not depend on the machine's speed."""
    import json
    import threading
    import time

    from harness.cli.main import main
    from tests.fake_server import Behaviour, FakeServer
    from tests.test_faults import ServerThread, workload

    free = [0.0]
    lock = threading.Lock()

    def queued(i: int) -> Behaviour:
        with lock:
            now = time.monotonic()
            free[0] = max(free[0], now) + 0.1
            return Behaviour(tokens=3, first_delay=free[0] - now, delay=0.001)

    out = tmp_path / "out"
    argv = ["--engine", "openai", "--workload", workload(tmp_path, 8), "--max-new-tokens", "3",
            "--repeats", "3", "--warmup", "0", "--duration", "1.0", "--slo", "ttft:1500",
            "--slo-start-rate", "4", "--slo-max-probes", "6", "--output-dir", str(out),
            "--quiet", "--no-plots"]  # fmt: skip
    with ServerThread(FakeServer(queued)) as url:
        code = main([*argv, "--base-url", url])
    printed = capsys.readouterr().out
    assert code == 0
    cap = json.loads((out / "results.json").read_text())["capacity"]
    (row,) = cap["variants"]
    assert row["status"] == "bracketed", cap["curves"]
    assert 4 <= row["capacity"] <= 64
    assert "## Capacity under the SLO (TTFT p90 <= 1500 ms)" in printed


def test_a_ramp_stops_where_it_saturates(queue_engine: None) -> None:
    """A linear ramp 20 -> 1000 req/s against the 200 req/s queue: stopped as saturated, the
    asked rate at the stop above the service rate, every record carrying its send-time rate."""
    plan = dataclasses.replace(
        _plan(), modes=("throughput",), concurrency=(), repeats=1, max_repeats=1, warmup=0,
        ramp_up_strategy="linear", ramp_up_start_rps=20.0, ramp_up_end_rps=1000.0,
    )  # fmt: skip
    run = run_queue(plan, 600)
    assert run.status.startswith("saturated"), run.status
    assert 200 < run.extra["saturation"]["request_rate_at_stop"] < 1000
    assert all(20 <= r.info["request_rate"] <= 1000 for r in run.records)
    assert run.cell.load["ramp_up_strategy"] == "linear"

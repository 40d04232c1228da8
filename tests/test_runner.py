"""The runner's timing, from an injected clock, and its handling of failures and caps."""

from __future__ import annotations

import asyncio

import pytest

from engines.base import Chunk, GenParams, Request, UnsupportedError
from harness.core.load import Concurrent, Poisson, Synchronous
from harness.run.runner import Runner
from tests.clock import FakeClock, ScriptedEngine


def run(coro):
    return asyncio.run(coro)


def test_latency_timing_from_injected_clock():
    clock = FakeClock()
    engine = ScriptedEngine(clock, {"a": [(0.5, 1), (0.1, 2), (0.2, 1)], "b": [(0.3, 1)]})
    seen = []
    runner = Runner(engine, clock=clock, sleep=clock.sleep, on_record=seen.append)
    records = run(runner.run([Request("a", "x"), Request("b", "y")], GenParams(), Synchronous()))
    a, b = records
    assert a.ttft == pytest.approx(0.5)
    assert a.itl == pytest.approx((0.1, 0.2))
    assert a.chunk_tokens == (1, 2, 1)
    assert a.output_tokens == 4 and a.output_token_ids == (0, 1, 2, 3)
    assert a.e2e == pytest.approx(0.8)
    assert a.tpot == pytest.approx((0.8 - 0.5) / 3)
    assert a.itl_per_token == pytest.approx((0.05, 0.05, 0.2))
    assert a.prompt_tokens == 5
    # one at a time: b is sent after a ended
    assert b.t_send == pytest.approx(a.t_end)
    assert b.ttft == pytest.approx(0.3) and b.tpot is None
    assert [r.request_id for r in seen] == ["a", "b"]


def test_engine_stamps_are_kept_and_delivery_lag_is_not_timed():
    """An in-process engine stamps chunks with the runner's clock where they are made; the runner
    keeps those stamps instead of its own arrival time (the lag of the hand-over)."""
    clock = FakeClock()
    script = {"a": [(0.5, 1), (0.1, 2), (0.2, 1)]}
    stamped = ScriptedEngine(clock, script, delivery_lag=0.05)
    (a,) = run(
        Runner(stamped, clock=clock, sleep=clock.sleep).run(
            [Request("a", "x")], GenParams(), Synchronous()
        )
    )
    # the chunks were made at +0.5, +0.65, +0.9 (each lag moves the clock on, unmeasured)
    assert a.ttft == pytest.approx(0.5)
    assert a.itl == pytest.approx((0.15, 0.25))
    assert a.e2e == pytest.approx(0.5 + 0.1 + 0.2 + 3 * 0.05)  # the end: when the stream ended
    clock2 = FakeClock()
    plain = ScriptedEngine(clock2, script)  # unstamped: the runner times arrival
    (b,) = run(
        Runner(plain, clock=clock2, sleep=clock2.sleep).run(
            [Request("a", "x")], GenParams(), Synchronous()
        )
    )
    assert b.ttft == pytest.approx(0.5) and b.itl == pytest.approx((0.1, 0.2))


def test_failure_is_recorded_not_raised_and_keeps_chunks():
    clock = FakeClock()
    engine = ScriptedEngine(clock, {"a": [(0.1, 3)], "b": [(0.1, 2)]}, fail={"a": "reset by peer"})
    records = run(
        Runner(engine, clock=clock, sleep=clock.sleep).run(
            [Request("a", "x"), Request("b", "y")], GenParams(), Synchronous()
        )
    )
    assert not records[0].ok and "reset by peer" in records[0].error
    assert records[0].error.startswith("ConnectionResetError")
    assert records[0].output_tokens == 3
    assert records[1].ok and records[1].error is None


def test_concurrency_cap_is_never_exceeded():
    clock = FakeClock()
    script = {str(i): [(0.01, 1)] * 5 for i in range(40)}
    engine = ScriptedEngine(clock, script)
    reqs = [Request(str(i), "p") for i in range(40)]
    records = run(
        Runner(engine, clock=clock, sleep=clock.sleep).run(reqs, GenParams(), Concurrent(4))
    )
    assert engine.peak == 4
    assert all(r.ok for r in records) and len(records) == 40


def test_poisson_arrivals_are_honoured():
    clock = FakeClock()
    script = {str(i): [(1e-12, 1)] for i in range(200)}  # a first token after its send
    engine = ScriptedEngine(clock, script)
    reqs = [Request(str(i), "p") for i in range(200)]
    strategy = Poisson(rate=10.0, seed=3)
    records = run(Runner(engine, clock=clock, sleep=clock.sleep).run(reqs, GenParams(), strategy))
    sends = [r.t_send - records[0].t_send for r in records]
    assert sends == pytest.approx(strategy.offsets(200), abs=1e-9)


def test_batch_one_engine_refuses_concurrency():
    clock = FakeClock()
    engine = ScriptedEngine(clock, {"a": [(0.1, 1)]}, max_batch=1)
    with pytest.raises(UnsupportedError, match="batch size 1"):
        run(Runner(engine, clock=clock).run([Request("a", "x")], GenParams(), Concurrent(4)))


def test_should_stop_stops_sending():
    clock = FakeClock()
    engine = ScriptedEngine(clock, {str(i): [(0.1, 1)] for i in range(10)})
    sent = []
    runner = Runner(
        engine,
        clock=clock,
        sleep=clock.sleep,
        on_record=sent.append,
        should_stop=lambda: len(sent) >= 3,
    )
    records = run(runner.run([Request(str(i), "p") for i in range(10)], GenParams(), Synchronous()))
    assert len(records) == 3


def test_ten_thousand_requests_keep_memory_per_record_small():
    """Records are kept (they are the result), but nothing else grows with the run: a record
    holds its timestamps and ids once, no chunk objects, no second copy of the text."""
    import tracemalloc

    clock = FakeClock()
    tokens = [(0.001, 1)] * 8

    class Many(ScriptedEngine):
        def __init__(self):
            super().__init__(clock, {})

        async def stream(self, request, params, clock=None):
            for i, (delay, _n) in enumerate(tokens):
                clock.now += delay
                yield Chunk(token_ids=(i,), text="tok ", prompt_tokens=5 if i == 0 else None)

    def peak(n: int) -> int:
        reqs = [Request(str(i), "p") for i in range(n)]
        tracemalloc.start()
        records = run(
            Runner(Many(), clock=clock, sleep=clock.sleep).run(reqs, GenParams(), Concurrent(100))
        )
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert len(records) == n and all(r.ok and r.output_tokens == 8 for r in records)
        return top

    small, large = peak(2_000), peak(10_000)
    per_record = (large - small) / 8_000
    assert per_record < 4_000, per_record  # bytes: 8 timestamps, 8 ids, text, bookkeeping


def test_a_chunk_of_several_steps_keeps_each_steps_stamp():
    """An in-process engine hands several steps over in one chunk (``times``/``sizes``): the
    record holds one arrival per step at its stamp, as if each step had come alone."""

    class Batched(ScriptedEngine):
        async def stream(self, request, params, clock=None):
            steps = []
            for delay, n in self.script[request.id]:
                self.clock.now += delay
                steps.append((n, clock()))  # stamped when made, handed over later
            self.clock.now += 0.3  # the hand-over's lag: not timed
            ids = tuple(range(sum(n for n, _ in steps)))
            times = tuple(t for _, t in steps)
            sizes = tuple(n for n, _ in steps)
            yield Chunk(token_ids=ids, t=times[-1], times=times, sizes=sizes, prompt_tokens=5)

    clock = FakeClock()
    engine = Batched(clock, {"a": [(0.5, 1), (0.1, 2), (0.2, 1)]})
    (a,) = run(
        Runner(engine, clock=clock, sleep=clock.sleep).run(
            [Request("a", "x")], GenParams(), Synchronous()
        )
    )
    assert a.ttft == pytest.approx(0.5) and a.itl == pytest.approx((0.1, 0.2))
    assert a.chunk_tokens == (1, 2, 1) and a.output_token_ids == (0, 1, 2, 3)
    assert a.e2e == pytest.approx(0.8 + 0.3)

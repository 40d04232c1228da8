"""The step simulator (bench/stepsim.py) and the cost benchmark's rounds: the harness's real
in-process path over a fake engine core, fast enough for CI (milliseconds per step)."""

from __future__ import annotations

import asyncio

import pytest

from bench.cost import Cell, _cell, _row


def test_cost_cell_measures_both_sides() -> None:
    cell = Cell(batch=8, step_ms=2.0, steps=6, requests_per_slot=2)
    hs, rs = asyncio.run(_cell(cell, pairs=2))
    assert len(hs) == len(rs) == 2
    # every requested token was made and counted on both sides
    assert {h.tokens for h in hs + rs} == {hs[0].tokens} and hs[0].tokens >= 16 * 3
    assert all(h.period >= 0.002 for h in hs + rs)  # a step never beats its set duration
    assert all(h.loop_us > 0 and h.stepper_us >= 0 for h in hs)
    cells, facts = _row(cell, hs, rs)
    assert cells[0] == "8 x 2 ms, 16 requests (steady state)" and len(facts["period"]) == 2


def test_each_token_is_stamped_with_its_step() -> None:
    """Whatever the hand-over batches, a token's time is the reading taken right after the step
    that made it: with a clock that counts steps, each request's chunk times are consecutive
    step numbers, one token each, and requests in one step share its stamp."""
    from bench.stepsim import StepSimEngine
    from engines.base import GenParams
    from harness.core.load import Concurrent
    from harness.run.runner import Runner
    from workloads.base import Request

    async def go() -> list:
        engine = StepSimEngine(step_s=0.001, gil_share=0.2, max_seqs=4)
        await engine.start()
        try:

            def clock() -> float:  # a step lasts 1 ms on it: hand-overs batch many steps
                return len(engine.core.starts) / 1000

            reqs = [Request(id=f"r{i}", prompt="p", max_new_tokens=5 + i) for i in range(10)]
            return await Runner(engine, clock=clock).run(reqs, GenParams(), Concurrent(4))
        finally:
            await engine.close()

    recs = asyncio.run(go())
    assert [r.output_tokens for r in recs] == [5 + i for i in range(10)]
    by_step: dict[float, int] = {}
    for r in recs:
        assert r.ok and set(r.chunk_tokens) == {1}
        steps = [round(t * 1000, 6) for t in r.chunk_times]
        assert steps == [steps[0] + k for k in range(r.output_tokens)]
        assert r.t_send <= r.chunk_times[0] and r.chunk_times[-1] <= r.t_end
        for t in steps:
            by_step[t] = by_step.get(t, 0) + 1
    assert max(by_step.values()) == 4  # the cap: four requests shared a step's stamp


@pytest.mark.slow  # three HF engines: ~15 s of CPU
def test_gpu_check_cpu_mode(tmp_path) -> None:
    """bench/gpu_check runs end to end on the CPU (tiny sizes): step costs, sides, markdown."""
    from bench.gpu_check import check, markdown

    dims = {"num_attention_heads": 2, "ffn_dim": 64, "vocab_size": 2304}
    sizes = {
        "target": {"hidden_size": 64, "num_hidden_layers": 2, **dims},
        "draft": {"hidden_size": 32, "num_hidden_layers": 1, **dims},
    }
    d = asyncio.run(check("cpu", sizes, n_prompts=1, tokens=9, rounds=1, workdir=tmp_path))
    assert set(d["sides"]) == {"plain", "assisted K=4", "assisted, HF defaults", "raw generate"}
    assert all(r["tokens"] == 9 for runs in d["sides"].values() for r in runs)
    assert d["step_costs"]["c"] > 0 and d["bound_tok_s"] > 0
    # zeroed blocks: the draft agrees with the target on every token (the ceiling)
    assert d["spec"]["assisted K=4"]["alpha"] == 1.0
    text = markdown(d)
    assert "c = " in text and "| plain" in text

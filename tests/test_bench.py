"""The benchmark suite's own arithmetic: verdicts with CIs, and why-lines built from measured parts.

The benchmarks themselves are not run here (too slow and noisy for CI: ``python -m bench``).
"""

from __future__ import annotations

import pytest

from bench.common import median_ci, ratio_headline
from bench.overhead import SCALED_LABEL, why


def test_median_ci_is_the_order_statistic_interval() -> None:
    xs = [0.9, 0.95, 1.0, 1.02, 0.97, 0.93, 1.05, 0.99, 0.96]
    lo, hi, level = median_ci(xs)
    assert (lo, hi) == (0.93, 1.02)  # 9 values: [x_(2), x_(8)], coverage 1 - 2 * 10/512
    assert level == pytest.approx(1 - 20 / 512)
    assert median_ci([1.0, 1.1, 1.2, 1.3, 1.4, 1.5])[:2] == (1.0, 1.5)  # 6: [min, max], 96.9%
    assert median_ci([1.0, 1.1, 1.2, 1.3, 1.4]) is None  # 5: even [min, max] covers 93.8%


def test_order_statistic_ci_covers_the_median_at_small_n() -> None:
    """Seeded simulation with a known median (skewed data, 6 and 9 pairs): coverage >= 95%."""
    import numpy as np

    rng = np.random.default_rng(0)
    for n in (6, 9):
        xs = rng.lognormal(0.0, 0.3, (3000, n))  # true median 1.0
        hits = [lo <= 1.0 <= hi for lo, hi, _ in (median_ci(list(x)) for x in xs)]
        assert np.mean(hits) >= 0.95 - 3 * np.sqrt(0.05 * 0.95 / 3000)


@pytest.mark.parametrize(
    ("ratios", "verdict"),
    [
        ([0.99, 1.0, 1.01, 0.995, 1.02, 1.0], "met"),  # CI [0.99, 1.02] inside >= 0.98
        ([0.90, 0.91, 0.92, 0.905, 0.915, 0.91], "missed"),  # CI far below
        ([0.90, 1.05, 0.95, 1.1, 0.96, 0.99], "inconclusive"),  # CI reaches across 0.98
        ([0.99, 1.0, 1.01, 1.0, 1.02], "inconclusive"),  # 5 pairs: no 95% CI, cannot be met
        ([1.05, 0.97, 1.0, 1.01, 1.02, 1.03], "inconclusive"),  # median 1.015 >= 0.98, CI not
    ],
)
def test_ratio_headline_verdicts(ratios: list[float], verdict: str) -> None:
    h = ratio_headline("x", ratios, 0.98, float("inf"), ">= 0.98")
    assert h.verdict == verdict and h.ok is {"met": True, "missed": False}.get(verdict)
    assert f"{len(ratios)} pairs" in h.detail


def test_ratio_headline_band_and_empty() -> None:
    inside = [1.04, 1.03, 1.02, 1.01, 1.0, 1.03]
    assert ratio_headline("x", inside, 0.95, 1.05, "within 5%").verdict == "met"
    assert ratio_headline("x", [1.2, 1.3, 1.25] * 2, 0.95, 1.05, "within 5%").verdict == "missed"
    edge = [1.04, 1.03, 1.06, 1.02, 1.04, 1.05]  # median 1.04 inside, CI to 1.06
    assert ratio_headline("x", edge, 0.95, 1.05, "within 5%").verdict == "inconclusive"
    empty = ratio_headline("x", [], 0.95, 1.05, "within 5%")
    assert empty.value is None and empty.ok is None and empty.verdict == "-"


def _fact(label: str, ratio: float, **kw: float | None) -> dict:
    base = {"cpu_us": 10.0, "tps": 2000.0, "raw_vs_first": None, "raw_tps": 2100.0, "n_req": 32}
    base["ci"] = (ratio - 0.05, ratio + 0.05)
    return {"label": label, "ratio": ratio, **base, **kw}


def test_why_attributes_measured_parts_only() -> None:
    facts = [
        _fact("vllm throughput", 0.90),
        _fact("vllm throughput vs raw streamed", 0.95, raw_vs_first=0.96),
        _fact(SCALED_LABEL, 0.97, cpu_us=20.0, tps=400.0, raw_tps=410.0),
        _fact("vllm latency", 0.99),  # met: no line
    ]
    (text,) = why(facts)
    assert "vllm throughput: 0.900" in text and "vllm latency" not in text
    assert "2.0% of the harness side's wall time" in text  # 10 us x 2000 tok/s
    assert "0.960x `llm.generate`'s speed" in text
    # 10% gap - 2% event loop - 4% streamed outputs = 4% left, outside the CI [0.85, 0.95]
    assert "remaining 4.0% is not attributed" in text and "outside the 95% CI" in text
    assert "8x512 Llama (78 ms per step of 32 requests, against 15 ms)" in text


def test_why_is_empty_when_every_target_is_met() -> None:
    assert why([_fact("hf latency", 0.99), _fact("vllm throughput", 1.01)]) == []


def test_costly_differences_skip_defaults_and_a_greedy_seed() -> None:
    from bench.recorder import costly_differences

    vb = {"model": "m", "prompt": "a", "max_tokens": 4, "temperature": 0.0, "logprobs": None,
          "repetition_penalty": 1.0, "ignore_eos": True}  # fmt: skip
    ours = {"model": "m", "prompt": "b", "max_tokens": 4, "temperature": 0.0, "top_p": 1.0,
            "seed": 0, "ignore_eos": True}  # fmt: skip
    assert costly_differences(ours, vb) == []
    assert costly_differences(ours | {"min_tokens": 4, "return_token_ids": True}, vb) == [
        "min_tokens",
        "return_token_ids",
    ]
    sampled = {"temperature": 0.7}  # a seed then gives the request its own generator
    assert costly_differences(ours | sampled, vb | sampled) == ["seed"]
    assert costly_differences(ours | {"top_p": 0.9}, vb) == ["top_p"]


@pytest.mark.slow
def test_fidelity_clients_ask_a_vllm_server_for_the_same_work(tmp_path, tiny_pair) -> None:
    """bench.fidelity's two clients with its own argv, through its recorder, against the fake
    vLLM server: the harness (one variant: no token ids) and ``vllm bench serve`` send bodies
    that differ in no field that costs the server; the recorder forwards them unchanged."""
    import asyncio
    import json

    from bench.fidelity import _harness, _harness_argv, _vbench_argv, fields_line
    from bench.recorder import Recorder, generation_bodies
    from bench.vbench import VBench
    from tests.fake_server import Behaviour, FakeServer

    model, n, tokens = tiny_pair[0], 2, 4
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"prompt number {i}"}) + "\n" for i in range(n)))
    vb = VBench(tmp_path / "vbench.log")

    async def main() -> dict[str, list[dict]]:
        server = FakeServer(Behaviour(tokens=tokens, ids_if_asked=True), model=model)
        bodies = {}
        async with server as url:
            root = url.removesuffix("/v1")
            for side in ("harness", "vbench"):
                rec = Recorder(root)
                async with rec as proxy:
                    if side == "harness":
                        out = tmp_path / "h"
                        argv = _harness_argv(proxy + "/v1", model, data, tokens, 2, out)
                        assert (await asyncio.to_thread(_harness, argv, out))[
                            "tokens"
                        ] == n * tokens
                    else:
                        argv = _vbench_argv(proxy, model, data, tokens, 2, n, tmp_path)
                        assert (await asyncio.to_thread(vb.run, argv))["failed"] == 0
                bodies[side] = rec.bodies
        assert [r.body for r in server.requests] == generation_bodies(
            bodies["harness"] + bodies["vbench"]
        )
        return bodies

    vb.start()
    try:
        bodies = asyncio.run(main())
    finally:
        vb.close()
    line, costly = fields_line(bodies)
    print(line)
    assert costly == [], line
    assert "return_token_ids" not in generation_bodies(bodies["harness"])[0]

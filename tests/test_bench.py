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


def test_fidelity_rounds_alternate_and_merged_rounds_cancel_a_linear_drift() -> None:
    """Two sides alternate which goes first (A B, B A); a server slowing by 1% per run biases
    every single round's ratio by a run's drift, and two rounds merged (A B B A) cancel it."""
    from bench.fidelity import round_order
    from bench.fidelity_analysis import abba

    assert [round_order(["h", "v"], i) for i in range(3)] == [["h", "v"], ["v", "h"], ["h", "v"]]
    assert round_order(["h", "v", "s"], 1) == ["v", "s", "h"]
    speed = iter(0.99**k for k in range(100))  # the server's speed at each run, in time order
    runs: dict[str, list[float]] = {"h": [], "v": []}
    for i in range(10):
        for side in round_order(["h", "v"], i):
            runs[side].append((0.97 if side == "h" else 1.0) * next(speed))
    single = [h / v for h, v in zip(runs["h"], runs["v"])]
    assert min(abs(r - 0.97) for r in single) > 0.009  # each round off by one run's drift
    assert abba(dict(enumerate(single))) == pytest.approx([0.97] * 5)
    gappy = dict(enumerate(single)) | {}
    del gappy[2]  # round 2 left out: 3 has no partner, no block joins rounds of the same order
    assert abba(gappy) == pytest.approx([0.97] * 4)


def test_fidelity_analysis_reads_back_the_saved_runs(tmp_path) -> None:
    """``runs.jsonl`` as the bench writes it (warm-ups with round null) gives the headlines: a
    harness 2% slower with 3% noise over 60 rounds is "met" within 5%; the ITL equal within
    noise; the lag-1 autocorrelation of independent rounds near 0."""
    import json

    import numpy as np

    from bench.fidelity_analysis import analyse, lag1, load

    rng = np.random.default_rng(1)
    rows = [{"round": None, "side": s, "tok_s": 1.0, "ttft": 1.0, "tokens": 1, "server_itl": 1.0,
             "server_ttft": 1.0, "ttft_mean": 1.0} for s in ("harness", "vbench")]  # fmt: skip
    for i in range(60):
        for side, f in (("harness", 0.98), ("vbench", 1.0)):
            e = rng.normal(0, 0.03, 3)
            rows.append({"round": i, "side": side, "tok_s": 1000 * f * np.exp(e[0]),
                         "ttft": 0.045 / f * np.exp(e[1]), "tokens": 8192,
                         "server_itl": 0.007 * np.exp(e[2]), "server_ttft": 0.040,
                         "ttft_mean": 0.040 + (0.002 if side == "harness" else 0.005)})  # fmt: skip
    path = tmp_path / "runs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    runs = load(path)
    assert [len(runs[s]) for s in ("harness", "vbench", "sampled")] == [60, 60, 0]
    body, heads = analyse(runs)
    assert [h.verdict for h in heads] == ["met", "met", "met"]
    assert heads[0].value == pytest.approx(0.98, abs=0.02)
    assert heads[0].detail.endswith("30 A B B A blocks")  # two sides: rounds merged in twos
    three = runs | {"sampled": runs["harness"]}
    assert analyse(three)[1][0].detail.endswith("60 rounds")  # three sides rotate: single rounds
    assert "contains 1: equal within noise" in body[1]
    assert "harness 2.0 ms, vllm bench 5.0 ms" in body[3]  # each client's TTFT over the server's
    assert "-3.0 .. -3.0 ms" in body[3]
    runs["vbench"][5]["server_ttft"] = None  # a run the server's counters missed
    runs["vbench"][6]["server_itl"] = None
    body, heads = analyse(runs)  # no crash: the rounds without the figure are left out
    assert heads[2].detail.endswith("29 A B B A blocks") and "1 round(s) in no block" in body[2]
    assert (
        abs(lag1([h["tok_s"] / v["tok_s"] for h, v in zip(runs["harness"], runs["vbench"])])) < 0.3
    )


def test_fidelity_band_verdict_is_calibrated_under_a_linear_drift() -> None:
    """Known truth at the band's edge: the harness reads 0.95 of vllm bench (the 5% band's low
    end) while the server slows 2% from one run to the next, with 8% run-to-run noise, over 150
    rounds as the bench runs them. "met" (a CI inside the band) is then a false verdict; the
    A B B A blocks keep it under 5%. Single rounds of one order would read h / v with v always
    the later, slower run: 2% too high, and "met" most of the time."""
    import numpy as np

    from bench.fidelity import round_order
    from bench.fidelity_analysis import analyse

    rng = np.random.default_rng(7)
    trials, met = 200, 0
    for _ in range(trials):
        runs: dict[str, list[dict]] = {"harness": [], "vbench": [], "sampled": []}
        t = 0
        for i in range(150):
            for side in round_order(["harness", "vbench"], i):
                speed = 1000 * (0.95 if side == "harness" else 1.0)
                x = speed * np.exp(-0.02 * t + rng.normal(0, 0.08))
                runs[side].append({"round": i, "tok_s": x, "ttft": 1 / x, "server_itl": 1 / x,
                                   "tokens": 1})  # fmt: skip
                t += 1
        met += analyse(runs)[1][0].verdict == "met"
    assert met / trials <= 0.05, met

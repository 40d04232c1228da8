"""--price-per-hour: cost per million output tokens and the cost ratio with its CI, on a real
priced tiny run (HF, the tiny pair, ngram) and its `compare`; the flag's bad values."""

from __future__ import annotations

import json
import shutil

import pytest

from harness.analysis.cost_energy import cost_ratio
from tests.inprocess import run_harness

RUN = ("--engine", "hf", "--model", "tiny", "--workload", "tiny", "--spec", "ngram",
       "--mode", "latency", "--num-prompts", "4", "--max-new-tokens", "16", "--repeats", "3",
       "--warmup", "1", "--no-plots", "--quiet")  # fmt: skip
PRICE = 2.5


def said(e: dict) -> str:
    """The answer line's words for a stored cost ratio (candidate / baseline)."""
    est, lo, hi = e["estimate"], e["lo"], e["hi"]
    if est < 1:
        return f"saves {(1 - est) * 100:.0f}% per million tokens [{(1 - hi) * 100:.0f}%, {(1 - lo) * 100:.0f}%]"
    return f"costs {(est - 1) * 100:.0f}% more per million tokens [{(lo - 1) * 100:.0f}%, {(hi - 1) * 100:.0f}%]"


@pytest.mark.slow
def test_a_priced_run_costs_the_inverse_of_its_speedup(tmp_path, tiny_pair, capsys):
    out = tmp_path / "priced"
    ran = run_harness([*RUN, "--price-per-hour", str(PRICE), "--output-dir", str(out)], capsys)
    assert ran.returncode == 0, ran.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    assert res["config"]["price_per_hour"] == {"hf": PRICE}
    for row in res["rows"]:  # price per device-hour over tokens per device-hour
        tok_s = row["summary"]["output_tok_s"]
        assert row["cost"]["usd_per_million_tokens"] == pytest.approx(PRICE / 3600 * 1e6 / tok_s)
    (c,) = [c for c in res["comparisons"] if c["metric"] == "output_tok_s"]
    cost = c["cost"]  # equal price: exactly the inverse of the speedup, its interval reversed
    assert cost["estimate"] == pytest.approx(1 / c["estimate"], rel=1e-12)
    assert cost["lo"] == pytest.approx(1 / c["hi"], rel=1e-12)
    assert cost["hi"] == pytest.approx(1 / c["lo"], rel=1e-12)
    assert cost["n"] == c["n"] == 3
    words = {"faster": "cheaper", "slower": "costs more"}
    assert cost["verdict"] == words.get(c["verdict"], c["verdict"])
    (entry,) = res["answer"]["cost"]
    assert entry["comparison"] == c["id"] and entry["estimate"] == cost["estimate"]
    summary = (out / "summary.md").read_text()
    assert f"- hf/ngram, 1 at a time: {said(cost)} n=3 ($" in summary
    header = next(ln for ln in summary.splitlines() if ln.startswith("| variant"))
    assert "| $/M tok" in header and "| J/tok" not in header  # no energy counter here
    assert said(cost) in (out / "report.html").read_text()
    assert all(row["energy"] is None for row in res["rows"])

    # compare: each file's own price; the same pairs, the same cost ratios
    twin = tmp_path / "twin"
    shutil.copytree(out, twin)
    ran = run_harness(["compare", str(out), str(twin), "--json", str(tmp_path / "c.json"),
                       "--no-plots"], capsys)  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-2000:]
    joined = json.loads((tmp_path / "c.json").read_text())
    costs = [x["cost"] for x in joined["comparisons"] if x["metric"] == "output_tok_s"]
    assert costs and all(x is not None for x in costs)
    assert "per million tokens" in ran.stdout and "$/M tok" in ran.stdout


def test_a_price_ratio_scales_the_cost_ratio_and_its_interval() -> None:
    """Mixed hardware: the candidate's device at twice the price doubles every bound."""
    c = {"estimate": 1.6, "lo": 1.2, "hi": 2.0, "n": 4, "method": "t", "verdict": "faster"}
    same = cost_ratio(c, 1.0, 0.02)
    assert (same["estimate"], same["lo"], same["hi"]) == pytest.approx((1 / 1.6, 1 / 2.0, 1 / 1.2))
    assert same["verdict"] == "cheaper"
    dear = cost_ratio(c, 2.0, 0.02)
    assert (dear["estimate"], dear["lo"], dear["hi"]) == pytest.approx((2 / 1.6, 2 / 2.0, 2 / 1.2))
    assert dear["verdict"] == "no significant difference"  # [1.0, 1.67] touches 1
    assert cost_ratio(c, 3.0, 0.02)["verdict"] == "costs more"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--price-per-hour", "abc"), "'abc' is not a number of dollars"),
        (("--price-per-hour", "vllm=2"), "no price for engine hf"),
        (("--price-per-hour", "2", "hf=1"), "not both"),
        (("--price-per-hour", "-1"), "expected a price > 0"),
        (("--price-per-hour", "hf=1", "sglang=2"), "sglang: not an engine of this run"),
    ],
)
def test_a_bad_price_is_one_line(args, says, capsys) -> None:
    ran = run_harness([*RUN, *args, "--dry-run"], capsys)
    assert ran.returncode == 2
    line = ran.stderr.strip().splitlines()[-1]
    assert says in line and "Traceback" not in ran.stderr

"""Per-category tables (Spec-Bench's shape), from simulated runs with a known truth: the
candidate is 2x on summarization, 0.8x on translation, and accepts 60% vs 10% of its drafts."""

from __future__ import annotations

import numpy as np

from harness.analysis.derived import analyze
from harness.analysis.workload.categories import category_tables
from harness.core.records import RequestRecord
from harness.core.results import Cell, Run
from harness.report.markdown import render

CATS = {f"s{i}": "summarization" for i in range(6)} | {f"t{i}": "translation" for i in range(6)}
TRUTH = {"summarization": 2.0, "translation": 0.8}
ACC = {"summarization": (6, 10), "translation": (1, 10)}  # accepted, drafted per request


def _runs(repeats: int = 8, seed: int = 0) -> list[Run]:
    rng = np.random.default_rng(seed)
    runs = []
    for rep in range(repeats):
        for label in ("baseline", "ngram"):
            recs, t = [], 0.0
            for rid, cat in CATS.items():
                e2e = 1.0 * float(rng.lognormal(0, 0.03))
                info = {}
                if label == "ngram":
                    e2e /= TRUTH[cat]
                    acc, drafted = ACC[cat]
                    info = {"spec_decode": {"num_draft_tokens": drafted,
                            "num_accepted_draft_tokens": acc, "num_spec_steps": 5}}  # fmt: skip
                times = tuple(t + e2e * k / 10 for k in range(1, 11))
                recs.append(RequestRecord(rid, t, t + e2e, times, (1,) * 10, info=info))
                t += e2e
            spec = None if label == "baseline" else {"method": "ngram"}
            cell = Cell("vllm", label, "latency", {"concurrency": 1}, 10, rep, "specbench")
            runs.append(Run(cell, spec, tuple(recs)))
    return runs


def test_each_category_recovers_its_own_speedup_and_acceptance() -> None:
    (table,) = category_tables(_runs(), CATS, min_effect=0.02)
    cells = table["cells"]
    assert table["categories"] == ["summarization", "translation"]
    for cat, truth in TRUTH.items():
        c = cells[cat]
        assert abs(c["estimate"] / truth - 1) < 0.03 and c["prompts"] == 6 and c["n"] == 8
        assert c["lo"] < c["estimate"] < c["hi"]
        assert c["verdict"] == ("faster" if truth > 1 else "slower")
        acc, drafted = ACC[cat]
        assert c["acceptance"]["acceptance_rate"] == acc / drafted
        assert c["acceptance"]["mean_acceptance_length"] == 1 + acc / 5
    # overall: the summed tokens over summed time of both halves, (12 / (3 + 7.5)) / (12 / 12)
    assert abs(cells["overall"]["estimate"] - 12 / 10.5) < 0.03
    assert cells["overall"]["acceptance"]["acceptance_rate"] == 7 / 20


def test_table_in_json_and_markdown() -> None:
    runs = _runs()
    derived = analyze(runs, min_effect=0.02, categories=CATS)
    md = render({"workload": {"name": "specbench"}, "runs": [], **derived})
    assert "## Per category: specbench, latency, 1 at a time" in md
    row = next(ln for ln in md.splitlines() if ln.startswith("| vllm/ngram") and "acc" in ln)
    assert "faster, acc 0.60" in row and "slower, acc 0.10" in row
    assert "summarization (6)" in md and "overall (12)" in md
    assert analyze(runs, min_effect=0.02)["categories"] == []  # no categories, no table

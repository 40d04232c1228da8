"""Each --spec method's K in the main job from a shipped family's committed tune result
(harness/models/<family>/tune.json, read by harness/tune/committed.py): the plan line, the
--num-spec-tokens override, the K and its source recorded in results.json, a family without a
file, a file tuned with other speculators, a broken file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engines.common.vllm_args import SCHEDULE
from harness.analysis.theory.speedup import PER_BATCH_SIZE, k_at_batch_1
from harness.cli.main import main
from harness.cli.preflight import engine_methods
from harness.cli.tune_variants import spec_config_for
from harness.flags.inputs import model_names
from harness.flags.parser import build_parser
from harness.flags.plan import build_plan
from harness.models import registry
from harness.tune import committed


def cand(method: str | None, k: int, status: str, est: float | None, pred: float | None = None):
    arm = "baseline" if method is None else f"{method}(k={k})"
    vs = None if est is None else {"estimate": est, "lo": None, "hi": None, "n": 3}
    return {"arm": arm, "method": method, "k": k, "status": status, "predicted": pred,
            "vs_baseline": vs}  # fmt: skip


# load 1: eagle3 chosen at K 2; draft_model raced at K 1 (0.95x) and K 3 (0.90x); ngram only
# predicted (pruned: K 4 0.97x, K 2 0.99x). load 4: eagle3 raced at K 1 (0.93x) and K 2 (0.91x),
# the baseline chosen; draft_model not probed (predicted below 0.9 at load 1); ngram K 4 raced.
TUNE = {
    "provenance": {"command": "python -m harness tune (test)", "speculators": {}, "note": None},
    "search": [
        {"load": 1, "chosen": "eagle3(k=2)", "candidates": [
            cand(None, 0, "undecided", None), cand("eagle3", 2, "chosen", 1.05),
            cand("eagle3", 4, "undecided", 1.08), cand("draft_model", 1, "eliminated", 0.95),
            cand("draft_model", 3, "eliminated", 0.90), cand("ngram", 4, "pruned", 0.97, 0.97),
            cand("ngram", 2, "pruned", None, 0.99)]},
        {"load": 4, "chosen": "baseline", "candidates": [
            cand(None, 0, "chosen", None), cand("eagle3", 2, "eliminated", 0.91),
            cand("eagle3", 1, "eliminated", 0.93), cand("ngram", 4, "eliminated", 0.96)]},
    ],
}  # fmt: skip


@pytest.fixture
def tuned_family(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The tiny family with TUNE as its committed tune result."""
    f = tmp_path / "tune.json"
    prov = {**TUNE["provenance"], "speculators": registry.speculator_digests("tiny")}
    f.write_text(json.dumps({**TUNE, "provenance": prov}))
    monkeypatch.setattr(registry, "tune_result", lambda family: f if family == "tiny" else None)
    return f


def plan_of(*argv: str, engine: str = "vllm"):
    args = build_parser().parse_args(["--engine", engine, "--workload", "tiny", *argv])
    return build_plan(args, *model_names(args))


def configs(plan) -> dict[str, dict[str, Any]]:
    return {
        label: dict(c.spec_config)
        for label, c in plan.engine_configs(engine_methods(plan))
        if c.spec_config is not None
    }


def test_a_methods_k_at_a_load_is_its_chosen_else_best_raced_else_best_predicted_k() -> None:
    one, four = TUNE["search"]
    assert committed.best_k(one, "eagle3") == 2  # chosen, though K 4 measured 1.08x
    assert committed.best_k(one, "draft_model") == 1  # raced: the best measured
    assert committed.best_k(one, "ngram") == 2  # pruned: the best predicted
    assert committed.best_k(four, "eagle3") == 1
    assert committed.best_k(four, "draft_model") is None  # not a candidate there
    # raced only at its probe K 6 (0.50x measured and predicted): K 1, predicted 0.95x, wins
    probe = {"load": 4, "chosen": "baseline", "candidates": [
        cand(None, 0, "chosen", None), cand("draft_model", 6, "eliminated", 0.50, 0.50),
        cand("draft_model", 1, "pruned", None, 0.95), cand("eagle3", 2, "eliminated", 0.89, 1.19),
        cand("eagle3", 1, "pruned", None, 1.18)]}  # fmt: skip
    assert committed.best_k(probe, "draft_model") == 1
    assert committed.best_k(probe, "eagle3") == 2  # predicted below the raced arm's prediction
    # both raced: the measured best (K 4, 1.28x) though K 6 was predicted higher (1.22x > 1.19x)
    both = {"load": 1, "chosen": "eagle3(k=2)", "candidates": [
        cand("ngram", 4, "undecided", 1.28, 1.19), cand("ngram", 6, "eliminated", 1.24, 1.22),
        cand("ngram", 2, "pruned", None, 1.15)]}  # fmt: skip
    assert committed.best_k(both, "ngram") == 4
    assert committed.method_ks(TUNE, "draft_model", [1, 4]) == {1: 1, 4: 1}  # carried forward
    assert committed.method_ks(TUNE, "eagle3", [1, 2, 8]) == {1: 2, 2: 2, 8: 1}
    assert committed.method_ks(TUNE, "mtp", [1, 4]) == {}


def test_the_main_job_runs_each_methods_tuned_k_and_says_so(tuned_family: Path) -> None:
    plan = plan_of("--model", "tiny", "--spec", "--mode", "both", "--concurrency", "4")
    got = configs(plan)
    # eagle3: K 2 at load 1, 1 at load 4: vLLM's per-batch-size schedule over the two loads
    assert got["eagle3"]["num_speculative_tokens"] == 2
    assert got["eagle3"][SCHEDULE] == [[1, 3, 2], [4, 4, 1]]
    assert got["draft_model"]["num_speculative_tokens"] == 1 and SCHEDULE not in got["draft_model"]
    assert got["ngram"]["num_speculative_tokens"] == 4
    assert got["ngram"][SCHEDULE] == [[1, 3, 2], [4, 4, 4]]
    line = committed.k_line(plan.spec_k)
    assert line == (
        f"K from {committed.shown(tuned_family)}: draft_model 1, eagle3 2 at load 1 / 1 at "
        "load 4, ngram 2 at load 1 / 4 at load 4"
    )
    # the record: each method's K, per load, its schedule and its source, in results.json config
    rec = json.loads(json.dumps(plan.to_json()))["spec_k"]
    assert rec["file"] == committed.shown(tuned_family) and rec["stale"] == []
    assert rec["methods"]["eagle3"] == {"k": 2, "by_load": {"1": 2, "4": 1},
                                        "schedule": [[1, 3, 2], [4, 4, 1]],
                                        "from": rec["file"]}  # fmt: skip
    assert rec["provenance"]["command"] == "python -m harness tune (test)"
    # one load: one K, no schedule; an engine that takes no schedule (HF): the K at load 1
    assert (
        SCHEDULE not in configs(plan_of("--model", "tiny", "--spec", "--mode", "latency"))["eagle3"]
    )
    hf = plan_of("--model", "tiny", "--spec", "draft_model", "--mode", "both", engine="hf")
    assert configs(hf)["draft_model"] == {**got["draft_model"], "num_speculative_tokens": 1}
    hf_e3 = configs(plan_of("--model", "tiny", "--spec", "--mode", "both", engine="hf"))["eagle3"]
    assert hf_e3["num_speculative_tokens"] == 2 and SCHEDULE not in hf_e3
    # tune's own arms set their K: the committed file does not reach them
    arm = spec_config_for(plan, "eagle3", 3)
    assert arm is not None and arm["num_speculative_tokens"] == 3 and SCHEDULE not in arm


def test_num_spec_tokens_overrides_the_tune(tuned_family: Path) -> None:
    plan = plan_of("--model", "tiny", "--spec", "--num-spec-tokens", "3")
    got = configs(plan)
    assert {c["num_speculative_tokens"] for c in got.values()} == {3}
    assert not any(SCHEDULE in c for c in got.values())
    assert plan.spec_k["file"] is None
    assert plan.spec_k["methods"]["eagle3"] == {"k": [3], "from": "--num-spec-tokens"}
    assert committed.k_line(plan.spec_k) == (
        "K: draft_model 3 (--num-spec-tokens), eagle3 3 (--num-spec-tokens), ngram 3 "
        "(--num-spec-tokens)"
    )
    head = {"method": "eagle3", "model": "/some/head", "num_speculative_tokens": 5}
    plan = plan_of("--model", "tiny", "--spec", "ngram", "--spec-config", json.dumps(head))
    assert dict(plan.spec_config) == head  # --spec-config: its own K, as given
    assert plan.tuned_k("ngram")["k"] == 2


def test_a_family_without_a_tune_file_keeps_the_default(capsys) -> None:
    assert registry.tune_result("tiny") is None  # the tiny family ships none
    plan = plan_of("--model", "tiny", "--spec")
    assert {c["num_speculative_tokens"] for c in configs(plan).values()} == {committed.DEFAULT_K}
    assert committed.k_line(plan.spec_k) == (
        "K: draft_model 4 (the default), eagle3 4 (the default), ngram 4 (the default)"
    )
    assert main(["--quiet", "--engine", "vllm", "--model", "tiny", "--workload", "tiny",
                 "--spec", "ngram", "--dry-run"]) == 0  # fmt: skip
    assert "  K: ngram 4 (the default)" in capsys.readouterr().out


def test_a_tune_of_other_speculators_is_said_and_a_broken_file_stops_in_one_line(
    tuned_family: Path, capsys
) -> None:
    data = json.loads(tuned_family.read_text())
    data["provenance"]["speculators"]["eagle3"] = "0" * 64
    data["provenance"]["note"] = "provisional"
    tuned_family.write_text(json.dumps(data))
    plan = plan_of("--model", "tiny", "--spec", "eagle3")
    assert plan.spec_k["stale"] == ["eagle3"]
    assert committed.k_line(plan.spec_k).endswith(
        ": eagle3 2 at load 1 / 1 at load 4; provisional; tuned with other eagle3 weights than this checkout's (re-run the "
        "tune: docs/tune.md)"
    )
    del data["search"][1]["candidates"][0]["k"]
    tuned_family.write_text(json.dumps(data))
    rc = main(["--quiet", "--engine", "vllm", "--model", "tiny", "--workload", "tiny", "--spec",
               "--dry-run"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "tune.json: search[1].candidates[0].k: expected an integer" in err[0]


def test_the_shipped_smollm2_file_drives_the_main_jobs_plan(smollm2, capsys) -> None:
    path = registry.tune_result("smollm2")
    assert path is not None, "harness/models/smollm2/tune.json is committed"
    tune = committed.read(path)
    assert tune["provenance"]["command"].startswith("python -m harness tune")
    assert main(["--engine", "vllm", "--spec", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "  K from harness/models/smollm2/tune.json: " in out
    plan = plan_of("--spec")
    for label, cfg in configs(plan).items():
        ks = committed.method_ks(tune, label, [1, 4])
        assert ks and cfg["num_speculative_tokens"] == max(ks.values()), label


def test_the_theory_reads_a_schedules_k_at_batch_1() -> None:
    assert PER_BATCH_SIZE == SCHEDULE
    assert k_at_batch_1({"num_speculative_tokens": 3, SCHEDULE: [[1, 3, 2], [4, 4, 3]]}) == 2
    assert k_at_batch_1({"num_speculative_tokens": 3}) == 3


@pytest.mark.slow
def test_a_tuned_schedule_runs_in_vllm_and_results_json_records_it(
    tuned_family: Path, tmp_path: Path, capsys
) -> None:
    """The main job's path with a tuned per-load K (eagle3: 2 one at a time, 1 at 4 in flight),
    through a real in-process vLLM: the schedule is sent, its source kept, theory reads K 2."""
    from tests.inprocess import run_harness

    out = tmp_path / "run"
    ran = run_harness(
        ["--engine", "vllm", "--model", "tiny", "--workload", "tiny", "--spec", "eagle3",
         "--num-prompts", "2", "--max-new-tokens", "8", "--repeats", "1", "--warmup", "0",
         "--output-dir", str(out), "--no-plots"],
        capsys,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "eagle3 2 at load 1 / 1 at load 4" in ran.stderr  # the plan line, said as it starts
    res = json.loads((out / "results.json").read_text())
    assert res["config"]["spec_k"]["methods"]["eagle3"]["from"] == committed.shown(tuned_family)
    spec = [r for r in res["runs"] if r["label"] == "eagle3"]
    assert spec and {r["status"] for r in spec} == {"ok"}
    assert all(r["spec_config"][SCHEDULE] == [[1, 3, 2], [4, 4, 1]] for r in spec)
    assert {t["gamma"] for t in res["theory"]} <= {2}


def test_a_head_by_spec_config_runs_beside_the_same_methods_shipped_one(
    tuned_family: Path, tmp_path: Path
) -> None:
    """``--spec eagle3 --spec-config`` of another EAGLE-3 head (a head against the shipped
    one): two lanes; under one label the two heads' runs pooled into one row."""
    head = {"method": "eagle3", "model": str(tmp_path), "num_speculative_tokens": 2}
    plan = plan_of("--model", "tiny", "--spec", "eagle3", "--spec-config", json.dumps(head))
    labels = [label for label, _ in plan.engine_configs(engine_methods(plan))]
    assert labels == ["baseline", "eagle3(spec-config)", "eagle3"]
    got = configs(plan)
    assert got["eagle3(spec-config)"] == head and got["eagle3"]["model"] != str(tmp_path)
    alone = configs(plan_of("--model", "tiny", "--spec-config", json.dumps(head)))
    assert alone == {"eagle3": head}  # no clash: its label stays the method's


def test_a_repeated_sweep_value_is_one_lane_or_point() -> None:
    """``--num-spec-tokens 2 2`` ran two lanes under one label, pooled into one row: a sweep's
    values count once each, in the order given (loads and lengths too)."""
    args = build_parser().parse_args(
        ["--num-spec-tokens", "2", "4,2", "--concurrency", "4", "4", "--request-rate", "1,1",
         "--max-new-tokens", "16", "32", "16"]
    )  # fmt: skip
    got = (args.num_spec_tokens, args.concurrency, args.request_rate, args.max_new_tokens)
    assert got == ([2, 4], [4], [1.0], [16, 32])
    plan = plan_of("--model", "tiny", "--spec", "ngram", "--num-spec-tokens", "2", "2")
    assert [label for label, _ in plan.engine_configs(engine_methods(plan))] == [
        "baseline", "ngram"
    ]  # fmt: skip

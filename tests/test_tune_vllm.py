"""The emitted speculative_config loads into a real vLLM engine as is, and feeds a normal run."""

from __future__ import annotations

import json

import pytest

from engines.base import DEFAULT_NGRAM
from harness.tune.schedule import Pick, build_config
from tests.inprocess import run_harness

pytestmark = pytest.mark.slow


def test_emitted_schedule_runs_in_vllm_through_spec_config_file(tmp_path, tiny_pair, capsys):
    picks = [Pick(1, "ngram", 3, 1.5, {"ngram": (3, 1.5)}), Pick(2, None, 0, 1.0, {})]
    cfg, schedule, _ = build_config(picks, {"ngram": {"method": "ngram", **DEFAULT_NGRAM}})
    assert schedule == ((1, 1, 3), (2, 2, 0))  # batch 1 drafts 3, batch 2 and up: off
    path = tmp_path / "speculative_config.json"
    path.write_text(json.dumps(cfg))
    out = tmp_path / "run"
    proc = run_harness(
        ["--model", "tiny", "--workload", "tiny",
         "--engine", "vllm", "--spec-config", f"@{path}",
         "--no-baseline", "--mode", "both", "--concurrency", "4", "--num-prompts", "4",
         "--max-new-tokens", "32", "--repeats", "1", "--warmup", "0", "--quiet", "--no-plots",
         "--output-dir", str(out)],
        capsys,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = {r["mode"]: r for r in json.loads((out / "results.json").read_text())["runs"]}
    for run in runs.values():
        assert run["status"] == "ok" and run["spec_config"] == cfg  # the file, verbatim
    lat, tput = runs["latency"], runs["throughput"]
    per_token = {
        m: r["spec_metrics"]["num_draft_tokens"] / r["summary"]["output_tokens"]
        for m, r in runs.items()
    }
    assert lat["spec_metrics"]["num_drafts"] > 0  # batch size 1: K = 3
    assert max(lat["spec_metrics"]["num_draft_tokens"] / lat["spec_metrics"]["num_drafts"], 0) <= 3
    assert per_token["throughput"] < per_token["latency"]  # 4 in flight: K = 0 until the tail
    assert tput["summary"]["peak_in_flight"] >= 2


def test_tune_end_to_end_writes_config_table_and_verification(
    tmp_path, tiny_pair, capsys, monkeypatch
):
    """In a process that started an hour ago (as psutil tells it): the tune keeps its own
    15-minute budget from its start, whatever ran in this process before it."""
    import time

    import psutil
    from vllm.v1.spec_decode.dynamic.utils import validate_and_normalize_dynamic_sd_schedule

    monkeypatch.setattr(psutil.Process, "create_time", lambda self: time.time() - 3600)
    out = tmp_path / "tune"
    proc = run_harness(
        ["tune", "--model", "tiny", "--workload", "tiny",
         "--engine", "vllm", "--spec", "ngram",
         "--tune-k", "1", "3", "--concurrency", "1", "4", "--num-prompts", "4",
         "--max-new-tokens", "24", "--max-rounds", "3", "--verify-rounds", "3", "--warmup", "1",
         "--quiet", "--output-dir", str(out)],
        capsys,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    first = proc.stdout.splitlines()[0]
    assert first.startswith(("tune: verified", "tune: verification FAILED")), proc.stdout[:500]
    assert (proc.returncode == 0) == first.startswith("tune: verified")
    tune = json.loads((out / "tune.json").read_text())
    fallback = (tune["fallback"] or {}).get("emitted")  # the fixed K's config or none instead
    if tune["speculative_config"] is None:  # no file, and the notes say which of three reasons
        assert not (out / "speculative_config.json").exists()
        notes = " ".join(tune["notes"])
        if fallback == "off":  # the schedule ran K = 0 at a load and was still slower there
            assert "emitted in place of the schedule: no speculative_config" in notes, notes
        elif tune["corrections"]:  # the verification set every load to K = 0
            assert all(c["k_to"] == 0 for c in tune["corrections"]), tune["corrections"]
            assert "corrected by the verification" in notes, notes
        else:  # the search: ngram paid at neither load
            assert "pays at none of the loads tuned" in notes, notes
    else:
        cfg = json.loads((out / "speculative_config.json").read_text())
        assert cfg["method"] == "ngram" and cfg["prompt_lookup_max"] == 3
        validate_and_normalize_dynamic_sd_schedule(cfg["num_speculative_tokens_per_batch_size"])
    first_plan = tune["plan"][0]  # what the budget covers comes first
    assert first_plan.startswith(
        "plan: the budget is 15.0 min of wall time for the whole tune, from the tune's start"
    )
    gave = ("the race stops", "left out:", "over the budget", "over its budget")
    assert not [x for x in tune["plan"][1:] if any(g in x for g in gave)], tune["plan"]
    assert "loads [1, 4]" in first_plan and tune["engines_started"] >= 2
    assert any(line.startswith("plan: verification: 3 rounds") for line in tune["plan"])
    assert tune["budget"]["wall_s_before_files"] <= 15 * 60 - tune["budget"]["margin_s"]
    assert "lower bound > 1" in tune["emit_rule"]
    assert [r["load"] for r in tune["search"]] == [1, 4]
    fixed_in = {c["load"] for c in tune["corrections"] if c["k_to"]}
    for r in tune["search"]:  # a load emits its leader only with its CI above 1.02 (Bonferroni)
        if r["emitted"]["method"] is not None and r["load"] not in fixed_in and not fallback:
            chosen = next(c for c in r["candidates"] if c["arm"] == r["chosen"])
            assert chosen["vs_baseline"]["lo"] > 1.02
    assert {r["load"] for r in tune["verification"]["rows"]} == {1, 4}
    for phase in ("search", "verify"):
        res = json.loads((out / phase / "results.json").read_text())
        assert res["runs"] and all(r["status"] == "ok" for r in res["runs"])
    verify_runs = json.loads((out / "verify" / "results.json").read_text())["runs"]
    labels = {r["label"] for r in verify_runs}
    fixed = tune["verification"]["fixed"]
    assert {"baseline", fixed} <= labels <= {"baseline", fixed, "schedule", "schedule-corrected"}
    if not tune["corrections"] and not fallback:
        assert ("schedule" in labels) == bool(tune["speculative_config"])
    if fallback == "fixed K":  # emitted in the schedule's place: the fixed K's config, no schedule
        assert tune["speculative_config"]["num_speculative_tokens"] == int(fixed.split("=")[1][:-1])
        assert "num_speculative_tokens_per_batch_size" not in tune["speculative_config"]
    # a corrected schedule is verified again on its own engine (none where it is off everywhere)
    corrected = bool(tune["corrections"] and tune["speculative_config"])
    assert corrected or "schedule-corrected" not in labels
    md = (out / "tune.md").read_text()
    assert "| load | candidate |" in md and "## Verification" in md
    if tune["speculative_config"] is not None:  # what the tune wrote feeds a normal run as is
        run = tmp_path / "run"
        proc = run_harness(
            ["--model", "tiny", "--workload", "tiny", "--engine", "vllm",
             "--spec-config", f"@{out / 'speculative_config.json'}", "--no-baseline",
             "--concurrency", "4", "--num-prompts", "4", "--max-new-tokens", "16",
             "--repeats", "1", "--warmup", "0", "--quiet", "--no-plots", "--output-dir", str(run)],
            capsys,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs = json.loads((run / "results.json").read_text())["runs"]
        assert runs and all(r["status"] == "ok" for r in runs)
        assert all(r["spec_config"] == tune["speculative_config"] for r in runs)


def test_tune_tunes_the_k_of_a_head_given_by_spec_config(tmp_path, tiny_pair, capsys):
    """`tune --spec-config` with an EAGLE-3 head (the tiny one, copied where a hub head would
    be): the head as given runs in vLLM at the probe's K and a K predicted from its acceptance
    per position, and the table and verification name its K. One load, K 1 and 3."""
    import shutil

    from harness.models.registry import tiny_path

    head_dir = tmp_path / "head"
    shutil.copytree(tiny_path("eagle3"), head_dir)
    head = {"method": "eagle3", "model": str(head_dir)}
    out = tmp_path / "tune"
    proc = run_harness(
        ["tune", "--model", "tiny", "--workload", "tiny", "--engine", "vllm",
         "--spec-config", json.dumps(head), "--tune-k", "1", "3", "--concurrency", "1",
         "--num-prompts", "4", "--max-new-tokens", "16", "--max-rounds", "3",
         "--verify-rounds", "3", "--warmup", "1", "--quiet", "--output-dir", str(out)],
        capsys,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    assert proc.stdout.startswith(("tune: verified", "tune: verification FAILED")), proc.stdout
    tune = json.loads((out / "tune.json").read_text())
    (search,) = tune["search"]
    cands = {c["arm"]: c for c in search["candidates"]}
    assert set(cands) == {"baseline", "eagle3(k=1)", "eagle3(k=3)"}  # both K, one predicted
    assert all(cands[a]["predicted"] is not None for a in ("eagle3(k=1)", "eagle3(k=3)"))
    runs = json.loads((out / "search" / "results.json").read_text())["runs"]
    probe = [r for r in runs if r["label"] == "eagle3(k=3)"]
    assert probe and all(r["status"] == "ok" for r in runs)
    for r in runs:  # each arm: the head as given, its K replaced
        if r["label"] != "baseline":
            k = r["spec_config"]["num_speculative_tokens"]
            assert r["spec_config"] == {**head, "num_speculative_tokens": k}
            assert r["label"] == f"eagle3(k={k})"
    acc = probe[0]["spec_metrics"]["acceptance_per_pos"]
    assert len(acc) == 3 and acc[0] > 0  # the head drafts tokens the target accepts
    assert tune["verification"]["fixed"].startswith("eagle3(k=")
    md = (out / "tune.md").read_text()
    # a raced K has a row, a pruned one its prediction under the table (which, the data decide)
    raced = "| 1 | eagle3(k=" in md
    assert (raced or "not raced (predicted): eagle3(k=" in md) and "## Verification" in md, md

"""The emitted speculative_config loads into a real vLLM engine as is, and feeds a normal run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.plan import DEFAULT_NGRAM
from harness.schedule import Pick, build_config

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_emitted_schedule_runs_in_vllm_through_spec_config_file(tmp_path, embedded_pair):
    picks = [Pick(1, "ngram", 3, 1.5, {"ngram": (3, 1.5)}), Pick(2, None, 0, 1.0, {})]
    cfg, schedule, _ = build_config(picks, {"ngram": {"method": "ngram", **DEFAULT_NGRAM}})
    assert schedule == ((1, 1, 3), (2, 2, 0))  # batch 1 drafts 3, batch 2 and up: off
    path = tmp_path / "speculative_config.json"
    path.write_text(json.dumps(cfg))
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "--engine", "vllm", "--spec-config", f"@{path}",
         "--no-baseline", "--mode", "both", "--concurrency", "4", "--num-prompts", "4",
         "--max-new-tokens", "32", "--repeats", "1", "--warmup", "0", "--quiet",
         "--output-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
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

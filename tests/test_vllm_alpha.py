"""vLLM's own alpha for an EAGLE-3 head (``harness.models.vllm_alpha``), on the tiny pair and its
head in real in-process vLLM: counted per prompt from vLLM's counters, so a prompt asked twice
counts twice, not the engine's running totals again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.models import registry as models
from harness.models import vllm_alpha

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.usefixtures("tiny_pair")
def test_alpha_is_counted_per_prompt_and_category(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    a = {"id": "a", "category": "x", "prompt_ids": list(range(5, 40))}
    b = {"id": "b", "category": "y", "prompt_ids": list(range(300, 320))}
    target, head = models.tiny_path("target"), models.tiny_path("eagle3")
    res = vllm_alpha.measure(target, head, [a, b, a], k=2, tokens=24)
    x, y = res["per_category"]["x"], res["per_category"]["y"]
    assert res["prompts"] == 3 and res["k"] == 2 and len(res["accepted_per_pos"]) == 2
    assert y["drafts"] > 0 and x["drafts"] > 0
    assert res["drafts"] == x["drafts"] + y["drafts"]
    assert res["accepted_per_pos"] == [
        p + q for p, q in zip(x["accepted_per_pos"], y["accepted_per_pos"])
    ]
    one = vllm_alpha.measure(target, head, [a], k=2, tokens=24)  # greedy: a prompt's own count
    assert x["drafts"] == 2 * one["drafts"] and x["accepted_per_pos"] == [
        2 * n for n in one["accepted_per_pos"]
    ]
    acc = res["accepted_per_pos"]
    assert acc[0] >= acc[1] and res["alpha"] == acc[0] / res["drafts"]  # P(first i+1 accepted)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--head", "NONE"], "vllm_alpha: NONE/eagle3.safetensors: no such head"),
        (["--k", "0"], "vllm_alpha: --k 0 --tokens 32: K must be >= 1 and TOKENS >= 2"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], line: str) -> None:
    args = [a.replace("NONE", str(tmp_path / "none")) for a in args]
    run = subprocess.run(
        [sys.executable, "-m", "harness.models.vllm_alpha", *args],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [line.replace("NONE", str(tmp_path / "none"))]

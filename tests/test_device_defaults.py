"""Defaults that follow the device: on CPU exactly today's main job; on CUDA (forced here: the
device is the one fake) Spec-Bench prompts, 256 new tokens, concurrency 1 4 16 64, one instance
per variant, each said; a flag the user gave is kept."""

from __future__ import annotations

import pytest

from harness.cli.device_defaults import follow_device
from harness.cli.main import main
from harness.flags.inputs import model_names
from harness.flags.parser import build_parser
from harness.flags.plan import build_plan
from harness.sizing.memory import Device

CPU = Device("cpu", "host memory", 24 * 2**30)
GPU = Device("cuda", "modelled H100 80GB HBM3", 80 * 10**9)


def plan_on(device: Device, monkeypatch: pytest.MonkeyPatch, *argv: str):
    monkeypatch.setattr("harness.cli.device_defaults.detect_device", lambda flag="auto": device)
    args = build_parser().parse_args(list(argv))
    said = follow_device(args)
    return build_plan(args, *model_names(args)), said


def test_cpu_keeps_the_main_job_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    plan, said = plan_on(CPU, monkeypatch, "--engine", "vllm", "--spec")
    assert said == []
    assert plan.workload == "default" and plan.num_prompts is None
    assert plan.max_new_tokens == (32,) and plan.concurrency == (4,) and plan.instances is None
    assert plan.modes == ("latency", "throughput")
    # the sequential design (a run that compares): first look at 3 blocks, cap 8, 8 min budget
    assert (plan.repeats, plan.max_repeats, plan.budget_s) == (3, 8, 480.0)


def test_cuda_gets_a_realistic_comparison(monkeypatch: pytest.MonkeyPatch) -> None:
    plan, said = plan_on(GPU, monkeypatch, "--engine", "hf,vllm", "--spec")
    assert plan.workload == "specbench" and plan.num_prompts == 32
    assert plan.max_new_tokens == (256,) and plan.concurrency == (1, 4, 16, 64)
    assert plan.instances == "one"
    assert len(said) == 5 and all(line.startswith("CUDA default: ") for line in said)
    assert any("not inside the CI" in line for line in said)  # the instance policy, stated


def test_a_remote_engine_never_probes_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(flag: str = "auto") -> Device:
        raise AssertionError("probed")

    monkeypatch.setattr("harness.cli.device_defaults.detect_device", boom)
    args = build_parser().parse_args(["--engine", "openai", "--base-url", "http://h:1/v1"])
    assert follow_device(args) == []


def test_cuda_keeps_what_the_user_gave(monkeypatch: pytest.MonkeyPatch) -> None:
    plan, said = plan_on(
        GPU, monkeypatch, "--engine", "vllm", "--workload", "tiny", "--max-new-tokens", "64",
        "--concurrency", "8", "--instances", "per-block",
    )  # fmt: skip
    assert said == []
    assert plan.workload == "tiny" and plan.max_new_tokens == (64,) and plan.concurrency == (8,)
    assert plan.instances == "per-block"


def test_the_dry_run_says_the_cuda_defaults(monkeypatch, tiny_pair, capsys) -> None:
    monkeypatch.setattr("harness.cli.device_defaults.detect_device", lambda flag="auto": GPU)
    monkeypatch.setattr("harness.cli.plan_view.detect_device", lambda flag="auto": GPU)
    assert main(["--quiet", "--engine", "vllm", "--model", tiny_pair[0], "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "CUDA default: --max-new-tokens 256" in out and "design: interleaved" in out
    assert "engines built per block: [1]" in out  # one instance for the whole run


def test_the_summary_states_the_cuda_defaults_and_the_instance_caveat() -> None:
    from harness.report.markdown import render

    said = ["CUDA default: --instances one (one instance per variant ...: not inside the CI)"]
    text = render({"status": "complete", "runs": [], "rows": [], "plan": {"device_defaults": said}})
    assert "## Defaults the device chose" in text and "not inside the CI" in text
    assert "Defaults the device chose" not in render({"status": "complete", "runs": [], "rows": []})

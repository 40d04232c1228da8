"""``harness tune --spec-config``: a variant given as a config (a hub EAGLE-3 head) is tuned like
a --spec method, its K replaced per arm and everything else kept as given."""

from __future__ import annotations

import json

from harness.cli.tune_command import _spec_config, parser
from harness.cli.tune_variants import tuned_methods
from harness.flags.inputs import model_names
from harness.flags.plan import build_plan

VLLM_METHODS = ("draft_model", "ngram", "eagle", "eagle3", "mtp", "suffix")


def tune_plan(*argv: str):
    args = parser().parse_args(["--engine", "vllm", "--workload", "tiny", *argv])
    args.mode = "throughput"
    args.spec = args.spec or (None if args.spec_config else "all")  # as tune's main does
    return build_plan(args, *model_names(args))


def test_a_head_given_by_spec_config_is_tuned_alone(tmp_path) -> None:
    head = {"method": "eagle3", "model": str(tmp_path), "num_speculative_tokens": 4,
            "draft_tensor_parallel_size": 1}  # fmt: skip
    plan = tune_plan("--model", "tiny", "--spec-config", json.dumps(head))
    assert tuned_methods(plan, VLLM_METHODS) == ["eagle3"]
    for k in (1, 3):  # each arm: the head as given, its K replaced
        assert _spec_config(plan, "eagle3", k) == {**head, "num_speculative_tokens": k}


def test_spec_and_spec_config_tune_together(tiny_pair) -> None:
    head = {"method": "eagle3", "model": tiny_pair[1], "num_speculative_tokens": 2}
    plan = tune_plan("--model", "tiny", "--spec", "ngram", "--spec-config", json.dumps(head))
    assert tuned_methods(plan, VLLM_METHODS) == ["ngram", "eagle3"]
    assert _spec_config(plan, "ngram", 2)["method"] == "ngram"
    assert tuned_methods(plan, ("ngram",)) == ["ngram"]  # an engine without the method: not tuned


def test_tune_engines_share_a_modelled_gpu_or_stop_in_one_line(tmp_path, monkeypatch) -> None:
    import pytest

    from engines.base import EngineConfig
    from harness.cli.plan_view import tune_fraction
    from harness.flags.options import UsageError
    from harness.sizing.memory import Device
    from tests.test_memory_plan import LLAMA_8B

    gpu = Device("cuda", "modelled 80 GB GPU", 80 * 10**9)
    monkeypatch.setattr("harness.cli.plan_view.detect_device", lambda flag="auto": gpu)
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B))
    plan = tune_plan("--model", str(tmp_path), "--spec", "ngram")
    short = {"max_model_len": 8192}
    configs = [EngineConfig("vllm", str(tmp_path), engine_args=short),
               EngineConfig("vllm", str(tmp_path), engine_args=short,
                            spec_config={"method": "ngram", "num_speculative_tokens": 3})]  # fmt: skip
    f = tune_fraction(plan, configs, alive=3)
    assert f is not None and 3 * f <= 0.9
    need = 2 * 8.03e9 + 8192 * 128 * 1024 + 2 * 2**30  # weights, one 8192-token request, overhead
    assert f * gpu.total_bytes >= need
    full = [EngineConfig("vllm", str(tmp_path))]  # 131072 tokens of KV each: 8 cannot fit
    with pytest.raises(UsageError, match="tune: 8 engines alive at once need") as eight:
        tune_fraction(plan, full, alive=8)
    assert "--max-model-len" not in str(eight.value)  # 8 x 15 GiB of weights: no length fits
    with pytest.raises(UsageError, match=r"or --max-model-len 32768 \(") as three:
        tune_fraction(plan, full, alive=3)  # the longest length at which three fit
    assert "\n" not in str(three.value)
    fits = [EngineConfig("vllm", str(tmp_path), engine_args={"max_model_len": 32768})]
    assert tune_fraction(plan, fits, alive=3) is not None


def test_the_tune_budget_starts_with_the_tune_not_the_process(tmp_path, monkeypatch) -> None:
    """A tune called in a process that started an hour ago (a notebook kernel, a long test run)
    gets its whole budget: the clock starts in the tune command (the old rule read psutil's
    create_time and found 60 min spent of 15). The budget is stopped where it is made, before
    any engine starts."""
    import time

    import psutil
    import pytest

    from harness.cli import tune_command
    from harness.tune.budget import TimeBudget

    monkeypatch.setattr(psutil.Process, "create_time", lambda self: time.time() - 3600)
    made: list[TimeBudget] = []

    class Stop(Exception):
        pass

    class Caught(TimeBudget):
        def __post_init__(self) -> None:
            super().__post_init__()
            made.append(self)
            raise Stop

    monkeypatch.setattr(tune_command, "TimeBudget", Caught)
    with pytest.raises(Stop):
        tune_command.main(["--model", "tiny", "--workload", "tiny", "--engine", "vllm",
                           "--spec", "ngram", "--output-dir", str(tmp_path / "tune")])  # fmt: skip
    (budget,) = made
    assert 0 <= budget.elapsed < 5 * 60, budget.elapsed  # the tune's front, even 3x slower
    assert budget.left_s() > budget.limit_s - 5 * 60

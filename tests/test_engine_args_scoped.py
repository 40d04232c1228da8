"""--engine-args per engine: the scoped form beside the global one; a key an engine does not take
refused in one line naming the engine, before anything loads."""

from __future__ import annotations

import pytest

from harness.cli.main import main
from harness.flags.inputs import model_names
from harness.flags.parser import build_parser
from harness.flags.plan import build_plan


def plan_of(*argv: str):
    args = build_parser().parse_args(["--workload", "tiny", *argv])
    return build_plan(args, *model_names(args))


def args_of(plan, engine: str) -> dict:
    return next(dict(c.engine_args) for _, c in plan.engine_configs({}) if c.engine == engine)


def test_scoped_args_reach_their_engine_only() -> None:
    plan = plan_of(
        "--engine", "hf,vllm", "--engine-args", 'vllm={"max_model_len": 4096}',
        "--engine-args", 'hf={"attn_implementation": "sdpa"}',
    )  # fmt: skip
    assert args_of(plan, "vllm") == {"max_model_len": 4096}
    assert args_of(plan, "hf") == {"attn_implementation": "sdpa"}


def test_a_global_key_goes_to_the_engines_that_take_it() -> None:
    plan = plan_of("--engine", "hf,vllm", "--engine-arg", "gpu_memory_utilization=0.5")
    assert args_of(plan, "vllm") == {"gpu_memory_utilization": 0.5}
    assert args_of(plan, "hf") == {}  # never reaches from_pretrained
    assert dict(plan.engine_args) == {"gpu_memory_utilization": 0.5}  # recorded as given
    one = plan_of("--engine", "vllm", "--engine-args", '{"max_num_seqs": 8}')
    assert one.engine_args_by_engine is None and args_of(one, "vllm") == {"max_num_seqs": 8}


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--engine", "hf,vllm", "--engine-args", 'hf={"gpu_memory_utilization": 0.5}'],
         "'gpu_memory_utilization' is not an argument engine hf takes"),
        (["--engine", "hf", "--engine-args", 'vllm={"max_model_len": 64}'],
         "vllm is not in --engine hf"),
        (["--engine", "hf,vllm", "--engine-arg", "no_such_arg=1"],
         "'no_such_arg' is not an argument engine hf takes"),
        (["--engine", "hf", "--engine-arg", "gpu_memory_utilization=0.5"],
         "hf engine: engine argument 'gpu_memory_utilization' is not taken"),
        (["--engine", "hf", "--engine-args", 'hff={"a": 1}'], "'hff' is no engine"),
    ],
)  # fmt: skip
def test_an_argument_an_engine_does_not_take_is_refused_in_one_line(
    argv: list[str], says: str, tiny_pair: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["--quiet", "--workload", "tiny", "--model", tiny_pair[0], "--dry-run", *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert says in err and "Traceback" not in err


def test_max_model_len_reaches_every_vllm_engine_and_no_other(tiny_pair) -> None:
    """--max-model-len is a plan setting (config.max_model_len) that each vLLM engine gets as
    its max_model_len: in-process (LLM's kwargs) and the managed `vllm serve` (its argv)."""
    from engines.servers.vllm_serve import VLLMServerEngine

    plan = plan_of("--engine", "hf,vllm,vllm-server", "--model", tiny_pair[0],
                   "--max-model-len", "4096", "--engine-args", 'hf={"attn_implementation": "sdpa"}')  # fmt: skip
    assert plan.to_json()["max_model_len"] == 4096
    assert args_of(plan, "vllm") == {"max_model_len": 4096}
    assert args_of(plan, "hf") == {"attn_implementation": "sdpa"}  # HF: nothing to do with it
    assert plan.engine_args_by_engine["vllm"] == {}  # --engine-args recorded as given
    server = next(c for _, c in plan.engine_configs({}) if c.engine == "vllm-server")
    argv = VLLMServerEngine(server).argv
    assert argv[argv.index("--max-model-len") + 1] == "4096"
    assert plan_of("--engine", "vllm").to_json()["max_model_len"] is None  # the model's own


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--engine", "vllm", "--max-model-len", "512", "--engine-arg", "max_model_len=256"],
         "--max-model-len 512 and --engine-args max_model_len=256 (vllm): one setting given twice"),
        (["--engine", "hf,vllm", "--max-model-len", "512", "--engine-args",
          'vllm={"max_model_len": 256}'], "--engine-args max_model_len=256 (vllm)"),
        (["--engine", "vllm", "--max-model-len", "64", "--max-new-tokens", "64"],
         "--max-new-tokens: 64 does not fit --max-model-len 64 (a vLLM request's prompt + output)"),
        (["--engine", "hf", "--max-model-len", "512"],
         "--max-model-len is for --engine vllm or vllm-server (vLLM's max_model_len); --engine hf"),
    ],
)  # fmt: skip
def test_max_model_len_given_twice_or_to_no_vllm_engine_is_refused(
    argv: list[str], says: str, tiny_pair: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["--quiet", "--workload", "tiny", "--model", tiny_pair[0], "--dry-run", *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert says in err and "Traceback" not in err


def test_tune_refuses_new_tokens_past_max_model_len(tiny_pair, capsys, tmp_path) -> None:
    """tune checks the lengths as a run does, before anything loads."""
    argv = ["tune", "--quiet", "--workload", "tiny", "--model", tiny_pair[0], "--engine", "vllm",
            "--spec", "ngram", "--max-model-len", "64", "--max-new-tokens", "64",
            "--output-dir", str(tmp_path / "t")]  # fmt: skip
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "does not fit --max-model-len 64" in err and "Traceback" not in err, err


@pytest.mark.slow
def test_the_in_process_vllm_engine_runs_with_the_flag(tmp_path, tiny_pair, capsys) -> None:
    """A real run on the tiny pair: vLLM's own model config says 256 (not the CPU default 2048),
    and results.json records the setting."""
    import json

    out = tmp_path / "run"
    argv = ["--engine", "vllm", "--model", "tiny", "--workload", "tiny", "--num-prompts", "1",
            "--max-new-tokens", "4", "--mode", "latency", "--repeats", "1", "--warmup", "0",
            "--max-model-len", "256", "--quiet", "--no-plots", "--output-dir", str(out)]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["max_model_len"] == 256
    info = results["runs"][0]["engine_info"]
    assert info["max_model_len"] == 256  # llm_engine.model_config.max_model_len
    assert info["engine_kwargs"]["max_model_len"] == 256
    assert "max_model_len" not in info["defaults_chosen"]  # the flag's, not the CPU table's
    assert results["plan"]["lanes"][0]["memory"]["max_model_len"] == 256

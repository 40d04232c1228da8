"""--engine-args per engine: the scoped form beside the global one; a key an engine does not take
refused in one line naming the engine, before anything loads."""

from __future__ import annotations

import pytest

from harness.cli.flags import build_parser
from harness.cli.main import main
from harness.cli.plan_flags import build_plan, model_names


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

"""HF lanes of one target share one model object (baseline, assisted generation and prompt
lookup differ only in ``generate``'s arguments; the draft is loaded once), and sharing changes no
record: every lane's outputs and acceptance counters equal those of the lane run alone
(``--sequential``: one lane at a time, each with its own objects, as before)."""

from __future__ import annotations

import asyncio
from typing import Any

from engines.hf import models as hf_models
from harness.cli.preflight import engine_methods
from harness.flags.inputs import model_names
from harness.flags.parser import build_parser
from harness.flags.plan import build_plan
from harness.run.session import Session
from workloads import load_workload


def run(tiny_pair: tuple[str, str], *extra: str) -> tuple[dict[str, Any], list[str]]:
    target, draft = tiny_pair
    argv = [
        "--engine", "hf", "--model", target, "--draft-model", draft,
        "--spec", "draft_model,ngram", "--num-spec-tokens", "3", "--workload", "tiny",
        "--num-prompts", "2", "--mode", "latency", "--max-new-tokens", "12", "--repeats", "2",
        "--warmup", "0", "--quiet", *extra,
    ]  # fmt: skip
    args = build_parser().parse_args(argv)
    plan = build_plan(args, *model_names(args))
    configs = plan.engine_configs(engine_methods(plan))
    requests = load_workload("tiny", num_prompts=2, seed=plan.seed).requests
    before = len(hf_models.BUILT)
    runs = asyncio.run(Session(plan, requests, progress=False).execute(configs))
    built = hf_models.BUILT[before:]
    assert hf_models.alive() == 0  # every lane closed: nothing held
    out = {
        f"{r.cell.label}/{r.cell.repeat}": (
            [rec.output_token_ids for rec in r.records],
            r.spec_metrics,
        )
        for r in runs
    }
    return out, built


def test_hf_lanes_share_one_target_and_one_draft(tiny_pair: tuple[str, str]) -> None:
    shared, built = run(tiny_pair)
    target, draft = tiny_pair
    # per block (2 repeats: 2 blocks of fresh instances) one target and one draft for 3 lanes
    assert sorted(built) == sorted([target, draft] * 2)
    alone, built_alone = run(tiny_pair, "--sequential")
    assert built_alone.count(target) == 3 * 2  # each lane its own target, per block
    assert set(shared) == set(alone) and len(shared) == 6
    for key in shared:  # same tokens, same acceptance counts: no lane counts another's
        assert shared[key] == alone[key], key
    assert shared["ngram/0"][1]["num_drafts"] > 0

"""What a run reads, as its flags name it: the dataset (``--workload`` or vLLM bench's
``--dataset-name``/``--dataset-path``) and the models (``--model``, its draft, its EAGLE-3 head),
resolved to files before anything loads. :mod:`harness.flags.plan` checks the settings; this
module finds the inputs."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from engines.base import engine_class
from engines.common.local_model import missing_path
from harness.flags import workload
from harness.flags.options import UsageError
from harness.run.plan import RunPlan


def resolve_dataset(args: argparse.Namespace) -> None:
    """--dataset-name/--dataset-path (vLLM bench serve's) or --workload, into ``args.dataset``;
    a synthetic dataset implies --ignore-eos and vLLM's default of 1000 prompts."""
    from harness.flags.vllm_bench import dataset_choice

    try:
        args.dataset = dataset_choice(
            args.workload,
            args.workload != "default",
            args.workload_format,
            args.dataset_name,
            args.dataset_path,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.dataset.synthetic and args.dataset.fmt != "mooncake":
        from workloads.synthetic import parse_range_ratio

        parse_range_ratio(args.random_range_ratio)  # a bad ratio is reported before loading
        args.ignore_eos = True
        if args.num_prompts is None and args.duration is None:
            args.num_prompts = 1000
    workload.check(args)  # a trace replay's and --multi-turn's needs


def load_dataset(args: argparse.Namespace, model: str) -> Any:
    """The workload: a file (shipped or the user's) or prompts made with the target's tokenizer."""
    from workloads import load_workload, synthetic_workload
    from workloads.synthetic import PrefixRepetitionSpec, RandomSpec, parse_range_ratio

    choice = args.dataset
    special = workload.load(args, model)  # a trace or conversations
    if special is not None:
        return special
    if not choice.synthetic:
        return load_workload(
            choice.workload,
            fmt=choice.fmt,
            num_prompts=args.num_prompts,
            seed=args.seed,
            turn=args.turn,
        )
    if choice.workload == "random":
        spec: Any = RandomSpec(
            args.random_input_len,
            args.random_output_len,
            parse_range_ratio(args.random_range_ratio),
            args.random_prefix_len,
        )
    else:
        spec = PrefixRepetitionSpec(
            args.prefix_repetition_prefix_len,
            args.prefix_repetition_suffix_len,
            args.prefix_repetition_num_prefixes,
            args.prefix_repetition_output_len,
        )
    n = args.num_prompts or 1000
    return synthetic_workload(choice.workload, args.tokenizer or model, n, spec, args.seed)


def model_names(args: argparse.Namespace) -> tuple[str, str | None, str | None]:
    """(target, draft, EAGLE-3 head) as named: --model, --draft-model or the shipped draft of a
    shipped --model, and the shipped head (None for other models)."""
    from harness.models.registry import companion

    draft = args.draft_model or companion(args.model, "draft")
    return args.model, draft, companion(args.model, "eagle3")


def needs_local_models(plan: RunPlan, synthetic: bool, named: bool) -> bool:
    """Whether the run's models must be local files (a shipped family assembled on first use):
    an engine loads or starts one, a synthetic dataset is made with the target's tokenizer, or
    the user named ``--model`` (its tokenizer then counts what a remote server does not). Only
    servers given by URL (engines that take ``--base-url``) with the default ``--model`` on a
    file workload need none: no foreign server serves the shipped default."""
    remote = all("base_url" in engine_class(e).run_flags for e in plan.engines)
    return named or synthetic or not remote


def resolve_models(plan: RunPlan) -> RunPlan:
    """The plan with its models as paths: a shipped family's directories when a name is one
    ("embedded" = SmolLM2, "tiny"), assembled on first use; else the user's ids/paths unchanged."""
    from harness.models import registry as models

    names = (plan.model, plan.draft_model, plan.eagle3_model)
    try:
        for name in names:
            fam = models.parse_name(name) if name else None
            if fam is not None:
                models.ensure_family(fam[0], progress=plan.progress)
        model, draft, head = (models.resolve_model(n) if n else None for n in names)
    except (ValueError, models.ShippedModelMissing) as exc:
        raise UsageError(str(exc)) from None
    for flag, value in (("--model", model), ("--draft-model", draft)):
        if value and missing_path(value):
            raise UsageError(f"{flag}: {value}: no such file or directory")
    assert model is not None
    return replace(plan, model=model, draft_model=draft, eagle3_model=head)

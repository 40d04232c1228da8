"""The front of the run pipeline, shared by ``python -m harness`` (``run_command``) and
``python -m harness tune`` (``tune_command``): flags -> the dataset, resolved and loaded once ->
one validated plan with its models -> the output folder; and each engine configuration with a
managed server's log beside the results. What follows differs: a run executes the plan's
configurations through ``Session.execute``; tune drives one session's lanes per arm
(``Session.start_lane``, ``Session.run_cell``)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from engines.base import EngineConfig, engine_class
from harness.cli.preflight import output_dir
from harness.flags.inputs import (
    load_dataset,
    model_names,
    needs_local_models,
    resolve_dataset,
    resolve_models,
)
from harness.flags.options import UsageError
from harness.flags.plan import build_plan
from harness.flags.workload import with_workload
from harness.run.plan import RunPlan

if TYPE_CHECKING:
    from workloads import Workload


@dataclass(frozen=True)
class Prepared:
    """What every run starts from: the frozen plan (models resolved, the prompt set's
    fingerprint recorded), the workload it was made for, and where its files go."""

    plan: RunPlan
    workload: Workload
    out: Path


def prepare(args: argparse.Namespace) -> Prepared:
    """Flags -> :class:`Prepared`. A bad dataset file is reported before any model is assembled
    (a synthetic dataset is made after, with the target's tokenizer). Raises ``UsageError``,
    ``PlanError``, ``EngineError`` or ``WorkloadError`` (one line each)."""
    if args.quiet:  # before any engine imports vLLM: its INFO lines are progress, not results
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    resolve_dataset(args)
    synthetic = args.dataset.synthetic
    workload = None if synthetic else load_dataset(args, args.model)
    plan = build_plan(args, *model_names(args))  # every flag checked before models load
    out = output_dir(args)
    if needs_local_models(plan, synthetic, args.model_named):
        plan = resolve_models(plan)
    if workload is None:  # made with the target's tokenizer
        hub_answers(plan.tokenizer or plan.model)
        workload = load_dataset(args, plan.model)
    plan = replace(plan, workload_fingerprint=workload.fingerprint)
    plan = with_workload(plan, workload, args)  # a replay's schedule, a conversation run
    return Prepared(plan, workload, out)


def hub_answers(name: str) -> None:
    """Before a hub id's tokenizer loads: one line (UsageError) when the hub does not answer
    within ``hub.HUB_TIMEOUT_S`` (transformers would wait out huggingface_hub's retries); its
    config.json (the memory plan's, fetched once into the HF cache) is the probe."""
    from harness.sizing.hub import is_hub_id
    from harness.sizing.model_size import ConfigUnavailable, read_config

    if not is_hub_id(name):
        return
    try:
        read_config(name)
    except ConfigUnavailable as exc:
        if exc.fatal:
            raise UsageError(str(exc)) from None


def with_log(label: str, config: EngineConfig, out: Path) -> EngineConfig:
    """``config`` with a managed server's log saved beside the results (``ENGINE-LABEL.log``);
    other engines' configs unchanged."""
    if not engine_class(config.engine).capabilities.managed:
        return config
    log = out / f"{config.engine}-{label}.log"
    return replace(config, options={**config.options, "log_path": str(log)})

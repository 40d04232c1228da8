"""Defaults that follow the device. On CPU nothing changes (4 prompts x 32 new tokens, one load
point of 4 in flight, fresh in-process instances per block: the 10-minute main job). On CUDA the
flags left at those defaults become a realistic comparison: Spec-Bench prompts, 256 new tokens
(32 mostly measures prefill), concurrency 1 4 16 64 (continuous batching under load), and one
engine instance per variant for the whole run (a fresh vLLM instance per block would capture
its CUDA graphs again each block; ``--instances per-block`` keeps that, at the cost the dry run
shows). Each change is said before the run and recorded (results.json ``plan.device_defaults``)."""

from __future__ import annotations

import argparse

from engines.base import REGISTRY, engine_class
from harness.core.design import ONE
from harness.sizing.memory import detect_device

CUDA_WORKLOAD = "specbench"
CUDA_NUM_PROMPTS = 32  # of its 480 questions, seeded: 8B x 7 lanes stays near an hour on one GPU
CUDA_MAX_NEW_TOKENS = 256
CUDA_CONCURRENCY = (1, 4, 16, 64)
INSTANCES_CAVEAT = (
    "one instance per variant for the whole run: an instance's own speed offset is not inside "
    "the CI (--instances per-block rebuilds every variant each block: see the dry run's builds)"
)


def follow_device(args: argparse.Namespace) -> list[str]:
    """Set the flags the user left at their CPU defaults to the CUDA ones when the run's device
    is CUDA; the lines saying what changed (none on CPU, or when no engine holds a model here)."""
    engines = [e.strip() for e in args.engine.split(",") if e.strip()]
    if not all(e in REGISTRY for e in engines):
        return []  # the plan refuses the name itself
    if not any(engine_class(e).capabilities.device_memory for e in engines):
        return []
    if not detect_device(args.device).on_cuda:
        return []
    said: list[str] = []
    file_default = args.workload == "default" and args.dataset_name is None
    if file_default and args.dataset_path is None:
        args.workload = CUDA_WORKLOAD
        said.append(f"--workload {CUDA_WORKLOAD} (Spec-Bench questions)")
        if args.num_prompts is None:
            args.num_prompts = CUDA_NUM_PROMPTS
            said.append(f"--num-prompts {CUDA_NUM_PROMPTS}")
    if args.max_new_tokens is None and args.dataset_name is None:
        args.max_new_tokens = [CUDA_MAX_NEW_TOKENS]
        said.append(f"--max-new-tokens {CUDA_MAX_NEW_TOKENS}")
    if not args.concurrency and not args.request_rate and args.mode != "latency":
        args.concurrency = list(CUDA_CONCURRENCY)
        said.append("--concurrency " + " ".join(map(str, CUDA_CONCURRENCY)))
    if args.instances is None:
        args.instances = ONE
        said.append(f"--instances one ({INSTANCES_CAVEAT})")
    return [f"CUDA default: {line}" for line in said]

"""Where an in-process vLLM engine's core runs.

On CPU: in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): no busy engine process competes
with the harness for 2 cores, and several lanes coexist through engines/vllm/setup.py's
``keep_dist_state`` (each shutdown spares the others' distributed state). On CUDA that would
rest on behaviour vLLM does not support (several ``LLM`` objects sharing one process's parallel
state, CUDA-graph pools and memory profiler: vllm#9198, vllm#1676, vllm#14376), so there each
engine's core runs in its own process (vLLM V1 multiprocessing, its default), the harness's
process keeps the ``LLM`` front end: ``llm_engine.step()`` returns the outputs as they reach
this process, where the stepping thread stamps them, as on CPU. The user's own setting of the
variable wins either way; tests/test_vllm_engine_process.py runs two coexisting lanes on V1
multiprocessing on CPU and gets the records of the in-process path."""

from __future__ import annotations

import os

ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"


def cuda_visible() -> bool:
    """Whether torch sees a CUDA device (no CUDA context is created: vLLM may still fork)."""
    import torch

    return bool(torch.cuda.is_available())


def engine_process_default(cuda: bool | None = None) -> str:
    """The variable's default: "1" (each engine core its own process) on CUDA, else "0"."""
    return "1" if (cuda_visible() if cuda is None else cuda) else "0"


def core_mode() -> str:
    """Where this process's engine cores run, for describe()."""
    if os.environ.get(ENV, "1") == "0":
        return "in-process LLMEngine (V1)"  # the engine core too (as recorded before)
    return "LLMEngine (V1) front end here, each engine core in its own process"

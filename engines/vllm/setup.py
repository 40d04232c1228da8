"""The in-process vLLM engine's start-up: config checks, ``LLM(...)`` built with the settings
:mod:`engines.common.vllm_args` maps (the CPU defaults recorded, never hidden), the threads it
steps with, and the workarounds a vLLM release needs at start-up and close."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import gc
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

from engines.base import EngineConfig, EngineError, GenParams, Request, new_tokens
from engines.common import vllm_async
from engines.common.local_model import missing_path
from engines.common.vllm_args import (
    RESERVED,
    check_draft_name,
    check_schedule,
    check_suffix,
    engine_kwargs,
    vllm_arg_names,
    warn_version,
)
from engines.common.vllm_resolved import resolved_config


class VLLMFlags:
    """What the run's flags and ``engine_args`` mean to the in-process engine: engine_args are
    ``EngineArgs`` fields; --max-model-len is the field of that name (``RunPlan.args_for``)."""

    run_flags: ClassVar[frozenset[str]] = frozenset({"max_model_len", "async_scheduling"})
    engine_arg_names = staticmethod(vllm_arg_names)

    @classmethod
    def options_from(cls, flags: Mapping[str, Any], speculative: bool) -> dict[str, Any]:
        return vllm_async.option(flags)

    @classmethod
    def for_variants(
        cls, configs: Sequence[tuple[str, EngineConfig]]
    ) -> list[tuple[str, EngineConfig]]:
        """Every lane with one async-scheduling value (engines/common/vllm_async.py)."""
        from vllm.platforms import current_platform

        return vllm_async.for_lanes(list(configs), current_platform.is_cpu())


def validate_config(config: EngineConfig, spec_methods: tuple[str, ...]) -> None:
    """Cheap checks before anything loads: paths, the speculative method, engine_args keys."""
    for what, path in (("model", config.model), ("tokenizer", config.tokenizer)):
        if missing_path(path):
            raise EngineError(f"vllm: {what} path does not exist: {path}")
    spec = config.spec_config
    if spec is not None:
        method = spec.get("method")
        if method not in spec_methods:
            raise EngineError(
                f"vllm: unknown speculative method {method!r}; "
                f"choose from: {', '.join(spec_methods)}"
            )
        draft = spec.get("model")
        if method == "draft_model" and not draft:
            raise EngineError("vllm: speculative method 'draft_model' needs a 'model' path")
        if isinstance(draft, str) and missing_path(draft):
            raise EngineError(f"vllm: draft model path does not exist: {draft}")
        check_draft_name(spec)
        check_schedule(spec, "vllm")
        check_suffix(spec, "vllm")
    bad = [k for k in config.engine_args if k in RESERVED]
    if bad:
        raise EngineError(f"vllm: set {bad[0]!r} through the engine config, not engine_args")
    from vllm.engine.arg_utils import EngineArgs

    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    for key in config.engine_args:
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise EngineError(f"vllm: unknown engine_args key {key!r}{hint}")


def build_llm(cfg: EngineConfig) -> tuple[Any, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``vllm.LLM`` built for ``cfg``, with its kwargs, the defaults chosen and what it settled
    on (dtype, context, prefix caching, workarounds applied), for describe()."""
    from vllm import LLM

    warn_version()
    kwargs, defaults = engine_kwargs(cfg)
    patched = [p for p in [patch_kernel_rebinding()] if p]
    with cpu_threads(defaults), tokenizer_unpooled(patched):
        # before the build too, so every engine is built with the thread count it steps with
        # (on the shared thread the first engine was built at the process default, 2 here, the
        # later ones at 1). Not the cause of the first-built engine's ~3-5% slower steps in real
        # A/A runs: that remained after this (docs/measurements.md: the build order).
        one_thread_stepping(defaults)
        if "stepping_torch_threads" in defaults:
            import torch

            defaults["build_torch_threads"] = torch._C.get_num_threads()  # noqa: SLF001 - torch._C: the original set/get_num_threads (vLLM's CPU worker no-ops torch's)
        llm = LLM(**kwargs)
        one_thread_stepping(defaults)
    mc = llm.llm_engine.model_config
    cc = llm.llm_engine.vllm_config.cache_config
    facts: dict[str, Any] = {
        "dtype": str(mc.dtype),
        "max_model_len": mc.max_model_len,
        "enable_prefix_caching": bool(cc.enable_prefix_caching),
        "kv_block_size": cc.block_size,  # the prefix cache's unit (a replay's hits round to it)
        # what the engine resolved, read back (harness.analysis.lanes diffs the lanes)
        "resolved_config": resolved_config(llm.llm_engine.vllm_config),
    }
    if patched:
        facts["workarounds"] = patched
    return llm, kwargs, defaults, facts


OMP_BIND = "VLLM_CPU_OMP_THREADS_BIND"


@contextlib.contextmanager
def cpu_threads(defaults: dict[str, Any]) -> Iterator[None]:
    """On CPU, build the engine without vLLM pinning this process's threads to cores.

    vLLM's default ("auto") binds one OpenMP thread per core. That suits its own engine-core
    process; here the engine steps in a thread of the harness's process, beside the event loop
    and other engines, and a bound worker cannot leave a core another process is using: with
    another process on one core, pinned decoding collapsed (docs/measurements.md).
    A user's own ``VLLM_CPU_OMP_THREADS_BIND`` is kept."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or OMP_BIND in os.environ:
        yield
        return
    os.environ[OMP_BIND] = "nobind"
    defaults[OMP_BIND] = "nobind"
    try:
        yield
    finally:
        del os.environ[OMP_BIND]


def one_thread_stepping(defaults: dict[str, Any]) -> None:
    """Step with one torch thread on CPU, as vLLM's own engine core does ("no steady-state CPU
    op benefits from intra-op parallelism"; idle OpenMP workers spin-wait after every parallel
    region and steal the step's serial time). Called on the stepping thread: OpenMP's thread
    count is per thread, so the harness's other threads keep theirs once ``torch_threads_kept``
    resets the process-wide default. Skipped when the user set ``OMP_NUM_THREADS``."""
    import torch
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or "OMP_NUM_THREADS" in os.environ:
        return
    # vLLM's CPU worker replaces torch.set_num_threads with a no-op; torch._C's is the original
    torch._C.set_num_threads(1)  # noqa: SLF001 - torch._C: the original set/get_num_threads (vLLM's CPU worker no-ops torch's)
    defaults["stepping_torch_threads"] = 1


@contextlib.contextmanager
def torch_threads_kept() -> Iterator[None]:
    """Keep torch's process-wide thread default across an engine start: the stepping thread
    sets its own to 1, which also moves the default that threads started later (HF's
    generate) take; it is reset from the calling thread, whose count it already was."""
    import torch

    n = torch._C.get_num_threads()  # noqa: SLF001 - torch._C: the original set/get_num_threads (vLLM's CPU worker no-ops torch's)
    try:
        yield
    finally:
        if torch._C.get_num_threads() != n:  # noqa: SLF001 - torch._C: the original set/get_num_threads (vLLM's CPU worker no-ops torch's)
            torch._C.set_num_threads(n)  # noqa: SLF001 - torch._C: the original set/get_num_threads (vLLM's CPU worker no-ops torch's)


def _safe_vars(obj: Any) -> Mapping[str, Any]:
    """``vars`` that yields {} when ``__dict__`` is not a mapping (llvmlite's ``ffi.lib``)."""
    try:
        d = vars(obj)
    except TypeError:
        return {}
    return d if isinstance(d, Mapping) else {}


def patch_kernel_rebinding() -> str | None:
    """Work around a vLLM 0.32 CPU start-up crash once numba/llvmlite is imported.

    ``triton_utils.dispatcher._rebind_kernels`` scans every module and calls
    ``vars(value).get(...)``; ``vars(llvmlite.binding.ffi.lib)`` is not a dict, so every engine
    started after an ngram engine (whose proposer imports numba) fails. Shadowing ``vars`` in
    that module with a safe version fixes it without changing what the scan rebinds.
    """
    try:
        from vllm.triton_utils import dispatcher
    except ImportError:
        return None
    if not hasattr(dispatcher, "_rebind_kernels"):
        return None
    dispatcher.vars = _safe_vars  # type: ignore[attr-defined]
    return "triton_utils.dispatcher.vars -> safe vars (llvmlite ffi.lib crash)"


@contextlib.contextmanager
def tokenizer_unpooled(applied: list[str]) -> Iterator[None]:
    """Build without the renderer's tokenizer pool (vLLM 0.32's ``maybe_make_thread_pool``).

    The pool deep-copies the tokenizer for thread-safe use from the renderer's executor threads;
    those copies are never freed, even after the engine's shutdown and ``gc.collect()`` (no
    Python referrer holds them): two ``tokenizers.Tokenizer`` per engine built, so the process
    grows with every block (docs/measurements.md). The in-process engine calls its tokenizer from the
    stepping thread alone (prompts go in as token ids), so the pool has nothing to protect.
    """
    try:
        from vllm.renderers import hf
    except ImportError:
        yield
        return
    saved = getattr(hf, "maybe_make_thread_pool", None)
    if saved is None:
        yield
        return
    hf.maybe_make_thread_pool = _unpooled  # type: ignore[attr-defined]
    applied.append("renderers.hf.maybe_make_thread_pool -> none (its tokenizer copies leak)")
    try:
        yield
    finally:
        hf.maybe_make_thread_pool = saved  # type: ignore[attr-defined]


def _unpooled(tokenizer: Any, copies: int = 1) -> Any:
    return tokenizer


@contextlib.contextmanager
def keep_dist_state() -> Iterator[None]:
    """While it lasts, an engine's shutdown leaves vLLM's process-wide distributed state alone.

    ``EngineCore.shutdown`` ends with ``cleanup_dist_env_and_memory()``, which destroys the
    process's model-parallel groups: right for the last engine of a process, fatal for other
    in-process engines still alive (interleaved lanes), whose next step needs those groups.
    """
    try:
        from vllm.v1.engine import core
    except ImportError:
        yield
        return
    saved = core.cleanup_dist_env_and_memory
    core.cleanup_dist_env_and_memory = gc.collect
    try:
        yield
    finally:
        core.cleanup_dist_env_and_memory = saved


def release_memory() -> None:
    """After an engine's shutdown: collect its garbage and, on a GPU, hand the freed blocks
    back to the driver, so the next block's fresh engines (harness/run/blocks.py) find the memory
    the profiler of ``gpu_memory_utilization`` expects."""
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001 - best effort
        pass


def free_dist_state() -> None:
    """Release what a half-built engine left (vLLM's distributed groups, garbage)."""
    try:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
    except Exception:  # noqa: BLE001 - best effort after a failed start
        gc.collect()


def sampling_params(request: Request, params: GenParams, delta: bool) -> Any:
    """vLLM's ``SamplingParams``; ``delta``: each output carries only the new tokens."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        max_tokens=new_tokens(request),
        temperature=params.temperature,
        top_p=params.top_p,
        ignore_eos=params.ignore_eos,
        seed=params.seed if params.temperature > 0 else None,
        output_kind=RequestOutputKind.DELTA if delta else RequestOutputKind.FINAL_ONLY,
    )

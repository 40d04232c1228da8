"""What a vLLM engine resolved: its ``VllmConfig`` read back after it was built, flattened to
``section.field`` -> plain value, so that the lanes of one run can be diffed (like with like,
checked from the engine itself: harness.analysis.lanes).

vLLM fills many settings itself, per platform and per speculative method (async scheduling, the
model runner, CUDA-graph sizes, chunked prefill, ...); what the harness passed is not what ran.
The in-process engine's ``llm_engine.vllm_config`` is the object the engine core was built from:
on CPU the core runs in this process and shares it; under V1 multiprocessing (CUDA) it is what
the front end resolved before spawning the core, which then only fills in the KV cache's size
(``cache.num_gpu_blocks``, measured after profiling), so those fields are left out here."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

# the VllmConfig sections read back, under these names
SECTIONS = {
    "model": "model_config",
    "cache": "cache_config",
    "scheduler": "scheduler_config",
    "parallel": "parallel_config",
    "compilation": "compilation_config",
    "load": "load_config",
    "device": "device_config",
    "speculative": "speculative_config",
}
# sizes the engine measures as it starts (not settings): they differ between identical lanes
MEASURED = frozenset(
    {
        "cache.num_gpu_blocks", "cache.num_cpu_blocks", "cache.num_gpu_blocks_override",
        "compilation.compilation_time", "compilation.encoder_compilation_time",
        "compilation.traced_files", "compilation.cache_dir",
    }
)  # fmt: skip
# fields that name the instance rather than a setting (paths of this run's model, hashes)
SKIPPED = frozenset({"model.hf_config", "model.hf_text_config", "model.hf_image_processor_config"})
MAX_ITEMS = 64  # a list longer than this (CUDA-graph capture sizes) is kept as its length + ends


def plain(value: Any) -> Any:
    """A JSON-able form of one field's value (None where it has none worth comparing)."""
    if isinstance(value, enum.Enum):
        return str(value.name)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=str) if isinstance(value, (set, frozenset)) else list(value)
        if all(isinstance(v, (bool, int, float, str)) or v is None for v in items):
            if len(items) > MAX_ITEMS:
                return {"len": len(items), "first": items[0], "last": items[-1]}
            return items
        return None
    if type(value).__module__.startswith("torch") and type(value).__name__ == "dtype":
        return str(value)
    return None


def flatten(section: str, obj: Any) -> dict[str, Any]:
    """One config section's plain fields as ``section.field``."""
    out: dict[str, Any] = {}
    if obj is None:
        return out
    try:
        fields = dataclasses.fields(obj)
    except TypeError:
        return out
    for f in fields:
        key = f"{section}.{f.name}"
        if key in SKIPPED or f.name.startswith("_"):
            continue
        try:
            value = plain(getattr(obj, f.name))
        except Exception:  # noqa: BLE001 - a property that raises is a field not worth recording
            continue
        if value is not None or f.name in ("async_scheduling", "kv_cache_memory_bytes"):
            out[key] = value
    return out


def resolved_config(vllm_config: Any) -> dict[str, Any]:
    """The engine's resolved settings, ``section.field`` -> value, sorted; the model runner as
    ``runner.v2`` where vLLM says (``use_v2_model_runner``)."""
    out: dict[str, Any] = {}
    for name, attr in SECTIONS.items():
        out.update(flatten(name, getattr(vllm_config, attr, None)))
    v2 = getattr(vllm_config, "use_v2_model_runner", None)
    if isinstance(v2, bool):
        out["runner.v2"] = v2
    return {k: out[k] for k in sorted(out) if k not in MEASURED}


def secret(key: str) -> bool:
    """Whether an argument holds a credential (never recorded)."""
    return key.endswith(("_key", "_token", "password")) and not key.startswith("max_")


def server_resolved(args: Mapping[str, Any], cpu: bool) -> dict[str, Any]:
    """A managed ``vllm serve``'s settings as far as the harness knows them: the arguments it
    was started with (its own resolution happens in its process and is not read back); a
    secret (``api_key``, ``hf_token``, ...) as ``***``."""
    out = {
        f"args.{k}": "***" if secret(k) else (plain(v) if plain(v) is not None else str(v))
        for k, v in args.items()
    }
    out["args.platform"] = "cpu" if cpu else "cuda"
    return dict(sorted(out.items()))

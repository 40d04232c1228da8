"""The memory plan, before anything loads: what each lane holds on the device (weights from the
models' config.json and the run's dtype, a minimum KV cache, a fixed overhead), what the
engines that reserve a share (vLLM's ``gpu_memory_utilization``) get from what the others leave,
and, where the sum cannot fit, one line saying what to change.

The device is a :class:`Device` (its size injectable: tests model an 80 GB card on a CPU
machine). The overheads are stated estimates, not measurements: a CUDA context and activations
per process, plus CUDA-graph pools per vLLM engine."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from engines.base import EngineConfig, engine_class
from harness.sizing.model_size import ConfigUnavailable, ModelSize, gib, model_size, read_config

# the plan's usable share of the device: a little under vLLM's own default gpu_memory_utilization
# (0.92 at 0.32: engines.common.vllm_args.VLLM_DEFAULT_UTILIZATION), the rest left to the driver
USABLE = 0.9
# estimates (stated in the plan): activations + CUDA context of a process that loads weights,
# and a vLLM engine's activations, sampler and CUDA-graph pools beyond its weights and KV
SHARED_OVERHEAD = 1 << 30
BUDGET_OVERHEAD = 2 << 30
OWN_OVERHEAD = 1 << 30
CPU_MAX_MODEL_LEN = 2048  # the in-process vLLM's max_model_len on CPU (engines/common/vllm_args.py)


@dataclass(frozen=True)
class Device:
    """Where the weights go: ``kind`` "cuda" or "cpu", its memory in bytes."""

    kind: str
    name: str
    total_bytes: int

    @property
    def on_cuda(self) -> bool:
        return self.kind == "cuda"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "total_bytes": self.total_bytes}


def detect_device(flag: str = "auto") -> Device:
    """The run's device: CUDA when ``--device`` names it or (auto) torch sees one, else the host
    (its RAM)."""
    import torch

    if flag.startswith("cuda") or (flag == "auto" and torch.cuda.is_available()):
        index = int(flag.split(":", 1)[1]) if ":" in flag else 0
        props = torch.cuda.get_device_properties(index)
        return Device("cuda", str(props.name), int(props.total_memory))
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return Device("cpu", "host memory", int(pages))


@dataclass
class LaneMemory:
    """One lane's part of the device: its own weights (0 where it shares another lane's), the
    smallest KV cache it can run with, an overhead, and (budget engines) the share it gets."""

    lane: str
    holds: str  # Capabilities.device_memory
    weights_bytes: int
    kv_min_bytes: int
    overhead_bytes: int
    shares_with: str | None = None  # the lane whose loaded weights this one uses
    budget_bytes: int | None = None
    memory_fraction: float | None = None
    kv_bytes: int | None = None  # what its budget leaves for the KV cache
    max_model_len: int | None = None
    unknown: str | None = None  # why its size is unknown (no config.json to read)

    @property
    def need_bytes(self) -> int:
        return self.weights_bytes + self.kv_min_bytes + self.overhead_bytes

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None} | {
            "need_bytes": self.need_bytes
        }


@dataclass
class MemoryPlan:
    device: Device
    dtype: str
    coexist: bool  # every lane alive at once (interleaved) or one after the other
    lanes: list[LaneMemory] = field(default_factory=list)
    peak_bytes: int = 0
    fits: bool = True
    advice: str | None = None  # one line: what to change when it does not fit

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device.to_json(),
            "dtype": self.dtype,
            "usable_fraction": USABLE,
            "lanes_alive_at_once": self.coexist,
            "peak_bytes": self.peak_bytes,
            "fits": self.fits,
            "advice": self.advice,
            "lanes": [lane.to_json() for lane in self.lanes],
            "estimates": {
                "overhead_shared_bytes": SHARED_OVERHEAD,
                "overhead_budget_bytes": BUDGET_OVERHEAD,
                "overhead_own_bytes": OWN_OVERHEAD,
            },
        }


class Sizes:
    """Model sizes by name, each config.json read once."""

    def __init__(self) -> None:
        self._seen: dict[str, ModelSize | str] = {}
        self.fatal: list[str] = []  # why a model cannot load either (the hub did not answer)

    def get(self, name: str | None) -> ModelSize | str | None:
        """The size, or why it is unknown, or None for no model."""
        if not name:
            return None
        if name not in self._seen:
            try:
                self._seen[name] = model_size(name, read_config(name))
            except ConfigUnavailable as exc:
                self._seen[name] = str(exc)
                if exc.fatal:
                    self.fatal.append(str(exc))
            except (KeyError, ValueError, TypeError) as exc:
                self._seen[name] = f"{name}: config.json lacks {exc}"
        return self._seen[name]


def companion(config: EngineConfig) -> str | None:
    """The draft model or EAGLE head a config loads beside its target."""
    spec = config.spec_config or {}
    if config.spec_method in ("draft_model", "eagle3", "eagle"):
        return spec.get("model") or (
            config.draft_model if config.spec_method == "draft_model" else None
        )
    return None


def plan_memory(
    lanes: Sequence[tuple[str, EngineConfig]],
    device: Device,
    dtype: str,
    coexist: bool,
    max_batch: int,
    max_tokens: int,
    sizes: Sizes | None = None,
) -> MemoryPlan:
    """Each lane's memory on ``device`` (``lanes``: name, config of every lane that builds an
    engine), the shares of the budget engines, whether it fits. ``max_tokens``: prompt plus new
    tokens of the longest request; ``max_batch``: the most requests in flight."""
    sizes = sizes or Sizes()
    out = MemoryPlan(device, dtype, coexist)
    loaded: dict[tuple[str, str], str] = {}  # (process-shared) model -> lane that loads it
    for name, cfg in lanes:
        holds = engine_class(cfg.engine).capabilities.device_memory
        if not holds:
            continue
        dt = str(cfg.engine_args.get("dtype", dtype))
        dt = dt if dt in ("float32", "float16", "bfloat16") else dtype
        parts = [(cfg.model, sizes.get(cfg.model)), (companion(cfg), sizes.get(companion(cfg)))]
        lane = LaneMemory(name, holds, 0, 0, 0)
        weights = kv_token = 0
        limit = None
        for i, (model, size) in enumerate(parts):
            if size is None:
                continue
            if isinstance(size, str):
                lane.unknown = size
                continue
            kv_token += size.kv_bytes_per_token(dt)
            if i == 0:
                limit = size.max_positions
            key = (str(model), dt)
            if holds == "shared" and key in loaded and coexist:
                lane.shares_with = loaded[key]
                continue
            loaded.setdefault(key, name)
            weights += size.weight_bytes(dt)
        lane.weights_bytes = weights
        gpu = device.on_cuda  # on the host the overheads are the OS's: not counted
        if holds == "budget":
            asked = cfg.engine_args.get("max_model_len")
            lane.max_model_len = int(asked) if asked else limit
            if not gpu and not asked and limit:  # vLLM-CPU's default (engines/vllm/setup)
                lane.max_model_len = min(limit, CPU_MAX_MODEL_LEN)
            lane.kv_min_bytes = kv_token * (lane.max_model_len or max_tokens)
            lane.overhead_bytes = BUDGET_OVERHEAD if gpu else 0
        else:
            batch = 1 if cfg.spec_config is not None else max_batch
            lane.kv_min_bytes = kv_token * batch * max_tokens
            lane.overhead_bytes = OWN_OVERHEAD if holds == "own" and gpu else 0
        out.lanes.append(lane)
    _shares(out)
    return out


def _shares(out: MemoryPlan) -> None:
    """Peak, fit, and the budget engines' fractions: what the others hold is taken first, the
    rest split so that every budget lane gets its own need plus an equal part of the spare."""
    usable = int(out.device.total_bytes * USABLE)
    lanes = out.lanes
    shared = [lane for lane in lanes if lane.holds == "shared"]
    # lanes sharing one process hold their weights together; their KV is one at a time (the one
    # generation thread runs one generate at once) and the process overhead is paid once
    shared_need = (
        sum(lane.weights_bytes for lane in shared)
        + max((lane.kv_min_bytes for lane in shared), default=0)
        + (SHARED_OVERHEAD if shared and out.device.on_cuda else 0)
    )
    if not out.coexist:  # one lane at a time: the largest one
        extra = SHARED_OVERHEAD if out.device.on_cuda else 0
        shared_one = [lane.weights_bytes + lane.kv_min_bytes + extra for lane in shared]
        out.peak_bytes = max(
            [lane.need_bytes for lane in lanes if lane.holds != "shared"] + shared_one + [0]
        )
        out.fits = out.peak_bytes <= usable
        return
    budget = [lane for lane in lanes if lane.holds == "budget"]
    others = shared_need + sum(lane.need_bytes for lane in lanes if lane.holds == "own")
    out.peak_bytes = others + sum(lane.need_bytes for lane in budget)
    out.fits = out.peak_bytes <= usable
    if not budget or not out.fits or not out.device.on_cuda:
        return
    spare = (usable - out.peak_bytes) // len(budget)
    for lane in budget:
        lane.budget_bytes = lane.need_bytes + spare
        # rounded down: the shares never add up to more than the usable part
        lane.memory_fraction = int(lane.budget_bytes / out.device.total_bytes * 1000) / 1000
        lane.kv_bytes = lane.budget_bytes - lane.weights_bytes - lane.overhead_bytes


def longest_fit(
    lanes: Sequence[tuple[str, EngineConfig]],
    device: Device,
    dtype: str,
    coexist: bool,
    max_batch: int,
    max_tokens: int,
    sizes: Sizes | None = None,
) -> tuple[int, MemoryPlan] | None:
    """The largest ``--max-model-len`` (a power of two from 65536 down, shorter than what the
    vLLM lanes have now and at least ``max_tokens``, the longest request) at which the plan
    fits, with that plan; None when no such length fits (or no lane is vLLM's)."""
    sizes = sizes or Sizes()
    now = plan_memory(lanes, device, dtype, coexist, max_batch, max_tokens, sizes)
    current = [m.max_model_len for m in now.lanes if m.holds == "budget" and m.max_model_len]
    for n in (2**k for k in range(16, 9, -1)):
        if not current or n >= max(current) or n < max_tokens:
            continue
        shorter = [(name, with_max_model_len(cfg, n)) for name, cfg in lanes]
        plan = plan_memory(shorter, device, dtype, coexist, max_batch, max_tokens, sizes)
        if plan.fits:
            return n, plan
    return None


def with_max_model_len(cfg: EngineConfig, n: int) -> EngineConfig:
    """``cfg`` as ``--max-model-len n`` makes it (vLLM's lanes; the others unchanged)."""
    if engine_class(cfg.engine).capabilities.device_memory != "budget":
        return cfg
    return replace(cfg, engine_args={**cfg.engine_args, "max_model_len": n})


def advice(
    out: MemoryPlan, sequential: MemoryPlan | None, shorter: tuple[int, MemoryPlan] | None = None
) -> str:
    """One line: what the plan needs, what the device has, and what to change (``shorter``:
    the --max-model-len that fits, from :func:`longest_fit`)."""
    usable = int(out.device.total_bytes * USABLE)
    head = (
        f"memory: {len(out.lanes)} lanes alive at once need {gib(out.peak_bytes)}"
        if out.coexist
        else f"memory: the largest lane needs {gib(out.peak_bytes)}"
    )
    head += (
        f"; {out.device.name} has {gib(usable)} usable ({USABLE} of {gib(out.device.total_bytes)};"
        " --dry-run lists each lane)"
    )
    fixes = []
    if sequential is not None and sequential.fits:
        fixes.append(f"--sequential (one lane at a time: {gib(sequential.peak_bytes)})")
    if len(out.lanes) > 1:
        fixes.append("fewer variants (--spec METHOD, one --engine)")
    if shorter is not None:
        n, plan = shorter
        fixes.append(
            f"--max-model-len {n} (a vLLM request's prompt + output at most {n} tokens: "
            f"{gib(plan.peak_bytes)})"
        )
    fixes.append("a smaller --dtype or model")
    return head + "; change: " + ", or ".join(fixes)


def lane_fractions(plan: MemoryPlan) -> Mapping[str, float]:
    """lane -> the gpu_memory_utilization the plan gave it (budget lanes on CUDA, interleaved)."""
    return {lane.lane: lane.memory_fraction for lane in plan.lanes if lane.memory_fraction}

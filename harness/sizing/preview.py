"""The plan as it will run, computed before anything loads: the lanes, the engines built per
block, the memory each lane gets (:mod:`harness.sizing.memory`), the requests and tokens, a wall-time
estimate where the device's bandwidth is known, and the variants ``--spec`` asked for that
cannot run (``not_run``, each with how to supply what it lacks). ``--dry-run`` prints it; every
run records it in results.json (``plan``, ``not_run``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import Any

from engines.base import REGISTRY, EngineConfig, Request, engine_class, speculative_config
from harness.core.design import ONE, PER_BLOCK
from harness.run.capacity import CapacityPlan, search_plan
from harness.run.lanes import Lane, unsupported_method
from harness.run.plan import EAGLE, Point, RunPlan
from harness.sizing.hub import hub_status, is_hub_id
from harness.sizing.memory import (
    Device,
    MemoryPlan,
    Sizes,
    advice,
    companion,
    longest_fit,
    plan_memory,
)
from harness.sizing.model_size import ModelSize

# nominal memory bandwidth (bytes/s) by device name: the batch-1 decode bound of the estimate
BANDWIDTH = {
    "H200": 4.8e12, "H100": 3.35e12, "H800": 3.35e12, "A100-SXM4-80GB": 2.04e12, "A100": 1.55e12,
    "L40S": 0.86e12, "A10": 0.6e12, "L4": 0.3e12, "4090": 1.0e12, "3090": 0.94e12,
}  # fmt: skip
# assumed seconds to build one engine (load + compile + CUDA-graph capture for budget engines)
BUILD_S = {"budget": 60.0, "shared": 10.0, "own": 30.0, "": 1.0}
HOW = {
    "draft_model": "--draft-model ID_OR_PATH (a smaller model with the target's vocabulary)",
    "eagle3": '--spec-config \'{"method": "eagle3", "model": HEAD_ID_OR_PATH, '
    '"num_speculative_tokens": 3}\' (an EAGLE-3 head trained for this target)',
}


class DoesNotFit(ValueError):
    """The plan's memory exceeds the device: one line saying what to change."""


@dataclass
class Preview:
    device: Device
    dtype: str
    dtype_why: str
    design: str  # "interleaved" or "sequential"
    lanes: list[dict[str, Any]] = field(default_factory=list)
    builds_per_block: list[int] = field(default_factory=list)
    requests: int | None = 0  # None: a capacity search, whose rates are chosen as it runs
    new_tokens: int | None = 0
    search: dict[str, Any] | None = None  # --slo: what the search runs (search_entry)
    estimate_s: float | None = None
    estimate_why: str = ""
    memory: MemoryPlan | None = None
    not_run: list[dict[str, str]] = field(default_factory=list)
    device_defaults: list[str] = field(default_factory=list)  # flags the device set (CUDA)
    downloads: list[dict[str, Any]] = field(default_factory=list)  # hub models (harness.sizing.hub)
    settings: list[str] = field(default_factory=list)  # set alike for every lane (said first)

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device.to_json(),
            "dtype": self.dtype,
            "dtype_why": self.dtype_why,
            "design": self.design,
            "lanes": self.lanes,
            "engines_built_per_block": self.builds_per_block,
            "engines_built": sum(self.builds_per_block),
            "requests": self.requests,
            "new_tokens": self.new_tokens,
            "estimate_s": self.estimate_s,
            "estimate_why": self.estimate_why,
            "memory": None if self.memory is None else self.memory.to_json(),
            "device_defaults": self.device_defaults,
            "downloads": self.downloads,
            "settings": self.settings,
            "search": self.search,
        }


def equal_settings(configs: Sequence[tuple[str, EngineConfig]]) -> list[str]:
    """What is set alike for every lane of an engine because the engine would choose it per
    method (vLLM's async scheduling: engines/common/vllm_async.py), one line per engine."""
    out: dict[str, str] = {}
    for _, c in configs:
        why = c.options.get("async_scheduling_why")
        if why and c.engine not in out:
            out[c.engine] = f"{c.engine}: async scheduling {why}"
    return list(out.values())


def search_entry(plan: CapacityPlan) -> dict[str, Any]:
    """What a capacity search runs, known before it starts: its rates and so its requests are
    chosen as it runs (:mod:`harness.run.capacity`), one engine instance per lane throughout."""
    return {
        "start_rate": plan.slo_start_rate,
        "max_probes": plan.slo_max_probes,
        "probe_s": plan.duration,
        "repeats": plan.repeats,
        "warmup_requests_per_probe": plan.warmup,
    }


def not_run(plan: RunPlan, engine_methods: Mapping[str, Sequence[str]]) -> list[dict[str, str]]:
    """Every (engine, method) ``--spec`` asked for that the plan has no variant for, and why:
    the engine lacks the method, or the method lacks its model (a draft, an EAGLE-3 head)."""
    out: list[dict[str, str]] = []
    for engine in plan.engines:
        has = engine_methods.get(engine, ())
        for method in plan.spec_methods:
            if method not in has and not (method in EAGLE and plan.eagle3_model):
                others = [e for e in REGISTRY if method in engine_class(e).spec_methods]
                out.append({
                    "engine": engine, "method": method, "why": f"{engine} has no {method}",
                    "how": f"--engine with {method} ({', '.join(others) or 'none has it'})",
                })  # fmt: skip
                continue
            k = plan.num_spec_tokens[0] if plan.num_spec_tokens else 1
            if speculative_config(method, k, plan.draft_model, plan.eagle3_model) is None:
                what = "draft model" if method == "draft_model" else "EAGLE-3 head"
                out.append({
                    "engine": engine, "method": method,
                    "why": f"no {what} for --model {plan.model}",
                    "how": HOW.get(method, f"--spec-config '{{\"method\": \"{method}\", ...}}'"),
                })  # fmt: skip
    return out


def preview(
    plan: RunPlan,
    configs: Sequence[tuple[str, EngineConfig]],
    requests: Sequence[Request],
    device: Device,
    dtype_why: str,
    engine_methods: Mapping[str, Sequence[str]],
    sizes: Sizes | None = None,
) -> Preview:
    """The plan of ``configs`` on ``device``, as :class:`harness.run.session.Session` will run it
    (its design, instances and points), with the memory of every lane it builds."""
    plan = search_plan(plan)  # --slo: the search's own plan (its instances, its first rate)
    search = plan if isinstance(plan, CapacityPlan) else None
    lanes = [Lane(label, c) for label, c in configs]
    built = [lane for lane in lanes if not unsupported_method(lane.config)]
    coexist = plan.interleave and len(lanes) > 1 and all(lane.coexist for lane in lanes)
    design = "interleaved" if coexist or len(lanes) == 1 else "sequential"
    per_block = all(lane.instances(plan.instances) == PER_BLOCK for lane in built)
    points = list(islice(plan.points(), 1) if search else plan.points())  # a search: its first
    out = Preview(device, plan.resolved_dtype or plan.dtype, dtype_why, design)
    out.search = None if search is None else search_entry(search)
    out.not_run = not_run(plan, engine_methods)
    out.settings = equal_settings(configs)
    blocks = plan.repeats if per_block else 1
    out.builds_per_block = [len(built)] * blocks
    longest_prompt = max((_prompt_tokens(r) for r in requests), default=0)
    max_new = max(plan.max_new_tokens, default=0)
    batch = max([p.strategy.max_concurrency or 1 for p in points if p.mode == "throughput"] + [1])
    for lane in lanes:
        entry: dict[str, Any] = {
            "lane": lane.name,
            "engine": lane.config.engine,
            "label": lane.label,
            "spec_config": None
            if lane.config.spec_config is None
            else dict(lane.config.spec_config),
            "engine_args": dict(lane.config.engine_args),
        }
        if unsupported_method(lane.config):
            entry["built"] = False
            entry["status"] = unsupported_method(lane.config)
            out.lanes.append(entry)
            continue
        entry["built"] = True
        entry["instances"] = PER_BLOCK if per_block else ONE
        if search is not None:  # requests: as many as the rates the search will choose
            entry["requests"] = entry["warmup_requests"] = out.requests = out.new_tokens = None
            out.lanes.append(entry)
            continue
        n_req = sum(len(plan.point_requests(p, requests)) for p in points) * plan.repeats
        warm = plan.warmup * len(points) * (plan.repeats if per_block else 1)
        entry["requests"] = n_req
        entry["warmup_requests"] = warm
        out.requests += n_req
        out.new_tokens += n_req * max_new
        out.lanes.append(entry)
    sized = [(lane.name, lane.config) for lane in built]
    longest = (longest_prompt or 1024) + max_new
    memory = plan_memory(sized, device, out.dtype, coexist, batch, longest, sizes)
    if not memory.fits:
        alone = plan_memory(sized, device, out.dtype, False, batch, longest, sizes)
        shorter = longest_fit(sized, device, out.dtype, coexist, batch, longest, sizes)
        memory.advice = advice(memory, alone if coexist else None, shorter)
    out.memory = memory
    names = [n for lane in built for n in (lane.config.model, companion(lane.config))]
    out.downloads = [hub_status(n) for n in dict.fromkeys(names) if n and is_hub_id(n)]
    for entry in out.lanes:
        mine = next((m for m in memory.lanes if m.lane == entry["lane"]), None)
        if mine is not None:
            entry["memory"] = mine.to_json()
    if search is None:
        _estimate(out, plan, built, requests, points, blocks, sizes or Sizes())
    else:
        out.estimate_why = "no estimate: the search chooses its rates as it runs"
    return out


def _estimate(
    out: Preview,
    plan: RunPlan,
    built: Sequence[Lane],
    requests: Sequence[Request],
    points: Sequence[Point],
    blocks: int,
    sizes: Sizes,
) -> None:
    """Assumed build times plus every new token at the weight-read bound of the target (batch 1
    in latency mode, shared by the requests in flight in throughput mode): the order of the wall
    time, not a promise (engines reach a fraction of the bound; speculation can pass it)."""
    device = out.device
    bandwidth = next((v for k, v in BANDWIDTH.items() if k in device.name), None)
    # the target's size only where it is used (a CUDA device of known bandwidth): reading a hub
    # id's config may go to the network, and a remote engine's model name need not be one
    target = sizes.get(plan.model) if bandwidth and device.on_cuda else None
    if not (bandwidth and device.on_cuda and isinstance(target, ModelSize)):
        out.estimate_why = "no estimate on this device (see docs/gpu.md for measured main jobs)"
        return
    holds = [engine_class(lane.config.engine).capabilities.device_memory for lane in built]
    seconds = sum(BUILD_S[h] for h in holds) * blocks
    per_token = target.weight_bytes(out.dtype) / bandwidth
    for p in points:
        n = len(plan.point_requests(p, requests)) * plan.repeats * len(built)
        in_flight = 1 if p.mode == "latency" else (p.strategy.max_concurrency or 1)
        seconds += n * p.max_new_tokens * per_token / in_flight
    out.estimate_s = round(seconds)
    out.estimate_why = (
        f"{sum(out.builds_per_block)} engine builds at the assumed {BUILD_S} s each, every token "
        f"at the target's weight-read bound ({device.name}: ~{bandwidth / 1e12:.2f} TB/s "
        "nominal); real engines reach a fraction of it"
    )


def not_run_records(view: Preview) -> list[dict[str, Any]]:
    """The variants that never ran, in the shape of results.json ``not_run`` (whose other
    entries are cells that did not run): no point, a ``not run:`` status and ``how``."""
    return [
        {
            "name": f"{n['engine']}/{n['method']}",
            "point": None,
            "mode": None,
            "load": None,
            "repeat": None,
            "status": f"not run: {n['why']}",
            "how": n["how"],
        }  # fmt: skip
        for n in view.not_run
    ]


def check_fit(p: Preview) -> None:
    """Stop before loading when the lanes cannot fit the device (CUDA; on the host the plan is
    reported, never refused: the OS pages and the CPU defaults size vLLM's cache)."""
    if p.memory is not None and not p.memory.fits and p.device.on_cuda:
        raise DoesNotFit(p.memory.advice or "memory: the plan does not fit")


def with_fractions(
    configs: Sequence[tuple[str, EngineConfig]], p: Preview
) -> list[tuple[str, EngineConfig]]:
    """The configs with each budget lane's ``memory_fraction`` from the plan."""
    fractions = {} if p.memory is None else {
        m.lane: m.memory_fraction for m in p.memory.lanes if m.memory_fraction
    }  # fmt: skip
    return [
        (label, replace(c, memory_fraction=fractions.get(f"{c.engine}/{label}", c.memory_fraction)))
        for label, c in configs
    ]


def _prompt_tokens(request: Request) -> int:
    """The prompt's length in tokens: its ids where known, else ~4 characters a token."""
    if request.prompt_token_ids is not None:
        return len(request.prompt_token_ids)
    text = request.prompt or " ".join(m.get("content", "") for m in request.messages or ())
    return len(text) // 4 + 1

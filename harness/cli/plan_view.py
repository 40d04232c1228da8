"""The plan said before anything loads: one dtype resolved for every engine, the device, the
preview of :mod:`harness.sizing.preview` printed (``--dry-run`` stops there), a plan that cannot fit
the device stopped with one line, and the vLLM lanes' memory shares applied."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from engines.base import REGISTRY, EngineConfig, Request, engine_class
from harness.flags.engine_args import describe
from harness.flags.options import UsageError
from harness.run.plan import RunPlan
from harness.sizing.memory import Device, Sizes, detect_device, longest_fit, plan_memory
from harness.sizing.model_size import ModelSize, gib, resolve_dtype
from harness.sizing.preview import DoesNotFit, Preview, check_fit, preview, with_fractions
from harness.tune.committed import k_line

NO_DEVICE = Device("none", "no local engine", 0)
NO_LOCAL = "no local engine: each server's own"


def local_engines(plan: RunPlan) -> bool:
    """Whether an engine of the run holds a model on this machine (else no torch import)."""
    return any(engine_class(e).capabilities.device_memory for e in plan.engines)


def resolve_device_and_dtype(plan: RunPlan, sizes: Sizes) -> tuple[RunPlan, Device, str]:
    """(plan with ``resolved_dtype``, the device, why that dtype): one dtype for every engine."""
    if not local_engines(plan):
        return plan, NO_DEVICE, NO_LOCAL
    device = detect_device(plan.device)
    dtype, why = dtype_for(plan.engines, plan.model, plan.dtype, device, sizes)
    return replace(plan, resolved_dtype=dtype), device, why


def dtype_for(
    engines: Sequence[str], model: str, flag: str, device: Device, sizes: Sizes
) -> tuple[str | None, str]:
    """(the one dtype, why) of a run of ``engines`` on ``model`` with ``--dtype flag`` on
    ``device``; None where no engine holds a model here. Also what a journal written before
    ``resolved_dtype`` was recorded resolves to (``preflight.check_resume``)."""
    if not any(e in REGISTRY and engine_class(e).capabilities.device_memory for e in engines):
        return None, NO_LOCAL
    size = sizes.get(model)
    stop_if_unloadable(sizes)
    config_dtype = size.config_dtype if isinstance(size, ModelSize) else None
    return resolve_dtype(flag, config_dtype, device.on_cuda)


def stop_if_unloadable(sizes: Sizes) -> None:
    """A model whose config.json the hub did not answer for cannot load either (its download
    would wait out huggingface_hub's retries): stop here, in one line (UsageError)."""
    if sizes.fatal:
        raise UsageError(sizes.fatal[0])


def plan_before_loading(
    plan: RunPlan,
    configs: Sequence[tuple[str, EngineConfig]],
    requests: Sequence[Request],
    device: Device,
    dtype_why: str,
    engine_methods: dict[str, tuple[str, ...]],
    sizes: Sizes,
    dry_run: bool,
    said: Sequence[str] = (),
) -> tuple[Preview, list[tuple[str, EngineConfig]]]:
    """The preview, said on stderr (all of it under ``dry_run``, else what will not run); a plan
    that cannot fit stops here (UsageError, one line); the configs with their memory shares."""
    view = preview(plan, configs, requests, device, dtype_why, engine_methods, sizes)
    view.device_defaults = list(said)
    stop_if_unloadable(sizes)  # a draft's or head's config: the target's was read before
    if dry_run:
        print(render(view, plan), file=sys.stdout)
    elif plan.progress:
        for line in [*said, *k_lines(plan), *view.settings, *download_lines(view),
                     *not_run_lines(view)]:  # fmt: skip
            print(f"[harness] {line}", file=sys.stderr)
    try:
        check_fit(view)
    except DoesNotFit as exc:
        raise UsageError(str(exc)) from None
    return view, with_fractions(configs, view)


def download_lines(view: Preview) -> list[str]:
    out = []
    for d in view.downloads:
        size = d["download_bytes"]
        what = "cached" if d["cached"] else (f"downloads {gib(size)}" if size else "downloads")
        out.append(f"model {d['model']}: {what}; {d['note']}")
    return out


def k_lines(plan: RunPlan) -> list[str]:
    """Each --spec method's K and where it came from (a family's committed tune result)."""
    line = k_line(plan.spec_k)
    return [line] if line else []


def not_run_lines(view: Preview) -> list[str]:
    return [
        f"not run: {n['engine']} {n['method']}: {n['why']}; add: {n['how']}" for n in view.not_run
    ]


def render(view: Preview, plan: RunPlan) -> str:
    """The dry-run plan, plain text."""
    d = view.device
    mem = view.memory
    lines = ["plan (dry run: nothing loaded)"]
    if d.total_bytes:
        lines.append(f"  device: {d.name} ({d.kind}), {gib(d.total_bytes)}")
    lines.append(f"  dtype: {view.dtype} ({view.dtype_why})")
    lines += [f"  {line}" for line in [*view.device_defaults, *view.settings]]
    by_engine = plan.engine_args_by_engine
    lines.append(f"  engine args: {describe(by_engine, plan.engine_args)}")
    if plan.max_model_len is not None:
        takers = [e for e in plan.engines if "max_model_len" in plan.args_for(e)]
        lines.append(f"  --max-model-len {plan.max_model_len}: {', '.join(takers)}")
    built = f"engines built per block: {view.builds_per_block}"
    if view.search is not None:  # one instance per lane, however many rates it probes
        built = "engines built: one per lane for the whole search"
    lines.append(f"  design: {view.design}; {built} ({sum(view.builds_per_block)} in all)")
    lines.append(f"  repeats: {repeats_line(plan)}")
    lines += [f"  {line}" for line in k_lines(plan)]
    if view.search is not None:
        lines.append(f"  capacity search: {search_line(view.search)}")
    lines.append("  lanes:")
    for lane in view.lanes:
        if not lane["built"]:
            lines.append(f"    {lane['lane']}: not built ({lane['status']})")
            continue
        m = lane.get("memory")
        if view.search is not None:
            text = f"    {lane['lane']}: one engine for the whole search"
        else:
            text = f"    {lane['lane']}: {lane['requests']} requests (+{lane['warmup_requests']} warm-up)"
        if m:
            own = f"weights {gib(m['weights_bytes'])}"
            if m.get("shares_with"):
                own += f" (the target: {m['shares_with']}'s, one object)"
            text += f"; {own}, KV min {gib(m['kv_min_bytes'])}"
            if m.get("max_model_len"):
                text += f" (max_model_len {m['max_model_len']})"
            if m.get("memory_fraction"):
                text += (
                    f"; gpu_memory_utilization {m['memory_fraction']} "
                    f"({gib(m['budget_bytes'])}, KV {gib(m['kv_bytes'])})"
                )
            if m.get("unknown"):
                text += "; size unknown"
        lines.append(text)
    if view.requests is not None:
        lines.append(f"  requests: {view.requests} measured, {view.new_tokens} new tokens at most")
    if view.estimate_s is not None:
        lines.append(f"  estimate: ~{view.estimate_s} s ({view.estimate_why})")
    else:
        lines.append(f"  estimate: {view.estimate_why}")
    unknown = sorted({m.unknown for m in mem.lanes if m.unknown}) if mem is not None else []
    if unknown:
        lines.append(f"  memory: not checked, a size is unknown: {'; '.join(unknown)}")
    elif mem is not None and mem.lanes:
        usable = gib(mem.device.total_bytes * 0.9)
        verdict = "fits" if mem.fits else "DOES NOT FIT"
        lines.append(f"  memory: peak {gib(mem.peak_bytes)} of {usable} usable: {verdict}")
    lines += [f"  {line}" for line in [*download_lines(view), *not_run_lines(view)]]
    return "\n".join(lines)


def search_line(search: dict[str, Any]) -> str:
    """What the --slo search runs: its requests follow from the rates it chooses as it runs."""
    return (
        f"rates from {search['start_rate']:g} req/s, chosen as it runs, at most "
        f"{search['max_probes']} probed; each probe {search['probe_s']:g} s of Poisson arrivals "
        f"x {search['repeats']} repeats per lane (+{search['warmup_requests_per_probe']} warm-up "
        "requests per lane and probe); the requests follow from the rates"
    )


def repeats_line(plan: RunPlan) -> str:
    """How many blocks each point runs, and what decides it."""
    if plan.stopping == "sequential":
        budget = f", a {plan.budget_s / 60:g}-min budget" if plan.budget_s else ""
        return (
            f"sequential: from {plan.repeats} blocks up to {plan.max_repeats}{budget}; a point "
            "stops once its verdicts are settled"
        )
    if plan.slo:
        return f"{plan.repeats} (fixed: --slo's capacities and their CIs are over repeats)"
    if plan.target_ci:
        return f"from {plan.repeats} up to {plan.max_repeats}, until the CI is within {plan.target_ci:g}"
    return f"{plan.repeats} (fixed)"


def tune_fraction(plan: RunPlan, configs: Sequence[EngineConfig], alive: int) -> float | None:
    """The device share each of tune's engines gets when ``alive`` of them live at once (each
    sized as the largest arm), None on the host; a tune that cannot fit the device stops here
    in one line (UsageError) before any engine starts."""
    sizes = Sizes()
    plan, device, _ = resolve_device_and_dtype(plan, sizes)
    if not device.on_cuda or not configs:
        return None
    dtype = plan.resolved_dtype or plan.dtype
    one = plan_memory([("x", c) for c in configs], device, dtype, False, 1, 1024, sizes)
    largest = configs[max(range(len(configs)), key=lambda i: one.lanes[i].need_bytes)]
    lanes = [(f"engine {i + 1}", largest) for i in range(alive)]
    batch = max(plan.concurrency or (1,))
    mem = plan_memory(lanes, device, dtype, True, batch, 1024, sizes)
    stop_if_unloadable(sizes)
    if not mem.fits:
        shorter = longest_fit(lanes, device, dtype, True, batch, 1024, sizes)
        fix = f", or --max-model-len {shorter[0]} ({gib(shorter[1].peak_bytes)})" if shorter else ""
        raise UsageError(
            f"tune: {alive} engines alive at once need {gib(mem.peak_bytes)}; {device.name} has "
            f"{gib(device.total_bytes * 0.9)} usable; change: fewer --tune-k values or methods "
            f"(--spec METHOD){fix}"
        )
    fractions = [m.memory_fraction for m in mem.lanes if m.memory_fraction]
    return min(fractions) if fractions else None

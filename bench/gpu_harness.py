"""The HF engine's lanes through the whole harness on the check's random-weight pair: the plan
said before loading (memory per lane from config.json), baseline + assisted generation + prompt
lookup alive at once on ONE target object and one draft (engines/hf/models.py), and the device's
measured peak next to the plan's estimate, and the energy each lane drew where a counter reads
it (NVML on the lent GPU: harness.run.energy; n/a on CPU machines without RAPL). Part of ``python -m bench.gpu_check``; on CPU the same
steps run on small sizes (tests/test_gpu_harness.py)."""

from __future__ import annotations

import contextlib
import io
import json
import time
from pathlib import Path
from typing import Any


def harness_lanes(device: str, target: str, draft: str, tokens: int, out: Path) -> dict[str, Any]:
    """One interleaved run of hf baseline, draft_model and ngram (latency, 2 prompts, 2 blocks
    on one instance each), with what the plan said and what the device held."""
    import torch

    from engines.hf import models as hf_models
    from harness.cli.main import main as harness_main
    from harness.run.energy import energy_meter

    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    before = len(hf_models.BUILT)
    argv = [
        "--engine", "hf", "--model", target, "--draft-model", draft,
        "--spec", "draft_model,ngram", "--num-spec-tokens", "4", "--workload", "tiny",
        "--mode", "latency", "--num-prompts", "2", "--max-new-tokens", str(tokens),
        "--repeats", "2", "--warmup", "1", "--instances", "one", "--device", device,
        "--ignore-eos", "--quiet", "--no-plots", "--output-dir", str(out),
    ]  # fmt: skip
    meter = energy_meter()  # the same counter the session reads, around the whole run too
    t0, j0 = time.perf_counter(), None if meter is None else meter.read()
    with contextlib.redirect_stdout(io.StringIO()):  # the summary: results.json holds it
        rc = harness_main(argv)
    seconds = time.perf_counter() - t0
    whole_j = None if meter is None or j0 is None or meter.sampled else meter.read() - j0
    results = json.loads((out / "results.json").read_text())
    memory = (results.get("plan") or {}).get("memory") or {}
    return {
        "rc": rc,
        "seconds": seconds,
        "models_built": [Path(p).name for p in hf_models.BUILT[before:]],
        "lanes": sorted({f"{r['engine']}/{r['label']}" for r in results["runs"]}),
        "statuses": sorted({r["status"] for r in results["runs"]}),
        "dtype": (results.get("plan") or {}).get("dtype"),
        "plan_peak_bytes": memory.get("peak_bytes"),
        "plan_lanes": [
            {k: m.get(k) for k in ("lane", "weights_bytes", "kv_min_bytes", "shares_with")}
            for m in memory.get("lanes", [])
        ],
        "measured_peak_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        "energy_source": None if meter is None else f"{meter.source} ({', '.join(meter.devices)})",
        "energy_whole_run_j": whole_j,
        "energy_rows": {r["name"]: r.get("energy") for r in results.get("rows", [])},
        "energy_ratios": [
            {"candidate": c["candidate"], **c["energy"]}
            for c in results.get("comparisons", [])
            if c["metric"] == "output_tok_s" and c.get("energy")
        ],
    }


def markdown(h: dict[str, Any]) -> list[str]:
    peak = h["measured_peak_bytes"]
    plan = h["plan_peak_bytes"]
    measured = "" if peak is None else f"; measured peak allocated {peak / 2**20:.0f} MiB"
    return [
        "",
        f"- Through the harness ({h['seconds']:.0f} s, exit {h['rc']}): lanes "
        f"{', '.join(h['lanes'])} ({', '.join(h['statuses'])}), dtype {h['dtype']}; model "
        f"objects built: {', '.join(h['models_built'])} (one target for the three lanes); "
        f"the plan's peak {0 if plan is None else plan / 2**20:.0f} MiB{measured}.",
        energy_line(h),
    ]


def energy_line(h: dict[str, Any]) -> str:
    """What the energy counter measured: J per output token and mean W per lane, the paired
    ratios, the whole run's joules; or that nothing read one."""
    if not h.get("energy_source"):
        return "- Energy: n/a (no NVML device and no readable RAPL counter on this machine)."
    rows = h.get("energy_rows") or {}
    lanes = ", ".join(
        f"{name} {e['joules_per_token']:.3g} J/tok at {e['mean_watts'] or 0:.0f} W"
        for name, e in rows.items()
        if e
    )
    ratios = ", ".join(
        f"{r['candidate']} {r['estimate']:.2f}x" + ("" if r["lo"] is None else
                                                  f" [{r['lo']:.2f}, {r['hi']:.2f}]")
        for r in h.get("energy_ratios") or []
    )  # fmt: skip
    whole = h.get("energy_whole_run_j")
    return (
        f"- Energy from the {h['energy_source']}: {lanes or 'no run read it'}; energy ratio vs "
        f"baseline {ratios or 'n/a'}"
        + ("" if whole is None else f"; the whole harness run (loading included) {whole:.0f} J")
        + "."
    )

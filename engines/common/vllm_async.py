"""Async scheduling, one value for every vLLM lane of a run (``--async-scheduling``).

Left unset, vLLM 0.32 chooses it per lane (config/vllm.py:1585-1644): on CUDA on for the
baseline and the methods it supports (EagleModelTypes: eagle, eagle3, mtp, dflash, ...;
ngram_gpu; draft_model; dspark), off for the others (ngram, suffix, medusa, mlp_speculator),
and an explicit True with one of those raises ValueError; on CPU the platform forces it off
(platforms/cpu.py:331). A speedup of ngram over the baseline would then include synchronous vs
asynchronous scheduling. So the harness sets it for all lanes alike: ``auto`` (the default: on
where every lane's method supports it on this platform, as vLLM's own default for the baseline,
else off for all), ``on`` (refused before loading where a lane's method cannot), ``off``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from engines.base import EngineError

CHOICES = ("auto", "on", "off")
# vLLM 0.32's list (config/vllm.py:1597-1603), used where vLLM cannot be imported
SUPPORTED = frozenset(
    {"eagle", "eagle3", "extract_hidden_states", "mtp", "dflash", "ngram_gpu", "draft_model",
     "dspark"}
)  # fmt: skip


def supported_methods() -> frozenset[str]:
    """The speculative methods vLLM keeps async scheduling on for, from its own type lists."""
    try:
        from typing import get_args

        from vllm.config import speculative as sc
    except ImportError:
        return SUPPORTED

    def names(t: Any) -> set[str]:
        out: set[str] = set()
        for a in get_args(t):
            out |= {a} if isinstance(a, str) else names(a)
        return out

    return frozenset(
        names(sc.EagleModelTypes) | names(getattr(sc, "NgramGPUTypes", ()))
        | {"draft_model", "dspark", "dflash"}
    )  # fmt: skip


def resolve(setting: str, methods: Iterable[str | None], cpu: bool) -> tuple[bool, str]:
    """(async_scheduling for every lane, why, for the plan); ``methods``: each lane's
    speculative method (None: the baseline). EngineError (one line) for ``on`` with a method
    vLLM refuses it for."""
    if setting not in CHOICES:
        raise EngineError(f"--async-scheduling: {setting!r}; choose from {', '.join(CHOICES)}")
    ok = supported_methods()
    refused = sorted({m for m in methods if m is not None and m not in ok})
    if setting == "off":
        return False, "off for every lane (--async-scheduling off)"
    if setting == "on" and refused:
        raise EngineError(
            f"--async-scheduling on: vLLM refuses async scheduling with {', '.join(refused)} "
            "(config/vllm.py); choose --async-scheduling off (every lane synchronous) or, on a "
            'GPU, the method ngram_gpu (--spec-config \'{"method": "ngram_gpu", ...}\')'
        )
    if cpu:
        return False, "off for every lane (vLLM runs without it on CPU: platforms/cpu.py)"
    if setting == "on":
        return True, "on for every lane (--async-scheduling on)"
    if refused:
        return False, (
            f"off for every lane: vLLM would turn it on for the others but not for "
            f"{', '.join(refused)} (--async-scheduling on refuses; see docs/gpu.md)"
        )
    return True, "on for every lane (every method supports it; vLLM's default)"


def option(flags: Any) -> dict[str, Any]:
    """The engine option from the run's flags (``RunFlags``: ``async_scheduling``)."""
    return {"async_scheduling": flags.get("async_scheduling") or "auto"}


def for_lanes(configs: list[tuple[str, Any]], cpu: bool) -> list[tuple[str, Any]]:
    """The (label, EngineConfig) pairs of one vLLM engine with ``--async-scheduling`` resolved
    to one bool for all of them (``async_scheduling``) and the reason (``async_scheduling_why``),
    which the plan says before loading. A user's own ``engine_args.async_scheduling`` wins."""
    from dataclasses import replace

    asked = [c.options.get("async_scheduling") for _, c in configs]
    if not configs or not isinstance(asked[0], str):
        return configs
    value, why = resolve(asked[0], [c.spec_method for _, c in configs], cpu)
    if any("async_scheduling" in c.engine_args for _, c in configs):
        why = "as engine_args.async_scheduling says (--async-scheduling not applied)"
    out = []
    for label, c in configs:
        opts = {**c.options, "async_scheduling": value, "async_scheduling_why": why}
        out.append((label, replace(c, options=opts)))
    return out

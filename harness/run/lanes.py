"""A lane (one engine configuration of a comparison) and the engine instance it runs on."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from engines.base import Engine, EngineConfig, SpecCounters
from harness.core.design import ONE, PER_BLOCK
from harness.run.energy import Reading
from harness.run.plan import GRACE_S
from harness.run.runner import error_line


def unsupported_method(config: EngineConfig) -> str | None:
    """ "unsupported (...)" when the engine cannot run the config's speculative method at all
    (the plan keeps such variants so that the table says so), else None."""
    from engines.base import engine_class

    method = config.spec_method
    if method is None or method in engine_class(config.engine).spec_methods:
        return None
    return f"unsupported ({config.engine} has no {method})"


@dataclass
class StopFlag:
    """Set by a signal or by --max-error-rate: stop sending, give the requests in flight
    ``grace_s``, then cancel what is left (``expired``; the runner polls it); each cancelled
    request is a failed record (``harness.run.runner.CANCELLED``)."""

    reason: str | None = None
    grace_s: float = GRACE_S
    expired: bool = False  # the grace is over: in-flight requests are cancelled now
    _timer: Any = field(default=None, repr=False)

    def set(self, reason: str) -> None:
        if self.reason is not None:
            return
        self.reason = reason
        with contextlib.suppress(RuntimeError):  # no running loop: expire() ends the grace
            self._timer = asyncio.get_running_loop().call_later(self.grace_s, self.expire)

    def expire(self) -> None:
        """End the grace now (its timer, or a second signal)."""
        self.expired = True
        if self._timer is not None:
            self._timer.cancel()

    def __bool__(self) -> bool:
        return self.reason is not None


@dataclass(eq=False)
class Lane:
    """One engine configuration and, while it runs, its started engine."""

    label: str
    config: EngineConfig
    engine: Engine | None = None
    info: dict[str, Any] = field(default_factory=dict)
    clients: Any = None  # harness.run.clients.workers.ClientPool under --client-workers N > 1
    step_costs: Any = None  # measured at the lane's first start, kept for later instances

    def with_share(self, n: int) -> Lane:
        """The lane told that ``n`` engines share the process and device (memory budgets)."""
        return Lane(self.label, replace(self.config, share=n))

    @property
    def coexist(self) -> bool:
        from engines.base import engine_class

        return engine_class(self.config.engine).capabilities.coexist

    @property
    def name(self) -> str:
        return f"{self.config.engine}/{self.label}"

    def instances(self, asked: str | None) -> str:
        """PER_BLOCK or ONE: as asked (--instances), else per the engine's capability; ONE
        where a new engine cannot be a fresh instance (build_plan refuses to ask for that)."""
        from engines.base import engine_class

        if asked == ONE or not can_rebuild(self.config.engine):
            return ONE
        if asked == PER_BLOCK:
            return PER_BLOCK
        return PER_BLOCK if engine_class(self.config.engine).capabilities.rebuild_per_block else ONE


def can_rebuild(engine: str) -> bool:
    """Whether a new engine object is a fresh instance: in-process engines, and servers the
    harness starts itself (``managed``: a new server per start), not a remote server that keeps
    running (a remote endpoint)."""
    from engines.base import engine_class

    caps = engine_class(engine).capabilities
    return caps.rebuild_per_block or caps.managed


def progress_bar(on: bool, desc: str, total: int | None) -> Any:
    """A tqdm bar on stderr for one run, or None when progress is off."""
    if not on:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True)


async def close_lanes(lanes: Sequence[Lane]) -> None:
    """Close every lane's clients and engine. Errors are ignored (the runs are recorded); a
    cancellation (Ctrl-C during a block's close) is re-raised only after every lane was closed,
    so that no engine is left open."""
    cancelled: BaseException | None = None
    for lane in lanes:
        for part in ("clients", "engine"):
            thing = getattr(lane, part)
            if thing is None:
                continue
            setattr(lane, part, None)
            try:
                with contextlib.suppress(Exception):
                    await thing.close()
            except BaseException as exc:  # CancelledError, KeyboardInterrupt: close the rest
                cancelled = cancelled or exc
    if cancelled is not None:
        raise cancelled


async def measured(
    lane: Lane,
    sample_load_s: float | None,
    sending: Awaitable[Any],
    energy: Reading | None = None,
) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """Await ``sending`` (a measured run) between two reads of the engine's counters: the run's
    speculative metrics and its extra (server load samples, client workers, prefix cache, and
    the device's ``energy`` over the sending alone when a meter reads it: harness.run.energy)."""
    from harness.run.load_sampler import LoadSampler

    engine = lane.engine
    assert engine is not None
    before, cache_before = await spec_counters(engine), cache_counters(engine)
    sampler = LoadSampler(engine, sample_load_s)
    async with sampler, energy or contextlib.nullcontext():
        await sending
    after, cache_after = await spec_counters(engine), cache_counters(engine)
    spec = (after - before).to_metrics() if before is not None and after is not None else None
    extra = sampler.summary()
    if lane.clients is not None:  # per run: clock offsets and drift, deaths so far
        extra["client_workers"] = lane.clients.describe()
    if cache_before is not None and cache_after is not None:
        extra["prefix_cache"] = {k: cache_after[k] - cache_before[k] for k in cache_after}
    if energy is not None:
        extra["energy"] = energy.summary()
    return spec, extra


async def spec_counters(engine: Engine) -> SpecCounters | None:
    await engine.refresh_metrics()
    return engine.spec_counters()


def cache_counters(engine: Engine) -> dict[str, int] | None:
    """The engine's cumulative prefix-cache queries/hits (tokens), where it counts them."""
    return engine.prefix_cache_counters()


async def reset_cache(engine: Engine, policy: str) -> str:
    """Apply the prefix-cache policy before a measured run; say what was done."""
    if policy != "reset":
        return policy
    try:
        return str(await engine.reset_prefix_cache())
    except Exception as exc:  # noqa: BLE001 - recorded with the run; the run still counts
        return f"reset failed: {error_line(exc)}"

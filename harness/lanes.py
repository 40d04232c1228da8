"""A lane (one engine configuration of a comparison) and the engine instance it runs on."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from engines.base import Engine, EngineConfig
from harness.design import ONE, PER_BLOCK


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
    """Set by a signal or by --max-error-rate: stop sending, keep what finished."""

    reason: str | None = None

    def set(self, reason: str) -> None:
        self.reason = self.reason or reason

    def __bool__(self) -> bool:
        return self.reason is not None


@dataclass(eq=False)
class Lane:
    """One engine configuration and, while it runs, its started engine."""

    label: str
    config: EngineConfig
    engine: Engine | None = None
    info: dict[str, Any] = field(default_factory=dict)
    clients: Any = None  # harness.client_workers.ClientPool under --client-workers N > 1
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
        """PER_BLOCK or ONE: as asked (--instances), else per the engine's capability."""
        from engines.base import engine_class

        if asked is not None:
            return asked
        return PER_BLOCK if engine_class(self.config.engine).capabilities.rebuild_per_block else ONE


async def close_lanes(lanes: Sequence[Lane]) -> None:
    """Close every lane's clients and engine (errors ignored: the runs are recorded)."""
    for lane in lanes:
        if lane.clients is not None:
            with contextlib.suppress(Exception):
                await lane.clients.close()
            lane.clients = None
        if lane.engine is not None:
            with contextlib.suppress(Exception):
                await lane.engine.close()
            lane.engine = None


def rss_mb() -> float | None:
    """This process's resident memory (MB), where /proc has it: recorded after every block's
    engines are closed, so a leak from rebuilding engines shows in results.json."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)

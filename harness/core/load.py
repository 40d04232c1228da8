"""Load strategies: each decides only WHEN the next request goes (as GuideLLM's strategies).

A strategy gives the send offset of every request (seconds after the run's start) and an
optional cap on requests in flight; the runner does the waiting. An open loop's offsets are a
schedule (:func:`open_loop`): each request is due then whatever the others do, so its latency
as a user waits it starts there; a closed loop's are not (a request goes when a slot frees).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np


class LoadStrategy(Protocol):
    max_concurrency: int | None

    def offsets(self, n: int) -> list[float]:
        """When each of ``n`` requests may be sent, in seconds after the start (non-decreasing)."""
        ...

    def to_json(self) -> dict[str, Any]: ...

    @property
    def label(self) -> str: ...


def open_loop(load: Any) -> bool:
    """Whether a load is an open loop: its offsets are a schedule each request is due at
    whatever the others do (a rate, a ramp, a trace), so latency as the user waits it starts
    there and the metric the load controls is E2E (DESIGN rule 5); a closed loop (one at a
    time, ``--concurrency N``) sends when a slot frees. ``load``: a strategy (its ``open_loop``)
    or its stored form (results.json ``load``: an open loop's names its ``arrivals``); the one
    rule every layer asks (tests/test_schedule.py checks both forms agree)."""
    if isinstance(load, Mapping):
        return load.get("arrivals") is not None
    return bool(getattr(load, "open_loop", False))


@dataclass(frozen=True)
class Synchronous:
    """One request at a time: the latency mode."""

    max_concurrency: int | None = 1

    def offsets(self, n: int) -> list[float]:
        return [0.0] * n

    def to_json(self) -> dict[str, Any]:
        return {"concurrency": 1}

    @property
    def label(self) -> str:
        return "1 at a time"


@dataclass(frozen=True)
class Concurrent:
    """Closed loop: ``n`` requests in flight; a new one goes as soon as one finishes."""

    n: int

    @property
    def max_concurrency(self) -> int | None:
        return self.n

    def offsets(self, n: int) -> list[float]:
        return [0.0] * n

    def to_json(self) -> dict[str, Any]:
        return {"concurrency": self.n}

    @property
    def label(self) -> str:
        return f"concurrency {self.n}"


@dataclass(frozen=True)
class Constant:
    """Open loop at a fixed rate (requests/s), optionally capped in flight."""

    open_loop: ClassVar[bool] = True
    rate: float
    max_concurrency: int | None = None

    def offsets(self, n: int) -> list[float]:
        return [i / self.rate for i in range(n)]

    def to_json(self) -> dict[str, Any]:
        return {
            "request_rate": self.rate,
            "arrivals": "constant",
            "concurrency": self.max_concurrency,
        }

    @property
    def label(self) -> str:
        cap = f", cap {self.max_concurrency}" if self.max_concurrency else ""
        return f"{self.rate:g} req/s constant{cap}"


@dataclass(frozen=True)
class Poisson:
    """Open loop with seeded gamma-distributed gaps: ``burstiness`` 1 is a Poisson process
    (as vLLM bench serve's ``--burstiness``); below 1 burstier, above 1 more regular."""

    open_loop: ClassVar[bool] = True
    rate: float
    burstiness: float = 1.0
    seed: int = 0
    max_concurrency: int | None = None

    def offsets(self, n: int) -> list[float]:
        rng = np.random.default_rng(self.seed)
        theta = 1.0 / (self.rate * self.burstiness)
        gaps = rng.gamma(shape=self.burstiness, scale=theta, size=max(n - 1, 0))
        return [0.0, *np.cumsum(gaps).tolist()][:n]

    def to_json(self) -> dict[str, Any]:
        return {
            "request_rate": self.rate,
            "arrivals": "poisson" if self.burstiness == 1.0 else "gamma",
            "burstiness": self.burstiness,
            "seed": self.seed,
            "concurrency": self.max_concurrency,
        }

    @property
    def label(self) -> str:
        cap = f", cap {self.max_concurrency}" if self.max_concurrency else ""
        b = "" if self.burstiness == 1.0 else f", burstiness {self.burstiness:g}"
        return f"{self.rate:g} req/s{b}{cap}"


def strategy_from_json(d: dict[str, Any]) -> LoadStrategy:
    """Rebuild a strategy from its JSON form (used by report/compare/resume)."""
    if "ramp_up_strategy" in d:
        from harness.core.ramp import ramp_from_json

        return ramp_from_json(d)
    if "request_rate" in d:
        if d.get("arrivals") == "constant":
            return Constant(float(d["request_rate"]), d.get("concurrency"))
        return Poisson(
            float(d["request_rate"]),
            float(d.get("burstiness", 1.0)),
            int(d.get("seed", 0)),
            d.get("concurrency"),
        )
    n = int(d.get("concurrency", 1))
    return Synchronous() if n == 1 else Concurrent(n)

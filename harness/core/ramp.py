"""Ramp-up: an open loop whose rate climbs from a start to an end rate over the run, with vLLM
bench serve's names and meaning (``--ramp-up-strategy linear|exponential --ramp-up-start-rps
--ramp-up-end-rps``): request ``i`` of ``n`` is sent at the rate ``start + (end - start) * p``
(linear) or ``start * (end / start) ** p`` (exponential), ``p = i / (n - 1)``, the gap before it
drawn from a gamma of that rate (burstiness 1: Poisson; ``inf``: constant gaps)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

RAMP_STRATEGIES = ("linear", "exponential")


@dataclass(frozen=True)
class Ramp:
    """Open loop with a rate ramped per request (as vLLM bench's ``get_request``)."""

    open_loop: ClassVar[bool] = True
    strategy: str
    start_rps: float
    end_rps: float
    burstiness: float = 1.0
    seed: int = 0
    max_concurrency: int | None = None

    def rates(self, n: int) -> list[float]:
        """The asked rate at each request's send (requests/s), in send order."""
        p = np.arange(n) / max(n - 1, 1)
        if self.strategy == "linear":
            r = self.start_rps + (self.end_rps - self.start_rps) * p
        else:
            r = self.start_rps * (self.end_rps / self.start_rps) ** p
        return r.tolist()

    def offsets(self, n: int) -> list[float]:
        rates = np.asarray(self.rates(n), dtype=float)[1:]
        if math.isinf(self.burstiness):
            gaps = 1.0 / rates
        else:
            rng = np.random.default_rng(self.seed)
            gaps = rng.gamma(self.burstiness, 1.0 / (rates * self.burstiness))
        return [0.0, *np.cumsum(gaps).tolist()][:n]

    def to_json(self) -> dict[str, Any]:
        return {
            "ramp_up_strategy": self.strategy,
            "ramp_up_start_rps": self.start_rps,
            "ramp_up_end_rps": self.end_rps,
            "arrivals": "constant" if math.isinf(self.burstiness) else "gamma",
            "burstiness": self.burstiness,
            "seed": self.seed,
            "concurrency": self.max_concurrency,
        }

    @property
    def label(self) -> str:
        cap = f", cap {self.max_concurrency}" if self.max_concurrency else ""
        return f"{self.strategy} ramp {self.start_rps:g}->{self.end_rps:g} req/s{cap}"


def ramp_from_json(d: dict[str, Any]) -> Ramp:
    return Ramp(
        str(d["ramp_up_strategy"]),
        float(d["ramp_up_start_rps"]),
        float(d["ramp_up_end_rps"]),
        float(d.get("burstiness", 1.0)),
        int(d.get("seed", 0)),
        d.get("concurrency"),
    )

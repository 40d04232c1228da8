"""The capacity search's driver: a plan whose rate points are chosen as the session runs
(:func:`harness.analysis.capacity.slo.next_rate` over the runs so far), each rate run by every
variant in the session's rotated, interleaved order, repeated ``--repeats`` times. The session
pulls the next point only after the previous one finished, so the search sees every run."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from harness.analysis.capacity.slo import next_rate, probe_entry
from harness.core.design import ONE
from harness.core.load import Poisson
from harness.core.results import Run
from harness.run.plan import Point, RunPlan

# Seconds of arrivals per probe without --duration: a fixed count of requests would end an
# overloaded probe before its queue could break the SLO (40 requests "held" at 1024 req/s on
# the tiny pair); saturation detection stops an overloaded one sooner.
DURATION_S = 5.0


@dataclass
class Search:
    """The search's state: the rates chosen so far, and the session's runs it reads."""

    runs: list[Run] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class CapacityPlan(RunPlan):
    """A RunPlan whose ``points()`` are the capacity search's rates (throughput mode, no cap
    unless --concurrency gave one, one engine instance per lane for the whole search)."""

    search: Search = field(default_factory=Search, compare=False)

    @classmethod
    def of(cls, plan: RunPlan) -> CapacityPlan:
        fields = {k: getattr(plan, k) for k in RunPlan.__dataclass_fields__}
        fields.update(modes=("throughput",), instances=ONE, max_new_tokens=plan.max_new_tokens[:1])
        fields["duration"] = plan.duration or DURATION_S  # a probe as long at every rate
        return cls(**fields)

    def _point(self, rate: float) -> Point:
        cap = self.concurrency[0] if self.concurrency else None
        return Point(
            "throughput", Poisson(rate, self.burstiness, self.seed, cap), self.max_new_tokens[0]
        )

    def points(self) -> Iterator[Point]:
        i = 0
        while True:
            if i < len(self.search.rates):
                yield self._point(self.search.rates[i])
                i += 1
                continue
            assert self.slo is not None
            probes = [
                e for r in self.search.runs
                if (e := probe_entry(r, self.slo, self.slo_quantile)) is not None
            ]  # fmt: skip
            variants = list(
                dict.fromkeys(f"{r.cell.engine}/{r.cell.label}" for r in self.search.runs)
            )
            rate = next_rate(probes, variants, self.slo_start_rate, self.slo_max_probes)
            if rate is None or rate in self.search.rates:
                return
            self.search.rates.append(rate)

    def to_json(self) -> dict[str, Any]:
        d = super().to_json()
        d.pop("search", None)
        return d


def search_plan(plan: RunPlan) -> RunPlan:
    """The plan the session runs: with --slo, a capacity search (:class:`CapacityPlan`)."""
    return CapacityPlan.of(plan) if plan.slo and not isinstance(plan, CapacityPlan) else plan


def bind(plan: RunPlan, runs: list[Run]) -> None:
    """Point a capacity search at the session's runs (its list, filled as runs finish)."""
    if isinstance(plan, CapacityPlan):
        plan.search.runs = runs

"""vLLM's speculative-decoding counters -> SpecCounters, from either side of vLLM's metrics.

* :func:`spec_counters_from_snapshot` reads ``LLM.get_metrics()`` (in-process engine);
* a server's ``/metrics`` text is read by :func:`engines.openai.prom.parse_metrics`.

Both sum over label sets (engine index, model name) and return None when the engine exposes
no speculative-decoding counters at all (a baseline). Importing this module does not import vLLM.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from engines.base import SpecCounters

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
_SCALARS = {DRAFTS: 0, DRAFT_TOKENS: 1, ACCEPTED: 2}


def _strip_total(name: str) -> str:
    return name[: -len("_total")] if name.endswith("_total") else name


def _build(scalars: list[float], per_pos: dict[int, float], seen: bool) -> SpecCounters | None:
    if not seen:
        return None
    n = max(per_pos) + 1 if per_pos else 0
    return SpecCounters(
        num_drafts=int(scalars[0]),
        num_draft_tokens=int(scalars[1]),
        num_accepted_tokens=int(scalars[2]),
        accepted_per_pos=tuple(int(per_pos.get(i, 0)) for i in range(n)),
    )


def spec_counters_from_snapshot(metrics: Iterable[Any]) -> SpecCounters | None:
    """From ``vllm.v1.metrics.reader`` objects (``Counter.value``, ``Vector.values``)."""
    scalars = [0.0, 0.0, 0.0]
    per_pos: dict[int, float] = {}
    seen = False
    for m in metrics:
        name = _strip_total(getattr(m, "name", ""))
        if name in _SCALARS:
            scalars[_SCALARS[name]] += float(m.value)
            seen = True
        elif name == PER_POS:
            for i, v in enumerate(m.values):
                per_pos[i] = per_pos.get(i, 0.0) + float(v)
            seen = True
    return _build(scalars, per_pos, seen)


class StatsTap:
    """One in-process engine's own running totals of vLLM's per-step scheduler stats.

    vLLM's Prometheus registry is process-global and each new engine's stat logger unregisters
    the previous engine's collectors, so with several engines alive in one process (interleaved
    lanes) ``LLM.get_metrics()`` reads only the newest engine. The tap wraps this engine's
    ``StatLoggerManager.record`` and adds up what each of its steps reports: speculative
    decoding (as :class:`SpecCounters`) and prefix-cache queries and hits (tokens).
    """

    def __init__(self) -> None:
        self.drafts = self.draft_tokens = self.accepted = 0
        self.per_pos: list[int] = []
        self.prefix_queries = self.prefix_hits = 0

    def install(self, logger_manager: Any) -> bool:
        """Wrap ``logger_manager.record``; False when stats are off (nothing to tap)."""
        if logger_manager is None:
            return False
        inner = logger_manager.record

        def record(scheduler_stats: Any = None, *args: Any, **kwargs: Any) -> Any:
            if scheduler_stats is not None:
                self.add(scheduler_stats)
            return inner(scheduler_stats, *args, **kwargs)

        logger_manager.record = record
        return True

    def add(self, scheduler_stats: Any) -> None:
        spec = getattr(scheduler_stats, "spec_decoding_stats", None)
        if spec is not None:
            self.drafts += int(spec.num_drafts)
            self.draft_tokens += int(spec.num_draft_tokens)
            self.accepted += int(spec.num_accepted_tokens)
            per_pos = list(spec.num_accepted_tokens_per_pos)
            if len(per_pos) > len(self.per_pos):
                self.per_pos += [0] * (len(per_pos) - len(self.per_pos))
            for i, x in enumerate(per_pos):
                self.per_pos[i] += int(x)
        prefix = getattr(scheduler_stats, "prefix_cache_stats", None)
        if prefix is not None:
            self.prefix_queries += int(prefix.queries)
            self.prefix_hits += int(prefix.hits)

    def spec_counters(self) -> SpecCounters:
        return SpecCounters(self.drafts, self.draft_tokens, self.accepted, tuple(self.per_pos))

    def prefix_cache(self) -> dict[str, int]:
        """Cumulative prefix-cache queries and hits, in prompt tokens."""
        return {"queries": self.prefix_queries, "hits": self.prefix_hits}

"""vLLM's speculative-decoding counters -> SpecCounters, from either side of vLLM's metrics.

* :func:`spec_counters_from_snapshot` reads ``LLM.get_metrics()`` (in-process engine);
* a server's ``/metrics`` text is read by :func:`engines.prom.parse_metrics`.

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

"""Output sanity: is the text degenerate (blank, or stuck in a loop), and did speculation change
the output (the lossless check)? Both are properties of the outputs, not of the timing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.core.records import RequestRecord
from harness.core.results import Run

MAX_PERIOD = 32  # the longest loop (in tokens) the repetition check looks for
WINDOW = 128  # the repetition check looks at this many trailing tokens


def blank_share(text: str) -> float:
    """Share of whitespace in ``text`` once each line's indentation is dropped: indented code is
    not blank, while a run of empty or space-only lines still is."""
    body = "\n".join(line.lstrip(" \t") for line in text.split("\n"))
    return sum(ch.isspace() for ch in body) / len(body) if body else 1.0


def loop_period(ids: Sequence[int]) -> int | None:
    """The shortest period p <= MAX_PERIOD with which the trailing window repeats itself: the
    periodic stretch spans at least two periods and half the window. None when there is none."""
    tail = list(ids[-WINDOW:])
    for p in range(1, MAX_PERIOD + 1):
        run = 0  # trailing positions i with tail[i] == tail[i - p]
        for i in range(len(tail) - 1, p - 1, -1):
            if tail[i] != tail[i - p]:
                break
            run += 1
        span = run + p
        if run >= p and 2 * span >= len(tail):
            return p
    return None


def degenerate(record: RequestRecord) -> str | None:
    """ "whitespace" (mostly blank text), "repetition" (stuck in a loop) or None."""
    text = record.output_text
    if text is not None and len(text) >= 8 and blank_share(text) > 0.5:
        return "whitespace"
    ids = record.output_token_ids
    if ids and len(ids) >= 16 and loop_period(ids) is not None:
        return "repetition"
    return None


def sanity(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """Share of counted outputs that are degenerate, by kind; how many carry token ids, and
    where their token counts came from."""
    n, with_ids = 0, 0
    kinds = {"whitespace": 0, "repetition": 0}
    sources: set[str] = set()  # where the output token counts came from (HTTP engines)
    for r in records:  # one at a time: the records may be columns of a million (issue 38)
        if not r.counted:
            continue
        n += 1
        if (kind := degenerate(r)) is not None:
            kinds[kind] += 1
        with_ids += r.output_token_ids is not None
        if x := r.info.get("output_tokens_from"):
            sources.add(str(x))
    out: dict[str, Any] = {"outputs": n}
    for kind, k in kinds.items():
        out[kind] = k / n if n else None
    out["with_token_ids"] = with_ids
    if n and not with_ids:
        out["repetition"] = None  # loops are found in token ids: none were streamed
    out["tokens_from"] = sorted(sources)
    return out


def lossless(base: list[Run], cand: list[Run], temperature: float | None) -> dict[str, Any]:
    """Share of prompts whose output token ids are identical, with the first divergence.

    Only greedy decoding (temperature 0) must give identical outputs; under sampling the check
    says so instead of reporting differences that mean nothing."""
    if temperature is None:
        return {"status": "n/a (temperature not recorded)"}
    if temperature > 0:
        return {"status": "n/a (sampling)"}

    def first_ids(runs: list[Run]) -> dict[str, tuple[int, ...]]:
        out: dict[str, tuple[int, ...]] = {}
        for run in runs:
            for r in run.counted:
                if r.output_token_ids is not None:
                    out.setdefault(r.request_id, r.output_token_ids)
        return out

    b, c = first_ids(base), first_ids(cand)
    ids = sorted(set(b) & set(c))
    diverged = {}
    for i in ids:
        if b[i] != c[i]:
            x, y = b[i], c[i]
            pos = next((k for k, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
            diverged[i] = pos
    return {
        "status": "checked" if ids else "n/a (no token ids)",
        "compared": len(ids),
        "identical": len(ids) - len(diverged),
        "share_identical": (len(ids) - len(diverged)) / len(ids) if ids else None,
        "first_divergence": diverged,
        "first_divergence_min": min(diverged.values()) if diverged else None,
    }

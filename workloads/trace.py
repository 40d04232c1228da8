"""Mooncake-format traces: one timed request a line, prompts built block by block from hash ids.

The format (kvcache-ai/Mooncake, ``FAST25-release/traces/``; vLLM bench's ``timed_trace``,
SGLang's and AIPerf's ``mooncake``): JSONL lines ``{"timestamp": ms, "input_length": tokens,
"output_length": tokens, "hash_ids": [...]}``. Each hash id names one block of ``block_size``
tokens (512 in Mooncake's traces) and equal ids are equal blocks, so the prefixes the trace
shares are shared here too: block ``h`` is ``block_size`` token ids of the target's tokenizer
drawn from ``numpy.random.default_rng([seed, h])`` (special ids excluded), the same for every
request, every variant and every run; the prompt is the blocks in order, cut to
``input_length``. The ids go to the engine as they are (no text, no BOS added), and
``output_length`` is forced (the plan ignores EOS).

Why ids and not text: a decoded block re-encodes to other ids at its seams, which would move the
block boundaries the trace's sharing is about.

Fitting a trace to a small model or machine (:class:`TraceSpec`, recorded in results.json):
``time_scale`` multiplies every gap (0.5 = twice as fast); ``input_scale`` scales the input
length and the block size alike (so the blocks stay whole and the sharing stays the trace's);
``max_input_len`` caps the input, rounded down to whole blocks when it is at least one block;
``first`` keeps the first N lines, ``window`` the lines whose timestamp (seconds after the
first line) lies in ``[start, end)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from workloads.base import Request
from workloads.readers import Loc, WorkloadError, jsonl_objects, read_text

KEYS = ("timestamp", "input_length", "output_length", "hash_ids")
DEFAULT_BLOCK = 512  # Mooncake's block (vLLM bench's --timed-trace-chunk-hash-size default is 16)


@dataclass(frozen=True)
class TraceSpec:
    """How a trace is fitted (every field recorded in results.json ``workload.params``)."""

    block_size: int = DEFAULT_BLOCK
    time_scale: float = 1.0
    input_scale: float = 1.0
    max_input_len: int | None = None
    first: int | None = None
    window: tuple[float, float] | None = None  # seconds after the first line: [start, end)
    seed: int = 0

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["window"] = None if self.window is None else list(self.window)
        return d


@dataclass(frozen=True)
class TraceLine:
    """One validated line: ``t_s`` = its timestamp in seconds after the file's first line."""

    source: str
    t_s: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def _int(loc: Loc, obj: dict[str, Any], key: str, low: int) -> int:
    if key not in obj:
        raise loc.error(key, "missing")
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise loc.error(key, f"must be an integer >= {low}, got {v!r}"[:120])
    if v < low:
        raise loc.error(key, f"must be >= {low}, got {v}")
    return v


def parse_line(loc: Loc, obj: dict[str, Any], block_size: int) -> tuple[float, int, int, tuple]:
    """(timestamp ms, input_length, output_length, hash_ids) of one line, or a located error."""
    unknown = [k for k in obj if k not in KEYS]
    if unknown:
        raise loc.error(unknown[0], f"unknown field (expected {', '.join(KEYS)})")
    if "timestamp" not in obj:
        raise loc.error("timestamp", "missing")
    ts = obj["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
        raise loc.error("timestamp", f"must be a number of milliseconds, got {ts!r}"[:120])
    if ts < 0:
        raise loc.error("timestamp", f"must be >= 0, got {ts}")
    n_in = _int(loc, obj, "input_length", 1)
    n_out = _int(loc, obj, "output_length", 1)
    if "hash_ids" not in obj:
        raise loc.error("hash_ids", "missing")
    ids = obj["hash_ids"]
    if not isinstance(ids, list) or not ids:
        raise loc.error("hash_ids", "must be a non-empty list of integers")
    for i, h in enumerate(ids):
        if isinstance(h, bool) or not isinstance(h, int) or h < 0:
            raise loc.error(f"hash_ids[{i}]", f"must be an integer >= 0, got {h!r}"[:120])
    if n_in > len(ids) * block_size:
        raise loc.error(
            "input_length",
            f"{n_in} tokens need more than the {len(ids)} blocks of {block_size} that hash_ids "
            "names (wrong --trace-block-size?)",
        )
    return float(ts), n_in, n_out, tuple(ids)


def read_trace(path: Path, shown: str, spec: TraceSpec) -> list[TraceLine]:
    """Every line validated (timestamps non-decreasing), then the slice the spec keeps."""
    if spec.block_size < 1:
        raise WorkloadError(None, f"must be >= 1, got {spec.block_size}", field="block_size")
    text = read_text(path, shown)
    lines: list[TraceLine] = []
    t_first = None
    last = -math.inf
    for loc, obj in jsonl_objects(text, shown):
        ts, n_in, n_out, ids = parse_line(loc, obj, spec.block_size)
        if ts < last:
            raise loc.error("timestamp", f"{ts:g} is before the previous line's {last:g}")
        last = ts
        t_first = ts if t_first is None else t_first
        lines.append(TraceLine(loc.source, (ts - t_first) / 1000.0, n_in, n_out, ids))
    if spec.window is not None:
        start, end = spec.window
        lines = [x for x in lines if start <= x.t_s < end]
    if spec.first is not None:
        lines = lines[: spec.first]
    if not lines:
        raise WorkloadError(shown, "no trace lines in the asked slice")
    return lines


def fitted(line: TraceLine, spec: TraceSpec) -> tuple[int, int, tuple[int, ...]]:
    """(input length, block size, hash ids kept) after ``input_scale`` and ``max_input_len``."""
    block = max(1, round(spec.block_size * spec.input_scale))
    n = max(1, min(len(line.hash_ids) * block, round(line.input_length * spec.input_scale)))
    cap = spec.max_input_len
    if cap is not None and n > cap:
        n = cap - cap % block if cap >= block else cap  # whole blocks where it can
    return n, block, line.hash_ids[: math.ceil(n / block)]


class BlockTokens:
    """Token blocks by hash id: ``block(h)`` is the same ids for the same (h, size, seed)."""

    def __init__(self, vocab: Sequence[int], seed: int = 0) -> None:
        if not len(vocab):
            raise WorkloadError(None, "the tokenizer has no ordinary token ids", field="tokenizer")
        self.vocab = np.asarray(vocab, dtype=np.int64)
        self.seed = seed
        self._cache: dict[tuple[int, int], tuple[int, ...]] = {}

    def block(self, h: int, size: int) -> tuple[int, ...]:
        key = (h, size)
        if key not in self._cache:
            rng = np.random.default_rng([self.seed, h])
            self._cache[key] = tuple(self.vocab[rng.integers(0, len(self.vocab), size)].tolist())
        return self._cache[key]

    def prompt(self, hash_ids: Sequence[int], block: int, length: int) -> tuple[int, ...]:
        ids: list[int] = []
        for h in hash_ids:
            ids.extend(self.block(h, block))
        return tuple(ids[:length])


def ordinary_ids(tok: Any) -> list[int]:
    """The tokenizer's ids that are not special (as the synthetic datasets draw from)."""
    special = set(getattr(tok, "all_special_ids", []) or [])
    return [i for i in range(int(tok.vocab_size)) if i not in special]


def trace_requests(
    lines: Sequence[TraceLine], vocab: Sequence[int], spec: TraceSpec
) -> tuple[Request, ...]:
    """One request a line: its token ids, its output length, its send offset (scaled)."""
    blocks = BlockTokens(vocab, spec.seed)
    t0 = lines[0].t_s
    out = []
    for i, line in enumerate(lines):
        n, block, ids = fitted(line, spec)
        out.append(
            Request(
                str(i),
                max_new_tokens=line.output_length,
                source=line.source,
                prompt_token_ids=blocks.prompt(ids, block, n),
                send_s=(line.t_s - t0) * spec.time_scale,
                block_ids=ids,
            )
        )
    return tuple(out)


def shared_prefix_tokens(requests: Sequence[Request], block: int) -> list[int]:
    """Per request, in send order: the longest token prefix it shares with any request sent
    before it (what a prefix cache that evicted nothing could serve, before rounding down to the
    cache's own block). Requests sharing ``k + 1`` leading hash ids agree on their first
    ``min(their lengths, (k + 1) * block)`` tokens."""
    cover: dict[tuple[int, ...], int] = {}  # block-id prefix -> longest earlier prompt with it
    out = []
    for r in requests:
        ids, n = tuple(r.block_ids or ()), len(r.prompt_token_ids or ())
        best = 0
        for k in range(len(ids)):
            seen = cover.get(ids[: k + 1])
            if seen is None:
                break
            best = max(best, min(n, seen, (k + 1) * block))
        out.append(best)
        for k in range(len(ids)):
            cover[ids[: k + 1]] = max(cover.get(ids[: k + 1], 0), n)
    return out

"""Workloads: prompt sets read from shipped files or user files, validated up front.

``load_workload("specbench")`` or ``load_workload("path/to/file.jsonl")``; see
:mod:`workloads.readers` for the formats and the one-line error messages.

A shipped name wins over a file of the same name in the working directory (write ``./default``
for the file). ``num_prompts=N`` draws a seeded sample of N entries without replacement
(``random.Random(seed)``) and keeps them in file order, so the same (file, N, seed) always
gives the same prompts in the same order. N larger than the file cycles through it
(:class:`Cycled`): the whole file in order, then seeded reshuffles, each copy with a fresh id.
Synthetic workloads (``random``, ``prefix_repetition``) are made by :func:`synthetic_workload`.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, overload

from workloads.base import Request
from workloads.readers import FORMATS, WorkloadError, read_requests

__all__ = [
    "FORMATS",
    "Cycled",
    "Request",
    "Workload",
    "WorkloadError",
    "available_workloads",
    "check_trace",
    "conversation_workload",
    "fingerprint",
    "load_workload",
    "shipped_path",
    "synthetic_workload",
    "trace_workload",
]

DATA_DIR = Path(__file__).resolve().parent / "data"

# name -> (file in data/, one-line description)
SHIPPED: dict[str, tuple[str, str]] = {
    "default": (
        "default.jsonl",
        "4 chat prompts for the default run: writing, math_reasoning + a summary and a code "
        "edit (input-grounded: where n-gram pays)",
    ),
    "tiny": (
        "tiny.jsonl",
        "16 short prompts for the tiny test pair: 8 stdlib code completions, 4 code edits, "
        "4 Spec-Bench (4 categories)",
    ),
    "grounded": (
        "grounded.jsonl",
        "180 input-grounded prompts (answer copies from the prompt): Spec-Bench summarization "
        "and rag + 20 stdlib code edits",
    ),
    "specbench": (
        "specbench_question.jsonl",
        "Spec-Bench question set: 480 prompts, 13 categories (first turn by default)",
    ),
}


# shipped files read by their own loaders (not prompt sets: load_workload does not take them)
SHIPPED_TRACES: dict[str, tuple[str, str]] = {
    "trace_tiny": (
        "trace_tiny.jsonl",
        "16 timed requests in Mooncake's format over 4.2 s, inputs 100-1800 tokens, sessions "
        "sharing leading 512-token blocks (made by the project for the tests)",
    ),
}
SHIPPED_CONVERSATIONS: dict[str, tuple[str, str]] = {
    "conversations": (
        "conversations.json",
        "10 ShareGPT-format conversations of 2-3 user turns whose later turns ask to repeat or "
        "rework the answer (made by the project for the tests)",
    ),
}


def _resolve_in(spec: str | Path, table: Mapping[str, tuple[str, str]]) -> tuple[str, Path, str]:
    s = str(spec)
    if s in table:
        p = DATA_DIR / table[s][0]
        return s, p, str(p)
    return _resolve(spec)


def fingerprint(requests: Sequence[Request]) -> str:
    """sha256 over the ids and prompts/messages (a trace's token ids, send times and lengths; a
    conversation's later turns), in order: equal iff the prompt sets are. The JSON list of one
    row per request, hashed row by row (a million requests: no list, no blob)."""
    h = hashlib.sha256(b"[")
    for k, r in enumerate(requests):
        row: list = [r.id, r.prompt, [dict(m) for m in r.messages or ()]]
        if r.prompt is None and r.messages is None and r.prompt_token_ids is not None:
            row += [list(r.prompt_token_ids), r.send_s, r.max_new_tokens]  # a trace's
        if r.next_turns:  # a conversation's later turns
            row.append(list(r.next_turns))
        text = json.dumps(row, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
        h.update(("," + text if k else text).encode("utf-8"))
    h.update(b"]")
    return h.hexdigest()


@dataclass(frozen=True)
class Workload:
    """A validated prompt set. ``fingerprint`` is computed from ``requests``."""

    name: str
    path: str
    fmt: str
    requests: Sequence[Request]  # a tuple, or packed (workloads.packed)
    turn: int = 0
    num_prompts: int | None = None  # None: the whole file
    seed: int = 0
    skipped: int = 0  # entries without the asked-for turn (only with skip_missing_turn)
    params: Mapping[str, Any] | None = None  # a synthetic workload's lengths
    fingerprint: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fingerprint", fingerprint(self.requests))

    def __len__(self) -> int:
        return len(self.requests)


def available_workloads() -> dict[str, str]:
    """Shipped workload names and their one-line descriptions."""
    return {name: desc for name, (_, desc) in sorted(SHIPPED.items())}


def shipped_path(name: str) -> Path:
    """The data file of a shipped workload."""
    if name not in SHIPPED:
        raise _unknown(name)
    return DATA_DIR / SHIPPED[name][0]


def _unknown(name: str) -> WorkloadError:
    return WorkloadError(
        None, f"unknown workload {name!r} (valid: {', '.join(sorted(SHIPPED))}, or a file path)"
    )


def _resolve(spec: str | Path) -> tuple[str, Path, str]:
    """(name, path, path as shown in errors) for a shipped name or a file path."""
    s = str(spec)
    if s in SHIPPED:
        p = shipped_path(s)
        return s, p, str(p)
    p = Path(s).expanduser()
    if not p.exists() and p.suffix == "" and len(p.parts) == 1:
        raise _unknown(s)  # a bare word: most likely a mistyped shipped name
    return p.stem, p, s


def load_workload(
    spec: str | Path,
    *,
    fmt: str | None = None,
    num_prompts: int | None = None,
    seed: int = 0,
    turn: int = 0,
    skip_missing_turn: bool = False,
) -> Workload:
    """Read and validate a whole workload (shipped name or file path); raises WorkloadError.

    ``turn``: which user turn is the prompt (Spec-Bench ``turns[turn]``; ShareGPT's
    ``turn``-th human turn). An entry without it is an error, unless ``skip_missing_turn``:
    then it is skipped, counted in ``Workload.skipped`` and in one warning.
    """
    name, path, shown = _resolve(spec)
    fmt, requests, skipped = read_requests(
        path, shown=shown, fmt=fmt, turn=turn, skip_missing_turn=skip_missing_turn
    )
    if num_prompts is not None:
        if isinstance(num_prompts, bool) or not isinstance(num_prompts, int) or num_prompts < 1:
            raise WorkloadError(
                None, f"must be an integer >= 1, got {num_prompts!r}", field="num_prompts"
            )
        if num_prompts > len(requests):
            requests = tuple(Cycled(requests, num_prompts, seed))
        else:
            keep = sorted(random.Random(seed).sample(range(len(requests)), num_prompts))
            requests = tuple(requests[i] for i in keep)
    return Workload(name, str(path), fmt, requests, turn, num_prompts, seed, skipped)


def synthetic_workload(
    name: str, tokenizer: str, num_prompts: int, spec: Any, seed: int = 0
) -> Workload:
    """``random`` or ``prefix_repetition`` prompts made with ``tokenizer`` (an HF id or path)."""
    from workloads import synthetic

    make = {
        "random": synthetic.random_requests,
        "prefix_repetition": synthetic.prefix_repetition_requests,
    }
    if name not in make:
        raise WorkloadError(None, f"unknown synthetic dataset {name!r}", field="--dataset-name")
    requests = make[name](synthetic.load_tokenizer(tokenizer), num_prompts, spec, seed)
    params = {**synthetic.describe(spec), "tokenizer": tokenizer}
    return Workload(name, "", name, requests, 0, num_prompts, seed, 0, params)


def trace_workload(spec_path: str | Path, tokenizer: str, trace: Any) -> Workload:
    """A Mooncake-format trace (:mod:`workloads.trace`) as token-id requests of ``tokenizer``,
    each with its send offset; ``trace`` is a :class:`workloads.trace.TraceSpec`."""
    from workloads import synthetic
    from workloads.trace import (
        fitted,
        ordinary_ids,
        read_trace,
        shared_prefix_tokens,
        trace_requests,
    )

    name, path, shown = _resolve_in(spec_path, SHIPPED_TRACES)
    lines = read_trace(path, shown, trace)
    vocab = ordinary_ids(synthetic.load_tokenizer(tokenizer))
    requests = trace_requests(lines, vocab, trace)
    block = fitted(lines[0], trace)[1]
    shared = shared_prefix_tokens(requests, block)
    params = {
        **trace.to_json(),
        "tokenizer": tokenizer,
        "fitted_block_size": block,
        "span_s": requests[-1].send_s,
        "input_tokens": sum(len(r.prompt_token_ids or ()) for r in requests),
        "shared_prefix_tokens": sum(shared),
        # per request id: the trace's shared prefix (harness.analysis.workload.replay compares it with the
        # prefix-cache hits the engine reports)
        "shared_prefix_by_request": {r.id: n for r, n in zip(requests, shared)},
    }
    return Workload(name, str(path), "mooncake", requests, 0, len(requests), trace.seed, 0, params)


def check_trace(spec_path: str | Path, trace: Any) -> int:
    """Read and validate a trace file without a tokenizer (before any model loads): the lines
    the spec keeps; raises WorkloadError."""
    from workloads.trace import read_trace

    _, path, shown = _resolve_in(spec_path, SHIPPED_TRACES)
    return len(read_trace(path, shown, trace))


def conversation_workload(
    spec: str | Path,
    *,
    fmt: str | None = None,
    num_prompts: int | None = None,
    seed: int = 0,
    min_turns: int = 2,
    max_turns: int | None = None,
) -> Workload:
    """Multi-turn conversations (:mod:`workloads.conversations`): one request per conversation,
    ``num_prompts`` of them drawn as :func:`load_workload` draws prompts (seeded, file order)."""
    from workloads.conversations import read_conversations

    name, path, shown = _resolve_in(spec, SHIPPED_CONVERSATIONS)
    fmt, requests, skipped = read_conversations(
        path, shown, fmt=fmt, min_turns=min_turns, max_turns=max_turns
    )
    if num_prompts is not None and num_prompts < len(requests):
        keep = sorted(random.Random(seed).sample(range(len(requests)), num_prompts))
        requests = tuple(requests[i] for i in keep)
    params = {
        "conversations": len(requests),
        "min_turns": min_turns,
        "max_turns": max_turns,
        "turns": sum(1 + len(r.next_turns) for r in requests),
    }
    return Workload(name, str(path), fmt, requests, 0, num_prompts, seed, skipped, params)


class Cycled(Sequence[Request]):
    """``n`` requests cycled from ``base``: pass 0 in order, each later pass a seeded
    reshuffle (``random.Random(f"{seed}/{pass}")``), ids ``ID~K`` for the K-th copy, each pass
    its own prefix-cache salt (a copy must not hit the blocks its original cached). Lazy, so a
    ``--duration`` run can ask for far more requests than it will send."""

    def __init__(self, base: Sequence[Request], n: int, seed: int = 0) -> None:
        if not base:
            raise WorkloadError(None, "no requests to cycle through", field="num_prompts")
        self.base, self.n, self.seed = tuple(base), n, seed
        self._orders: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return self.n

    def _at(self, i: int) -> Request:
        k, j = divmod(i, len(self.base))
        if k == 0:
            return self.base[j]
        if k not in self._orders:
            order = list(range(len(self.base)))
            random.Random(f"{self.seed}/{k}").shuffle(order)
            self._orders[k] = order
        r = self.base[self._orders[k][j]]
        return replace(r, id=f"{r.id}~{k}", cache_salt=f"pass-{k}")

    @overload
    def __getitem__(self, i: int) -> Request: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[Request, ...]: ...
    def __getitem__(self, i: int | slice) -> Request | tuple[Request, ...]:
        if isinstance(i, slice):
            return tuple(self._at(k) for k in range(*i.indices(self.n)))
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self._at(i)

    def __iter__(self) -> Iterator[Request]:
        return (self._at(i) for i in range(self.n))

"""The design of the experiment: which variant runs when, and what may warm which cache.

A comparison's variants (lanes) alternate in time: at each plan point, every repeat (a block) runs each
lane once, in an order that is a seeded permutation of the lanes rotated by one position per
block, so each lane takes each position equally often and a machine that drifts
(other tenants, thermal state) slows every variant alike. Lanes that cannot live in one process
run one after the other ("sequential"): each variant's repeats form one block, which a paired
verdict must treat with care (between-block drift is not cancelled).

Engine instances: an in-process engine keeps a speed offset of a few % for its whole life, so
where a start is cheap each block runs on fresh instances (PER_BLOCK), built in a seeded order
per block, and the offset varies between blocks, inside the CI; servers keep ONE instance.

Every run records where it sat in the schedule (:class:`Slot`), so the statistics can pair a
baseline and a candidate by repeat (the "block" of the interleaved design) and anyone can check
from results.json that start times alternate.

Caches: warm-up requests use prompts that are never measured (:func:`warmup_requests`), and the
prefix cache is reset before every measured run (policy ``reset``), switched off (``off``), or
left alone (``keep``: the old behaviour, where repeats 2+ of a vLLM variant hit the prompts that
repeat 1 cached and HF has no such cache).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from workloads.base import Request

INTERLEAVED = "interleaved"
SEQUENTIAL = "sequential"
# runs of separate sessions (two files written one after the other, a vLLM bench file): never
# interleaved with each other, whatever each session's own design was
SEPARATE = "separate sessions"
PREFIX_CACHE_POLICIES = ("reset", "off", "keep")
AA_LABEL = "baseline-aa"  # --aa: the baseline configuration again, as a candidate

DESCRIPTIONS = {
    INTERLEAVED: "variants alternate run by run; order a seeded permutation rotated by one "
    "position per block; a block is one repeat of every variant (the pairing unit)",
    SEQUENTIAL: "variants one after the other (each variant's repeats back to back): "
    "drift between blocks is not cancelled",
}
CACHE_DESCRIPTIONS = {
    "reset": "prefix cache on, reset before every measured run; warm-ups use unmeasured prompts",
    "off": "prefix cache disabled; warm-ups use unmeasured prompts",
    "keep": "prefix cache on and never reset: repeats may hit what earlier runs cached",
}


def lane_order(n_lanes: int, rotation: int, seed: int) -> list[int]:
    """Indices of the lanes in the order they run in one block (one repeat of every lane).

    A seeded permutation, rotated by ``rotation`` (the session's count of blocks so far): over
    ``n_lanes`` consecutive blocks every lane runs once in every position (a Latin square), and
    with 3+ lanes no lane ever runs twice in a row; two lanes give A B, B A, A B, ...
    """
    base = list(range(n_lanes))
    random.Random(seed).shuffle(base)
    k = rotation % n_lanes if n_lanes else 0
    return base[k:] + base[:k]


@dataclass(frozen=True)
class Slot:
    """Where one run sat in the schedule (stored with the run in results.json)."""

    design: str  # INTERLEAVED | SEQUENTIAL
    point: int  # index of the plan point
    block: int  # the repeat: runs of one block are the pairing unit
    position: int  # 0-based place of this lane within its block
    seq: int  # global run number in the session (0, 1, 2, ...)
    t_start_s: float | None = None  # session clock, seconds since the session began
    t_end_s: float | None = None
    cache: str | None = None  # what was done to the engine's cache before the run

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> Slot | None:
        if not d:
            return None
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__})


def design_of(slots: Iterable[Slot | None]) -> str:
    """The design a group of runs used: one name, "mixed", or "unknown" (older files)."""
    names = {s.design if s is not None else "unknown" for s in slots}
    return names.pop() if len(names) == 1 else "mixed"


def warmup_requests(requests: Sequence[Request], n: int, cap: int | None = None) -> list[Request]:
    """``n`` warm-up requests shaped like the workload's first ones (lengths resolved:
    ``harness.run.plan.RunPlan.resolve_lengths``) but never measured; with ``cap``
    (--warmup-tokens) each asks for at most ``cap`` new tokens.

    Each is a measured prompt with its words reversed behind a ``warm-up k:`` marker: similar
    length and vocabulary (the same kernels and batch shapes warm up), a different first token
    (so no prefix-cache block is shared with a measured prompt).
    """
    out = []
    for k in range(n):
        src = requests[k % len(requests)] if requests else Request(id="w", prompt="warm up")
        out.append(
            replace(
                src,
                id=f"warmup-{k}",
                prompt=None if src.prompt is None else _scramble(src.prompt, k),
                messages=None
                if src.messages is None
                else tuple(
                    {**m, "content": _scramble(m.get("content", ""), k)} for m in src.messages
                ),
                # a synthetic prompt's ids: the scrambled text replaces them; a trace's (ids
                # only): reversed, so no leading block is a measured prompt's
                prompt_token_ids=None
                if src.prompt is not None or src.prompt_token_ids is None
                else tuple(reversed(src.prompt_token_ids)),
                send_s=None,
                block_ids=None,
                max_new_tokens=src.max_new_tokens
                if cap is None or src.max_new_tokens is None
                else min(cap, src.max_new_tokens),
            )
        )
    return out


def _scramble(text: str, k: int) -> str:
    return f"warm-up {k}: " + " ".join(reversed(text.split(" ")))


PER_BLOCK = "per-block"  # a fresh engine instance per block (repeat) for every lane
ONE = "one"  # one engine instance per lane for the whole run
INSTANCES = (PER_BLOCK, ONE)
INSTANCE_DESCRIPTIONS = {
    PER_BLOCK: "a fresh engine instance per block, built in a seeded random order per block, so "
    "an instance's own speed offset varies between blocks and is inside the CI",
    ONE: "one engine instance per variant for the whole run: an instance's own speed offset "
    "(a few % in real A/A runs) is constant across blocks and NOT inside the CI",
}

# a fresh instance warms up before every point of every block: at full length that alone took
# the CPU main job past its 10 minutes; 8 new tokens still run every decode shape of
# the point (batch sizes, the drafter's proposals), not the longest contexts
PER_BLOCK_WARMUP_TOKENS = 8


def warmup_cap(asked: int | None, instances: str) -> int | None:
    """New tokens per warm-up request: ``--warmup-tokens`` if given, else
    ``PER_BLOCK_WARMUP_TOKENS`` for per-block instances, else None (the point's length)."""
    if asked is not None:
        return asked
    return PER_BLOCK_WARMUP_TOKENS if instances == PER_BLOCK else None


def build_order(n_lanes: int, seed: int, block: int = 0) -> list[int]:
    """The order the lanes' engines are built in for ``block`` (when they are rebuilt per
    block): seeded, recorded. In one process the engine built first stepped 3-5% slower than
    those built after it (real A/A runs, docs/measurements.md); building the baseline first
    made that a bias for every speculative variant. Here the lane built first is balanced (over
    each ``n_lanes`` consecutive blocks every lane leads once, in a seeded order per cycle) and
    the rest follow in a seeded random order per block."""
    lanes = list(range(n_lanes))
    if not lanes:
        return []
    cycle, k = divmod(block, n_lanes)
    leaders = random.Random(f"build-{seed}-cycle-{cycle}").sample(lanes, n_lanes)
    rest = [i for i in lanes if i != leaders[k]]
    random.Random(f"build-{seed}-{block}").shuffle(rest)
    return [leaders[k], *rest]


def build_orders(design: Mapping[str, Any]) -> list[list[str]]:
    """The build order of every block from a stored design record; files written before
    engines were rebuilt per block hold one flat list (one build for the whole run)."""
    orders = design.get("build_order") or []
    if orders and all(isinstance(x, str) for x in orders):
        return [list(orders)]
    return [list(o) for o in orders]


def design_record(
    design: str,
    seed: int,
    prefix_cache: str,
    labels: Sequence[str],
    built: Sequence[Sequence[str]] = (),
    instances: Mapping[str, str] | None = None,
    warmup_tokens: Mapping[str, int | None] | None = None,
) -> dict:
    """The session-level description stored in results.json. ``built``: the engines (as
    ``engine/label``) in the order they were built, one list per block; ``instances``: per
    lane, PER_BLOCK or ONE; ``warmup_tokens``: per lane, the cap on a warm-up request's new
    tokens (None: the point's length)."""
    kinds = sorted(set((instances or {}).values()))
    return {
        "name": design,
        "description": DESCRIPTIONS[design],
        "seed": seed,
        "lanes": list(labels),
        **({"build_order": [list(b) for b in built]} if built else {}),
        **({"instances": dict(instances)} if instances else {}),
        **({"warmup_tokens": dict(warmup_tokens)} if warmup_tokens else {}),
        **(
            {"instances_description": "; ".join(INSTANCE_DESCRIPTIONS[k] for k in kinds)}
            if kinds
            else {}
        ),
        "prefix_cache": prefix_cache,
        "prefix_cache_description": CACHE_DESCRIPTIONS[prefix_cache],
        "warmup_prompts": "unmeasured: measured prompts with words reversed behind a marker",
    }

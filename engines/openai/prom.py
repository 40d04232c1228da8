"""Prometheus ``/metrics`` of an OpenAI-compatible server -> speculative counters, load gauges
and the server's own latency histograms (sum and count: a delta gives the mean over a run).

Parses vLLM's exposition text with ``prometheus_client``'s parser. Counters are summed over every
label set (engines, models) and over replicas; the runner takes deltas between snapshots.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from engines.base import SpecCounters

SPEC_PREFIX = "vllm:spec_decode_"
_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
_PER_POS = "num_accepted_tokens_per_pos"
_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
# prompt tokens the prefix cache was asked for and served (counters, as the in-process tap's)
PREFIX = {"vllm:prefix_cache_queries": "queries", "vllm:prefix_cache_hits": "hits"}
# the server's own view of latency: vLLM's histograms, by short name
HISTOGRAMS = {
    "vllm:inter_token_latency_seconds": "itl",
    "vllm:time_to_first_token_seconds": "ttft",
    "vllm:e2e_request_latency_seconds": "e2e",
}


@dataclass(frozen=True)
class Scrape:
    """What one /metrics page says: spec counters (None if none exposed) and load gauges."""

    spec: SpecCounters | None
    running: float | None
    waiting: float | None
    hist: Mapping[str, tuple[float, float]] = field(default_factory=dict)  # name -> (sum, count)
    vllm: bool = False  # some series is named ``vllm:...`` (a sign the server is vLLM)
    prefix: Mapping[str, int] = field(default_factory=dict)  # PREFIX's, when exposed
    kv_block_size: int | None = None  # vllm:cache_config_info's block_size label


def _base(name: str) -> str:
    for suffix in ("_total", "_created"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def parse_metrics(text: str) -> Scrape:
    """Parse one exposition page. ``_created`` samples are ignored; ``_total`` is optional."""
    totals: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    gauges: dict[str, float] = {}
    hist: dict[str, list[float]] = {}
    prefix: dict[str, int] = {}
    block = None
    seen_spec = vllm = False
    for family in text_string_to_metric_families(text):
        vllm = vllm or family.name.startswith("vllm:")
        short = HISTOGRAMS.get(family.name)
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            if short is not None and s.name.endswith(("_sum", "_count")):
                acc = hist.setdefault(short, [0.0, 0.0])
                acc[s.name.endswith("_count")] += s.value
            name = _base(s.name)
            if name == "vllm:cache_config_info" and str(s.labels.get("block_size", "")).isdigit():
                block = int(s.labels["block_size"])
            if name in PREFIX:
                prefix[PREFIX[name]] = prefix.get(PREFIX[name], 0) + int(s.value)
            if name in _GAUGES:
                gauges[name] = gauges.get(name, 0.0) + s.value
            if not name.startswith(SPEC_PREFIX):
                continue
            key = name[len(SPEC_PREFIX) :]
            if key == _PER_POS:
                seen_spec = True
                pos = int(s.labels.get("position", 0))
                per_pos[pos] = per_pos.get(pos, 0.0) + s.value
            elif key in _COUNTERS:
                seen_spec = True
                totals[key] = totals.get(key, 0.0) + s.value
    spec = None
    if seen_spec:
        n = max(per_pos) + 1 if per_pos else 0
        spec = SpecCounters(
            num_drafts=int(totals.get("num_drafts", 0)),
            num_draft_tokens=int(totals.get("num_draft_tokens", 0)),
            num_accepted_tokens=int(totals.get("num_accepted_tokens", 0)),
            accepted_per_pos=tuple(int(per_pos.get(i, 0)) for i in range(n)),
        )
    return Scrape(
        spec=spec,
        running=gauges.get("vllm:num_requests_running"),
        waiting=gauges.get("vllm:num_requests_waiting"),
        hist={k: (v[0], v[1]) for k, v in hist.items()},
        vllm=vllm,
        prefix=prefix if len(prefix) == len(PREFIX) else {},
        kv_block_size=block,
    )


def add(a: SpecCounters, b: SpecCounters) -> SpecCounters:
    """Field-wise sum; per-position vectors padded with zeros to the longer one."""
    n = max(len(a.accepted_per_pos), len(b.accepted_per_pos))
    pa = list(a.accepted_per_pos) + [0] * (n - len(a.accepted_per_pos))
    pb = list(b.accepted_per_pos) + [0] * (n - len(b.accepted_per_pos))
    return SpecCounters(
        a.num_drafts + b.num_drafts,
        a.num_draft_tokens + b.num_draft_tokens,
        a.num_accepted_tokens + b.num_accepted_tokens,
        tuple(x + y for x, y in zip(pa, pb)),
    )


def combine(scrapes: Iterable[Scrape]) -> Scrape:
    """Sum scrapes of several replicas (None stays None only when every replica says None)."""
    spec: SpecCounters | None = None
    running: float | None = None
    waiting: float | None = None
    hist: dict[str, tuple[float, float]] = {}
    prefix: dict[str, int] = {}
    vllm = False
    for s in scrapes:
        vllm = vllm or s.vllm
        for k, v in s.prefix.items():
            prefix[k] = prefix.get(k, 0) + v
        for k, (total, n) in s.hist.items():
            t0, n0 = hist.get(k, (0.0, 0.0))
            hist[k] = (t0 + total, n0 + n)
        if s.spec is not None:
            spec = s.spec if spec is None else add(spec, s.spec)
        if s.running is not None:
            running = (running or 0.0) + s.running
        if s.waiting is not None:
            waiting = (waiting or 0.0) + s.waiting
    return Scrape(spec, running, waiting, hist, vllm, prefix)


async def scrape(
    session: aiohttp.ClientSession, root: str, timeout: aiohttp.ClientTimeout
) -> Scrape:
    """GET ``{root}/metrics``; a server without the endpoint (404) says nothing."""
    async with session.get(f"{root}/metrics", timeout=timeout) as resp:
        if resp.status == 404:
            return Scrape(None, None, None)
        resp.raise_for_status()
        return parse_metrics(await resp.text())


def mean_between(before: Scrape, after: Scrape, name: str) -> float | None:
    """The server's mean of histogram ``name`` ("itl", "ttft", "e2e") over what happened between
    two scrapes (None when it observed nothing or does not expose it)."""
    if name not in before.hist or name not in after.hist:
        return None
    total = after.hist[name][0] - before.hist[name][0]
    n = after.hist[name][1] - before.hist[name][1]
    return total / n if n > 0 else None

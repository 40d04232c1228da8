"""What the HTTP client learns from the server and asks of it outside the streams: the model to
request and whether the server is vLLM (rules in :mod:`engines.openai.server_info`), whether to
ask for token ids, a tokenizer to count with (plain functions the engine calls at start), and
``/metrics`` (speculative counters, prefix-cache tokens, load gauges, :mod:`engines.openai.prom`)
and the prefix-cache reset (:class:`ServerMetrics`, an object the engine holds)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import aiohttp

from engines.base import EngineConfig, EngineError, SpecCounters
from engines.common.local_model import counting_tokenizer
from engines.openai import prom
from engines.openai.options import split_base_url
from engines.openai.server_info import START_TIMEOUT, get_models, is_vllm, pick_model

log = logging.getLogger("engines.openai")  # the HTTP client's warnings


class ServerMetrics:
    """The replicas' ``/metrics`` and prefix-cache reset, over the engine's HTTP session; keeps
    the last scrape's speculative counters and prefix-cache tokens."""

    def __init__(self, session: aiohttp.ClientSession, base_urls: list[str]) -> None:
        self.session = session
        self.base_urls = base_urls
        self.spec: SpecCounters | None = None  # the last refresh's (None before, or unknown)
        self.prefix: dict[str, int] | None = None  # the last refresh's (queries, hits)

    async def refresh(self) -> SpecCounters | None:
        """Scrape every replica's /metrics, keep the summed spec counters and return them.

        They become None when a replica has no spec counters while another has, or when a
        scrape fails: a partial sum would make a wrong delta.
        """
        scrapes = await self.scrape_all()
        total = prom.combine(scrapes or [])  # and vLLM's prefix-cache tokens, where every has them
        self.prefix = total.prefix if scrapes and all(s.prefix for s in scrapes) else None
        self.spec = (
            None if scrapes is None or len({s.spec is None for s in scrapes}) > 1 else total.spec
        )
        return self.spec

    async def sample_load(self) -> dict[str, Any]:
        """Load gauges summed over replicas: ``num_requests_running``/``_waiting`` (None = unknown)."""
        scrapes = await self.scrape_all()
        total = prom.combine(scrapes or [])
        return {
            "num_requests_running": total.running if scrapes else None,
            "num_requests_waiting": total.waiting if scrapes else None,
        }

    async def reset_prefix_cache(self) -> str:
        """Empty each replica's prefix cache before a measured run: vLLM's
        ``POST /reset_prefix_cache`` (served when the server runs with VLLM_SERVER_DEV_MODE=1).
        A server without it is left alone and the run records that its cache was not reset."""
        timeout = aiohttp.ClientTimeout(total=START_TIMEOUT)
        for url in self.base_urls:
            root = split_base_url(url)[0]
            try:
                async with self.session.post(root + "/reset_prefix_cache", timeout=timeout) as r:
                    body = await r.json(content_type=None) if r.status == 200 else {}
                    if r.status in (404, 405):
                        return "not reset: server has no /reset_prefix_cache"
                    if r.status != 200 or not (body or {}).get("success", True):
                        return f"not reset: /reset_prefix_cache answered {r.status} {body}"
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
                return f"not reset: {type(exc).__name__}"
        return "reset"

    async def scrape_all(self) -> list[prom.Scrape] | None:
        """Every replica's /metrics, None when any scrape fails."""
        timeout = aiohttp.ClientTimeout(total=START_TIMEOUT)
        try:
            return list(
                await asyncio.gather(
                    *(
                        prom.scrape(self.session, split_base_url(u)[0], timeout)
                        for u in self.base_urls
                    )
                )
            )
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return None


async def detect_vllm(metrics: ServerMetrics, server_version: str | None, owned: bool) -> bool:
    """:func:`engines.openai.server_info.is_vllm`; /metrics is read only when the model cards
    do not already say vLLM (``owned``)."""
    from_metrics = False
    if server_version is not None and not owned:
        scrapes = await metrics.scrape_all()
        from_metrics = scrapes is not None and prom.combine(scrapes).vllm
    return is_vllm(server_version, owned, from_metrics)


async def decide_token_ids(vllm_extras: bool | None, metrics: ServerMetrics) -> tuple[bool, str]:
    """--token-ids auto with nothing compared: ask for ids only where a vLLM server's
    /metrics shows spec-decode counters (several tokens per event)."""
    if not vllm_extras:
        return False, "--token-ids auto: not a vLLM server (no ids to ask for)"
    if await metrics.refresh() is None:
        return False, "--token-ids auto: no spec-decode counters on the server's /metrics"
    return True, "--token-ids auto: the server's /metrics shows spec-decode counters"


def load_counting_tokenizer(config: EngineConfig) -> tuple[Any, str | None]:
    """The tokenizer that counts output when a server sends neither usage nor ids, and its
    name: one the user named (``--tokenizer``, or ``--model`` given explicitly: option
    ``count_with_model``), never a guess; else (None, None) and each text event counts one."""
    by_model = config.options.get("count_with_model")
    name = config.tokenizer or (config.model if by_model else None)
    tokenizer = counting_tokenizer(name)
    return tokenizer, name if tokenizer is not None else None


async def choose_model(
    session: aiohttp.ClientSession,
    base_urls: list[str],
    model: str,
    served_model: str | None,
    warn: Callable[[str], None],
) -> tuple[str, str | None, bool]:
    """The model to request, how it was chosen (None when given) and whether a model card says
    vLLM. ``/v1/models`` is a convenience: with ``served_model`` set, a listing that fails, is
    empty or lacks the name is a warning (transformers serve answers 500 when its cache
    directory is missing; hosted APIs hide aliases)."""
    served: list[str] | None = None
    owned = False
    for url in base_urls:
        try:
            listed, vllm = await get_models(session, url)
        except EngineError as e:
            if served_model is None:
                raise EngineError(f"{e}; pass --served-model NAME to skip the listing") from None
            warn(f"{e}; requesting {served_model!r} by name")
            continue
        served = listed if served is None else served
        owned = owned or vllm
    if served_model is None:
        assert served is not None
        chosen, how = pick_model(model, served, base_urls[0])
        if chosen != model:
            log.warning("openai: requesting %r, %s", chosen, how)
        return chosen, how, owned
    if served is not None and served_model not in served:
        listed = ", ".join(served[:5]) or "nothing"
        warn(
            f"openai: {base_urls[0]}/models does not list {served_model!r} "
            f"(lists: {listed}); requesting it anyway"
        )
    return served_model, None, owned

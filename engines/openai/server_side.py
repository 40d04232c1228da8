"""What the HTTP client learns from the server and asks of it outside the streams: the model to
request and whether the server is vLLM (rules in :mod:`engines.openai.server_info`), whether to
ask for token ids, a tokenizer to count with, and ``/metrics`` (speculative counters, prefix-cache
tokens, load gauges, :mod:`engines.openai.prom`) and the prefix-cache reset."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp

from engines.base import EngineConfig, EngineError, SpecCounters
from engines.common.local_model import counting_tokenizer
from engines.openai import prom
from engines.openai.options import split_base_url
from engines.openai.server_info import START_TIMEOUT, get_models, is_vllm, pick_model

log = logging.getLogger("engines.openai")  # the HTTP client's warnings


class ServerSide:
    """The server's side of :class:`engines.openai.engine.OpenAIEngine`, which holds these."""

    config: EngineConfig
    base_urls: list[str]
    served_model: str | None
    server_version: str | None
    vllm_extras: bool | None
    warnings: list[str]
    _session: aiohttp.ClientSession | None
    _owned_by_vllm: bool
    _model_how: str | None
    _spec: SpecCounters | None
    _tokenizer: Any
    _tokenizer_path: str | None

    async def _detect_vllm(self) -> bool:
        """:func:`engines.openai.server_info.is_vllm`; /metrics is read only when the model cards
        do not already say vLLM."""
        metrics = False
        if self.server_version is not None and not self._owned_by_vllm:
            scrapes = await self._scrape_all()
            metrics = scrapes is not None and prom.combine(scrapes).vllm
        return is_vllm(self.server_version, self._owned_by_vllm, metrics)

    async def _decide_token_ids(self) -> tuple[bool, str]:
        """--token-ids auto with nothing compared: ask for ids only where a vLLM server's
        /metrics shows spec-decode counters (several tokens per event)."""
        if not self.vllm_extras:
            return False, "--token-ids auto: not a vLLM server (no ids to ask for)"
        if await self.refresh_metrics() is None:
            return False, "--token-ids auto: no spec-decode counters on the server's /metrics"
        return True, "--token-ids auto: the server's /metrics shows spec-decode counters"

    def _load_counting_tokenizer(self) -> None:
        """The tokenizer that counts output when a server sends neither usage nor ids: one the
        user named (``--tokenizer``, or ``--model`` given explicitly: option
        ``count_with_model``), never a guess; else each text event counts one token."""
        by_model = self.config.options.get("count_with_model")
        name = self.config.tokenizer or (self.config.model if by_model else None)
        self._tokenizer = counting_tokenizer(name)
        self._tokenizer_path = name if self._tokenizer is not None else None

    async def _pick_model(self) -> None:
        """The model to request. ``/v1/models`` is a convenience: with ``served_model`` set, a
        listing that fails, is empty or lacks the name is a warning (transformers serve answers
        500 when its cache directory is missing; hosted APIs hide aliases)."""
        served: list[str] | None = None
        for url in self.base_urls:
            try:
                listed, vllm = await get_models(self._session, url)
            except EngineError as e:
                if self.served_model is None:
                    raise EngineError(
                        f"{e}; pass --served-model NAME to skip the listing"
                    ) from None
                self._warn(f"{e}; requesting {self.served_model!r} by name")
                continue
            served = listed if served is None else served
            self._owned_by_vllm = self._owned_by_vllm or vllm
        if self.served_model is None:
            assert served is not None
            self.served_model, self._model_how = pick_model(
                self.config.model, served, self.base_urls[0]
            )
            if self.served_model != self.config.model:
                log.warning("openai: requesting %r, %s", self.served_model, self._model_how)
        elif served is not None and self.served_model not in served:
            listed = ", ".join(served[:5]) or "nothing"
            self._warn(
                f"openai: {self.base_urls[0]}/models does not list {self.served_model!r} "
                f"(lists: {listed}); requesting it anyway"
            )

    def _warn(self, msg: str) -> None:
        self.warnings.append(msg)
        log.warning("warning: %s", msg)

    # ---- /metrics ---------------------------------------------------------------------------
    def spec_counters(self) -> SpecCounters | None:
        """The snapshot the last :meth:`refresh_metrics` took (None before, or when unknown)."""
        return self._spec

    async def refresh_metrics(self) -> SpecCounters | None:
        """Scrape every replica's /metrics, cache the summed spec counters and return them.

        The cache becomes None when a replica has no spec counters while another has, or when a
        scrape fails: a partial sum would make a wrong delta.
        """
        scrapes = await self._scrape_all()
        total = prom.combine(scrapes or [])  # and vLLM's prefix-cache tokens, where every has them
        self._prefix = total.prefix if scrapes and all(s.prefix for s in scrapes) else None
        self._spec = (
            None if scrapes is None or len({s.spec is None for s in scrapes}) > 1 else total.spec
        )
        return self._spec

    def prefix_cache_counters(self) -> dict[str, int] | None:
        return getattr(self, "_prefix", None)  # the last refresh_metrics' (queries, hits)

    async def sample_load(self) -> dict[str, Any]:
        """Load gauges summed over replicas: ``num_requests_running``/``_waiting`` (None = unknown)."""
        scrapes = await self._scrape_all()
        total = prom.combine(scrapes or [])
        return {
            "num_requests_running": total.running if scrapes else None,
            "num_requests_waiting": total.waiting if scrapes else None,
        }

    async def reset_prefix_cache(self) -> str:
        """Empty each replica's prefix cache before a measured run: vLLM's
        ``POST /reset_prefix_cache`` (served when the server runs with VLLM_SERVER_DEV_MODE=1).
        A server without it is left alone and the run records that its cache was not reset."""
        assert self._session is not None, "reset_prefix_cache() before start()"
        timeout = aiohttp.ClientTimeout(total=START_TIMEOUT)
        for url in self.base_urls:
            root = split_base_url(url)[0]
            try:
                async with self._session.post(root + "/reset_prefix_cache", timeout=timeout) as r:
                    body = await r.json(content_type=None) if r.status == 200 else {}
                    if r.status in (404, 405):
                        return "not reset: server has no /reset_prefix_cache"
                    if r.status != 200 or not (body or {}).get("success", True):
                        return f"not reset: /reset_prefix_cache answered {r.status} {body}"
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
                return f"not reset: {type(exc).__name__}"
        return "reset"

    async def _scrape_all(self) -> list[prom.Scrape] | None:
        assert self._session is not None, "refresh_metrics() before start()"
        timeout = aiohttp.ClientTimeout(total=START_TIMEOUT)
        try:
            return list(
                await asyncio.gather(
                    *(
                        prom.scrape(self._session, split_base_url(u)[0], timeout)
                        for u in self.base_urls
                    )
                )
            )
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return None

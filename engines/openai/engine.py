"""An existing OpenAI-compatible server (vLLM, SGLang, TGI, transformers serve, ...): aiohttp, SSE.

Requests are spread round-robin over ``base_urls``. Which model to request and whether the server is
vLLM: :mod:`engines.openai.server_info`. vLLM servers get ``ignore_eos`` and, with option ``token_ids``
(default), per-chunk token ids (``return_token_ids``: exact counts of multi-token events, outputs to
compare); no more: an extra field is work the server does for the client (``min_tokens`` ran vLLM's
min-tokens logits processor every step; ``ignore_eos`` alone reaches ``max_tokens``). Without ids a
vLLM event counts one token, as in vllm bench. Other servers get plain OpenAI requests (transformers
serve answers 422 to unknown fields). The total is the server's usage, else the token ids, else a
local tokenizer's count of the text (only one the user named: ``--tokenizer``, or ``--model`` given
explicitly), else one token per text event; each record says which, how its stream ended and where
its first-token time came from (:mod:`engines.openai.sse`). Speculative counters and load gauges come from
``/metrics`` (:mod:`engines.openai.prom`). No torch, transformers or vllm import: an HTTP run stays light.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from typing import Any, ClassVar

import aiohttp

from engines.base import (
    SPEC_METHODS,
    Capabilities,
    Chunk,
    Clock,
    Engine,
    EngineConfig,
    GenParams,
    SpecCounters,
    new_tokens,
)
from engines.openai.flags import OpenAIFlags
from engines.openai.options import (
    ENDPOINTS,
    OPTIONS,
    ignore_eos_unsent,
    prompt_fields,
    read_api_key,
    split_base_url,
    validate_options,
)
from engines.openai.server_info import (
    get_version,
    one_line,
)
from engines.openai.server_side import (
    ServerMetrics,
    choose_model,
    decide_token_ids,
    detect_vllm,
    load_counting_tokenizer,
)
from engines.openai.sse import DONE, RequestFailed, StreamEnd, parse_event, sse_events
from workloads.base import Request

READ_BUFSIZE = 1 << 24  # 16 MiB; lines are split by hand anyway, so no line-length limit
log = logging.getLogger("engines.openai")  # the HTTP client's warnings
KEEPALIVE_S = 4.0  # below uvicorn's 5 s, so a pooled connection is never one the server closed


class OpenAIEngine(OpenAIFlags, Engine):
    """Streams from one or more replicas of an OpenAI-compatible server (its flags:
    :class:`engines.openai.flags.OpenAIFlags`)."""

    name: ClassVar[str] = "openai"
    spec_methods: ClassVar[tuple[str, ...]] = SPEC_METHODS  # whatever the server runs
    # only an HTTP session: configurations interleave; /metrics has the load gauges
    capabilities: ClassVar[Capabilities] = Capabilities(
        coexist=True, load_gauges=True, client_workers=True
    )

    def __init__(self, config: EngineConfig) -> None:
        self.validate(config)
        self.config = config
        opts = config.options
        self.base_urls: list[str] = [str(u).rstrip("/") for u in opts["base_urls"]]
        self.endpoint: str | None = opts.get("endpoint")
        self.request_timeout = float(opts.get("request_timeout", 600))
        self.max_concurrency: int | None = opts.get("max_concurrency")
        self.served_model: str | None = opts.get("served_model")
        self.vllm_extras: bool | None = opts.get("vllm_extras")
        # ask a vLLM server for token ids; None: only if it speculates (decided in start())
        self.token_ids: bool | None = opts.get("token_ids", True)
        self._ids_how: str = opts.get("token_ids_why") or "option token_ids"
        self._model_how = "--served-model" if self.served_model is not None else None
        self.extra_body: dict[str, Any] = dict(opts.get("extra_body") or {})
        self.server_version: str | None = None
        self._api_key = read_api_key(opts)
        self._session: aiohttp.ClientSession | None = None
        self._rr = itertools.count()
        self.metrics: ServerMetrics | None = None  # at start(), over the session
        self.warnings: list[str] = []
        self._tokenizer: Any = None
        self._tokenizer_path: str | None = None

    # ---- protocol --------------------------------------------------------------------------
    @classmethod
    def validate(cls, config: EngineConfig) -> None:
        validate_options(config.options)

    async def start(self) -> None:
        n = self.max_concurrency
        connector = aiohttp.TCPConnector(
            limit=0 if n is None else n + 16, limit_per_host=0, keepalive_timeout=KEEPALIVE_S
        )
        self._session = aiohttp.ClientSession(
            connector=connector, read_bufsize=READ_BUFSIZE, headers=self._headers()
        )
        self.metrics = ServerMetrics(self._session, self.base_urls)
        try:
            self.served_model, how, owned = await choose_model(
                self._session, self.base_urls, self.config.model, self.served_model, self._warn
            )
        except BaseException:
            await self.close()
            raise
        self._model_how = how or self._model_how
        self.server_version = await get_version(self._session, self.base_urls[0])
        if self.vllm_extras is None:
            self.vllm_extras = await detect_vllm(self.metrics, self.server_version, owned)
        if eos := ignore_eos_unsent(self.config.options, self.vllm_extras, self.extra_body):
            self._warn(eos)
        if self.token_ids is None:  # a speculating server sends several tokens per event
            self.token_ids, self._ids_how = await decide_token_ids(self.vllm_extras, self.metrics)
        self._tokenizer, self._tokenizer_path = load_counting_tokenizer(self.config)

    def client_config(self) -> EngineConfig:
        """This started engine as an ``openai`` config for a client in another process
        (``--client-workers``): the same servers, model name, request shape and key source."""
        opts = {k: v for k, v in self.config.options.items() if k in OPTIONS}
        opts |= {
            "base_urls": list(self.base_urls),
            "served_model": self.served_model,
            "vllm_extras": self.vllm_extras,
            "token_ids": self.token_ids,  # as decided here: a worker does not decide again
            "token_ids_why": self._ids_how,
            "count_with_model": False,  # the tokenizer chosen here, or none
            "extra_body": dict(self.extra_body),
        }
        return replace(self.config, engine="openai", tokenizer=self._tokenizer_path, options=opts)

    def describe(self) -> Mapping[str, Any]:
        return {
            "base_urls": list(self.base_urls),
            "served_model": self.served_model,
            "served_model_from": self._model_how,
            "endpoint": self.endpoint or "auto (completions for prompts, chat for messages)",
            "server_version": self.server_version,
            "vllm_extras": self.vllm_extras,
            "token_ids_asked": bool(self.vllm_extras and self.token_ids),
            "token_ids_decided": self._ids_how,
            "request_timeout_s": self.request_timeout,
            "max_concurrency": self.max_concurrency,
            "api_key_env": self.config.options.get("api_key_env", "OPENAI_API_KEY"),
            "api_key_set": self._api_key is not None,
            "extra_body": dict(self.extra_body),
            "tokenizer_for_counts": self._tokenizer_path,  # when a server sends no usage
            "warnings": list(self.warnings),
        }

    async def stream(
        self, request: Request, params: GenParams, clock: Clock | None = None
    ) -> AsyncIterator[Chunk]:
        """Each chunk is stamped with ``clock`` when its bytes were read from the socket."""
        if self._session is None:
            raise RuntimeError("openai: stream() before start()")
        url = self.base_urls[next(self._rr) % len(self.base_urls)]
        path, payload = self._payload(request, params)
        chat = path == ENDPOINTS["chat"]
        first = True
        end = StreamEnd()
        ids_known, text = True, []
        steps = bool(self.vllm_extras and not self.token_ids)  # one event per step, no ids
        timeout = aiohttp.ClientTimeout(total=self.request_timeout)
        try:
            async with self._session.post(
                split_base_url(url)[1] + path, json=payload, timeout=timeout
            ) as resp:
                if resp.status >= 400:
                    body = await resp.text(errors="replace")
                    raise RequestFailed("http", one_line(body) or resp.reason or "", resp.status)
                async for data, t in sse_events(resp, clock):
                    if data.strip() == DONE:
                        end.done = True
                        break
                    try:
                        obj = json.loads(data)
                    except ValueError as e:
                        raise RequestFailed("bad sse", f"{e}: {one_line(data, 80)}") from None
                    chunks = parse_event(obj, chat, t, steps)
                    end.see(chunks, obj, chat)
                    for chunk in chunks:
                        if chunk.size:
                            ids_known = ids_known and len(chunk.token_ids) == chunk.size
                            text.append(chunk.text)
                        if first and chunk.size:
                            chunk = replace(chunk, info={"replica": url})
                            first = False
                        yield chunk
        except RequestFailed:
            raise
        except asyncio.TimeoutError:
            raise RequestFailed("timeout", f"after {self.request_timeout:g} s") from None
        except aiohttp.ClientConnectorError as e:
            kind = "connection refused"
            if not isinstance(e.os_error, ConnectionRefusedError):
                kind = "connect error"
            raise RequestFailed(kind, f"{url}: {e}") from None
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as e:
            raise RequestFailed("connection reset", f"{url}: {e!r}") from None
        except aiohttp.ClientOSError as e:
            raise RequestFailed("connection reset", f"{url}: {e}") from None
        except aiohttp.ClientError as e:
            raise RequestFailed("client error", f"{url}: {e!r}") from None
        except UnicodeDecodeError as e:
            raise RequestFailed("bad sse", str(e)) from None
        info: dict[str, Any] = {"stream_end": end.close()}
        counted = None
        if end.usage_output is not None:
            info["output_tokens_from"] = "server usage"
        elif ids_known:
            info["output_tokens_from"] = "token ids"
        elif self._tokenizer is not None:
            counted = len(self._tokenizer.encode("".join(text), add_special_tokens=False).ids)
            info["output_tokens_from"] = "tokenizer (the server sent no usage)"
        else:
            info["output_tokens_from"] = "text events (no usage, no tokenizer)"
        info["first_token_from"], late = end.first_token(not first, url)  # see engines.openai.sse
        if late is not None:  # no event carried text: the only token was a special one
            yield late
        elif first:  # no token-carrying chunk: the replica goes with the last one
            info["replica"] = url
        yield Chunk(num_tokens=0, usage_output_tokens=counted, info=info)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def max_batch(self) -> int | None:
        return None

    # ---- /metrics (engines.openai.server_side.ServerMetrics) ---------------------------------
    def spec_counters(self) -> SpecCounters | None:
        """The snapshot the last :meth:`refresh_metrics` took (None before, or when unknown)."""
        return self.metrics.spec if self.metrics else None

    async def refresh_metrics(self) -> SpecCounters | None:
        """See :meth:`engines.openai.server_side.ServerMetrics.refresh`."""
        assert self.metrics is not None, "refresh_metrics() before start()"
        return await self.metrics.refresh()

    def prefix_cache_counters(self) -> dict[str, int] | None:
        return self.metrics.prefix if self.metrics else None

    async def sample_load(self) -> dict[str, Any]:
        """See :meth:`engines.openai.server_side.ServerMetrics.sample_load`."""
        assert self.metrics is not None, "sample_load() before start()"
        return await self.metrics.sample_load()

    async def reset_prefix_cache(self) -> str:
        """See :meth:`engines.openai.server_side.ServerMetrics.reset_prefix_cache`."""
        assert self.metrics is not None, "reset_prefix_cache() before start()"
        return await self.metrics.reset_prefix_cache()

    # ---- helpers ---------------------------------------------------------------------------
    def _warn(self, msg: str) -> None:
        self.warnings.append(msg)
        log.warning("warning: %s", msg)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}

    def _payload(self, request: Request, params: GenParams) -> tuple[str, dict[str, Any]]:
        endpoint = self.endpoint or ("chat" if request.messages is not None else "completions")
        body: dict[str, Any] = {
            "model": self.served_model,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": new_tokens(request),
            "temperature": params.temperature,
            "top_p": params.top_p,
            "seed": params.seed,
        }
        body.update(prompt_fields(request, endpoint))
        if self.vllm_extras:
            if self.token_ids:
                body["return_token_ids"] = True
            if request.cache_salt:
                body["cache_salt"] = request.cache_salt
            if params.ignore_eos:  # EOS and the generation config's extra EOS ids: not stops
                body["ignore_eos"] = True
        body.update(self.extra_body)
        return ENDPOINTS[endpoint], body

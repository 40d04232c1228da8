"""What answers at an OpenAI-compatible URL: the models it lists, which one to request, and
whether it is vLLM (and so takes vLLM's extra request fields).

Both are guesses from what servers volunteer, so both are strict: a foreign server (Ollama,
SGLang, TGI, llama.cpp, a hosted API) must never be sent another model's name, nor fields it
rejects. Pure rules here (:func:`listed_models`, :func:`pick_model`, :func:`is_vllm`), the HTTP
reads in :func:`get_models` and :func:`get_version`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from engines.base import EngineError
from engines.openai.options import split_base_url

START_TIMEOUT = 30.0
SHOWN = 5  # listed ids named in a message


def one_line(text: str, limit: int = 200) -> str:
    return " ".join(text.split())[:limit]


def listed_models(body: Any) -> tuple[list[str], bool]:
    """A ``/v1/models`` body -> (the listed ids, whether an entry says ``owned_by: vllm``, as
    vLLM's model cards do). Entries that are not objects with an ``id`` are skipped."""
    data = body.get("data") if isinstance(body, dict) else None
    entries = [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []
    ids = [str(m["id"]) for m in entries if "id" in m]
    return ids, any(m.get("owned_by") == "vllm" for m in entries)


def pick_model(configured: str, listed: list[str], url: str) -> tuple[str, str]:
    """The model to request when ``--served-model`` is not given, and why (for the record).

    ``--model`` when listed; else the one model listed (a server that serves one model, e.g.
    ``vllm serve`` given a path); with none or several there is nothing safe to guess (the
    default ``--model`` names a local directory no foreign server lists, and Ollama lists every
    model it has pulled): the engine does not start, and the line says what to pass.
    """
    if configured in listed:
        return configured, "--model (listed by the server)"
    if len(listed) == 1:
        return listed[0], "the only model the server lists"
    if not listed:
        raise EngineError(f"openai: {url}/models lists no model; pass --served-model NAME")
    shown = ", ".join(listed[:SHOWN]) + (
        f", ... ({len(listed)} in all)" if len(listed) > SHOWN else ""
    )
    raise EngineError(
        f"openai: {url}/models lists {len(listed)} models ({shown}), not --model "
        f"{configured!r}; pass --served-model NAME"
    )


def is_vllm(version: str | None, owned_by_vllm: bool, vllm_metrics: bool) -> bool:
    """vLLM only when ``GET /version`` answers AND its model cards say ``owned_by: vllm`` or its
    ``/metrics`` has ``vllm:`` series: other servers answer ``/version`` too (SGLang, proxies)
    and would get HTTP 4xx for ``return_token_ids`` or ``ignore_eos``, or take them silently."""
    return version is not None and (owned_by_vllm or vllm_metrics)


async def get_models(session: aiohttp.ClientSession, url: str) -> tuple[list[str], bool]:
    """GET ``{url}/models`` -> :func:`listed_models`; an EngineError (one line) when it fails."""
    api = split_base_url(url)[1]
    timeout = aiohttp.ClientTimeout(total=START_TIMEOUT)
    try:
        async with session.get(f"{api}/models", timeout=timeout) as resp:
            if resp.status >= 400:
                body = one_line(await resp.text(errors="replace"), 120)
                raise EngineError(f"openai: GET {api}/models answered {resp.status}: {body}")
            return listed_models(await resp.json(content_type=None))
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
        raise EngineError(f"openai: {api}/models does not answer: {one_line(repr(e))}") from None


async def get_version(session: aiohttp.ClientSession, url: str) -> str | None:
    """``GET /version``'s ``version`` (vLLM's, among others), else None."""
    timeout = aiohttp.ClientTimeout(total=START_TIMEOUT)
    try:
        async with session.get(f"{split_base_url(url)[0]}/version", timeout=timeout) as r:
            if r.status != 200:
                return None
            body = await r.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return None
    v = body.get("version") if isinstance(body, dict) else None
    return None if v is None else str(v)

"""The ``openai`` engine's options: what each may hold, their checks, the server URL's two roots,
and the API key (read from a file or the environment, never from a flag)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from engines.base import EngineError
from engines.openai.sse import RequestFailed
from workloads.base import Request

# option -> accepted types (None = may be left unset)
OPTIONS: dict[str, tuple[type, ...]] = {
    "base_urls": (list, tuple),
    "api_key_env": (str,),
    "api_key_file": (str,),
    "served_model": (str,),
    "endpoint": (str, type(None)),
    "request_timeout": (int, float),
    "max_concurrency": (int, type(None)),
    "vllm_extras": (bool, type(None)),
    # ask a vLLM server for each chunk's token ids (return_token_ids); None: decide at start
    "token_ids": (bool, type(None)),
    "token_ids_why": (str,),  # why token_ids is what it is (the record's token_ids_decided)
    # the configured model is the one served (named by the user, or started by the harness):
    # its local tokenizer counts output when the server sends neither usage nor token ids
    "count_with_model": (bool,),
    "extra_body": (dict,),  # merged into every request body (--extra-body)
    "ignore_eos": (bool,),  # the run asks ignore_eos: warned at start where it is not sent
}
ENDPOINTS = {"completions": "/completions", "chat": "/chat/completions"}


def split_base_url(url: str) -> tuple[str, str]:
    """``http://h:p/v1`` or ``http://h:p`` -> (root ``http://h:p``, api ``http://h:p/v1``)."""
    url = url.rstrip("/")
    root = url[: -len("/v1")] if url.endswith("/v1") else url
    return root, root + "/v1"


def _check_url(url: Any) -> None:
    if not isinstance(url, str):
        raise EngineError(f"base_urls: {url!r} is not a string")
    u = urlparse(url)
    if u.scheme not in ("http", "https") or not u.netloc:
        raise EngineError(f"base_urls: {url!r} is not an http(s) URL")


def validate_options(opts: Mapping[str, Any]) -> None:
    """Each option known and of its type, the URLs http(s), the key file present."""
    unknown = sorted(set(opts) - set(OPTIONS))
    if unknown:
        raise EngineError(f"openai: unknown options {unknown}; known: {sorted(OPTIONS)}")
    for key, value in opts.items():
        types = OPTIONS[key]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise EngineError(f"openai: option {key}={value!r} has the wrong type")
    urls = opts.get("base_urls")
    if not urls:
        raise EngineError("openai: options.base_urls is required (a list of server URLs)")
    for url in urls:
        _check_url(url)
    if opts.get("endpoint") not in (None, *ENDPOINTS):
        raise EngineError(f"openai: endpoint must be one of {sorted(ENDPOINTS)} or null")
    if float(opts.get("request_timeout", 600)) <= 0:
        raise EngineError("openai: request_timeout must be > 0")
    key_file = opts.get("api_key_file")
    if key_file is not None and not Path(key_file).is_file():
        raise EngineError(f"openai: api_key_file {key_file} does not exist")


def ignore_eos_unsent(opts: Mapping[str, Any], vllm: bool, extra: Mapping[str, Any]) -> str | None:
    """The warning when the run asks ``--ignore-eos`` and this server will not get it: only a
    vLLM server is sent ``ignore_eos`` (others may answer 422 to an unknown field), so outputs
    may stop at EOS, shorter than on a server that got it; ``--extra-body`` sends it anyway."""
    if not opts.get("ignore_eos") or vllm or "ignore_eos" in extra:
        return None
    return (
        "--ignore-eos not sent (not a vLLM server): outputs may end at EOS, shorter than where "
        "it was sent; --extra-body '{\"ignore_eos\": true}' sends it to a server that takes it"
    )


def read_api_key(opts: Mapping[str, Any]) -> str | None:
    """The API key: from ``api_key_file``, else the environment variable ``api_key_env``."""
    if opts.get("api_key_file"):
        key = Path(opts["api_key_file"]).read_text().strip()
    else:
        key = os.environ.get(opts.get("api_key_env", "OPENAI_API_KEY"), "").strip()
    return key or None


def prompt_fields(request: Request, endpoint: str) -> dict[str, Any]:
    """The body's prompt: ``messages`` for the chat endpoint (a plain prompt as one user
    message), else ``prompt``: the text, or a trace's token ids as they are (a request with ids
    and no text; /v1/completions takes a list of ids)."""
    ids_only = request.prompt is None and request.messages is None and request.prompt_token_ids
    if ids_only:
        if endpoint == "chat":
            raise RequestFailed("unsupported", "token-id prompts need endpoint 'completions'")
        return {"prompt": list(ids_only)}
    if endpoint == "chat":
        msgs = request.messages or ({"role": "user", "content": request.prompt or ""},)
        return {"messages": [dict(m) for m in msgs]}
    if request.messages is not None:
        raise RequestFailed("unsupported", "chat messages need endpoint 'chat'")
    return {"prompt": request.prompt or ""}

"""What the engines that load a model themselves share: whether a model name is a local path or
a hub id, and a request's prompt token ids. One rule each, so that HF and vLLM feed a model the
same prompt and reject the same missing path (and the CLI agrees with both)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from workloads.base import Request


def looks_like_path(name: str) -> bool:
    """A local path rather than a hub id. Hub ids are ``name`` or ``org/name``: a name with two
    slashes (``a/b/c``), a leading ``/``, ``.`` or ``~``, or a backslash is a path, and so is any
    name that exists on disk."""
    if name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name:
        return True
    return os.path.exists(os.path.expanduser(name))


def missing_path(name: str | None) -> bool:
    """``name`` is a path and nothing is there: say so before anything loads."""
    return (
        bool(name)
        and looks_like_path(str(name))
        and not os.path.exists(os.path.expanduser(str(name)))
    )


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def prompt_ids(tokenizer: Any, request: Request) -> tuple[list[int], bool]:
    """The request's prompt token ids, and whether the chat template made them.

    A synthetic workload's exact ids are used as they are; chat messages go through the
    tokenizer's chat template (generation prompt added, no second BOS) when it has one, else
    their contents are joined by newlines; a plain prompt is encoded with special tokens.
    """
    if request.prompt_token_ids is not None:
        return list(request.prompt_token_ids), False
    if request.messages is not None:
        messages = [dict(m) for m in request.messages]
        if has_chat_template(tokenizer):
            text = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
            return list(tokenizer.encode(text, add_special_tokens=False)), True
        joined = "\n".join(str(m.get("content", "")) for m in messages)
        return list(tokenizer.encode(joined)), False
    return list(tokenizer.encode(request.prompt or "")), False


def counting_tokenizer(name: str | None) -> Any:
    """The ``tokenizer.json`` of a local directory, or of a hub id already in the Hugging Face
    cache (never downloaded), through the light ``tokenizers`` library; else None. Used only to
    count output tokens when a server sends neither usage nor token ids."""
    path = _tokenizer_file(name) if name else None
    if path is None:
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    return Tokenizer.from_file(str(path))


def _tokenizer_file(name: str) -> Path | None:
    local = Path(name).expanduser() / "tokenizer.json"
    if local.is_file() or looks_like_path(name):
        return local if local.is_file() else None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        cached = try_to_load_from_cache(name, "tokenizer.json")
    except ValueError:  # not a valid repo id
        return None
    return Path(cached) if isinstance(cached, str) else None

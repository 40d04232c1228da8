"""The request shape every workload reader produces."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Request:
    """One request of a workload: a text prompt or chat messages.

    ``prompt_token_ids``: the exact prompt ids of a synthetic workload (made with the target's
    tokenizer); in-process engines send them as they are, HTTP engines send ``prompt``.
    """

    id: str
    prompt: str | None = None
    messages: tuple[Mapping[str, str], ...] | None = None
    max_new_tokens: int | None = None
    category: str | None = None
    source: str = ""  # "file:line" for error messages
    prompt_token_ids: tuple[int, ...] | None = None
    # prefix-cache namespace (vLLM's ``cache_salt``): copies of one prompt cycled into a run get
    # one per pass, so a copy never reuses the blocks its original cached (workloads.Cycled)
    cache_salt: str | None = None

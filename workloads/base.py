"""The request shape every workload reader produces."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Request:
    """One request of a workload: a text prompt, chat messages, or token ids.

    ``prompt_token_ids``: the exact prompt ids of a synthetic workload or a trace (made with the
    target's tokenizer); in-process engines send them as they are, HTTP engines send ``prompt``,
    or the ids themselves where there is no ``prompt`` (a trace: /v1/completions takes ids).
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
    # a trace's request (workloads.trace): when it is sent (seconds after the first, scaled) and
    # the hash ids of its token blocks (what it shares with other requests)
    send_s: float | None = None
    block_ids: tuple[int, ...] | None = None
    # a conversation (workloads.conversations): the user turns after the first; turn k is sent
    # with the variant's own answers to turns 1..k-1 (harness.run.conversations)
    next_turns: tuple[str, ...] = ()

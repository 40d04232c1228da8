"""What the run-level HTTP flags mean to the engines that talk HTTP: the options of the ``openai``
client (which needs ``--base-url``, and one server per variant when there are several) and of
the servers the harness starts itself, the per-variant server of a labelled ``--base-url``, and
the probe that each URL answers before the run starts.

The harness hands every engine the same neutral mapping (:data:`RunFlags`, built from its flags);
each engine class takes what it declares in ``run_flags`` (:meth:`engines.base.Engine.options_from`);
the mixins below give an engine class these meanings in one line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar

from engines.base import EngineConfig, EngineError
from engines.openai.options import split_base_url

# The neutral run-level settings (``None`` when a flag was not given):
#   base_url: [URL, ...] (normalised to .../v1), variant_urls: {label: [URL, ...]} | None,
#   request_timeout, max_concurrency, endpoint, api_key_env, api_key_file, served_model,
#   server_start_timeout, token_ids (True: the run needs each chunk's token ids, it compares
#   outputs or a speculative variant streams several tokens per event; False: forced off;
#   None: the client asks only if its server speculates), token_ids_why (the reason, recorded),
#   model_named (the user gave --model: a remote server serves it, so its tokenizer may count),
#   ignore_eos (the run asks it: a client warns where its server is not sent it),
#   extra_body ({...} merged into every request body: --extra-body)
RunFlags = Mapping[str, Any]

CLIENT_FLAGS = frozenset(
    {
        "request_timeout", "max_concurrency", "endpoint", "token_ids", "token_ids_why",
        "ignore_eos", "extra_body",
    }
)  # fmt: skip
OPENAI_FLAGS = CLIENT_FLAGS | {
    "base_url", "api_key_env", "api_key_file", "served_model", "model_named"
}  # fmt: skip
SERVER_FLAGS = CLIENT_FLAGS | {"server_start_timeout"}


def client_options(flags: RunFlags) -> dict[str, Any]:
    """What every HTTP client takes: the request timeout, the most in flight, the endpoint,
    whether to ask for token ids, --ignore-eos (to warn where unsent), --extra-body."""
    out = {"request_timeout": flags["request_timeout"], "max_concurrency": flags["max_concurrency"]}
    if flags.get("endpoint") is not None:
        out["endpoint"] = flags["endpoint"]
    if "token_ids" in flags:  # None: the client decides once it sees the server
        out["token_ids"] = flags["token_ids"]
        if flags.get("token_ids_why"):
            out["token_ids_why"] = flags["token_ids_why"]
    if flags.get("ignore_eos"):
        out["ignore_eos"] = True
    if flags.get("extra_body"):
        out["extra_body"] = dict(flags["extra_body"])
    return out


def server_options(flags: RunFlags) -> dict[str, Any]:
    """A server the harness starts: the client's options and how long to wait for /health."""
    return {**client_options(flags), "start_timeout": flags["server_start_timeout"]}


def openai_options(flags: RunFlags, speculative: bool, name: str) -> dict[str, Any]:
    """The ``openai`` client's options; one line (EngineError) when the flags cannot run it."""
    urls, per_variant = flags.get("base_url"), flags.get("variant_urls")
    if not urls:
        raise EngineError(f"--engine {name} needs --base-url (e.g. http://127.0.0.1:8000/v1)")
    if speculative and per_variant is None:
        raise EngineError(
            f"--engine {name} --spec: one server cannot be compared with itself; give one URL "
            "per variant (--base-url baseline=URL ngram=URL) or let an engine that starts its "
            "own server run them"
        )
    out = {**client_options(flags), "api_key_env": flags["api_key_env"]}
    if per_variant:
        out["base_urls"] = [u for us in per_variant.values() for u in us]
        out["variant_urls"] = per_variant
    else:
        out["base_urls"] = list(urls)
    for key in ("api_key_file", "served_model"):
        if flags.get(key) is not None:
            out[key] = flags[key]
    if flags.get("model_named"):  # else the default --model, which no remote server serves
        out["count_with_model"] = True
    return out


def variant_urls(configs: Sequence[tuple[str, EngineConfig]]) -> list[tuple[str, EngineConfig]]:
    """``--base-url baseline=URL ngram=URL``: each variant talks to its own server."""
    out = []
    for label, c in configs:
        opts = dict(c.options)
        urls = opts.pop("variant_urls", None)
        if urls is not None:
            if label not in urls:
                given = " ".join(f"{k}=URL" for k in urls)
                raise EngineError(f"--base-url: no URL for variant {label!r} (given: {given})")
            opts["base_urls"] = urls[label]
        out.append((label, replace(c, options=opts)))
    labels = {label for label, _ in configs}
    for _, c in configs:
        extra = sorted(set(c.options.get("variant_urls") or ()) - labels)
        if extra:
            raise EngineError(f"--base-url: {extra[0]}=URL names no variant of this run")
    return out


PROBE_TIMEOUT_S = 10.0


def probe_urls(config: EngineConfig) -> None:
    """Each base URL must answer before the run starts (a typo costs seconds, not a run). Any
    HTTP answer, of any status, from the server's root or its ``/v1/models`` means it is there
    (transformers serve answers 500 on /v1/models, a hosted API 401 without a key); only no
    answer from either (refused, unknown host, timed out, reset) stops the run."""
    import urllib.error
    import urllib.request

    for url in config.options.get("base_urls", ()):
        root, api = split_base_url(url)
        reason: object = None
        for probe in (root + "/", api + "/models"):
            try:
                with urllib.request.urlopen(probe, timeout=PROBE_TIMEOUT_S):
                    pass
            except urllib.error.HTTPError:
                pass  # it answers (an auth error is the engine's to report with the key)
            except (urllib.error.URLError, OSError, ValueError) as exc:
                reason = reason or getattr(exc, "reason", exc)
                continue
            break
        else:
            raise EngineError(f"--base-url: {url} does not answer ({reason})")


class OpenAIFlags:
    """What the run's flags mean to an ``openai`` client (mixed into its engine class)."""

    name: ClassVar[str]
    run_flags: ClassVar[frozenset[str]] = OPENAI_FLAGS

    @classmethod
    def options_from(cls, flags: RunFlags, speculative: bool) -> dict[str, Any]:
        return openai_options(flags, speculative, cls.name)

    @classmethod
    def for_variants(
        cls, configs: Sequence[tuple[str, EngineConfig]]
    ) -> list[tuple[str, EngineConfig]]:
        return variant_urls(configs)

    @classmethod
    def probe(cls, config: EngineConfig) -> None:
        probe_urls(config)


class ManagedServerFlags:
    """What the run's flags mean to a server the harness starts (mixed into its engine class)."""

    run_flags: ClassVar[frozenset[str]] = SERVER_FLAGS

    @classmethod
    def options_from(cls, flags: RunFlags, speculative: bool) -> dict[str, Any]:
        return server_options(flags)


class VLLMServerFlags(ManagedServerFlags):
    """A ``vllm serve`` the harness starts: also --max-model-len, as its engine argument
    ``max_model_len`` (``RunPlan.args_for``), a ``--max-model-len`` of the server."""

    run_flags: ClassVar[frozenset[str]] = SERVER_FLAGS | {"max_model_len"}

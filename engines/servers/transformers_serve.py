"""``transformers serve`` (Hugging Face's OpenAI-compatible server), started and stopped by the
harness and driven over HTTP like any server: a second real server beside ``vllm serve``.

Process handling is :class:`engines.servers.vllm_serve.VLLMServerEngine`'s (own process group on
127.0.0.1 and a free port, a log file, ``/health``, SIGTERM then SIGKILL); only the command line
and the environment differ. Without continuous batching the server generates one request at a
time on one thread; ``transformers-server-cb`` passes ``--continuous-batching`` (paged attention,
requests batched as they arrive; on CPU its cache is held to ~1 GiB). Its stream ends with a ``finish_reason`` + ``usage`` chunk and
no ``[DONE]``; its ``/v1/models`` scans the Hugging Face cache (500 when there is none), so the
model is always requested by name. No ``/metrics``: no speculative counters, no load gauges.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

from engines.base import Capabilities, EngineConfig, EngineError
from engines.openai.flags import ManagedServerFlags
from engines.servers.vllm_serve import VLLMServerEngine, to_flags

RESERVED = ("host", "port", "force_model", "model")
CB_CPU_CACHE_BYTES = 1 << 30  # else the paged cache takes 90% of RAM (its own size: not vLLM's)


def _cpu_cache_share() -> float:
    """``--cb-max-memory-percent`` giving the paged KV cache ~1 GiB of this machine's RAM (on CPU
    the default share, 0.9 of all RAM, got the server SIGKILLed at its first request here)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return round(min(0.9, CB_CPU_CACHE_BYTES / total), 4)


class TransformersServerEngine(VLLMServerEngine):
    """Starts ``transformers serve MODEL`` and streams from it over HTTP."""

    name: ClassVar[str] = "transformers-server"
    spec_methods: ClassVar[tuple[str, ...]] = ()
    continuous_batching: ClassVar[bool] = False
    run_flags: ClassVar[frozenset[str]] = ManagedServerFlags.run_flags  # no --max-model-len
    # no /metrics: no load gauges (nor speculative counters)
    capabilities: ClassVar[Capabilities] = Capabilities(
        coexist=True, managed=True, client_workers=True, device_memory="own"
    )

    @classmethod
    def validate(cls, config: EngineConfig) -> None:
        if config.spec_config is not None:
            raise EngineError(f"{cls.name}: transformers serve runs no speculative method")
        super().validate(config)

    def _env(self) -> dict[str, str]:
        """The harness's environment (none of vLLM's shims), without the PyPI version query."""
        return {**os.environ, "HF_HUB_DISABLE_UPDATE_CHECK": "1"}

    @classmethod
    def _inner_config(cls, config: EngineConfig, base_url: str) -> EngineConfig:
        inner = super()._inner_config(config, base_url)
        # the server answers whatever name is asked (it serves the forced model), and its
        # /v1/models lists the cache, not that model: request it by the name it was given
        opts = {**inner.options, "served_model": config.model, "vllm_extras": False}
        return EngineConfig(engine="openai", model=config.model, seed=config.seed, options=opts)

    def _defaults(self) -> dict[str, Any]:
        sized = {"cb_max_memory_percent", "cb_num_blocks"} & set(self.config.engine_args)
        if self.cpu and self.continuous_batching and not sized:
            return {"cb_max_memory_percent": _cpu_cache_share()}
        return {}

    def _argv(self, python: str) -> list[str]:
        cfg = self.config
        args: dict[str, Any] = {
            "device": "cpu" if self.cpu else cfg.device,
            "dtype": cfg.dtype,
            "default_seed": cfg.seed,
            "continuous_batching": self.continuous_batching,
            **self.defaults,
        }
        args.update(cfg.engine_args)
        for reserved in RESERVED:
            if reserved in args:
                raise EngineError(f"{self.name}: engine_args.{reserved} is set by the harness")
        self.args = args  # what it is started with (describe()'s resolved_config)
        serve = [python, "-m", "transformers.cli.transformers", "serve", cfg.model]
        return serve + ["--host", "127.0.0.1", "--port", str(self.port), *to_flags(args)]


class TransformersServerCBEngine(TransformersServerEngine):
    """``transformers serve --continuous-batching``."""

    name: ClassVar[str] = "transformers-server-cb"
    continuous_batching: ClassVar[bool] = True

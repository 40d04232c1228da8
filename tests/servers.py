"""Managed servers for the tests (``vllm serve``, ``transformers serve``), started once per
session on the tiny pair and shared by every module that asks: a server takes tens of seconds to
start on CPU, so the engine files and the contract test use the same processes. Each server is
closed at the session's end and checked gone (no process left in its group).

``transformers serve``'s ``/v1/models`` scans the Hugging Face cache; its servers start with that
cache pointed at a directory that does not exist, so the listing answers 500 for real and the
tests see the model requested by name.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engines.base import EngineConfig, create_engine
from engines.servers.vllm_serve import VLLMServerEngine

Pair = tuple[str, str]  # (target, draft) directories


def _vllm(spec: bool) -> Callable[[Pair, Path], EngineConfig]:
    def config(pair: Pair, logs: Path) -> EngineConfig:
        extra = {}
        if spec:
            extra = {
                "draft_model": pair[1],
                "spec_config": {"method": "draft_model", "num_speculative_tokens": 2},
            }
        name = "vllm-spec" if spec else "vllm-base"
        return EngineConfig(
            engine="vllm-server",
            model=pair[0],
            dtype="float32",
            engine_args={"max_num_seqs": 8},
            options={"log_path": str(logs / f"{name}.log")},
            **extra,
        )

    return config


def _transformers(engine: str) -> Callable[[Pair, Path], EngineConfig]:
    def config(pair: Pair, logs: Path) -> EngineConfig:
        opts = {"log_path": str(logs / f"{engine}.log"), "start_timeout": 240}
        return EngineConfig(engine=engine, model=pair[0], dtype="float32", options=opts)

    return config


# name -> (its config, whether it needs the missing Hugging Face cache)
SERVERS: dict[str, tuple[Callable[[Pair, Path], EngineConfig], bool]] = {
    "vllm-base": (_vllm(spec=False), False),
    "vllm-spec": (_vllm(spec=True), False),
    "ts-plain": (_transformers("transformers-server"), True),
    "ts-cb": (_transformers("transformers-server-cb"), True),
}


class ServerPool:
    """Starts the named servers on first use (those asked together start concurrently) and keeps
    them for the session; ``close`` ends one early (a later ``get`` starts it again)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, pair: Pair, logs: Path) -> None:
        self.loop, self.pair, self.logs = loop, pair, logs
        self.live: dict[str, VLLMServerEngine] = {}

    def get(self, *names: str) -> dict[str, VLLMServerEngine]:
        missing = [n for n in names if n not in self.live]
        for no_cache in (False, True):
            group = {
                n: SERVERS[n][0](self.pair, self.logs) for n in missing if SERVERS[n][1] is no_cache
            }
            if group:
                self._start(group, no_cache)
        return {n: self.live[n] for n in names}

    def _start(self, configs: dict[str, EngineConfig], no_cache: bool) -> None:
        engines = {n: create_engine(c) for n, c in configs.items()}
        assert all(isinstance(e, VLLMServerEngine) for e in engines.values())

        async def start_all() -> list[Any]:
            starts = (e.start() for e in engines.values())
            return list(await asyncio.gather(*starts, return_exceptions=True))

        with _hub_cache(self.logs / "no-cache-here" if no_cache else None):
            results = self.loop.run_until_complete(start_all())
        for (name, engine), result in zip(engines.items(), results):
            if isinstance(result, BaseException):
                for other in engines.values():
                    self.loop.run_until_complete(other.close())
                raise result
            self.live[name] = engine

    def close(self, name: str) -> VLLMServerEngine:
        """Close one server now and forget it; return it (for checks on what it left)."""
        engine = self.live.pop(name)
        self.loop.run_until_complete(engine.close())
        return engine

    def close_all(self) -> None:
        for name in list(self.live):
            assert self.close(name).process.pid is None, (
                f"{name}: server process left after close()"
            )


@contextlib.contextmanager
def _hub_cache(path: Path | None) -> Iterator[None]:
    """The Hugging Face cache the servers started inside see (None: unchanged)."""
    if path is None:
        yield
        return
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_CACHE", str(path))
    try:
        yield
    finally:
        mp.undo()

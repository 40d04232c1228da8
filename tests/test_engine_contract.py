"""The contract every registered engine keeps, checked the same way for each.

A new engine is covered by one entry in ``ENTRIES`` (how to start it cheaply, and a config its
``validate`` must refuse); a registered engine without one fails here. The checks:

- the class declares the protocol: every abstract method of ``engines.base.Engine`` defined by
  the engine itself, ``Capabilities`` declared, a capability's method there when it is claimed;
- ``validate`` refuses a bad config with one line (``EngineError``);
- started, it streams a short greedy request whose token-carrying chunks are stamped with the
  clock it was handed (values that clock returned, in order, inside the request), reports its
  token counts, answers the same ids again (greedy), describes itself as JSON, and closes;
- it generates to the request's own ``max_new_tokens`` (the one length an engine reads; the
  harness resolves it before: tests/test_lengths.py): exactly that many with ignore_eos.

Engines that start a model or a server are ``slow``; ``openai`` runs on the repo's fake server.
The managed servers come from the session's shared pool (tests/servers.py), which closes them at
the session's end and checks that no process is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest

from engines.base import (
    REGISTRY,
    SPEC_METHODS,
    Capabilities,
    Chunk,
    Engine,
    EngineConfig,
    EngineError,
    GenParams,
    Request,
    create_engine,
    engine_class,
)
from tests.fake_server import Behaviour, FakeServer

N = 8
GREEDY = GenParams(temperature=0.0, ignore_eos=True)  # no length: the request carries it
SHORT = 3  # a second request's own length, under N
PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return"
ABSTRACT = sorted(Engine.__abstractmethods__)  # validate, start, describe, stream, close


# (target, draft) of the tiny pair -> the started engine, closed on leaving
Starter = Callable[[tuple[str, str]], contextlib.AbstractAsyncContextManager[Engine]]


@dataclass(frozen=True)
class Entry:
    """How the contract starts one engine cheaply, and a config ``validate`` must refuse."""

    start: Starter | None  # None: ``pooled``
    bad: EngineConfig
    refusal: str  # what the one-line error says (a regex)
    slow: bool = True
    # a managed server from the session's pool (tests/servers.py), which closes it at the
    # session's end and checks that no process is left
    pooled: str | None = None


def _in_process(engine: str) -> Starter:
    @contextlib.asynccontextmanager
    async def start(pair: tuple[str, str]) -> AsyncIterator[Engine]:
        e = create_engine(EngineConfig(engine, pair[0], device="cpu"))
        await e.start()
        try:
            yield e
        finally:
            await e.close()

    return start


@contextlib.asynccontextmanager
async def _on_fake_server(pair: tuple[str, str]) -> AsyncIterator[Engine]:
    async with FakeServer(Behaviour(tokens=N, delay=0.001, obey_max_tokens=True)) as url:
        e = create_engine(EngineConfig("openai", "m", options={"base_urls": [url]}))
        await e.start()
        try:
            yield e
        finally:
            await e.close()


@contextlib.asynccontextmanager
async def _started(engine: Engine) -> AsyncIterator[Engine]:
    yield engine  # the pool's: left running for the session's other users


ENTRIES: dict[str, Entry] = {
    "hf": Entry(
        _in_process("hf"), EngineConfig("hf", "./no/such/model"), "hf engine: model path not found"
    ),
    "vllm": Entry(
        _in_process("vllm"), EngineConfig("vllm", "./no/such/model"), "vllm: model path does not"
    ),
    "openai": Entry(
        _on_fake_server, EngineConfig("openai", "m"), "base_urls is required", slow=False
    ),
    "vllm-server": Entry(
        None,
        EngineConfig("vllm-server", "m", options={"port": 1}),
        "unknown options",
        pooled="vllm-base",
    ),
    "transformers-server": Entry(
        None,
        EngineConfig("transformers-server", "m", spec_config={"method": "ngram"}),
        "no speculative method",
        pooled="ts-plain",
    ),
    "transformers-server-cb": Entry(
        None,
        EngineConfig("transformers-server-cb", "m", options={"start_timeout": -1}),
        "start_timeout must be a positive number",
        pooled="ts-cb",
    ),
}


def _params(fast: bool) -> list[Any]:
    """The registry's engine names, engine-starting ones marked slow (``fast``: the static checks)."""
    out = []
    for name in sorted(REGISTRY):
        entry = ENTRIES.get(name)
        slow = not fast and (entry is None or entry.slow)
        out.append(pytest.param(name, marks=[pytest.mark.slow] if slow else [], id=name))
    return out


class HandedClock:
    """A clock that remembers every value it returned (engines may read it from any thread)."""

    def __init__(self) -> None:
        self.values: set[float] = set()
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            t = time.perf_counter()
            self.values.add(t)
            return t


# ---- the registry is covered -------------------------------------------------------------------
def test_every_registered_engine_has_a_contract_entry() -> None:
    assert sorted(ENTRIES) == sorted(REGISTRY), "add the new engine's entry to ENTRIES"


# ---- the class declares the protocol (no engine started) ---------------------------------------
@pytest.mark.parametrize("name", _params(fast=True))
def test_class_declares_the_protocol(name: str) -> None:
    cls = engine_class(name)
    assert Engine in cls.__mro__ and cls.name == name  # subclasses the protocol explicitly
    assert not getattr(cls, "__abstractmethods__", ()), f"{name} lacks {cls.__abstractmethods__}"
    for method in ABSTRACT:  # defined by the engine, not the protocol's placeholder
        assert getattr(cls, method) is not getattr(Engine, method), f"{name}.{method}"
    assert isinstance(cls.capabilities, Capabilities)
    assert set(cls.spec_methods) <= set(SPEC_METHODS)
    claimed = {
        "static_batching": "stream_batch",
        "load_gauges": "sample_load",
        "client_workers": "client_config",
    }
    for flag, method in claimed.items():
        if getattr(cls.capabilities, flag):
            assert getattr(cls, method) is not getattr(Engine, method), f"{name}: {flag}"
    for method in ("start", "close", "refresh_metrics", "sample_load", "reset_prefix_cache"):
        assert inspect.iscoroutinefunction(getattr(cls, method)), f"{name}.{method}"


@pytest.mark.parametrize("name", _params(fast=True))
def test_validate_refuses_a_bad_config_in_one_line(name: str) -> None:
    entry = ENTRIES[name]
    with pytest.raises(EngineError, match=entry.refusal) as info:
        engine_class(name).validate(entry.bad)
    assert "\n" not in str(info.value)


# ---- started: stream, stamps, counts, describe, close -------------------------------------------
@pytest.mark.parametrize("name", _params(fast=False))
def test_engine_keeps_the_contract(
    name: str, loop: asyncio.AbstractEventLoop, tiny_pair: tuple[str, str], request: Any
) -> None:
    entry = ENTRIES[name]
    if entry.pooled is not None:  # every pooled server of the contract starts at once
        pooled = [e.pooled for e in ENTRIES.values() if e.pooled is not None]
        server = request.getfixturevalue("managed_servers").get(*pooled)[entry.pooled]
        started = _started(server)
    else:
        assert entry.start is not None
        started = entry.start(tiny_pair)
    req = Request(id="contract", prompt=PROMPT, max_new_tokens=N)

    async def check() -> Engine:
        async with started as engine:
            assert isinstance(engine, Engine)
            json.dumps(dict(engine.describe()))  # goes into results.json as it is
            clock = HandedClock()
            t0 = clock()
            chunks = [c async for c in engine.stream(req, GREEDY, clock)]
            t1 = clock()
            _check_stamps(chunks, clock, t0, t1)
            first = _check_counts(name, chunks)
            again = [c async for c in engine.stream(req, GREEDY, clock)]
            assert _output(again) == first, "greedy: the same request gives the same output"
            short = [c async for c in engine.stream(replace(req, max_new_tokens=SHORT), GREEDY)]
            assert _generated(short) == SHORT, f"{name}: ignored the request's max_new_tokens"
            assert engine.spec_counters() is None  # a baseline config
            batch = engine.max_batch()
            assert batch is None or batch >= 1
            assert isinstance(await engine.reset_prefix_cache(), str)
            await engine.refresh_metrics()
            cache = engine.prefix_cache_counters()
            assert cache is None or set(cache) >= {"queries", "hits"}
            if engine.capabilities.static_batching:
                two = [Request(id=f"b{i}", prompt=PROMPT, max_new_tokens=N - i) for i in range(2)]
                got: dict[int, list[Chunk]] = {}
                async for i, c in engine.stream_batch(two, GREEDY, clock):
                    got.setdefault(i, []).append(c)
                assert {i: _generated(cs) for i, cs in got.items()} == {0: N, 1: N - 1}
            return engine

    engine = loop.run_until_complete(check())
    if entry.pooled is None:  # closed on leaving its start(): closing again is harmless
        loop.run_until_complete(engine.close())


def _check_stamps(chunks: list[Chunk], clock: HandedClock, t0: float, t1: float) -> None:
    """Every token-carrying chunk stamped with the handed clock, in order, inside the request."""
    stamps: list[float] = []
    for c in chunks:
        if c.size == 0:
            continue
        assert c.t is not None, "a token-carrying chunk left unstamped"
        if c.times:
            assert len(c.times) == len(c.sizes) and sum(c.sizes) == c.size and c.t == c.times[-1]
        stamps += list(c.times or (c.t,))
    assert stamps, "no tokens streamed"
    assert all(t in clock.values for t in stamps), "a stamp the handed clock did not return"
    assert stamps == sorted(stamps) and t0 <= stamps[0] and stamps[-1] <= t1


def _check_counts(name: str, chunks: list[Chunk]) -> tuple[Any, ...]:
    """Output tokens known (ids, or the server's usage) and within the limit; prompt counted."""
    timed = [c for c in chunks if c.size]
    total = sum(c.size for c in timed)
    ids = [t for c in timed for t in c.token_ids]
    usage = [c.usage_output_tokens for c in chunks if c.usage_output_tokens is not None]
    prompt = [c.prompt_tokens for c in chunks if c.prompt_tokens is not None]
    assert 1 <= total <= N
    assert len(ids) == total or usage, f"{name}: no way to count the output tokens"
    if usage:
        assert 1 <= usage[-1] <= N and usage[-1] >= total  # one text event >= one token
        if len(ids) == total:
            assert usage[-1] == total
    assert prompt and prompt[-1] > 0, f"{name}: prompt tokens not reported"
    return _output(chunks)


def _generated(chunks: list[Chunk]) -> int:
    """Output tokens: the server's usage where it reports one, else the chunks' sizes."""
    usage = [c.usage_output_tokens for c in chunks if c.usage_output_tokens is not None]
    return usage[-1] if usage else sum(c.size for c in chunks)


def _output(chunks: list[Chunk]) -> tuple[Any, ...]:
    ids = tuple(t for c in chunks for t in c.token_ids)
    return ids or ("".join(c.text for c in chunks),)

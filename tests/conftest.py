"""Shared fixtures: the shipped models (built or assembled once, never per test), and the
managed servers on them (started once, shared by every module: tests/servers.py).

``tiny_pair`` is the 1M-parameter test pair (seconds per engine); ``smollm2`` the default family
(SmolLM2-135M-Instruct, its draft and EAGLE-3 head), assembled by bin/setup from PyPI's wheel.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.servers import ServerPool

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# as engines/vllm/engine.py sets it for the harness, whichever test imports vLLM first: its log lines
# go to stderr, and stdout stays the harness's own (tests/inprocess.py reads it)
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")


RAY_FILES = frozenset({"tests/test_ray_clients.py", "tests/test_client_workers.py"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (bin/test runs ``-n 2 --dist loadgroup``) a file's tests stay on one
    worker, so its module fixtures (engines, servers) start once; the tests that share the
    session's managed servers, or start a Ray cluster, share one worker too. Without xdist the
    marker is inert."""
    for item in items:
        path = item.nodeid.split("::")[0]
        if "managed_servers" in item.fixturenames:
            group = "servers"
        else:
            group = "ray" if path in RAY_FILES else path
        item.add_marker(pytest.mark.xdist_group(group))


# the fixtures that give a test real models: only its sessions build engines that free a heap
REAL_MODELS = frozenset({"tiny_pair", "smollm2", "managed_servers"})


@pytest.fixture(autouse=True)
def untrimmed_heap(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test without a real model runs its sessions on fake engines: the heap trim after each
    block (engines/common/heap.py) has nothing to return, and its ``gc.collect()`` walks the
    whole suite's heap once vLLM and torch are imported (docs/measurements.md, "Test suite
    time"), so there it returns 0.0 at once. Tests of the trim itself patch it again
    (tests/test_instances.py) or call engines.common.heap directly (tests/test_heap.py)."""
    if REAL_MODELS.isdisjoint(request.fixturenames):
        from harness.run import blocks

        monkeypatch.setattr(blocks, "trim_heap", lambda: 0.0)


@pytest.fixture(scope="session")
def tiny_pair() -> tuple[str, str]:
    """(target, draft) directories of the tiny test pair."""
    from harness.models.registry import ensure_tiny

    target, draft = ensure_tiny(progress=False)
    return str(target), str(draft)


@pytest.fixture(scope="session")
def smollm2() -> dict[str, str]:
    """{"target", "draft", "eagle3"} directories of the SmolLM2 family (assembled if missing)."""
    from harness.models import registry as models

    models.ensure_family("smollm2", progress=False)
    return {k: str(models.model_path("smollm2", k)) for k in models.smollm2_kinds()}


@pytest.fixture(scope="session")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """One event loop for the session: the shared servers' HTTP sessions live on it."""
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


@pytest.fixture(scope="session")
def managed_servers(
    loop: asyncio.AbstractEventLoop,
    tmp_path_factory: pytest.TempPathFactory,
    tiny_pair: tuple[str, str],
) -> Iterator[ServerPool]:
    """``managed_servers.get("vllm-base", ...)``: servers on the tiny pair (tests/servers.py),
    closed and checked gone at the session's end."""
    from tests.servers import ServerPool

    pool = ServerPool(loop, tiny_pair, tmp_path_factory.mktemp("servers"))
    yield pool
    pool.close_all()

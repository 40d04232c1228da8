"""``--client-workers N --ray-address ADDR``: the client workers of ``--client-workers`` placed as
Ray actors across a cluster's nodes, for loads one host cannot send.

What stays the same (harness.run.client_workers): the parent's runner owns the schedule; each run
deals the one seeded schedule to the workers; each worker runs the same loop
(:class:`harness.run.client_process.WorkerLoop`, unchanged: inside the actor it talks over a
local pipe) with its own ``openai`` engine; records come back in batches, are journalled as they
arrive and merged in send order, as if one client had sent them.

What Ray changes:
- Placement: N actors in total, ``SPREAD`` over the cluster's nodes (Ray's spread strategy: as
  many nodes as it can); each actor reports its node, recorded per worker.
- Clocks: a monotonic clock is per host. Each actor stamps with its host's clock; the parent
  estimates each worker's offset (its clock minus the runner's) as NTP does: several round trips
  ``a -> w -> b``, offset ``w - (a + b) / 2`` from the tightest, uncertainty ``(b - a) / 2``.
  Estimated at start and again at close (the drift between the two is recorded); ``t0`` goes to a
  worker on its clock (``t0 + offset``) and its records come back on the runner's (``- offset``).
- Failure: an actor (or its node) that dies mid-run loses only its share's unfinished requests,
  recorded as failed with the reason; the run ends with every record it has.

``ray`` is an optional extra (``pip install 'spec-harness[distributed]'``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from engines.base import EngineError
from harness.run.client_process import SHARED_CLOCKS, Close, Exited, Failed, Ready, WorkerLoop
from harness.run.client_workers import START_TIMEOUT_S, ClientPool, WorkerHandle

INSTALL = "pip install 'spec-harness[distributed]' (or: pip install ray)"
SYNC_ROUNDS = 8  # round trips per offset estimate; the tightest is kept
RECV_S = 0.05  # an actor's long poll for its worker's messages
OFFSET_ENV = "HARNESS_TEST_CLOCK_OFFSET_S"  # a test hook: "INDEX:SECONDS" plants an offset


def require_ray() -> Any:
    """The ``ray`` module, or a one-line usage error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise EngineError(f"--ray-address needs Ray: {INSTALL}") from None
    return ray


class RayClient:
    """The actor: one :class:`WorkerLoop` on this node, reached through a local duplex pipe.

    ``offset_s`` shifts this actor's clock (a test hook: one host cannot have two monotonic
    clocks, so a test plants the difference)."""

    def __init__(self, config: Any, clock_name: str, offset_s: float = 0.0) -> None:
        from multiprocessing import Pipe

        base = SHARED_CLOCKS[clock_name]
        self.clock: Callable[[], float] = base if not offset_s else (lambda: base() + offset_s)
        self.mine, theirs = Pipe()
        self.loop = WorkerLoop(theirs, config, self.clock)
        self.outbox: asyncio.Queue[Any] | None = None
        self.sender = ThreadPoolExecutor(1)  # one thread: messages keep their order
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> dict[str, Any]:
        import ray

        aio = asyncio.get_running_loop()
        self.outbox = asyncio.Queue()
        outbox = self.outbox

        def readable() -> None:
            try:
                while self.mine.poll():
                    outbox.put_nowait(self.mine.recv())
            except (EOFError, OSError):
                aio.remove_reader(self.mine.fileno())
                outbox.put_nowait(Exited())

        aio.add_reader(self.mine.fileno(), readable)
        self.task = asyncio.ensure_future(self.loop.serve())
        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "host": os.uname().nodename, "pid": os.getpid()}

    async def now(self) -> float:
        return self.clock()

    async def send(self, msg: Any) -> None:
        await asyncio.get_running_loop().run_in_executor(self.sender, self.mine.send, msg)

    async def recv(self, timeout: float) -> list[Any]:
        """Every message the worker has sent, waiting up to ``timeout`` for the first."""
        assert self.outbox is not None
        out = []
        with contextlib.suppress(asyncio.TimeoutError):
            out.append(await asyncio.wait_for(self.outbox.get(), timeout))
        while not self.outbox.empty():
            out.append(self.outbox.get_nowait())
        return out


@dataclass
class RayHandle(WorkerHandle):
    """A worker that is a Ray actor: sends are actor calls, a poller feeds the pool's inbox."""

    actor: Any = None
    node: dict[str, Any] = field(default_factory=dict)
    sync: list[dict[str, float]] = field(default_factory=list)  # start, end estimates
    died: str | None = None
    poller: asyncio.Task[None] | None = None

    def send(self, msg: Any) -> None:
        self.actor.send.remote(msg)

    def exit_reason(self) -> str:
        return self.died or "the actor died"


async def estimate_offset(
    actor: Any, clock: Callable[[], float], rounds: int = SYNC_ROUNDS
) -> dict[str, float]:
    """The actor's clock minus ``clock``, from the tightest of ``rounds`` round trips."""
    best: dict[str, float] | None = None
    for _ in range(rounds):
        a = clock()
        w = await actor.now.remote()
        b = clock()
        if best is None or b - a < 2 * best["uncertainty_s"]:
            best = {"offset_s": w - (a + b) / 2, "uncertainty_s": (b - a) / 2, "at": a}
    assert best is not None
    return best


def _planted(index: int) -> float:
    spec = os.environ.get(OFFSET_ENV, "")
    k, _, s = spec.partition(":")
    return float(s) if spec and int(k) == index else 0.0


class RayClientPool(ClientPool):
    """N Ray actors as client workers of one started HTTP engine (one lane of a run)."""

    @classmethod
    async def start_on_ray(
        cls,
        engine: Any,
        workers: int,
        clock: Callable[[], float],
        address: str,
        resources: dict[str, float] | None = None,
    ) -> RayClientPool:
        """``resources``: a custom resource every actor needs (bench: all on one node)."""
        ray = require_ray()
        name = next((k for k, c in SHARED_CLOCKS.items() if c is clock), None)
        if name is None:
            raise EngineError(f"--ray-address: the runner's clock {clock!r} is not a host clock")
        if not ray.is_initialized():
            try:
                ray.init(address=address, logging_level="ERROR", log_to_driver=False)
            except Exception as exc:  # ConnectionError, ValueError, ray's own
                raise EngineError(f"--ray-address {address}: {exc}".splitlines()[0]) from None
        actor_cls = ray.remote(num_cpus=0.01, max_concurrency=8)(RayClient)
        config = engine.client_config()
        handles: list[WorkerHandle] = []
        for i in range(workers):
            where = {"resources": resources} if resources else {"scheduling_strategy": "SPREAD"}
            actor = actor_cls.options(**where).remote(config, name, _planted(i))
            handles.append(RayHandle(i, None, None, actor=actor))  # type: ignore[arg-type]
        pool = cls(clock, handles)
        pool.survive_deaths = True
        try:
            await pool.connect()
        except BaseException:
            await pool.close()
            raise
        return pool

    async def connect(self) -> None:
        """Start every actor, wait for its engine, estimate its clock offset."""
        for h in self._ray_handles():
            h.node = await asyncio.wait_for(h.actor.start.remote(), START_TIMEOUT_S)
            h.pid = int(h.node["pid"])
            h.poller = asyncio.ensure_future(self._poll(h))
        for _ in self.handles:
            i, msg = await asyncio.wait_for(self.inbox.get(), START_TIMEOUT_S)
            if not isinstance(msg, Ready):
                why = msg.error if isinstance(msg, Failed) else self.handles[i].exit_reason()
                raise EngineError(f"client worker {i}: {why}")
        for h in self._ray_handles():
            h.sync.append(await estimate_offset(h.actor, self.clock))
            h.offset_s = h.sync[0]["offset_s"]

    async def _poll(self, h: RayHandle) -> None:
        """Feed the worker's messages into the pool's inbox; a dead actor is one ``Exited``."""
        while True:
            try:
                msgs = await h.actor.recv.remote(RECV_S)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # RayActorError, the node gone
                h.died = f"Ray actor died: {str(exc).splitlines()[0][:200]}"
                self.inbox.put_nowait((h.index, Exited()))
                return
            for msg in msgs:
                self.inbox.put_nowait((h.index, msg))

    def _ray_handles(self) -> list[RayHandle]:
        return [h for h in self.handles if isinstance(h, RayHandle)]

    def describe(self) -> dict[str, Any]:
        """What the run records (``engine_info.client_workers``): placement and clocks per
        worker, the deaths, the worst clock uncertainty."""
        per = []
        for h in self._ray_handles():
            start = h.sync[0] if h.sync else {}
            end = h.sync[1] if len(h.sync) > 1 else None
            per.append(
                {
                    "worker": h.index,
                    "node_id": h.node.get("node_id"),
                    "host": h.node.get("host"),
                    "offset_s": start.get("offset_s"),
                    "uncertainty_s": start.get("uncertainty_s"),
                    "drift_s": None if end is None else end["offset_s"] - start["offset_s"],
                    "died": h.died,
                }
            )
        known = [p["uncertainty_s"] for p in per if p["uncertainty_s"] is not None]
        return {
            "workers": len(self.handles),
            "placement": "ray SPREAD, N in total",
            "nodes": len({p["node_id"] for p in per}),
            "clock": "each host's time.perf_counter (CLOCK_MONOTONIC); offsets estimated by "
            "round trips (tightest of several), stamps converted to the runner's clock",
            "max_uncertainty_s": max(known) if known else None,
            "per_worker": per,
            "deaths": list(self.deaths),
        }

    async def close(self) -> None:
        """A last offset estimate (the drift), then each actor's engine closed and the actor
        ended."""
        import ray

        for h in self._ray_handles():
            if h.died is None and h.sync:
                with contextlib.suppress(Exception):
                    h.sync.append(await asyncio.wait_for(estimate_offset(h.actor, self.clock), 10))
        self._send_all(Close())
        await asyncio.sleep(0.2)
        for h in self._ray_handles():
            if h.poller is not None:
                h.poller.cancel()
            with contextlib.suppress(Exception):
                ray.kill(h.actor)

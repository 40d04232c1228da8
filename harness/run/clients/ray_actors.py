"""``--client-workers N --ray-address ADDR``: the client workers of ``--client-workers`` placed as
Ray actors across a cluster's nodes, for loads one host cannot send.

What stays the same (harness.run.clients.workers): the parent's runner owns the schedule; each run
deals the one seeded schedule to the workers; each worker runs the same loop
(:class:`harness.run.clients.process.WorkerLoop`, unchanged: inside the actor it talks over a
local pipe) with its own ``openai`` engine; records come back in batches, are journalled as they
arrive and merged in send order, as if one client had sent them.

What Ray changes:
- Placement: N actors in total, ``SPREAD`` over the cluster's nodes (Ray's spread strategy: as
  many nodes as it can); each actor reports its node, recorded per worker.
- Clocks: a monotonic clock is per host. Each actor stamps with its host's clock; the parent
  estimates each worker's offset (its clock minus the runner's) as NTP does: several round trips
  ``a -> w -> b``, offset ``w - (a + b) / 2`` from the tightest, uncertainty ``(b - a) / 2``.
  Estimated at start and again at close (the drift between the two is recorded); ``t0`` goes to a
  worker on its clock (``t0 + offset``) and its records come back on the runner's (``- offset``),
  each open-loop record's scheduled arrival with them (``t0 + its offset`` exactly, so its client
  queue is one host's difference).
- Failure: an actor (or its node) that dies mid-run loses only its share's unfinished requests,
  recorded as failed with the reason; the run ends with every record it has.

``ray`` is an optional extra (``pip install 'spec-harness[distributed]'``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engines.base import EngineError
from harness.run.clients.process import SHARED_CLOCKS, Close, Exited, Failed, Ready, WorkerLoop
from harness.run.clients.workers import START_TIMEOUT_S, ClientPool, WorkerHandle

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


class _Outbox:
    """The worker loop's ``conn`` inside an actor: ``send`` queues for the parent's poll (no
    pipe, so no send can block the loop that would drain it)."""

    def __init__(self, queue: asyncio.Queue[Any]) -> None:
        self.queue = queue

    def send(self, msg: Any) -> None:
        self.queue.put_nowait(msg)


class RayClient:
    """The actor: one :class:`WorkerLoop` on this node, fed and drained through two queues on
    the actor's event loop (Ray runs an async actor's methods there).

    ``offset_s`` shifts this actor's clock (a test hook: one host cannot have two monotonic
    clocks, so a test plants the difference)."""

    def __init__(self, config: Any, clock_name: str, offset_s: float = 0.0) -> None:
        base = SHARED_CLOCKS[clock_name]
        self.clock: Callable[[], float] = base if not offset_s else (lambda: base() + offset_s)
        self.config = config
        self.inbox: asyncio.Queue[Any] | None = None
        self.outbox: asyncio.Queue[Any] | None = None
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> dict[str, Any]:
        import ray

        self.inbox, self.outbox = asyncio.Queue(), asyncio.Queue()
        loop = WorkerLoop(_Outbox(self.outbox), self.config, self.clock, inbox=self.inbox)  # type: ignore[arg-type]
        self.task = asyncio.ensure_future(loop.serve())
        self.task.add_done_callback(self._ended)
        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "host": os.uname().nodename, "pid": os.getpid()}

    def _ended(self, task: asyncio.Task[None]) -> None:
        """The worker loop returned or crashed: the parent hears it (else it would wait)."""
        assert self.outbox is not None
        exc = None if task.cancelled() else task.exception()
        self.outbox.put_nowait(Exited() if exc is None else Failed(f"worker loop: {exc!r}"[:300]))

    async def now(self) -> float:
        return self.clock()

    async def send(self, msg: Any) -> None:
        assert self.inbox is not None
        self.inbox.put_nowait(msg)

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
        await self.resync()

    async def resync(self, end: bool = False) -> None:
        """Estimate every live worker's clock offset: before a run (the offset that run's
        stamps are converted with) or after it (``end``: the drift over the run)."""
        for h in self._ray_handles():
            if h.gone:
                continue
            try:
                est = await asyncio.wait_for(estimate_offset(h.actor, self.clock), 30)
            except Exception:  # noqa: BLE001 - a dead actor: its poller says so
                continue
            if end:
                h.sync = [*h.sync[:1], est]
            else:
                h.sync = [est]
                h.offset_s = est["offset_s"]

    async def run(self, runner: Any, *args: Any, **kwargs: Any) -> Any:
        """A run as the pool runs it, between two offset estimates (start: used; end: drift)."""
        await self.resync()
        try:
            return await super().run(runner, *args, **kwargs)
        finally:
            await self.resync(end=True)

    async def _poll(self, h: RayHandle) -> None:
        """Feed the worker's messages into the pool's inbox; a dead actor is one ``Exited``."""
        while True:
            try:
                msgs = await h.actor.recv.remote(RECV_S)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # RayActorError, the node gone
                h.died = f"Ray actor died: {str(exc).splitlines()[0][:200]}"
                h.gone = True  # no share of a later run goes to it
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
        """Each actor's engine closed, then the actor ended (``ray.kill``: nothing left)."""
        import ray

        self.send_all(Close())
        await asyncio.sleep(0.2)
        for h in self._ray_handles():
            if h.poller is not None:
                h.poller.cancel()
            with contextlib.suppress(Exception):
                ray.kill(h.actor)


async def start_pool(engine: Any, plan: Any, clock: Callable[[], float]) -> ClientPool:
    """The run's client workers for one started HTTP engine: processes on this host
    (``--client-workers N``), or Ray actors on the cluster at ``plan.ray_address``."""
    if plan.ray_address:
        return await RayClientPool.start_on_ray(
            engine, plan.client_workers, clock, plan.ray_address
        )
    return await ClientPool.start(engine, plan.client_workers, clock)

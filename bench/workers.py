"""Benchmark 6: client capacity vs ``--client-workers`` (1, 2, 4) against a zero-delay stub.

The stub (``bench/stub_server.py``, its own process, no send log) answers every request at once
with a short stream, so the client side is what limits the request rate, as far as the cores
allow. Sides, rotated round by round: the harness's own process (the default: Runner +
OpenAIEngine in the event loop), then :class:`harness.run.clients.workers.ClientPool` with 1, 2 and 4
worker processes (the same Runner in each worker, records sent back to the parent). Each side
runs one closed-loop point (``Concurrent(C)``, C split across the workers); figures per round:
req/s over the wall time, the client's CPU per request (the parent's ``time.process_time`` plus
every worker's), the stub's CPU per request and the cores busy (client + stub CPU over wall
time), from ``/proc/PID/stat`` for the stub.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.capacity import StubServer
from bench.common import PY, ROOT, Headline, Result, now, prompts, requests, table

TOKENS, CONC = 4, 64
WORKERS = (1, 2, 4)
TICK = os.sysconf("SC_CLK_TCK")


class QuietStub(StubServer):
    """The stub without its per-request send log (it would cost the stub CPU per request)."""

    def __init__(self, work: Path) -> None:
        from engines.servers.process import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [PY, "-m", "bench.stub_server", "--port", str(self.port)]
        self.cmd = " ".join(["python", *argv[1:]])
        self.proc = subprocess.Popen(argv, cwd=ROOT, stderr=open(work / "stub.err", "w"))  # noqa: SIM115


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc, 1/CLK_TCK steps)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


async def _side(engine: Any, pool: Any, n: int, tag: str, stub_pid: int) -> dict[str, float]:
    from engines.base import GenParams
    from harness.core.load import Concurrent
    from harness.run.runner import Runner

    reqs = requests(prompts(n, tag=tag), TOKENS)
    params = GenParams(ignore_eos=True)
    s0, p0, t0 = proc_cpu(stub_pid), time.process_time(), now()
    recs = await Runner(engine, clients=pool).run(reqs, params, Concurrent(CONC))
    wall, parent, stub = now() - t0, time.process_time() - p0, proc_cpu(stub_pid) - s0
    bad = [r.error for r in recs if not r.ok or r.output_tokens != TOKENS]
    assert len(recs) == n and not bad, bad[:3]
    workers = sum(pool.last_cpu_s) if pool is not None else 0.0
    client = parent + workers
    return {
        "req_s": n / wall,
        "client_us": client / n * 1e6,
        "parent_us": parent / n * 1e6,
        "stub_us": stub / n * 1e6,
        "cores": (client + stub) / wall,
    }


RAY_SIDES = ("ray: 2 actors, 1 node", "ray: 2 actors, 2 nodes")


def _has_ray() -> bool:
    import importlib.util

    return importlib.util.find_spec("ray") is not None


async def run(quick: bool) -> Result:
    from engines.base import EngineConfig
    from engines.openai.engine import OpenAIEngine
    from harness.run.clients.workers import ClientPool

    res = Result("workers", "6. Client capacity vs --client-workers (zero-delay stub)")
    n, rounds = (256, 1) if quick else (2000, 5)
    sides = ["in process", *(f"{w} worker{'s' * (w > 1)}" for w in WORKERS)]
    from bench.ray_cluster import private_network

    # Ray actors (--ray-address) on a local 2-node cluster: when installed, and only inside a
    # loopback-only network namespace (Ray binds to the host's address too): run it as
    # unshare -n sh -c 'ip link set lo up && python -m bench workers'
    ray = _has_ray() and private_network()
    if ray:
        sides += RAY_SIDES
    figures: dict[str, list[dict[str, float]]] = {s: [] for s in sides}
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as work, contextlib.ExitStack() as st:
        stub = QuietStub(Path(work))
        pools: dict[str, Any] = {}
        engine = None
        try:
            await stub.wait()
            res.commands.append(stub.cmd)
            opts = {"base_urls": [stub.url + "/v1"], "max_concurrency": CONC}
            engine = OpenAIEngine(EngineConfig(engine="openai", model="stub", options=opts))
            await engine.start()
            pools["in process"] = None
            for w, side in zip(WORKERS, sides[1:]):
                pools[side] = await ClientPool.start(engine, w, time.perf_counter)
            if ray:
                from bench.ray_cluster import local_cluster
                from harness.run.clients.ray_actors import RayClientPool

                address = st.enter_context(local_cluster(2, str(Path(work) / "ray")))
                res.commands.append("bench/ray_cluster.py: 2 x ray start on 127.0.0.1")
                one, two = RAY_SIDES
                clock = time.perf_counter
                pools[one] = await RayClientPool.start_on_ray(
                    engine, 2, clock, address, resources={"node_0": 0.01}
                )
                pools[two] = await RayClientPool.start_on_ray(engine, 2, clock, address)
            for k in range(rounds + 1):  # round 0 warms every side (connections), untimed
                order = sides[k % len(sides) :] + sides[: k % len(sides)]
                for side in order:
                    f = await _side(engine, pools[side], n, f"w{k}-{side}", stub.proc.pid)
                    if k:
                        figures[side].append(f)
        finally:
            for pool in pools.values():
                if pool is not None:
                    await pool.close()
            if engine is not None:
                await engine.close()
            stub.close()

    def m(side: str, key: str) -> float:
        return statistics.median(f[key] for f in figures[side])

    def span(side: str, key: str) -> str:
        xs = [f[key] for f in figures[side]]
        return f"{statistics.median(xs):,.0f} [{min(xs):,.0f}, {max(xs):,.0f}]"

    rows = [
        [
            side,
            span(side, "req_s"),
            f"{m(side, 'client_us'):,.0f}",
            f"{m(side, 'parent_us'):,.0f}",
            f"{m(side, 'stub_us'):,.0f}",
            f"{m(side, 'cores'):.2f}",
            f"{1e6 / m(side, 'client_us'):,.0f}",
        ]
        for side in sides
    ]
    res.body.append(
        f"Closed loop at concurrency {CONC} (split across the workers), {n} requests of "
        f"{TOKENS} output tokens per side per round, {rounds} rounds, sides rotated each round "
        "after one untimed warm-up round; medians [min, max] over rounds. `python -m bench "
        f"workers` on {os.cpu_count()} cores shared with the stub server:\n\n"
        + table(
            [
                "client",
                "req/s",
                "client CPU us/request (all processes)",
                "of which the parent's",
                "stub CPU us/request",
                "cores busy (client + stub)",
                "req/s per client core (1e6 / CPU us)",
            ],
            rows,
        )
    )
    base = m("in process", "req_s")
    for side in sides[1:]:
        res.headlines.append(
            Headline(
                f"req/s {side} / in process (zero-delay stub, {TOKENS} tokens)",
                m(side, "req_s") / base,
                "(report)",
                None,
                f"{m(side, 'req_s'):,.0f} vs {base:,.0f} req/s; client CPU "
                f"{m(side, 'client_us'):,.0f} vs {m('in process', 'client_us'):,.0f} us/request",
            )
        )
    res.commands.append(
        "unshare -n sh -c 'ip link set lo up && python -m bench workers'"
        if ray
        else "python -m bench workers (Ray sides: under unshare -n, see bench/ray_cluster.py)"
    )
    return res

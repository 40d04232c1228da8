"""``--client-workers N --ray-address ADDR``: client workers as Ray actors on a real local Ray
cluster of two nodes (two ``ray start`` on 127.0.0.1, each its own raylet and resources), against
the scripted fake server with known delays (harness.run.ray_clients).

Ray binds some services to the host's own address, so the cases run in a fresh network
namespace with only loopback (``unshare -n``): outside one, this module's one test runs its
cases there in a child pytest and reports its summary; inside, the cases run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.ray_cluster import private_network, private_network_argv
from tests.fake_server import Behaviour, FakeServer
from tests.test_client_workers import FIRST_S, ITL_S, TOKENS
from tests.test_faults import ServerThread, run_harness

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray")
INSIDE = private_network()
inside_only = pytest.mark.skipif(not INSIDE, reason="runs in a loopback-only namespace (below)")


@pytest.mark.skipif(INSIDE, reason="already in a loopback-only network namespace")
def test_ray_cases_in_a_loopback_only_network_namespace() -> None:
    """Every case of this module, run by a child pytest inside ``unshare -n`` (lo only)."""
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__]
    proc = subprocess.run(
        private_network_argv(argv), capture_output=True, text=True, timeout=900,
        cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, tail
    summary = proc.stdout.strip().splitlines()[-1]
    assert "3 passed, 1 skipped" in summary, tail  # every case ran there (this one skipped)


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A head node and a second node on 127.0.0.1, one CPU each; stopped at the end."""
    from bench.ray_cluster import local_cluster

    with local_cluster(2, str(tmp_path_factory.mktemp("ray"))) as address:
        yield address


def _run(tmp_path: Path, url: str, n: int, *extra: str) -> dict:
    tmp_path.mkdir()
    code, out = run_harness(tmp_path, url, n, "--concurrency", "4", *extra)
    assert code == 0
    return json.loads((out / "results.json").read_text())


def _server() -> FakeServer:
    return FakeServer(Behaviour(tokens=TOKENS, first_delay=FIRST_S, delay=ITL_S))


@inside_only
def test_two_ray_nodes_match_one_local_worker(tmp_path, ray_cluster, monkeypatch) -> None:
    """The same request ids and TTFT/TPOT statistics (within tolerance) from 2 Ray actors on 2
    nodes as from one local client; both nodes used; a planted clock offset of 0.25 s on worker 1
    recovered within 1 ms and corrected in its records."""
    n = 24
    planted = 0.25
    monkeypatch.setenv("HARNESS_TEST_CLOCK_OFFSET_S", f"1:{planted}")
    with ServerThread(_server()) as url:
        one = _run(tmp_path / "local", url, n)
        two = _run(tmp_path / "ray", url, n, "--client-workers", "2", "--ray-address", ray_cluster)
    assert two["config"]["ray_address"] == ray_cluster
    (r1,), (r2,) = one["runs"], two["runs"]
    assert sorted(r["id"] for r in r1["records"]) == sorted(r["id"] for r in r2["records"])
    assert r2["summary"]["completed"] == n and r2["summary"]["failed"] == 0
    info = r2["engine_info"]["client_workers"]
    assert info["workers"] == 2 and info["nodes"] == 2, info
    per = {w["worker"]: w for w in info["per_worker"]}
    assert abs(per[1]["offset_s"] - per[0]["offset_s"] - planted) < 1e-3, per
    assert per[1]["uncertainty_s"] < 1e-3 or abs(per[1]["offset_s"] - planted) < 1e-3
    senders = {r["info"]["client_worker"] for r in r2["records"]}
    assert senders == {0, 1}
    for key, truth in (("ttft_s", FIRST_S), ("tpot_s", ITL_S)):
        a, b = r1["summary"][key]["median"], r2["summary"][key]["median"]
        assert truth <= a < truth + 0.2 and truth <= b < truth + 0.2, (key, a, b)
    # corrected: worker 1's stamps are on the runner's time line, not 0.25 s ahead of it
    sends = {r["info"]["client_worker"]: [] for r in r2["records"]}
    for r in r2["records"]:
        sends[r["info"]["client_worker"]].append(r["send_s"])
    assert abs(min(sends[1]) - min(sends[0])) < 0.1, sends


@inside_only
def test_a_killed_actor_loses_only_its_unfinished_requests(tmp_path, ray_cluster) -> None:
    """One actor killed 0.3 s into a run of 16 requests at 2 in flight (each ~0.35 s on the fake
    server): the run finishes, the lost requests are failed records naming the death, nothing
    the other worker finished is lost."""
    import asyncio
    import time

    from engines.base import EngineConfig, GenParams, Request
    from engines.openai import OpenAIEngine
    from harness.core.load import Concurrent
    from harness.run.ray_clients import RayClientPool
    from harness.run.runner import Runner

    n = 16

    async def body(url: str) -> tuple[list, dict]:
        opts = {"base_urls": [url]}
        engine = OpenAIEngine(EngineConfig(engine="openai", model="fake-model", options=opts))
        await engine.start()
        pool = await RayClientPool.start_on_ray(engine, 2, time.perf_counter, ray_cluster)
        seen = []
        runner = Runner(engine, on_record=seen.append, clients=pool)
        reqs = [Request(id=f"r{j}", prompt="x", max_new_tokens=TOKENS) for j in range(n)]

        async def kill_soon() -> None:
            await asyncio.sleep(0.3)
            ray.kill(pool.handles[1].actor)

        killer = asyncio.ensure_future(kill_soon())
        try:
            records = await runner.run(reqs, GenParams(), Concurrent(2))
        finally:
            await killer
            info = pool.describe()
            await pool.close()
            await engine.close()
        assert len(seen) == len(records)
        return records, info

    slow = FakeServer(Behaviour(tokens=TOKENS, first_delay=0.05, delay=0.05))
    with ServerThread(slow) as url:
        records, info = asyncio.run(body(url))
    assert sorted(r.request_id for r in records) == sorted(f"r{j}" for j in range(n))
    failed = [r for r in records if not r.ok]
    assert failed and all("client worker 1" in r.error and "died" in r.error for r in failed)
    assert all(r.info["client_worker"] == 1 for r in failed)
    assert all(r.ok for r in records if r.info.get("client_worker") == 0)
    assert info["deaths"] and info["deaths"][0]["lost"] == len(failed)


def test_without_ray_the_flag_is_one_line(tmp_path) -> None:
    """Without the extra installed: exit 2, one line saying how to install it."""
    code = (
        "import sys, importlib.util as u; real = u.find_spec\n"
        "u.find_spec = lambda name, *a: None if name == 'ray' else real(name, *a)\n"
        "from harness.cli.main import main\n"
        "sys.exit(main(['--engine', 'openai', '--base-url', 'http://127.0.0.1:9/v1',"
        " '--ray-address', 'auto', '--quiet']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    err = proc.stderr.strip()
    assert proc.returncode == 2 and err.count("\n") == 0, err
    assert "--ray-address needs Ray" in err and "pip install" in err

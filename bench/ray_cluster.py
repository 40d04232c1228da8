"""A local Ray cluster of several nodes on 127.0.0.1 (one ``ray start`` each: its own raylet,
object store and resources ``node_0``, ``node_1``, ...), for the Ray client workers' tests and
benchmark (``--client-workers N --ray-address``). Stopped with ``ray stop --force``.

Only inside a network namespace whose one interface is loopback (``unshare -n``, see
:func:`private_network_argv`): Ray binds some services to the host's own address whatever
``--node-ip-address`` says (its client server, its runtime-env agent), and this project's tests
send traffic to loopback only."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))


def private_network() -> bool:
    """Whether this process sees no network interface but loopback."""
    return [name for _, name in socket.if_nameindex()] == ["lo"]


def private_network_argv(argv: list[str]) -> list[str]:
    """``argv`` run in a fresh network namespace with only loopback up, and its own PID
    namespace (``ray stop --force`` then stops this cluster's processes only). Linux, as root."""
    import shlex

    return [
        "unshare",
        "-n",
        "-p",
        "-f",
        "--mount-proc",
        "sh",
        "-c",
        "ip link set lo up && exec " + shlex.join(argv),
    ]


@contextlib.contextmanager
def local_cluster(nodes: int, temp_dir: str, cpus: int = 1) -> Iterator[str]:
    """Yields the head's address; each node has the custom resource ``node_K``."""
    if not private_network():
        raise RuntimeError("local_cluster: run inside `unshare -n` (loopback only)")
    from engines.servers.process import free_port

    port = free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    common = [f"--num-cpus={cpus}", "--node-ip-address=127.0.0.1",
              "--object-store-memory=80000000", "--disable-usage-stats"]  # fmt: skip
    try:
        for k in range(nodes):
            where = (
                ["--head", f"--port={port}", "--include-dashboard=false", f"--temp-dir={temp_dir}"]
                if k == 0
                else [f"--address=127.0.0.1:{port}"]
            )
            cmd = [RAY, "start", *where, f'--resources={{"node_{k}": 1}}', *common]
            subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=120)
        yield f"127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ImportError):
            import ray

            if ray.is_initialized():
                ray.shutdown()
        subprocess.run([RAY, "stop", "--force"], env=env, capture_output=True, timeout=120)

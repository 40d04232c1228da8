"""A server the harness starts as a child process: its own process group (closed as a whole,
and SIGTERMed if the harness dies), a free port on 127.0.0.1, its log, the wait until it is
healthy, and the stop (SIGTERM, a grace, SIGKILL, the group reaped)."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import aiohttp

from engines.base import EngineError


def group_alive(pgid: int) -> bool:
    """Whether a live (non-zombie) process remains in the group ``pgid`` (Linux /proc)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return not Path("/proc/self").exists()  # no /proc: trust killpg


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tail(path: str | Path, n: int = 20) -> str:
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the harness dies, even by SIGKILL (Linux)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class ServerProcess:
    """One server child process, owned by the engine that starts it
    (:class:`engines.servers.vllm_serve.VLLMServerEngine` and the servers built on it): the
    engine builds the command line and the environment, this object runs and ends the process."""

    def __init__(
        self, name: str, argv: list[str], port: int, log_path: str | None, kill_grace: float
    ) -> None:
        self.name = name
        self.argv = argv
        self.port = port
        self.log_path = log_path  # a temp file at start() when None
        self.kill_grace = kill_grace
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_offset = 0  # where the last start's lines begin in the log

    @property
    def pid(self) -> int | None:
        """The server's pid (its process group's id), None when it is not running."""
        return self.proc.pid if self.proc is not None else None

    def start(self, env: dict[str, str]) -> None:
        """Start the command in its own process group, its output appended to the log."""
        if self.log_path is None:
            fd, self.log_path = tempfile.mkstemp(prefix=f"{self.name}-", suffix=".log")
            os.close(fd)
        Path(self.log_path).parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.log_offset = log.tell()  # where this start's lines begin (a log is appended)
            log.write(("$ " + " ".join(self.argv) + "\n").encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # own process group: stop() kills the whole tree
                preexec_fn=die_with_parent,
            )
        atexit.register(self.kill_now)

    def this_start_log(self) -> str:
        """What the server wrote to its log since the last ``start()``."""
        if not self.log_path:
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(self.log_offset)
            return f.read().decode(errors="replace")

    def log_tail(self, n: int = 20) -> str:
        """The last ``n`` lines of the server's log (for error messages)."""
        return tail(self.log_path, n) if self.log_path else ""

    async def wait_healthy(self) -> None:
        """Poll ``/health`` until it answers 200; EngineError (with the log's tail) if the
        process exits first. No deadline here: the caller bounds the wait."""
        url = f"http://127.0.0.1:{self.port}/health"
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                if self.proc is None:
                    raise EngineError(f"{self.name}: wait_healthy() before start()")
                code = self.proc.poll()
                if code is not None:
                    raise EngineError(
                        f"{self.name}: the server exited with code {code} (log: {self.log_path}):"
                        f"\n{self.log_tail()}"
                    )
                with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                    async with session.get(url) as resp:
                        if resp.status == 200:
                            return
                await asyncio.sleep(0.5)

    async def stop(self) -> None:
        """SIGTERM the server's group, SIGKILL it after the grace, wait for the rest of it."""
        proc = self.proc
        if proc is None:
            return
        pgid = proc.pid
        if proc.poll() is None:
            self._signal(signal.SIGTERM)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.to_thread(proc.wait), self.kill_grace)
        self.kill_now()
        for _ in range(100):  # up to 5 s for the rest of the group (engine core, trackers)
            if not group_alive(pgid):
                break
            await asyncio.sleep(0.05)

    def kill_now(self) -> None:
        """SIGKILL the group and reap the server (also the atexit hook)."""
        if self.proc is None:
            return
        self._signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        atexit.unregister(self.kill_now)
        self.proc = None

    def _signal(self, sig: int) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)

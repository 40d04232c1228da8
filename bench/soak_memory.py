"""Where a long run's memory goes (issue 38), without a server: ``N`` stub-like requests held
as a run holds them (the workload packed, each finished record in the run's columns), then the
run's analysis and its records file, with this process's peak RSS after each step. The slope
between two sizes is the bytes a request costs (what a million requests add).

Run: ``python -m bench.soak_memory 50000 200000`` (one process per size).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import PY, ROOT


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def one(n: int) -> dict[str, float]:
    """Peak RSS (MB) after each step of ``n`` requests, in this process."""
    import pyarrow  # noqa: F401  (a run imports it to write its records)

    from harness.analysis.derived import analyze
    from harness.core.columns import RecordColumns
    from harness.core.records import RequestRecord
    from harness.core.records_file import write_records
    from harness.core.results import Cell, Run
    from workloads.packed import PackedRequests

    out = {"start": _rss_mb()}
    reqs, cols = PackedRequests(), RecordColumns()
    info = {"stream_end": "[DONE]", "output_tokens_from": "server usage"}
    t = time.process_time()
    for i in range(n):  # 16 prompt tokens (~48 non-ASCII characters), 8 one-token chunks
        text = "".join(chr(0x400 + (i * 7 + k) % 200) * 3 for k in range(16))
        reqs.append(str(i), text, 8, [(i * 31 + k) % 49000 for k in range(17)])
        t0 = 1000.0 + i * 1e-3
        times = tuple(t0 + 0.001 * (k + 1) + i * 1e-9 for k in range(8))
        text_out = "".join(f" t{k}" for k in range(8))
        cols.append(
            RequestRecord(reqs[i].id, t0, times[-1] + 1e-4, times, (1,) * 8, None, 17, 8,
                          text_out, True, None, False, info)
        )  # fmt: skip
    out["held"] = _rss_mb()
    cell = Cell("openai", "baseline", "throughput", {"concurrency": 256}, 8, 0, "random", "tiny")
    run = Run(cell, None, cols, 0.0)
    analyze([run], min_effect=0.05)
    out["analysis"] = _rss_mb()
    with tempfile.TemporaryDirectory() as d:
        write_records(Path(d) / "records.parquet", [run])
    out["write"] = _rss_mb()
    out["cpu_s"] = time.process_time() - t
    return out


def main(argv: list[str]) -> None:
    if len(argv) == 2 and argv[0] == "--one":
        print(json.dumps(one(int(argv[1]))))
        return
    sizes = [int(a) for a in argv] or [50_000, 200_000]
    rows = []
    for n in sizes:  # a fresh process per size: ru_maxrss is a process's peak
        got = subprocess.run([PY, "-m", "bench.soak_memory", "--one", str(n)], cwd=ROOT,
                             capture_output=True, text=True, check=True)  # fmt: skip
        rows.append((n, json.loads(got.stdout.strip().splitlines()[-1])))
    for n, r in rows:
        print(f"{n:>9,} requests: start {r['start']:.0f} MB, held {r['held']:.0f}, after the "
              f"analysis {r['analysis']:.0f}, after the records file {r['write']:.0f} MB "
              f"({r['cpu_s']:.1f} s CPU)")  # fmt: skip
    if len(rows) > 1:
        (a, ra), (b, rb) = rows[0], rows[-1]
        for k in ("held", "analysis", "write"):
            print(f"slope, {k}: {(rb[k] - ra[k]) * 1024 / (b - a) * 1024:.0f} bytes a request")


if __name__ == "__main__":
    main(sys.argv[1:])

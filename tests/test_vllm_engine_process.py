"""Coexisting in-process vLLM lanes on CUDA's mechanism: each engine core in its own process (V1
multiprocessing). Here on CPU: CUDA forced at import (the device is the fake), and two lanes
alive at once on V1 multiprocessing give the records of the in-process path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engines.vllm.process import ENV, engine_process_default
from harness.core.records_file import load_with_records

ROOT = Path(__file__).resolve().parents[1]


def _env(**kw: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    return {**env, "PYTHONPATH": str(ROOT), **kw}


def test_cuda_puts_each_engine_core_in_its_own_process() -> None:
    assert engine_process_default(cuda=True) == "1"
    assert engine_process_default(cuda=False) == "0"
    code = (
        "import os, engines.vllm.process as p; p.cuda_visible = lambda: True; "
        "import engines.vllm.engine; print(os.environ['VLLM_ENABLE_V1_MULTIPROCESSING'], p.core_mode())"
    )
    forced = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True,
                            text=True, check=True, cwd=ROOT)  # fmt: skip
    assert forced.stdout.split()[0] == "1" and "own process" in forced.stdout
    code = code.replace("lambda: True", "lambda: False")
    cpu = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True,
                         text=True, check=True, cwd=ROOT)  # fmt: skip
    assert cpu.stdout.split()[0] == "0"
    user = subprocess.run([sys.executable, "-c", code], env=_env(**{ENV: "1"}),
                          capture_output=True, text=True, check=True, cwd=ROOT)  # fmt: skip
    assert user.stdout.split()[0] == "1"  # the user's own setting wins


def _start(out: Path, mp: str) -> subprocess.Popen[bytes]:
    """The main job's shape on the tiny pair, in its own interpreter; stderr beside out."""
    argv = [
        sys.executable, "-m", "harness", "--engine", "vllm", "--spec", "ngram",
        "--model", "tiny", "--workload", "tiny", "--mode", "latency", "--num-prompts", "3",
        "--max-new-tokens", "16", "--repeats", "1", "--warmup", "0", "--quiet", "--no-plots",
        "--output-dir", str(out),
    ]  # fmt: skip
    # a file, not a pipe: neither run waits on a reader while the test waits on the other
    with open(out.with_suffix(".stderr"), "wb") as err:
        return subprocess.Popen(argv, env=_env(**{ENV: mp}), stdout=subprocess.DEVNULL,
                                stderr=err, cwd=ROOT)  # fmt: skip


def _results(proc: subprocess.Popen[bytes], out: Path) -> dict:
    assert proc.wait(timeout=600) == 0, out.with_suffix(".stderr").read_text()[-3000:]
    return load_with_records(out / "results.json")


@pytest.mark.slow
def test_two_lanes_on_engine_processes_give_the_in_process_records(tmp_path, tiny_pair) -> None:
    """Both runs at once: each spends most of its time starting (imports, engines), mostly on
    one core, so together they take little more than one; their records do not depend on
    time (docs/measurements.md, "Test suite time")."""
    procs = {mp: _start(tmp_path / mp, mp) for mp in ("0", "1")}
    try:
        here, own = (_results(procs[mp], tmp_path / mp) for mp in ("0", "1"))
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert here["design"]["name"] == own["design"]["name"] == "interleaved"  # coexisting

    def records(results: dict) -> dict:
        return {
            r["label"]: (
                [x["output_token_ids"] for x in r["records"]],
                {k: v for k, v in (r["spec_metrics"] or {}).items() if k.startswith("num_")},
            )
            for r in results["runs"]
        }

    assert records(here) == records(own)
    assert records(own)["ngram"][1]["num_drafts"] > 0
    modes = {r["engine_info"]["mode"] for r in own["runs"]}
    assert all("own process" in m for m in modes), modes
    assert all(r["engine_info"]["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1" for r in own["runs"])
    for r in own["runs"]:  # stamped in the harness's process: every token has its time
        for rec in r["records"]:
            assert rec["ok"] and rec["ttft_s"] > 0 and len(rec["itl_s"]) >= 1

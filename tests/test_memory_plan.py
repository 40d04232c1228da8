"""The plan before anything loads, on a modelled GPU: sizes from config.json (checked against the
shipped models' safetensors), per-lane memory, the vLLM shares computed from what the HF lanes
hold, a plan that cannot fit stopped in one line, one dtype for every engine.

The device is the one fake here (this machine has no GPU): ``detect_device`` returns an 80 GB
card; the models are Llama-3.1-8B-Instruct's, Llama-3.2-1B-Instruct's and an EAGLE-3 head's
config.json values written to directories with no weights (nothing loads in a dry run)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.analysis.theory.sol import count_params
from harness.cli.main import main
from harness.sizing.memory import Device
from harness.sizing.model_size import model_size, read_config, resolve_dtype

GPU_80GB = Device("cuda", "modelled 80 GB GPU", 80 * 10**9)

LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,
    "max_position_embeddings": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}  # fmt: skip
LLAMA_1B = {
    **LLAMA_8B, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "head_dim": 64, "tie_word_embeddings": True,
}  # fmt: skip
EAGLE3_8B = {
    **LLAMA_8B, "architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1,
    "draft_vocab_size": 32000,
}  # fmt: skip


@pytest.fixture
def gpu_models(tmp_path: Path) -> dict[str, str]:
    out = {}
    for name, cfg in (("target", LLAMA_8B), ("draft", LLAMA_1B), ("eagle3", EAGLE3_8B)):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
        out[name] = str(d)
    return out


@pytest.fixture
def on_gpu(monkeypatch: pytest.MonkeyPatch) -> Device:
    monkeypatch.setattr("harness.cli.plan_view.detect_device", lambda flag="auto": GPU_80GB)
    return GPU_80GB


def test_config_counts_match_the_shipped_safetensors(tiny_pair: tuple[str, str]) -> None:
    from harness.models import registry

    paths = list(tiny_pair)
    if registry.model_path("smollm2", "target").exists():
        paths += [str(registry.model_path("smollm2", k)) for k in ("target", "draft", "eagle3")]
    for path in paths:
        counted, stored = model_size(path, read_config(path)).params, count_params(path)
        assert stored is not None
        assert abs(counted - stored) / stored < 0.002, path


def test_llama_8b_from_its_config() -> None:
    size = model_size("llama", LLAMA_8B)
    assert 8.02e9 < size.params < 8.04e9  # Meta's figure: 8.03B
    assert size.weight_bytes("bfloat16") == 2 * size.params
    assert size.kv_bytes_per_token("bfloat16") == 32 * 2 * 8 * 128 * 2  # 128 KiB a token
    assert 0.3e9 < model_size("head", EAGLE3_8B).params < 0.6e9


def test_one_dtype_for_every_engine() -> None:
    assert resolve_dtype("auto", "bfloat16", on_cuda=True)[0] == "bfloat16"
    assert resolve_dtype("auto", "float32", on_cuda=True)[0] == "bfloat16"
    assert resolve_dtype("auto", "bfloat16", on_cuda=False)[0] == "float32"  # CPU as before
    assert resolve_dtype("float16", "bfloat16", on_cuda=True)[0] == "float16"


def dry(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["--quiet", "--workload", "tiny", "--dry-run", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def run_args(models: dict[str, str], *extra: str) -> list[str]:
    return [
        "--engine", "hf,vllm", "--model", models["target"], "--draft-model", models["draft"],
        "--spec", "draft_model,ngram",
        "--spec-config", json.dumps({"method": "eagle3", "model": models["eagle3"],
                                     "num_speculative_tokens": 3}),
        *extra,
    ]  # fmt: skip


def test_8b_interleaved_on_80gb_stops_in_one_line(gpu_models, on_gpu, capsys) -> None:
    rc, out, err = dry(capsys, *run_args(gpu_models))
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    assert "lanes alive at once need" in lines[0] and "--sequential" in lines[0]
    assert "Traceback" not in err
    assert "DOES NOT FIT" in out  # the dry run printed its plan before it stopped


def test_8b_sequential_on_80gb_gets_a_plan_that_fits(gpu_models, on_gpu, capsys) -> None:
    rc, out, err = dry(capsys, *run_args(gpu_models, "--sequential"))
    assert rc == 0, err
    assert "fits" in out and "design: sequential" in out
    for lane in ("hf/baseline", "hf/draft_model", "hf/ngram", "vllm/eagle3", "vllm/ngram"):
        assert f"    {lane}: " in out
    assert "hf/eagle3: not built" in out
    assert "dtype: bfloat16" in out  # the model's own, for both engines


def test_the_advice_names_a_max_model_len_that_fits(gpu_models, on_gpu, capsys) -> None:
    """At the 8B's 131072 positions two vLLM lanes beside HF's cannot fit 80 GB; the stop line
    names the longest --max-model-len that does, and with it the plan fits, each vLLM lane's
    minimum KV cache one request of that length."""
    import re

    argv = ("--engine", "hf,vllm", "--model", gpu_models["target"], "--spec", "ngram")
    rc, out, err = dry(capsys, *argv)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "(max_model_len 131072)" in out
    n = int(re.search(r"--max-model-len (\d+) \(a vLLM request's prompt", err).group(1))
    assert n == 65536  # the numbers: 15 GiB weights + 8 GiB KV + 2 GiB per vLLM lane, HF's 16
    rc, out, err = dry(capsys, *argv, "--max-model-len", str(n))
    assert rc == 0 and "fits" in out and f"--max-model-len {n}: vllm" in out, err
    mem = plan_json(gpu_models, *argv, "--max-model-len", str(n))["memory"]
    lanes = {m["lane"]: m for m in mem["lanes"]}
    for lane in ("vllm/baseline", "vllm/ngram"):
        assert lanes[lane]["max_model_len"] == n and lanes[lane]["kv_min_bytes"] == n * 128 * 1024
    assert "max_model_len" not in lanes["hf/baseline"]  # HF's KV: its longest request
    # seven lanes need more than the weights leave at any length: no length is advised
    rc, _, err = dry(capsys, *run_args(gpu_models))
    assert rc == 2 and "--max-model-len" not in err and "--sequential" in err


def plan_json(models: dict[str, str], *extra: str) -> dict[str, Any]:
    """The preview's JSON, as a run records it (results.json "plan")."""
    import argparse

    from harness.cli.plan_view import resolve_device_and_dtype
    from harness.cli.preflight import engine_methods
    from harness.flags.inputs import model_names
    from harness.flags.parser import build_parser
    from harness.flags.plan import build_plan
    from harness.sizing.memory import Sizes
    from harness.sizing.preview import preview
    from workloads import load_workload

    args: argparse.Namespace = build_parser().parse_args(["--workload", "tiny", *extra])
    plan = build_plan(args, *model_names(args))
    sizes = Sizes()
    plan, device, why = resolve_device_and_dtype(plan, sizes)
    configs = plan.engine_configs(engine_methods(plan))
    requests = load_workload("tiny").requests
    return preview(plan, configs, requests, device, why, engine_methods(plan), sizes).to_json()


def test_vllm_shares_are_what_the_hf_lanes_leave(gpu_models, on_gpu) -> None:
    p = plan_json(
        gpu_models, "--engine", "hf,vllm", "--model", gpu_models["target"], "--spec", "ngram",
        "--engine-args", 'vllm={"max_model_len": 8192}',
    )  # fmt: skip
    mem = p["memory"]
    assert mem["fits"]
    lanes = {m["lane"]: m for m in mem["lanes"]}
    hf_held = sum(m["weights_bytes"] for k, m in lanes.items() if k.startswith("hf/"))
    assert hf_held == model_size("t", LLAMA_8B).weight_bytes("bfloat16")  # one target object
    assert lanes["hf/ngram"]["shares_with"] == "hf/baseline"
    vllm = [m for k, m in lanes.items() if k.startswith("vllm/")]
    total = GPU_80GB.total_bytes
    used = sum(m["memory_fraction"] for m in vllm) * total + hf_held
    assert used <= 0.9 * total
    for m in vllm:  # each share holds its weights and a KV cache for one 8192-token request
        assert m["memory_fraction"] * total >= m["weights_bytes"] + m["kv_min_bytes"]
        assert m["kv_min_bytes"] == 8192 * 128 * 1024


def test_memory_fraction_reaches_vllm_on_cuda(monkeypatch: pytest.MonkeyPatch, tiny_pair) -> None:
    from vllm.platforms import current_platform

    from engines.base import EngineConfig
    from engines.common.vllm_args import engine_kwargs

    monkeypatch.setattr(current_platform, "is_cpu", lambda: False)  # modelled: a CUDA platform
    cfg = EngineConfig("vllm", tiny_pair[0], dtype="bfloat16", memory_fraction=0.31, share=7)
    kwargs, _ = engine_kwargs(cfg)
    assert kwargs["gpu_memory_utilization"] == 0.31  # the plan's share, not 0.9 / 7
    assert kwargs["dtype"] == "bfloat16"
    from engines.hf.models import dtype_name

    assert dtype_name(cfg.dtype, on_cuda=True) == "bfloat16"  # what HF loads for that config


def test_dry_run_lists_what_spec_would_run_but_cannot(tiny_pair, capsys) -> None:
    rc, out, _ = dry(capsys, "--engine", "vllm", "--model", tiny_pair[0], "--spec")
    assert rc == 0
    assert "not run: vllm draft_model: no draft model" in out and "--draft-model" in out
    assert "not run: vllm eagle3: no EAGLE-3 head" in out and '"method": "eagle3"' in out


def test_a_hub_id_offline_is_said_before_anything_loads(monkeypatch, capsys) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rc, out, _ = dry(capsys, "--engine", "hf", "--model", "no-such-org/no-such-model-26")
    assert rc == 0
    assert "model no-such-org/no-such-model-26: downloads; not in the HF cache" in out
    assert "memory: not checked, a size is unknown" in out  # never "fits" on a guess


def test_a_known_device_gets_a_wall_time_estimate(gpu_models, monkeypatch) -> None:
    h100 = Device("cuda", "NVIDIA H100 80GB HBM3", 80 * 10**9)
    monkeypatch.setattr("harness.cli.plan_view.detect_device", lambda flag="auto": h100)
    argv = ("--engine", "vllm", "--model", gpu_models["target"], "--mode", "latency",
            "--max-new-tokens", "100", "--repeats", "1", "--engine-args", '{"max_model_len": 4096}')  # fmt: skip
    p = plan_json(gpu_models, *argv)
    tokens = p["requests"] * 100
    bound = tokens * model_size("t", LLAMA_8B).weight_bytes("bfloat16") / 3.35e12
    assert p["estimate_s"] == round(60 + bound)  # one build (assumed 60 s) + decode at the bound
    assert "H100" in p["estimate_why"]
    monkeypatch.setattr("harness.cli.plan_view.detect_device", lambda flag="auto": GPU_80GB)
    assert plan_json(gpu_models, *argv)["estimate_s"] is None  # an unknown card: none, said


def test_a_run_records_its_plan_and_the_variants_not_run(tmp_path, tiny_pair, capsys) -> None:
    out = tmp_path / "run"
    # the tiny target by path with its draft: no EAGLE-3 head (tiny:eagle3 goes with "tiny")
    argv = ["--engine", "hf", "--model", tiny_pair[0], "--draft-model", tiny_pair[1], "--spec",
            "--workload", "tiny",
            "--num-prompts", "2", "--mode", "latency", "--max-new-tokens", "6", "--repeats", "1",
            "--warmup", "0", "--quiet", "--no-plots", "--output-dir", str(out)]  # fmt: skip
    assert main(argv) == 0
    capsys.readouterr()
    results = json.loads((out / "results.json").read_text())
    plan = results["plan"]
    assert plan["dtype"] == "float32" and results["config"]["resolved_dtype"] == "float32"
    assert {lane["lane"] for lane in plan["lanes"]} == {"hf/baseline", "hf/draft_model", "hf/ngram"}
    assert all(lane["memory"]["weights_bytes"] >= 0 for lane in plan["lanes"])
    skipped = [n for n in results["not_run"] if n["status"].startswith("not run")]
    assert [n["name"] for n in skipped] == ["hf/eagle3"]
    assert "hf has no eagle3" in skipped[0]["status"] and "vllm" in skipped[0]["how"]
    assert "## Variants not run" in (out / "summary.md").read_text()


@pytest.fixture
def silent_hub() -> Iterator[socket.socket]:
    """A hub endpoint that never answers: a real socket listening on 127.0.0.1 that accepts no
    connection (the kernel completes each handshake; nothing is read, nothing sent back)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield s


def harness_against(hub: socket.socket, tmp_path: Path, *argv: str, **env: str) -> Any:
    """``python -m harness`` in a fresh process (huggingface_hub reads HF_ENDPOINT on import)
    with an empty HF cache and ``hub`` as the endpoint; the guard is pytest's, generous."""
    root = Path(__file__).resolve().parents[1]
    clean = {
        k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    }
    clean |= {"HF_ENDPOINT": f"http://127.0.0.1:{hub.getsockname()[1]}", "HF_HOME": str(tmp_path / "hf"),
              "PYTHONPATH": str(root), **env}  # fmt: skip
    cmd = [sys.executable, "-m", "harness", "--engine", "hf", "--model", HUB_ID, "--quiet", *argv]
    return subprocess.run(cmd, env=clean, capture_output=True, text=True, timeout=120, cwd=root)


HUB_ID = "no-such-org/no-such-model-26"


@pytest.mark.parametrize(
    "dataset",
    [("--workload", "tiny", "--num-prompts", "1", "--mode", "latency"),
     ("--dataset-name", "random", "--random-input-len", "8", "--num-prompts", "2")],
    ids=["run", "tokenizer of a synthetic dataset"],
)  # fmt: skip
def test_a_hub_that_never_answers_stops_the_run_in_one_line(silent_hub, tmp_path, dataset):
    """huggingface_hub retries an unanswered request for minutes; the harness waits
    $HARNESS_HUB_TIMEOUT_S (10 s; 2 here) for the config.json it reads before loading (the
    memory plan's, a synthetic dataset's probe)."""
    done = harness_against(silent_hub, tmp_path, *dataset, "--output-dir", str(tmp_path / "o"),
                           HARNESS_HUB_TIMEOUT_S="2")  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: {HUB_ID}: config.json not readable (hub not reachable in 2 s; offline? set "
        "HF_HUB_OFFLINE=1 or pass a local path)"
    ]


def test_offline_reads_the_hf_cache_only(silent_hub, tmp_path) -> None:
    done = harness_against(silent_hub, tmp_path, "--workload", "tiny", "--dry-run",
                           HF_HUB_OFFLINE="1")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "not in the HF cache and HF_HUB_OFFLINE=1: it cannot load" in done.stdout
    assert "memory: not checked, a size is unknown" in done.stdout
    silent_hub.setblocking(False)
    with pytest.raises(BlockingIOError):  # nothing ever connected to the hub
        silent_hub.accept()

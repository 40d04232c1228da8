"""Bad input: one line on stderr naming what and where, exit code 2, no traceback, nothing loaded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli.main import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def files(tmp_path):
    def write(name: str, content: str | bytes) -> str:
        p = tmp_path / name
        p.write_bytes(content if isinstance(content, bytes) else content.encode())
        return str(p)

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps({"vocab_size": 100, "max_position_embeddings": 512})
    )
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(
        json.dumps({"vocab_size": 120, "max_position_embeddings": 512})
    )
    nocfg = tmp_path / "nocfg"
    nocfg.mkdir()
    return {
        "write": write,
        "model": str(model),
        "draft": str(draft),
        "nocfg": str(nocfg),
        "tmp": tmp_path,
    }


CASES = {
    "malformed jsonl": (["--workload", "{w:bad.jsonl}"], ["bad.jsonl:2:"]),
    "missing prompt": (["--workload", "{w:noprompt.jsonl}"], ["noprompt.jsonl:1:", "prompt"]),
    "wrong type": (["--workload", "{w:type.jsonl}"], ["type.jsonl:1:", "max_new_tokens"]),
    "empty prompt": (["--workload", "{w:empty_prompt.jsonl}"], ["empty_prompt.jsonl:1:", "prompt"]),
    "empty file": (["--workload", "{w:empty.jsonl}"], ["empty.jsonl", "empty"]),
    "non utf8": (["--workload", "{w:latin.jsonl}"], ["latin.jsonl", "UTF-8"]),
    "sharegpt no human": (
        ["--workload", "{w:share.json}"],
        ["share.json", "entry 0", "conversations"],
    ),
    "max_new_tokens 0 in file": (
        ["--workload", "{w:zero.jsonl}"],
        ["zero.jsonl:1:", "max_new_tokens"],
    ),
    "max_new_tokens flag 0": (["--max-new-tokens", "0"], ["--max-new-tokens", "must be > 0"]),
    "max_new_tokens too large": (
        ["--model", "{model}", "--max-new-tokens", "100000"],
        ["--max-new-tokens", "512"],
    ),
    "unknown engine": (["--engine", "tgi"], ["unknown engine 'tgi'", "vllm"]),
    "unknown spec method": (["--spec", "medusa2"], ["--spec", "medusa2", "ngram"]),
    "unknown workload": (["--workload", "nosuch"], ["nosuch", "specbench"]),
    "missing model path": (["--model", "./no/such/model"], ["--model", "no/such/model"]),
    "missing draft path": (
        ["--model", "{model}", "--draft-model", "/no/such/draft", "--spec", "draft_model"],
        ["--draft-model", "/no/such/draft"],
    ),
    "not a model dir": (["--model", "{nocfg}"], ["nocfg", "config.json"]),
    "vocab mismatch": (
        ["--model", "{model}", "--draft-model", "{draft}", "--spec", "draft_model"],
        ["vocabulary", "120", "100"],
    ),
    "bad spec-config json": (
        ["--spec-config", "{method: ngram"],
        ["--spec-config", "invalid JSON"],
    ),
    "spec-config not object": (["--spec-config", "[1]"], ["--spec-config", "JSON object"]),
    "spec-config missing file": (
        ["--spec-config", "@/no/such/spec.json"],
        ["--spec-config", "/no/such/spec.json", "No such file"],
    ),
    "spec-config bad file": (
        ["--spec-config", "@{w:spec_bad.json}"],
        ["--spec-config", "spec_bad.json", "invalid JSON", "line 3"],
    ),
    "tune with hf": (["tune", "--engine", "hf"], ["tune", "--engine", "vllm-server"]),
    "tune with request rate": (["tune", "--request-rate", "2"], ["tune", "--concurrency"]),
    "tune bad k": (["tune", "--tune-k", "0"], ["--tune-k", "must be > 0"]),
    "tune bad budget": (["tune", "--budget-min", "0"], ["--budget-min", "minutes > 0"]),
    "spec-config bad schedule": (
        ["--spec-config", "{w:spec_gap.json}", "--mode", "latency", "--model", "tiny"],
        ["num_speculative_tokens_per_batch_size", "must start at 1"],
    ),
    "bad engine-args json": (["--engine-args", "{'a': 1}"], ["--engine-args", "invalid JSON"]),
    "concurrency in latency mode": (
        ["--mode", "latency", "--concurrency", "4"],
        ["--concurrency", "throughput"],
    ),
    "no-baseline without spec": (["--no-baseline"], ["--no-baseline", "--spec"]),
    "openai without base-url": (["--engine", "openai"], ["--base-url"]),
    "per-block instances of a remote server": (
        ["--engine", "openai", "--instances", "per-block", "--base-url", "http://127.0.0.1:9/v1"],
        ["--instances per-block", "--engine openai"],
    ),
    "openai spec with one server": (
        ["--engine", "openai", "--spec", "--base-url", "http://127.0.0.1:9/v1"],
        ["--engine openai --spec", "one URL per variant"],
    ),
    "openai spec url missing for a variant": (
        [
            "--model",
            "tiny",
            "--engine",
            "openai",
            "--spec",
            "--base-url",
            "baseline=http://127.0.0.1:9/v1",
            "ngram=http://127.0.0.1:8/v1",
        ],
        ["--base-url", "no URL for variant 'draft_model'"],
    ),  # fmt: skip
    "openai url for no variant": (
        [
            "--model",
            "tiny",
            "--engine",
            "openai",
            "--spec",
            "ngram",
            "--base-url",
            "baseline=http://127.0.0.1:9/v1",
            "ngram=http://127.0.0.1:8/v1",
            "eagle=http://127.0.0.1:7/v1",
        ],
        ["--base-url", "eagle=URL names no variant"],
    ),  # fmt: skip
    "openai half-labelled urls": (
        [
            "--engine",
            "openai",
            "--spec",
            "--base-url",
            "baseline=http://127.0.0.1:9/v1",
            "http://127.0.0.1:8/v1",
        ],
        ["--base-url", "label every URL"],
    ),  # fmt: skip
    "chat workload to completions": (
        [
            "--model",
            "tiny",
            "--engine",
            "openai",
            "--base-url",
            "http://127.0.0.1:9/v1",
            "--endpoint",
            "completions",
            "--workload",
            "{w:chat.jsonl}",
        ],
        ["chat.jsonl:2: messages", "--endpoint chat"],
    ),  # fmt: skip
    "default workload to completions": (
        [
            "--model",
            "tiny",
            "--engine",
            "openai",
            "--base-url",
            "http://127.0.0.1:9/v1",
            "--endpoint",
            "completions",
        ],
        ["default.jsonl:1: messages", "--endpoint chat"],
    ),  # fmt: skip
    "bad extra-body json": (
        ["--engine", "openai", "--extra-body", "{ignore_eos: true}"],
        ["--extra-body", "invalid JSON"],
    ),
    "extra-body not object": (
        ["--engine", "openai", "--extra-body", "[1]"],
        ["--extra-body", "JSON object"],
    ),
    "extra-body without an HTTP engine": (
        ["--engine", "hf", "--extra-body", "{}", "--model", "tiny"],
        ["--extra-body", "HTTP engines", "openai"],
    ),
    "aa with spec": (["--aa", "--spec"], ["--aa", "drop --spec"]),
    "bad goodput": (["--goodput", "ttft=5"], ["--goodput"]),
    "bad mode": (["--mode", "fast"], ["--mode", "fast"]),
    "resume without journal": (["--resume", "{tmp}"], ["--resume", "journal"]),
    # vllm bench serve's names
    "vllm endpoint path": (["--endpoint", "/v1/embeddings"], ["--endpoint", "URL path"]),
    "custom dataset without path": (["--dataset-name", "custom"], ["custom", "--dataset-path"]),
    "dataset and workload": (
        ["--workload", "specbench", "--dataset-name", "spec_bench"],
        ["--workload", "--dataset-name"],
    ),
    "dataset path missing": (
        ["--dataset-name", "sharegpt", "--dataset-path", "/no/such.json"],
        ["/no/such.json", "file not found"],
    ),
    "synthetic with path": (
        ["--dataset-name", "random", "--dataset-path", "x.jsonl"],
        ["random", "no --dataset-path"],
    ),
    "bad range ratio": (
        ["--dataset-name", "random", "--random-range-ratio", "1.5"],
        ["--random-range-ratio", "[0, 1)"],
    ),
    "bad metric percentiles": (["--metric-percentiles", "50,100"], ["--metric-percentiles"]),
    "bad percentile metric": (["--percentile-metrics", "ttft,foo"], ["'foo'"]),
    "bad metadata": (["--metadata", "novalue"], ["--metadata", "KEY=VALUE"]),
    "duration in latency mode": (["--mode", "latency", "--duration", "5"], ["--duration"]),
}

FILES = {
    "bad.jsonl": '{"id": 1, "prompt": "a"}\n{"id": 2, "prompt": \n',
    "noprompt.jsonl": '{"id": 1}\n',
    "type.jsonl": '{"id": 1, "prompt": "a", "max_new_tokens": "ten"}\n',
    "empty_prompt.jsonl": '{"id": 1, "prompt": ""}\n',
    "empty.jsonl": "",
    "latin.jsonl": b'{"id": 1, "prompt": "caf\xe9"}\n',
    "share.json": json.dumps([{"id": "a", "conversations": [{"from": "gpt", "value": "hi"}]}]),
    "chat.jsonl": '{"id": 1, "prompt": "a"}\n{"id": 2, "messages": [{"role": "user", "content": "b"}]}\n',
    "zero.jsonl": '{"id": 1, "prompt": "a", "max_new_tokens": 0}\n',
    "spec_bad.json": '{\n "method": "ngram",\n}\n',
    "spec_gap.json": json.dumps(
        {
            "method": "ngram",
            "num_speculative_tokens": 3,
            "num_speculative_tokens_per_batch_size": [[2, 8, 3]],
        }
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_one_line_exit_2(name, files, capsys):
    argv, expect = CASES[name]
    subst = {k: v for k, v in files.items() if isinstance(v, str)}
    subst["tmp"] = str(files["tmp"])
    out = []
    for a in argv:
        if a.lstrip("@").startswith("{w:"):
            fname = a.lstrip("@")[3:-1]
            out.append(a[: len(a) - len(a.lstrip("@"))] + files["write"](fname, FILES[fname]))
        elif a.startswith("{") and a.endswith("}") and a[1:-1] in subst:
            out.append(subst[a[1:-1]])
        else:
            out.append(a)
    code = main([*out, "--quiet", "--output-dir", str(files["tmp"] / "out")])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for piece in expect:
        assert piece in lines[0], (piece, lines[0])
    assert not (files["tmp"] / "out").exists()  # nothing ran


def test_subprocess_exit_code_and_no_traceback(tmp_path):
    bad = tmp_path / "w.jsonl"
    bad.write_text('{"id": 1, "prompt": "x"}\nnot json\n')
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "--workload", str(bad)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and f"{bad}:2:" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_help_documents_every_flag():
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0
    for flag in (
        "--engine",
        "--spec",
        "--num-spec-tokens",
        "--spec-config",
        "--engine-args",
        "--mode",
        "--concurrency",
        "--request-rate",
        "--burstiness",
        "--max-new-tokens",
        "--repeats",
        "--warmup",
        "--output-dir",
        "--base-url",
        "--api-key-env",
        "--goodput",
        "--resume",
        "--max-error-rate",
        "--no-baseline",
        "--max-concurrency",
        "--num-warmups",
        "--dataset-name",
        "--random-input-len",
        "--metric-percentiles",
        "--save-result",
        "--duration",
        "--extra-body",
    ):
        assert flag in proc.stdout
    assert "vllm bench serve names:" in proc.stdout


def test_help_states_the_defaults_the_plan_uses():
    """--help's defaults are the constants build_plan applies (it once said 64 for 32)."""
    import re

    from harness.flags.parser import build_parser
    from harness.flags.plan import DEFAULT_CONCURRENCY, DEFAULT_MAX_NEW_TOKENS, build_plan

    text = " ".join(build_parser().format_help().split())
    assert re.search(
        rf"output length \(list = sweep; default: .*?else {DEFAULT_MAX_NEW_TOKENS};", text
    )
    assert f"requests in flight (list = sweep; default {DEFAULT_CONCURRENCY};" in text
    plan = build_plan(build_parser().parse_args(["--engine", "hf"]), "m", None)
    assert plan.max_new_tokens == (DEFAULT_MAX_NEW_TOKENS,)
    assert plan.concurrency == (DEFAULT_CONCURRENCY,)


def test_vllm_bench_names_mean_the_same():
    from harness.flags.inputs import resolve_dataset
    from harness.flags.options import goodput as _goodput
    from harness.flags.parser import build_parser

    args = build_parser().parse_args(
        [
            "--max-concurrency",
            "4",
            "8",
            "--num-warmups",
            "3",
            "--served-model-name",
            "m",
            "--result-dir",
            "d",
            "--endpoint",
            "/v1/chat/completions",
            "--dataset-name",
            "sharegpt",
            "--dataset-path",
            "s.json",
            "--metric-percentiles",
            "50,99.9",
            "--metadata",
            "a=1",
            "b=x=y",
        ]
    )
    assert (args.concurrency, args.warmup, args.served_model, args.output_dir) == (
        [4, 8],
        3,
        "m",
        "d",
    )
    assert args.endpoint == "chat" and args.metric_percentiles == (50.0, 99.9)
    assert dict(args.metadata) == {"a": "1", "b": "x=y"}
    resolve_dataset(args)
    assert (args.dataset.workload, args.dataset.fmt) == ("s.json", "sharegpt")
    assert _goodput(["e2el:500", "ttft:20"]) == {"e2e": 500.0, "ttft": 20.0}
    args = build_parser().parse_args(["--dataset-name", "random"])
    resolve_dataset(args)
    assert args.dataset.synthetic and args.ignore_eos and args.num_prompts == 1000
    args = build_parser().parse_args(["--dataset-name", "spec_bench"])
    resolve_dataset(args)
    assert (args.dataset.workload, args.dataset.fmt) == ("specbench", "specbench")


def test_vllm_style_base_url_is_the_server_root():
    from harness.flags.vllm_bench import api_root

    assert api_root("http://127.0.0.1:8000") == "http://127.0.0.1:8000/v1"
    assert api_root("http://127.0.0.1:8000/") == "http://127.0.0.1:8000/v1"
    assert api_root("baseline=http://h:8000") == "baseline=http://h:8000/v1"
    for kept in ("http://h:8000/v1", "http://h/api/v1", "ngram=http://h:1/v1"):
        assert api_root(kept) == kept

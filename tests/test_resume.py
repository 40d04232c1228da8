"""``--resume`` continues a run only with the settings it was recorded with, and results.json
records every setting (one frozen plan; nothing after the flags reads argparse)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from harness.cli.main import main
from harness.run.plan import config_differences

# hf on the tiny pair, 2 prompts x 8 tokens, one repeat: a few seconds
RUN = ("--model", "tiny", "--workload", "tiny", "--engine", "hf", "--mode", "latency",
       "--num-prompts", "2", "--max-new-tokens", "8", "--warmup", "0", "--no-plots", "--quiet")  # fmt: skip


def test_differences_name_measured_keys_only() -> None:
    base = {"model": "/a", "temperature": 0.0, "repeats": 3, "min_effect": 0.02,
            "options": {"vllm-server": {"start_timeout": 60, "request_timeout": 600}}}  # fmt: skip
    asked = {**base, "repeats": 5, "min_effect": 0.05,
             "options": {"vllm-server": {"start_timeout": 900, "request_timeout": 600}}}  # fmt: skip
    assert config_differences(base, asked) == []  # more repeats, another analysis: same runs
    asked = {**asked, "model": "/b", "temperature": 1.0}
    asked["options"] = {"vllm-server": {"start_timeout": 60, "request_timeout": 5}}
    assert config_differences(base, asked) == [
        "model",
        "options.vllm-server.request_timeout",
        "temperature",
    ]
    assert config_differences(base, {**base, "workload_fingerprint": "x"}) == [
        "workload_fingerprint"
    ]


def test_execute_reads_no_flags() -> None:
    """Every setting reaches the run through the plan: ``args`` appears only in run_main."""
    tree = ast.parse((Path(__file__).parents[1] / "harness" / "cli" / "run_command.py").read_text())
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name != "run_main":
            names = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
            assert "args" not in names, fn.name


@pytest.mark.slow
def test_resume_refuses_other_settings_and_continues_with_the_same(
    tmp_path: Path, tiny_pair, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert main([*RUN, "--repeats", "1", "--output-dir", str(out)]) == 0
    config = json.loads((out / "results.json").read_text())["config"]
    assert config["temperature"] == 0.0 and config["ignore_eos"] is False
    assert config["workload_fingerprint"] and config["num_prompts"] == 2
    capsys.readouterr()

    for flags, key in (
        (["--temperature", "1.0"], "temperature=0.0"),
        (["--model", "tiny:draft"], "model="),
        (["--ignore-eos"], "ignore_eos=false"),
        (["--max-new-tokens", "9"], "max_new_tokens=[8]"),
        (["--num-prompts", "3"], "num_prompts=2"),
    ):
        args = [*RUN, "--repeats", "1", "--resume", str(out), *flags]
        if "--model" in flags:
            args = args[2:]
        assert main(args) == 2, flags
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and err.startswith("error: resume: journal "), err
        assert key in err and "start a new --output-dir or use the same flags" in err, err

    # the same flags (more repeats are not another setting): r0 kept, only r1 runs
    journal = (out / "journal.jsonl").read_text()
    assert main([*RUN, "--repeats", "2", "--resume", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["status"] == "complete" and res["config"]["resume"] is True
    assert sorted(r["repeat"] for r in res["runs"]) == [0, 1]
    added = (out / "journal.jsonl").read_text()[len(journal) :]
    assert '"repeat": 0' not in added and '"repeat": 1' in added
    assert '"kind": "config"' not in added  # the recorded config stays the first one


def test_the_token_ids_flag_is_not_a_measured_setting() -> None:
    """--token-ids is what the run asked for; what an HTTP engine resolved it to sits in its
    options (measured): a journal from before the flag, or of in-process engines, resumes."""
    old = {"engines": ["hf"], "options": {}}
    assert config_differences(old, {**old, "token_ids": "auto"}) == []
    assert config_differences({**old, "token_ids": "auto"}, {**old, "token_ids": "on"}) == []
    http = {"engines": ["openai"], "options": {"openai": {"token_ids": False}}}
    assert config_differences(http, {**http, "options": {"openai": {"token_ids": True}}}) != []


def test_resume_takes_a_shipped_name_and_its_directory_as_one_model(tmp_path) -> None:
    """A remote-only run keeps the default name "embedded" (nothing assembled); journals written
    before that hold its directory, and no count_with_model option: still one configuration."""
    import json
    from types import SimpleNamespace

    import pytest

    from harness.cli.preflight import check_resume
    from harness.flags.options import UsageError
    from harness.models.registry import resolve_model

    old = {"model": resolve_model("embedded"), "options": {"openai": {"count_with_model": True}}}
    (tmp_path / "journal.jsonl").write_text(json.dumps({"kind": "config", "config": old}) + "\n")

    def plan(config: dict) -> SimpleNamespace:
        return SimpleNamespace(resume=True, to_json=lambda: config)

    check_resume(plan({"model": "embedded", "options": {"openai": {}}}), tmp_path)  # no error
    with pytest.raises(UsageError, match="model="):
        check_resume(plan({"model": "tiny", "options": {"openai": {}}}), tmp_path)


@pytest.mark.slow
def test_a_journal_from_before_resolved_dtype_resumes(tmp_path: Path, tiny_pair, capsys) -> None:
    """Journals are public: one written before ``resolved_dtype`` (and ``max_model_len``) were
    recorded is read as its ``dtype`` resolves now (float32 on CPU, what it loaded) and resumes;
    another --dtype is still another setting."""
    out = tmp_path / "run"
    assert main([*RUN, "--repeats", "1", "--output-dir", str(out)]) == 0
    path = out / "journal.jsonl"
    first, *rest = path.read_text().splitlines(keepends=True)
    entry = json.loads(first)
    assert entry["kind"] == "config" and entry["config"]["resolved_dtype"] == "float32"
    for key in ("resolved_dtype", "max_model_len"):  # the old form: the keys are absent
        del entry["config"][key]
    path.write_text(json.dumps(entry) + "\n" + "".join(rest))
    capsys.readouterr()

    assert main([*RUN, "--repeats", "1", "--resume", str(out), "--dtype", "bfloat16"]) == 2
    err = capsys.readouterr().err.strip()
    assert "with dtype=auto, resolved_dtype=float32, this run asks dtype=bfloat16" in err, err
    assert main([*RUN, "--repeats", "2", "--resume", str(out)]) == 0, capsys.readouterr().err
    res = json.loads((out / "results.json").read_text())
    assert res["status"] == "complete" and sorted(r["repeat"] for r in res["runs"]) == [0, 1]
    assert res["config"]["resolved_dtype"] == "float32"
    assert "resolved_dtype" not in path.read_text().splitlines()[0]  # read, never rewritten

"""Every `bin/harness` / `python -m harness` command of README.md and docs/*.md goes through the
checks a run makes before it loads anything: the flags parsed, the plan built, models resolved,
vocabularies and lengths checked, the memory plan (``--dry-run``: harness/cli/run_command.py
stops right after them); a `tune` command through tune's own front (harness/cli/tune_command.py:
the plan, models, the methods that apply, each arm's engine config validated), stopped where its
budget is made, before any engine starts. tests/test_docs.py only parses them.

What cannot be checked offline is set aside, per command, by the substitutions below: a hub model
(Llama, Qwen, a hub EAGLE-3 head) is planned with HF_HUB_OFFLINE=1 (its size unknown: the memory
plan says "not checked"); a remote server (--base-url HOST, --ray-address HEAD) is never reached
(``--dry-run`` skips the server check and client workers start only in a run); a user's own file
(prompts.jsonl, mine.jsonl, results/<ts>/speculative_config.json) is stood in for by one written
here. `report`, `compare` and `models` read result files or list models: not planned.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.inprocess import run_harness
from tests.test_docs import DOCS, README, SUBCOMMANDS, harness_commands

ROOT = Path(__file__).resolve().parents[1]
USER_FILES = ("prompts.jsonl", "mine.jsonl")  # a user's own workload: the tiny one stands in
USER_SPEC = "@results/<ts>/speculative_config.json"  # tune's answer: an ngram schedule stands in
STAND_IN_SPEC = {"method": "ngram", "prompt_lookup_max": 3, "num_speculative_tokens": 3}


def documented() -> list[tuple[str, list[str]]]:
    return [
        (p.name, args)
        for p in [README, *DOCS]
        for args in harness_commands(p.read_text())
        if not (args[:1] and args[0] in SUBCOMMANDS)
    ]


COMMANDS = documented()


def offline(args: list[str], tmp: Path) -> list[str]:
    """``args`` with a user's files replaced by stand-ins in ``tmp`` and the output in ``tmp``."""
    out = []
    for word in args:
        if word in USER_FILES:
            word = str(tmp / word)
            Path(word).write_text((ROOT / "workloads/data/tiny.jsonl").read_text())
        elif word == USER_SPEC:
            (tmp / "speculative_config.json").write_text(json.dumps(STAND_IN_SPEC))
            word = f"@{tmp / 'speculative_config.json'}"
        out.append(word)
    return [*out, "--output-dir", str(tmp / "out")]


class Planned(Exception):
    """Raised where tune makes its budget: its front passed, no engine started."""


@pytest.mark.parametrize(
    "doc,args", COMMANDS, ids=[f"{d}:{' '.join(a)[:60]}" for d, a in COMMANDS]
)  # fmt: skip
def test_every_documented_command_is_planned_before_loading(doc, args, tmp_path, monkeypatch,
                                                            capsys):  # fmt: skip
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # harness.sizing.hub reads it at call time
    argv = offline(args, tmp_path)
    if argv[:1] == ["tune"]:
        from harness.cli import tune_command
        from harness.tune.budget import TimeBudget

        class Stop(TimeBudget):
            def __post_init__(self) -> None:
                raise Planned

        monkeypatch.setattr(tune_command, "TimeBudget", Stop)
        try:
            ran = run_harness(argv, capsys)
        except Planned:
            return
        pytest.fail(f"{doc}: `harness {' '.join(args)}` stopped before its budget: "
                    f"exit {ran.returncode}: {ran.stderr[-2000:]}")  # fmt: skip
    if "--dry-run" not in argv:
        argv.append("--dry-run")
    ran = run_harness(argv, capsys)
    assert ran.returncode == 0, f"{doc}: `harness {' '.join(args)}`: {ran.stderr[-2000:]}"
    assert ran.stdout.startswith("plan (dry run: nothing loaded)"), ran.stdout[:500]
    assert not (tmp_path / "out").exists()  # a dry run writes nothing

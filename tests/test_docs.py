"""The documents say what the code does: every `bin/harness` / `python -m harness` command in the
README's shell blocks parses with the real parser (tune's for `tune`), every relative link of
README.md and docs/*.md resolves (file and #anchor), the README stays a guide (<= 250 lines, no
measurement log), and `--help` stays short with every default shown."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
SUBCOMMANDS = ("report", "compare", "models")
# Flags the README's GPU quick-start uses from issue 26 ("--dry-run") before that work is merged.
# A flag listed here that the parser now has fails the test: drop it from this set then.
PENDING: set[str] = set()


def shell_blocks(text: str) -> list[str]:
    return re.findall(r"^```(?:bash|sh|shell|console)\n(.*?)^```", text, re.M | re.S)


def harness_commands(text: str) -> list[list[str]]:
    """Each `bin/harness ...` / `python -m harness ...` of the shell blocks, continuation lines
    joined, comments dropped, as its argument list (without the program)."""
    out = []
    for block in shell_blocks(text):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["bin/harness"]:
                out.append(words[1:])
            elif words[:3] == ["python", "-m", "harness"]:
                out.append(words[3:])
    return out


def check_command(args: list[str]) -> None:
    """Parse ``args`` as the harness would; PENDING flags (and their values) are set aside."""
    from harness.cli.tune_command import parser as tune_parser
    from harness.flags.parser import build_parser

    if args[:1] and args[0] in SUBCOMMANDS:
        return  # their parsers are built inside the subcommand; the name is what can go stale
    parser = tune_parser() if args[:1] == ["tune"] else build_parser()
    args = args[1:] if args[:1] == ["tune"] else args
    known = {o for a in parser._actions for o in a.option_strings}
    for flag in PENDING & known:
        pytest.fail(f"{flag} is in the parser now: remove it from PENDING in tests/test_docs.py")
    kept, skipping = [], False
    for word in args:
        if word.startswith("--"):
            skipping = word in PENDING
        if not skipping:
            kept.append(word)
    try:
        parser.parse_args(kept)
    except SystemExit as exc:  # --help prints and exits 0
        assert exc.code == 0, f"{args}: exit {exc.code}"


def test_readme_commands_parse_with_the_real_parser(capsys):
    commands = harness_commands(README.read_text())
    assert len(commands) >= 5, commands  # the two commands, the quick-start, a server, tune...
    for path in [README, *DOCS]:  # the docs' shell blocks too
        for args in harness_commands(path.read_text()):
            try:
                check_command(args)
            except Exception as exc:  # a UsageError names the flag
                pytest.fail(f"{path.name}: `harness {' '.join(args)}`: {exc}")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        m = None if in_code else re.match(r"#{1,6} (.*)", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(path: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked here
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            bad.append(f"{path.name}: {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{path.name}: {target}: no heading #{anchor} in {dest.name}")
    return bad


def test_every_relative_link_resolves():
    assert DOCS, "docs/ is empty"
    bad = [b for path in [README, *DOCS] for b in broken_links(path)]
    assert not bad, "\n".join(bad)


def test_slug_follows_github():
    assert slug("From `vllm serve`: engine arguments and GPUs") == (
        "from-vllm-serve-engine-arguments-and-gpus"
    )
    assert slug("Caches and A/A") == "caches-and-aa"
    assert slug("SmolLM2's speculators retrained") == "smollm2s-speculators-retrained"


def test_readme_is_a_guide_without_measurement_logs():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    assert "UTC" not in text and "since commit" not in text.lower()
    hashes = [h for h in re.findall(r"\b[0-9a-f]{7,40}\b", text) if re.search(r"\d", h)]
    assert not [h for h in hashes if re.search(r"[a-f]", h)], hashes
    assert len(re.findall(r"\b20\d\d-\d\d-\d\d\b", text)) <= 1, "one run's date, once"
    assert "<!-- ANSWER BLOCK" in text


def run_help(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "harness", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200", "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def entries(text: str) -> dict[str, str]:
    """``--flag`` -> its help entry, from argparse's full help."""
    out: dict[str, str] = {}
    flag = None
    for line in text.splitlines():
        m = re.match(r"  (--[\w-]+)", line)
        if m and m.group(1) in out:  # a group's description that opens with a flag's name
            flag = None
        elif m:
            flag = m.group(1)
            out[flag] = line
        elif flag and line.startswith("      "):
            out[flag] += " " + line.strip()
        else:
            flag = None
    return out


def test_help_is_short_and_every_default_is_shown():
    from harness.flags.parser import build_parser

    short = run_help("--help")
    assert len(short.splitlines()) <= 150, len(short.splitlines())
    parser = build_parser()
    full = entries(run_help("--help-all"))
    for action in parser._actions:
        if not action.option_strings or action.help == "==SUPPRESS==":
            continue
        flag = action.option_strings[0]
        assert flag in short, f"{flag} missing from --help"  # every flag named at least
        if action.nargs != 0 and flag not in ("-h",):  # a switch is off unless given
            assert re.search(r"default", full[flag]), f"{flag}: no default in --help-all"


def test_tune_help_shows_only_what_tune_uses():
    from harness.cli.tune_command import NOT_FOR_TUNE

    text = run_help("tune", "--help")
    assert len(text.splitlines()) <= 150
    assert "--tune-k" in text and "--budget-min" in text
    shown = set(re.findall(r"--[\w-]+", text))
    assert not shown & set(NOT_FOR_TUNE), shown & set(NOT_FOR_TUNE)


def test_one_list_syntax_spaces_or_commas():
    from harness.flags.options import UsageError
    from harness.flags.parser import build_parser

    p = build_parser()
    a = p.parse_args(["--concurrency", "1,4", "16", "--engine", "hf", "vllm", "--spec"])
    assert a.concurrency == [1, 4, 16] and a.engine == "hf,vllm" and a.spec == "all"
    b = p.parse_args(["--spec", "ngram", "draft_model", "--metadata", "note=a,b"])
    assert b.spec == "ngram,draft_model" and b.metadata == [("note", "a,b")]
    c = p.parse_args(["--percentile-metrics", "ttft", "tpot", "--metric-percentiles", "50,99.9"])
    assert c.percentile_metrics == ("ttft", "tpot") and c.metric_percentiles == (50.0, 99.9)
    from harness.flags.options import split_top

    assert split_top('vllm={"a": 1, "b": [2, 3]},hf={"c": "x,y"}') == [
        'vllm={"a": 1, "b": [2, 3]}',
        'hf={"c": "x,y"}',
    ]
    with pytest.raises(UsageError, match="--concurrency/--max-concurrency: 0 must be > 0"):
        p.parse_args(["--concurrency", "1,0"])


def test_the_readme_prompt_line_is_a_workload(tmp_path):
    """The quick-start's "your prompts as one JSONL line" reads as a native workload."""
    from workloads import load_workload

    blocks = re.findall(r"```json\n(.*?)\n\s*```", README.read_text(), re.S)
    assert blocks, "no JSONL example in the README"
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(b.strip() for b in blocks) + "\n")
    workload = load_workload(str(path))
    assert workload.requests and workload.requests[0].max_new_tokens == 256

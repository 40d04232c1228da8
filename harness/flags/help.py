"""Two levels of ``--help``: the flags a first run needs, in full, and every other group as one
line naming its flags (``-h``/``--help``); every flag in full (``--help-all``). Both show each
flag's default.

The short level is computed from the parser's groups, so a flag added to any group later is
listed there (and in full under ``--help-all``) without editing this module; only the first-run
list is written down here, and a name in it that no parser defines is skipped.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

from harness.flags.options import UsageError

# The flags a first run needs, in the order a newcomer meets them (README: the GPU quick-start).
FIRST_RUN = (
    "--engine",
    "--model",
    "--spec",
    "--spec-config",
    "--draft-model",
    "--workload",
    "--num-prompts",
    "--mode",
    "--concurrency",
    "--max-new-tokens",
    "--repeats",
    "--output-dir",
    "--base-url",
    "--dry-run",
)
WIDTH = 100
EPILOG = """\
subcommands:
  python -m harness report results.json        re-render summary.md from a results file
  python -m harness compare A.json B.json ...  runs of several files side by side
  python -m harness models build|path ...      the shipped models (SmolLM2 family, tiny pair)
  python -m harness tune --engine vllm         best (method, K) per load -> speculative_config

examples:
  python -m harness --engine vllm --spec                      the main job (SmolLM2 family)
  python -m harness --engine hf --spec --model tiny --workload tiny   seconds: the test pair
  python -m harness --engine hf,vllm --spec ngram --mode latency --num-prompts 8
  python -m harness --engine vllm --spec --concurrency 1 4 16 --max-new-tokens 50 200
  python -m harness --engine openai --base-url http://127.0.0.1:8000/v1 --concurrency 32
  python -m harness --engine vllm --dataset-name random --random-input-len 256 --random-output-len 32 --max-concurrency 4 --num-prompts 64
"""
SAYS_DEFAULT = re.compile(r"\bdefault[ :)]")  # "default 4", "default: x", "'embedded' (default)"


class DefaultsFormatter(argparse.RawDescriptionHelpFormatter):
    """Appends ``(default: X)`` to every flag that takes a value and whose help does not say its
    default already; a switch (no value) is off unless given, as the usage line says."""

    def __init__(self, prog: str, **kw: Any) -> None:
        super().__init__(prog, width=WIDTH, max_help_position=32, **kw)

    def _get_help_string(self, action: argparse.Action) -> str:  # argparse's documented hook
        text = action.help or ""
        if (
            SAYS_DEFAULT.search(text)
            or action.default is argparse.SUPPRESS
            or not action.option_strings
            or action.nargs == 0
        ):
            return text
        return f"{text} (default: {shown(action.default)})".strip()

    def _format_action(self, action: argparse.Action) -> str:
        """A flag without help still gets its default (argparse skips an empty help)."""
        if not action.help and action.option_strings and action.nargs != 0:
            action = copy.copy(action)
            action.help = f"(default: {shown(action.default)})"
        return super()._format_action(action)

    def _format_args(self, action: argparse.Action, default_metavar: str) -> str:
        """``N ...`` for a list, not argparse's ``N [N ...]`` (the lines stay short)."""
        if action.nargs in ("+", "*"):
            (metavar,) = self._metavar_formatter(action, default_metavar)(1)
            return f"{metavar} ..." if action.nargs == "+" else f"[{metavar} ...]"
        return super()._format_args(action, default_metavar)


NOTE = (
    "Switches are off unless given; a list flag takes its items space- or comma-separated "
    "(--concurrency 1 4 16 = --concurrency 1,4,16). --help-all: every flag in full."
)


def shown(value: Any) -> str:
    if value is None or value == [] or value == ():
        return "none"
    if isinstance(value, list | tuple):
        value = " ".join(str(v) for v in value)
    return str(value).replace("%", "%%")


# argparse has no public accessor for a parser's actions and groups: these three read them.
def actions(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return list(p._actions)  # noqa: SLF001 - argparse has no public list of a parser's actions


def parser_groups(p: argparse.ArgumentParser) -> list[Any]:
    return list(p._action_groups)  # noqa: SLF001 - argparse has no public list of its groups


def members(group: Any) -> list[argparse.Action]:
    return list(group._group_actions)  # noqa: SLF001 - argparse has no public list of a group's


def _first(action: argparse.Action, first: Sequence[str]) -> bool:
    return any(o in first for o in action.option_strings)


def brief(parser: argparse.ArgumentParser) -> str:
    """The short help: usage, description, the first-run flags in full, every other group in one
    line (its title and flags), groups named in ``parser.full_groups`` in full, the epilog."""
    first = getattr(parser, "first_run", FIRST_RUN)
    full_groups = getattr(parser, "full_groups", ())
    fmt = parser.formatter_class(prog=parser.prog)
    fmt.add_usage(f"{parser.prog} [flags]", [], [])
    for text in (parser.description, NOTE):
        fmt.add_text(textwrap.fill(text or "", width=WIDTH))
    groups = [(g.title, members(g)) for g in parser_groups(parser)]
    visible = [a for _, acts in groups for a in acts if a.help is not argparse.SUPPRESS]
    fmt.start_section("flags for a first run")
    by_name = {o: a for a in visible for o in a.option_strings}
    fmt.add_arguments([by_name[f] for f in first if f in by_name])
    fmt.end_section()
    for title, acts in groups:
        if title not in full_groups:
            continue
        fmt.start_section(title)
        fmt.add_arguments([a for a in acts if a.help is not argparse.SUPPRESS])
        fmt.end_section()
    lines = []
    for title, acts in groups:
        rest = [
            "/".join(a.option_strings)  # aliases too: --warmup/--num-warmups
            for a in acts
            if a in visible
            and not _first(a, first)
            and a.option_strings
            and not isinstance(a, BriefHelp)
        ]
        if rest and title not in full_groups:
            lines.append(
                textwrap.fill(
                    f"{title}: " + " ".join(rest),
                    width=WIDTH,
                    initial_indent="  ",
                    subsequent_indent="      ",
                    break_on_hyphens=False,
                )
            )
    more = "more flags (--help-all shows each in full):\n" + "\n".join(lines) + "\n"
    return fmt.format_help() + "\n" + more + ("\n" + parser.epilog if parser.epilog else "")


class BriefHelp(argparse.Action):
    def __init__(self, option_strings: Sequence[str], dest: str, **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kw: Any) -> None:
        sys.stdout.write(brief(parser))
        parser.exit()


class FullHelp(BriefHelp):
    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kw: Any) -> None:
        parser.print_help()
        parser.exit()


def add_help(p: argparse.ArgumentParser) -> None:
    """``-h``/``--help`` (the short level) and ``--help-all`` (every flag) on a parser built
    with ``add_help=False`` and ``formatter_class=DefaultsFormatter``."""
    p.add_argument("-h", "--help", action=BriefHelp, help="the flags a first run needs; exit")
    p.add_argument("--help-all", action=FullHelp, help="every flag in full; exit")


def hide(p: argparse.ArgumentParser, flags: Sequence[str]) -> None:
    """Leave ``flags`` out of both levels of help (a subcommand that does not use them)."""
    for action in actions(p):
        if any(o in flags for o in action.option_strings):
            action.help = argparse.SUPPRESS


def refuse_given(
    p: argparse.ArgumentParser, args: argparse.Namespace, flags: Sequence[str], command: str
) -> None:
    """One line for a flag of ``flags`` given with a value other than its default: refused,
    not silently ignored."""
    for action in actions(p):
        flag = next((o for o in action.option_strings if o in flags), None)
        if flag and getattr(args, action.dest, action.default) != action.default:
            raise UsageError(
                f"{command}: {flag} is a flag of a normal run; {command} decides it itself "
                f"(python -m harness {command} --help)"
            )

"""Command line: `python -m harness [run flags]`, `... report`, `... compare`, `... models`,
`... tune`: dispatch to the subcommand; one-line errors exit 2."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from harness.cli.options import UsageError


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "tune":
            from harness.cli import tune_command

            return tune_command.main(argv[1:])
        if argv and argv[0] in ("report", "compare", "models"):
            from harness.cli import commands

            return commands.main(argv)
        from harness.cli.flags import build_parser

        args = build_parser().parse_args(argv)
        from harness.cli.run_command import run_main

        return run_main(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `python -m harness report ... | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0

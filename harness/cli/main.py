"""Command line: `python -m harness [run flags]`, `... report`, `... compare`, `... models`,
`... tune`: dispatch to the subcommand; one-line errors exit 2."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from harness.flags.options import UsageError


class Terminated(BaseException):
    """SIGTERM before a run's own handler took over (while flags, files and models are read)."""


def _terminated(signum: int, frame: Any) -> None:
    raise Terminated


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    before = signal.getsignal(signal.SIGTERM)
    in_main = threading.current_thread() is threading.main_thread()
    if in_main:  # SIGTERM as Ctrl-C until a run's own handlers take both (run_command)
        signal.signal(signal.SIGTERM, _terminated)
    try:
        if argv and argv[0] == "tune":
            from harness.cli import tune_command

            return tune_command.main(argv[1:])
        if argv and argv[0] in ("report", "compare", "models"):
            from harness.cli import commands

            return commands.main(argv)
        from harness.flags.parser import build_parser

        args = build_parser().parse_args(argv)
        from harness.cli.run_command import run_main

        return run_main(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `python -m harness report ... | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (KeyboardInterrupt, Terminated) as exc:  # e.g. while models load: nothing ran yet
        name, code = ("SIGINT", 130) if isinstance(exc, KeyboardInterrupt) else ("SIGTERM", 143)
        print(f"error: interrupted by {name}", file=sys.stderr)
        return code
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, before)

"""The harness's command line run inside the test process: ``harness.cli.main.main``, which
``python -m harness`` calls. A fresh interpreter per run would import torch and vLLM again, ~10 s
a run on 2 cores; the module's own ``__main__`` path keeps its subprocess tests
(tests/test_app_hf.py, tests/test_cli_errors.py). What a run sets in the environment (``--quiet``:
vLLM's log level) is undone after it, as it would end with its process.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Ran:
    """What ``subprocess.run(..., capture_output=True, text=True)`` would have returned."""

    returncode: int
    stdout: str
    stderr: str


def run_harness(args: Sequence[str], capsys: pytest.CaptureFixture[str]) -> Ran:
    """``python -m harness ARGS``, from the repository root, in this process."""
    from harness.cli.main import main

    capsys.readouterr()  # what came before is not this run's
    env, cwd = dict(os.environ), os.getcwd()
    os.chdir(ROOT)
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code if isinstance(exc.code, int) else 2
    finally:
        os.chdir(cwd)
        for key in set(os.environ) - set(env):
            del os.environ[key]
        for key, value in env.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
    out, err = capsys.readouterr()
    return Ran(code, out, err)

"""Runs ``uv pip ARGS`` with pip's own configuration: ``python3 bin/uv_pip.py UV install ...``.

uv reads no pip.conf and no PIP_* variables, but a machine's package sources often live there
(extra indexes, find-links holding a local ``torch+cpu`` wheel, a constraints file), so without
them uv would resolve against other packages than pip. ``pip config list`` prints the merged
configuration (files, then PIP_* variables); this translates the options that choose packages
into uv's flags and resolves like pip does across indexes (best version over all of them).
Standard library only: bin/setup runs it with the system Python before the venv exists.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

# pip option -> uv flag, for options that may hold several whitespace-separated values
LIST_FLAGS = {
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
    "trusted-host": "--allow-insecure-host",
}
TRUE = {"1", "true", "yes", "on"}
# where a value comes from, strongest first: PIP_* variables, then `install`, then `global`
SECTIONS = (":env:", "install", "global")


def pip_config(text: str) -> dict[str, str]:
    """``pip config list`` output (``section.name='value'`` lines) -> {name: value} with pip's
    precedence."""
    found: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        key, sep, raw = line.partition("=")
        section, dot, name = key.rpartition(".")
        if not sep or not dot or section not in SECTIONS:
            continue
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw.strip("'\"")
        found.setdefault(name, {})[section] = str(value)
    return {name: next(by[s] for s in SECTIONS if s in by) for name, by in found.items()}


def uv_flags(cfg: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """(uv pip flags, environment variables) that select the packages pip would select."""
    flags = ["--index-strategy", "unsafe-best-match"]  # pip takes the best version of any index
    env: dict[str, str] = {}
    if cfg.get("no-index", "").lower() in TRUE:
        flags.append("--no-index")
    if cfg.get("index-url"):
        flags += ["--index-url", cfg["index-url"]]
    for name, flag in LIST_FLAGS.items():
        for value in cfg.get(name, "").split():
            flags += [flag, value]
    if cfg.get("cert"):
        env["SSL_CERT_FILE"] = cfg["cert"]  # uv verifies with these roots instead of its own
    if cfg.get("timeout") or cfg.get("default-timeout"):
        env["UV_HTTP_TIMEOUT"] = cfg.get("timeout") or cfg["default-timeout"]
    return flags, env


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: uv_pip.py UV PIP_SUBCOMMAND [ARGS...]", file=sys.stderr)
        return 2
    uv, args = argv[0], argv[1:]
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
    )
    flags, env = uv_flags(pip_config(listed.stdout if listed.returncode == 0 else ""))
    for k, v in env.items():
        os.environ.setdefault(k, v)
    cmd = [uv, "pip", args[0], *flags, *args[1:]]
    return subprocess.run(cmd).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Subcommands that read saved results: `report`, `compare`; and `models`."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.cli import UsageError, _Parser


def load_results(path: str) -> dict[str, Any]:
    p = Path(path)
    if p.is_dir():
        p = p / "results.json"
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{p}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{p}: not a results file (invalid JSON: {exc})") from None
    if not isinstance(data, dict) or "schema_version" not in data or "runs" not in data:
        raise UsageError(f"{p}: not a results file (no schema_version/runs)")
    return data


def report(argv: Sequence[str]) -> int:
    from harness.report import render

    p = _Parser(prog="python -m harness report")
    p.add_argument("results", help="results.json (or the directory holding it)")
    p.add_argument("--output", default=None, help="also write the markdown to this file")
    args = p.parse_args(argv)
    md = render(load_results(args.results))
    if args.output:
        Path(args.output).write_text(md)
    print(md)
    return 0


def compare(argv: Sequence[str]) -> int:
    """Runs of several results files side by side: every file's runs joined, then compared."""
    from harness.analysis import comparisons
    from harness.report import render
    from harness.results import Run

    p = _Parser(prog="python -m harness compare")
    p.add_argument("results", nargs="+", help="two or more results.json files")
    p.add_argument("--force", action="store_true", help="compare even across different prompt sets")
    p.add_argument("--min-effect", type=float, default=0.02)
    args = p.parse_args(argv)
    if len(args.results) < 2:
        raise UsageError("compare: give at least two results files")
    files = [load_results(f) for f in args.results]
    prints = {f.get("workload", {}).get("fingerprint") for f in files}
    if len(prints) > 1 and not args.force:
        names = ", ".join(
            f"{a} ({f.get('workload', {}).get('name')}, {f.get('workload', {}).get('num_requests')} prompts)"
            for a, f in zip(args.results, files)
        )
        raise UsageError(
            f"compare: the files ran different prompt sets ({names}); pass --force to compare anyway"
        )
    runs_json = []
    for i, (name, f) in enumerate(zip(args.results, files)):
        tag = Path(name).parent.name or f"file{i}"
        for r in f["runs"]:
            runs_json.append({**r, "engine": f"{r['engine']}@{tag}"})
    runs = [Run.from_json(r) for r in runs_json]
    merged = {
        **files[0],
        "runs": runs_json,
        "comparisons": comparisons(runs, min_effect=args.min_effect),
    }
    print(render(merged))
    return 0


def main(argv: Sequence[str]) -> int:
    cmd, rest = argv[0], list(argv[1:])
    try:
        if cmd == "report":
            return report(rest)
        if cmd == "compare":
            return compare(rest)
        from harness import models

        return models.main(rest)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

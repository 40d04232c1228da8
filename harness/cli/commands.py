"""Subcommands that read saved results: `report`, `compare`; and `models`."""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.core.results import SCHEMA_VERSION, with_config
from harness.flags.options import Parser, UsageError, prices
from harness.run.journal import atomic_write


def load_results(path: str, records: bool = False) -> dict[str, Any]:
    """A harness results.json, or a ``vllm bench serve --save-result`` file turned into one;
    with ``records``, each run's records in it (schema 4: read from its records file)."""
    data = _load(path)
    if not records or not data.get("records_file"):
        return data
    from harness.core.records_file import with_records

    base = (Path(path) if Path(path).is_dir() else Path(path).parent).resolve()
    try:
        return with_records(data, base)
    except (OSError, ValueError) as exc:  # pyarrow's errors are OSError or ValueError
        raise UsageError(f"{base / data['records_file']}: records unreadable: {exc}") from None


def _load(path: str) -> dict[str, Any]:
    from harness.report.vllm_json import read_vllm_file, to_results

    p = Path(path)
    if p.is_dir():
        p = p / "results.json"
    try:
        text = p.read_text(encoding="utf-8")
        data = json.loads(text)
    except FileNotFoundError:
        raise UsageError(f"{p}: no such file") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"{p}: not a results file (not UTF-8: {exc.reason})") from None
    except json.JSONDecodeError as exc:
        items = read_vllm_file(text)  # --append-result: one object a line
        if items is None:
            raise UsageError(f"{p}: not a results file (invalid JSON: {exc})") from None
        return upgrade(to_results(items, str(p)))
    items = read_vllm_file(text)
    if items is not None:
        if not all(d.get("start_times") and d.get("latencies") for d in items):
            raise UsageError(
                f"{p}: a vllm bench serve result without per-request data; rerun it with "
                "--save-detailed (the harness pairs requests, not aggregates)"
            )
        return upgrade(to_results(items, str(p)))
    if not isinstance(data, dict) or "schema_version" not in data or "runs" not in data:
        raise UsageError(
            f"{p}: not a results file (no schema_version/runs, nor vllm bench serve's "
            "completed/duration/output_throughput)"
        )
    version = data["schema_version"]
    if version == 1:  # before the analysis was stored: derive it once, here, from the runs
        return upgrade(data)
    if version == 2:  # before runs named their model and temperature: the config's
        config = data.get("config") or {}
        runs = [with_config(r, config) for r in data["runs"]]
        return with_reading({**data, "runs": runs, "schema_version": SCHEMA_VERSION})
    if version == 3:  # records in the runs (no records file): read as they are
        return with_reading(data)
    if version != SCHEMA_VERSION:
        raise UsageError(
            f"{p}: results schema {version!r}; this version reads 1 to {SCHEMA_VERSION}"
        )
    return with_reading(data)


def with_reading(data: dict[str, Any]) -> dict[str, Any]:
    """A file written before the answer block and the stored distributions, with both derived
    from its stored analysis and runs; one whose answer block is older than ``answer.blocks``
    (the title's n) and the stops' ``answer``, with the block derived again (a file that has
    all is returned as it is)."""
    from harness.analysis.answer import answer_block, reading
    from harness.core.results import Run

    answer = data.get("answer")
    stops_read = all("answer" in s for s in (answer or {}).get("stops", []))
    if answer is not None and "distributions" in data and "blocks" in answer and stops_read:
        return data
    runs = [Run.from_json(r) for r in data.get("runs", [])]
    if "distributions" in data:
        return {**data, "answer": answer_block(data, runs)}
    return {**data, **reading(data, runs)}


def upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """A schema-1 file (runs and comparisons, no stored analysis) with the analysis derived
    from its runs. Its temperature is read from the recorded command line (default 0)."""
    from harness.analysis.derived import KEYS, analyze
    from harness.core.results import Run

    config = data.get("config") or {}
    config = {"temperature": _argv_temperature(data), **config}
    data = {**data, "runs": [with_config(r, config) for r in data["runs"]]}
    runs = [Run.from_json(r) for r in data["runs"]]
    derived = analyze(
        runs,
        min_effect=config.get("min_effect", 0.02),
        seed=config.get("seed", 0),
        temperature=config["temperature"],
        goodput=config.get("goodput"),
        bound=data.get("speed_of_light"),
        categories=(data.get("workload") or {}).get("categories"),
    )
    rest = {k: v for k, v in data.items() if k not in KEYS}
    return {
        **rest,
        **derived,
        "config": config,
        "schema_version": SCHEMA_VERSION,
        "upgraded_from": 1,
    }


def _argv_temperature(data: dict[str, Any]) -> float | None:
    """--temperature from the recorded command line: 0 (the default) when absent."""
    argv = [str(a) for a in (data.get("environment") or {}).get("argv") or []]
    for i, a in enumerate(argv):
        value = a.split("=", 1)[1] if a.startswith("--temperature=") else None
        if a == "--temperature" and i + 1 < len(argv):
            value = argv[i + 1]
        if value is not None:
            try:
                return float(value)
            except ValueError:
                return None
    return 0.0 if argv else None


def _results_dir(path: str) -> Path:
    p = Path(path)
    return p if p.is_dir() else p.parent


def report(argv: Sequence[str]) -> int:
    """summary.md, summary.csv, report.html and the plots regenerated from a results file."""
    from harness.report.views import write_views

    p = Parser(prog="python -m harness report")
    p.add_argument("results", help="results.json (or the directory holding it)")
    p.add_argument("--output", default=None, help="also write the markdown to this file")
    p.add_argument(
        "--output-dir",
        default=None,
        help="where summary.md, summary.csv, report.html and the plots go "
        "(default: the directory holding the results file)",
    )
    p.add_argument("--no-plots", action="store_true", help="skip the plots (faster)")
    args = p.parse_args(argv)
    results = load_results(args.results)
    out = Path(args.output_dir) if args.output_dir else _results_dir(args.results)
    out.mkdir(parents=True, exist_ok=True)
    md = write_views(results, out, plots=not args.no_plots, write=atomic_write)
    if args.output:
        Path(args.output).write_text(md)
    print(md)
    print(f"[harness] wrote {out / 'summary.md'} and {out / 'report.html'}", file=sys.stderr)
    return 0


def compare(argv: Sequence[str]) -> int:
    """Runs of several results files side by side: every file's runs joined, then compared."""
    from harness.analysis.derived import KEYS, analyze
    from harness.core.results import Run
    from harness.report.views import write_views

    p = Parser(prog="python -m harness compare")
    p.add_argument("results", nargs="+", help="two or more results.json files")
    p.add_argument("--force", action="store_true", help="compare even across different prompt sets")
    p.add_argument("--min-effect", type=float, default=0.02)
    p.add_argument("--json", default=None, help="also write the joined runs and their analysis "
                   "to this file (report reads it)")  # fmt: skip
    p.add_argument("--output-dir", default=None, help="where summary.md, report.html and the "
                   "plots of the comparison go (default: beside --json, else "
                   "compare-A-B/ beside the first file's directory)")  # fmt: skip
    p.add_argument("--no-plots", action="store_true", help="skip the plots (faster)")
    p.add_argument("--price-per-hour", nargs="+", default=None, metavar="USD|ENGINE=USD",
                   help="price the runs (default: each file's own --price-per-hour)")  # fmt: skip
    args = p.parse_args(argv)
    if len(args.results) < 2:
        raise UsageError("compare: give at least two results files")
    files = [load_results(f, records=True) for f in args.results]
    sessions = [_file_session(f) for f in files]
    _align_vllm_runs(files)
    prints = {f.get("workload", {}).get("fingerprint") for f in files} - {None}
    if len(prints) > 1 and not args.force:
        names = ", ".join(
            f"{a} ({f.get('workload', {}).get('name')}, {f.get('workload', {}).get('num_requests')} prompts)"
            for a, f in zip(args.results, files)
        )
        raise UsageError(
            f"compare: the files ran different prompt sets ({names}); pass --force to compare anyway"
        )
    runs_json = []
    for tag, f, session in zip(_tags(args.results), files, sessions):
        for r in f["runs"]:
            tagged = {"engine": f"{r['engine']}@{tag}", "session": r.get("session") or session}
            runs_json.append({**r, **tagged})
    runs = [Run.from_json(r) for r in runs_json]
    setups = sorted({(str(r.cell.model), str(r.cell.temperature)) for r in runs})
    if len(setups) > 1:
        said = "; ".join(f"model {m}, temperature {t}" for m, t in setups)
        print(
            f"[harness] compare: the runs differ in model or temperature ({said}): "
            "only runs that share both are paired",
            file=sys.stderr,
        )
    config = files[0].get("config") or {}
    temps = {f.get("config", {}).get("temperature") for f in files}
    derived = analyze(
        runs,
        min_effect=args.min_effect,
        seed=config.get("seed", 0),
        temperature=temps.pop() if len(temps) == 1 else None,
        goodput=config.get("goodput"),
        bound={k: v for k, v in (files[0].get("speed_of_light") or {}).items() if k != "reached"},
        percentiles=config.get("metric_percentiles") or (50, 90, 99),
        categories=(files[0].get("workload") or {}).get("categories"),
        stopping=(files[0].get("design") or {}).get("stopping") if len(files) == 1 else None,
        prices=_prices(args.price_per_hour, files, _tags(args.results), runs),
    )
    drop = {"upgraded_from", "records_file"}  # the joined runs hold their records
    rest = {k: v for k, v in files[0].items() if k not in KEYS and k not in drop}
    joined = {**rest, "runs": runs_json, **derived}
    for key in ("replay", "turns"):  # each file's own trace checks and turn tables, tagged
        joined[key] = [
            {**e, "name": e["name"].replace("/", f"@{tag}/", 1)}
            for tag, f in zip(_tags(args.results), files)
            for e in f.get(key) or []
        ]
    if args.json:
        atomic_write(Path(args.json), json.dumps(joined, indent=1))
    out = Path(args.output_dir) if args.output_dir else _compare_dir(args.results, args.json)
    out.mkdir(parents=True, exist_ok=True)
    print(write_views(joined, out, plots=not args.no_plots, csv=False, write=atomic_write))
    print(f"[harness] wrote {out / 'summary.md'} and {out / 'report.html'}", file=sys.stderr)
    return 0


def _prices(
    asked: Sequence[str] | None, files: Sequence[dict[str, Any]], tags: Sequence[str], runs: Any
) -> dict[str, float] | None:
    """Each tagged engine's price: --price-per-hour's, else its file's own (a file without one
    leaves its engines unpriced)."""
    if asked:
        return prices(asked, sorted({r.cell.engine for r in runs}))
    own = {
        f"{engine}@{tag}": usd
        for tag, f in zip(tags, files)
        for engine, usd in ((f.get("config") or {}).get("price_per_hour") or {}).items()
    }
    return own or None


def _compare_dir(paths: Sequence[str], json_path: str | None) -> Path:
    """Beside --json, else ``compare-<tags>`` next to the first file's directory."""
    if json_path:
        return Path(json_path).resolve().parent
    tags = "-".join(t.replace("#", "") for t in _tags(paths))[:80]
    return _results_dir(paths[0]).resolve().parent / f"compare-{tags}"


def _file_session(data: dict[str, Any]) -> str:
    """The session of a file's runs that carry no marker (written before it, or by vLLM's
    bench): the file's own, named by its runs' content, so that a file compared with itself
    (or a copy) is one session and two files run one after the other are two."""
    runs = json.dumps(data.get("runs"), sort_keys=True, default=str).encode()
    return f"file {hashlib.sha256(runs).hexdigest()[:16]}"


def _tags(paths: Sequence[str]) -> list[str]:
    """Each file's name in the tables: the directory that holds its results.json (unique)."""
    dirs = [Path(p) if Path(p).is_dir() else Path(p).parent for p in paths]
    tags = [d.resolve().name or f"file{i}" for i, d in enumerate(dirs)]
    if len(set(tags)) < len(tags):
        tags = [f"{t}#{i}" for i, t in enumerate(tags)]
    return tags


def _align_vllm_runs(files: list[dict[str, Any]]) -> None:
    """A vLLM bench file names no workload nor temperature: its runs join the harness files'
    (the prompts are then paired by index, which is what vLLM's order and the harness's ids
    share; the temperature is the one the user gave both)."""
    own = [r["workload"] for f in files if f.get("source") is None for r in f["runs"]]
    temps = [r.get("temperature") for f in files if f.get("source") is None for r in f["runs"]]
    for f in files:
        if f.get("source") == "vllm bench serve":
            for r in f["runs"]:
                r["workload"] = r["workload"] or (own[0] if own else "vllm-bench")
                if r.get("temperature") is None and temps:
                    r["temperature"] = temps[0]
            if own:
                f["workload"] = {**f["workload"], "name": own[0]}


def main(argv: Sequence[str]) -> int:
    cmd, rest = argv[0], list(argv[1:])
    try:
        if cmd == "report":
            return report(rest)
        if cmd == "compare":
            return compare(rest)
        from harness.models import cli as models

        return models.main(rest)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

"""A tune result committed with a shipped family (``harness/models/<family>/tune.json``): the
``tune.json`` that ``harness tune`` writes, with its ``provenance``. The main job takes each
``--spec`` method's K from it at the loads it runs (docs/tune.md, "The main job's K").

A method's K at a tuned load (:func:`best_k`): the arm the tune chose there when it is of that
method; else the method's arm that raced there with the best measured speedup over the baseline,
unless the tune's prediction ranks one of its pruned arms above that arm (predictions compared
with predictions: a method raced only at its probe K, the largest, measured none of its small
K); else (the method was pruned there) its best predicted K. Not the emitted schedule: that turns
speculation off where it was not shown to pay, and the main job compares every method. A main-job
load takes the largest tuned load at or below it where the method has candidates (else the
smallest where it has); where the main job's loads get different K, the variant runs vLLM's
``num_speculative_tokens_per_batch_size`` schedule over them (:func:`harness.tune.schedule.ranges`).
"""

from __future__ import annotations

import datetime as dt
import json
import shlex
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.models import registry
from harness.tune.schedule import ranges

DEFAULT_K = 4  # a method the tune has no K for, without --num-spec-tokens
FLAG = "--num-spec-tokens"
REPO = Path(__file__).resolve().parents[2]


class TuneFileError(ValueError):
    """A committed tune file that cannot be read (one line: file, field, what)."""


def provenance(model: str, argv: Sequence[str], note: str | None = None) -> dict[str, Any]:
    """What a tune was run on and how: the command, the date, the checkout's commit, and each
    shipped speculator's digest (the main job warns when the checkout's differ)."""
    family = family_of(model)
    return {
        "command": "python -m harness tune " + shlex.join(argv),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "git_head": _git_head(),
        "family": family,
        "speculators": registry.speculator_digests(family) if family else {},
        "note": note,
    }


def family_of(model: str) -> str | None:
    """The shipped family a --model names, else None."""
    try:
        parsed = registry.parse_name(model)
    except ValueError:
        return None
    return parsed[0] if parsed else None


def _git_head() -> str | None:
    try:
        got = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=False)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return got.stdout.strip() or None


def read(path: Path) -> dict[str, Any]:
    """The tune file, checked for what :func:`method_ks` reads; TuneFileError in one line."""
    where = shown(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TuneFileError(f"{where}: not a readable JSON file: {exc}") from None
    search = data.get("search") if isinstance(data, dict) else None
    if not isinstance(search, list):
        raise TuneFileError(f"{where}: search: expected the list of loads tune writes")
    for i, entry in enumerate(search):
        if not isinstance(entry.get("load"), int) or not isinstance(entry.get("candidates"), list):
            raise TuneFileError(f"{where}: search[{i}]: expected 'load' and 'candidates'")
        for j, c in enumerate(entry["candidates"]):
            if not isinstance(c, dict) or not isinstance(c.get("k"), int):
                raise TuneFileError(f"{where}: search[{i}].candidates[{j}].k: expected an integer")
    return data


def best_k(entry: Mapping[str, Any], method: str) -> int | None:
    """The method's K at one tuned load (the module docstring's rule); None: not a candidate."""
    mine = [c for c in entry["candidates"] if c.get("method") == method and c["k"] > 0]
    if not mine:
        return None
    chosen = [c for c in mine if c.get("arm") == entry.get("chosen")]
    if chosen:
        return int(chosen[0]["k"])
    predicted = [c for c in mine if c.get("status") == "pruned" and c.get("predicted") is not None]
    best_predicted = min(predicted, key=lambda c: (-c["predicted"], c["k"])) if predicted else None
    raced = [c for c in mine if c.get("status") != "pruned" and _estimate(c) is not None]
    if raced:
        best = min(raced, key=lambda c: (-_estimate(c), c["k"]))  # type: ignore[operator]
        if (
            best_predicted is not None
            and best.get("predicted") is not None
            and best_predicted["predicted"] > best["predicted"]
        ):
            return int(best_predicted["k"])
        return int(best["k"])
    return None if best_predicted is None else int(best_predicted["k"])


def _estimate(c: Mapping[str, Any]) -> float | None:
    v = c.get("vs_baseline") or {}
    return v.get("estimate")


def method_ks(tune: Mapping[str, Any], method: str, loads: Iterable[int]) -> dict[int, int]:
    """Main-job load -> the method's K (the module docstring's rule); {} when the tune has none."""
    by_tuned = {}
    for entry in sorted(tune["search"], key=lambda e: e["load"]):
        k = best_k(entry, method)
        if k is not None:
            by_tuned[entry["load"]] = k
    if not by_tuned:
        return {}
    out = {}
    for load in sorted(set(loads)):
        below = [t for t in by_tuned if t <= load]
        out[load] = by_tuned[max(below) if below else min(by_tuned)]
    return out


def spec_k(
    methods: Sequence[str], loads: Sequence[int], ks: Sequence[int] | None, family: str | None
) -> dict[str, Any]:
    """The run's record of each ``--spec`` method's K and where it came from (results.json
    ``config.spec_k``): ``--num-spec-tokens`` when given (``ks``), else the family's committed
    tune (``file``, its ``provenance``, ``stale``: speculators changed since), else the default."""
    path = registry.tune_result(family) if family and methods and ks is None else None
    out: dict[str, Any] = {"file": None, "provenance": None, "stale": [], "methods": {}}
    tune: Mapping[str, Any] = {"search": []}
    if path is not None:
        tune = read(path)
        out["file"] = shown(path)
        out["provenance"] = tune.get("provenance")
        out["stale"] = _stale(tune.get("provenance"), family)
    tuned_loads = sorted({e["load"] for e in tune["search"]})
    for method in methods:
        if ks is not None:
            out["methods"][method] = {"k": list(ks), "from": FLAG}
            continue
        by_load = method_ks(tune, method, loads or tuned_loads)
        if not by_load:
            why = "the default" + (f" ({out['file']} has no K for it)" if out["file"] else "")
            out["methods"][method] = {"k": DEFAULT_K, "from": why}
            continue
        schedule = ranges(sorted(by_load.items())) if len(set(by_load.values())) > 1 else None
        out["methods"][method] = {
            "k": by_load[min(by_load)],  # one K where a schedule cannot run (engines: tunable)
            "by_load": {str(load): k for load, k in by_load.items()},
            "schedule": None if schedule is None else [list(r) for r in schedule],
            "from": out["file"],
        }
    return out


def _stale(prov: Mapping[str, Any] | None, family: str | None) -> list[str]:
    """The speculators whose digest differs from the one the tune recorded."""
    tuned = (prov or {}).get("speculators") or {}
    now = registry.speculator_digests(family) if family else {}
    return sorted(kind for kind, digest in tuned.items() if now.get(kind) != digest)


def k_line(record: Mapping[str, Any]) -> str | None:
    """The plan line: "K from harness/models/smollm2/tune.json: eagle3 2, draft_model 1 at load
    1 / 2 at load 4, ngram 4 (the default)"; None without --spec methods."""
    methods = record.get("methods") or {}
    if not methods:
        return None
    parts = []
    for method, m in methods.items():
        by_load = m.get("by_load") or {}
        if len(set(by_load.values())) > 1:
            ks = " / ".join(f"{k} at load {load}" for load, k in by_load.items())
        else:
            ks = " ".join(str(k) for k in m["k"]) if isinstance(m["k"], list) else str(m["k"])
        parts.append(
            f"{method} {ks}" + ("" if m["from"] == record.get("file") else f" ({m['from']})")
        )
    head = f"K from {record['file']}" if record.get("file") else "K"
    line = f"{head}: {', '.join(parts)}"
    prov = record.get("provenance") or {}
    if prov.get("note"):
        line += f"; {prov['note']}"
    if record.get("stale"):
        line += (
            f"; tuned with other {', '.join(record['stale'])} weights than this checkout's "
            "(re-run the tune: docs/tune.md)"
        )
    return line


def shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)

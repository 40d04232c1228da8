"""A run's identity (``Cell.key``) names its model and temperature: two runs that differ only in
those never collide in the journal (``--resume``), never pool into one row, and never pair; files
written before (schema 2, old journals) are still read, resumed and compared."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from harness.analysis.comparisons.paired import comparisons
from harness.cli.commands import load_results
from harness.core.records import RequestRecord
from harness.core.results import SCHEMA_VERSION, Cell, Run, group_runs
from harness.run.journal import Journal, runs_from_journal

FIXTURE = Path(__file__).resolve().parent / "data" / "results-vllm-small.json"
BASE = Cell("vllm", "baseline", "latency", {"concurrency": 1}, 8, 0, "w", "/m/a", 0.0)
# the same engine, variant, point and repeat: only the model or the temperature differ
OTHERS = (replace(BASE, model="/m/b"), replace(BASE, temperature=0.8))


def _run(cell: Cell, seconds: float = 1.0) -> Run:
    rec = RequestRecord("p0", 0.0, seconds, (seconds / 2, seconds), (1, 1), (5, 6))
    spec = None if cell.label == "baseline" else {"method": cell.label}
    return Run(cell, spec, (rec,))


def _journal(path: Path, config: dict | None, runs: list[Run], key=lambda c: c.key, head=None):
    """Write runs as the session does (config line, header, record, end; no end for a run with
    status "interrupted")."""
    j = Journal(path)
    if config is not None:
        j.write("config", {"config": config})
    for run in runs:
        k = key(run.cell)
        j.write("run", {"key": k, "run": (head or (lambda d: d))(run.to_json({}))})
        j.write("record", {"key": k, "record": run.records[0].to_json(0.0)})
        if run.status != "interrupted":
            j.write("end", {"key": k, "status": run.status})
    j.close()


def test_runs_differing_only_in_model_or_temperature_stay_apart(tmp_path: Path) -> None:
    cells = (BASE, *OTHERS)
    assert len({c.key for c in cells}) == 3 and len({c.group for c in cells}) == 3
    runs = [_run(c, 1.0 + i) for i, c in enumerate(cells)]
    _journal(tmp_path / "journal.jsonl", {"model": "/m/a", "temperature": 0.0}, runs)
    back, finished = runs_from_journal(tmp_path / "journal.jsonl")
    assert finished == {c.key for c in cells}  # --resume redoes none, loses none
    assert sorted(r.records[0].t_end for r in back) == [1.0, 2.0, 3.0]
    assert len(group_runs(runs)) == 3  # three rows, not one row pooling three configurations
    # a speculative run at temperature 0.8 is not paired with the baseline at temperature 0
    hot = _run(replace(BASE, label="ngram", temperature=0.8))
    assert comparisons([_run(BASE), hot]) == []
    assert comparisons([_run(BASE), _run(replace(BASE, label="ngram"))]) != []


def test_an_old_journal_still_resumes(tmp_path: Path) -> None:
    """A journal written before cells named model and temperature: its finished runs are done
    for a plan of the same config (the config line supplies them), a re-run replaces its run."""
    strip = lambda d: {k: v for k, v in d.items() if k not in ("model", "temperature")}  # noqa: E731
    path = tmp_path / "journal.jsonl"
    r1 = replace(BASE, repeat=1)
    cut = replace(_run(r1, 2.0), status="interrupted")
    old_key = lambda c: c.name  # noqa: E731  the key before schema 3: engine/.../workload/rN
    _journal(path, {"model": "/m/a", "temperature": 0.0}, [_run(BASE), cut], old_key, strip)
    runs, finished = runs_from_journal(path)
    assert finished == {BASE.key} and [r.cell for r in runs] == [BASE, r1]
    _journal(path, None, [_run(r1, 4.0)])  # --resume reruns r1 and writes today's key
    runs, finished = runs_from_journal(path)
    assert finished == {BASE.key, r1.key} and [r.cell for r in runs] == [BASE, r1]
    assert [r.records[0].t_end for r in runs] == [1.0, 4.0]  # the cut run's record is gone


def test_schema_2_results_get_model_and_temperature_from_their_config(tmp_path: Path) -> None:
    old = json.loads(FIXTURE.read_text())
    assert old["schema_version"] == 2 and "model" not in old["runs"][0]
    data = load_results(str(FIXTURE))
    assert data["schema_version"] == SCHEMA_VERSION
    cells = [Run.from_json(r).cell for r in data["runs"]]
    assert {(c.model, c.temperature) for c in cells} == {(old["config"]["model"], 0.0)}
    assert all(r["key"] == Run.from_json(r).cell.key for r in data["runs"])
    from harness.report.plots import draw

    assert "png" in draw(data, tmp_path).markdown  # the views read the longer cells too
    assert {k: data[k] for k in ("rows", "comparisons")} == {
        k: old[k] for k in ("rows", "comparisons")
    }


def test_compare_pairs_only_runs_of_one_model_and_temperature(tmp_path: Path, capsys) -> None:
    from harness.cli.main import main

    hot = json.loads(FIXTURE.read_text())
    hot["config"]["temperature"] = 0.8
    for tag, data in (("a", json.loads(FIXTURE.read_text())), ("b", hot)):
        (tmp_path / tag).mkdir()
        (tmp_path / tag / "results.json").write_text(json.dumps(data))
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    out, err = capsys.readouterr()
    assert "| vllm@b/ngram vs vllm@b/baseline " in out  # within a file: paired
    assert "vllm@b/ngram vs vllm@a/ngram" not in out  # across temperatures: not
    assert "differ in model or temperature" in err and "temperature 0.8" in err

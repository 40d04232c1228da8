"""Per-request records in records.parquet (schema 4, issue 38): a run's output directory
round-trips through `report`, `compare` and `--resume` (its journal compacted once the run is
complete); a schema-3 results.json (records embedded, written by the code before) still reads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.core.records import RequestRecord
from harness.core.records_file import RECORDS_FILE, load_with_records, read_records, write_records
from harness.core.results import Cell, Run
from tests.inprocess import run_harness
from tests.test_soak import instant  # noqa: F401 - the fixture

OLD = Path(__file__).resolve().parent / "data" / "results-schema3-stub.json"
RUN = [
    "--engine", "instant", "--model", "tiny", "--dataset-name", "random",
    "--random-input-len", "16", "--random-output-len", "8", "--num-prompts", "12",
    "--mode", "throughput", "--concurrency", "4", "--warmup", "2", "--aa", "--no-plots",
    "--quiet",
]  # fmt: skip


def test_records_round_trip_through_the_file(tmp_path: Path) -> None:
    recs = (
        RequestRecord("a", 10.0, 10.5, (10.1, 10.2, 10.4), (1, 2, 1), (5, 6, 7, 8),
                      prompt_tokens=3, usage_output_tokens=4, output_text="x y",
                      info={"turn": 2, "request_rate": 1.5}, t_scheduled=9.9),
        RequestRecord("b", 10.2, 10.3, ok=False, error="HTTP 500"),
        RequestRecord("w", 9.0, 9.5, (9.2,), (1,), warmup=True),
    )  # fmt: skip
    cell = Cell("e", "baseline", "throughput", {"concurrency": 4}, 8, 0, "w")
    run = Run(cell, None, recs, t0=9.0)
    assert write_records(tmp_path / RECORDS_FILE, [run]) == 3
    back = read_records(tmp_path / RECORDS_FILE)
    assert back == {cell.key: [r.to_json(9.0) for r in recs]}
    again = tuple(RequestRecord.from_json(d) for d in back[cell.key])
    assert [r.to_json(0.0) for r in again] == [r.to_json(9.0) for r in recs]


def test_a_new_directory_reports_compares_and_resumes(
    instant: None,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "run"
    args = [*RUN, "--repeats", "1", "--output-dir", str(out)]
    assert run_harness(args, capsys).returncode == 0
    res = json.loads((out / "results.json").read_text())
    assert res["schema_version"] == 4 and res["records_file"] == RECORDS_FILE
    assert all("records" not in r and r["n_records"] == 14 for r in res["runs"])  # 2 warm-ups
    full = load_with_records(out / "results.json")
    assert [len(r["records"]) for r in full["runs"]] == [14, 14]
    journal = (out / "journal.jsonl").read_text().splitlines()
    kinds = [json.loads(line)["kind"] for line in journal]
    assert "record" not in kinds and kinds[-1] == "records_file"  # compacted: each record once

    rep = run_harness(["report", str(out), "--no-plots"], capsys)
    assert rep.returncode == 0 and "out tok/s" in rep.stdout, rep.stderr
    cmp = run_harness(["compare", str(out), str(OLD), "--force", "--no-plots",
                       "--json", str(tmp_path / "joined.json")], capsys)  # fmt: skip
    assert cmp.returncode == 0, cmp.stderr
    joined = json.loads((tmp_path / "joined.json").read_text())
    assert [len(r["records"]) for r in joined["runs"]] == [14, 14, 12, 12, 12, 12]
    assert (
        run_harness(["report", str(tmp_path / "joined.json"), "--no-plots"], capsys).returncode == 0
    )

    # --resume of the compacted journal: repeat 0 read back from the records file, 1 runs
    again = [*RUN, "--repeats", "2", "--resume", str(out)]
    assert run_harness(again, capsys).returncode == 0
    res2 = load_with_records(out / "results.json")
    first = {r["key"]: r for r in full["runs"]}
    kept = [r for r in res2["runs"] if r["key"] in first]
    assert len(res2["runs"]) == 4 and len(kept) == 2
    assert all(r["records"] == first[r["key"]]["records"] for r in kept)
    assert all(r["summary"] == first[r["key"]]["summary"] for r in kept)


def test_a_schema_3_file_with_records_embedded_still_reads(tmp_path: Path, capsys) -> None:
    old = tmp_path / "old" / "results.json"
    old.parent.mkdir()
    shutil.copy(OLD, old)
    rep = run_harness(["report", str(old), "--no-plots"], capsys)
    assert rep.returncode == 0 and "out tok/s" in rep.stdout, rep.stderr
    assert load_with_records(old)["runs"][0]["records"]  # embedded: read as they are
    cmp = run_harness(["compare", str(old), str(OLD), "--no-plots",
                       "--output-dir", str(tmp_path / "c")], capsys)  # fmt: skip
    assert cmp.returncode == 0, cmp.stderr

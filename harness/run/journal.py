"""Journal I/O: results.json written atomically, and an append-only journal flushed per record,
so that nothing finished is ever lost and ``--resume`` can rebuild the runs that ran."""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.core.columns import RecordColumns
from harness.core.design import Slot
from harness.core.records import RequestRecord
from harness.core.results import Run, with_config


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file and a rename: never half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class Journal:
    """Append-only JSONL: the config it was started with, then per run its header, each record
    as it finishes, and its end."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = path.open("a", encoding="utf-8")
        self.late = 0  # entries offered after close(): counted, never written to a closed file

    def write(self, kind: str, payload: Mapping[str, Any]) -> None:
        if self._f.closed:  # the run settles every request before closing: this is a bug
            self.late += 1
            return
        self._f.write(json.dumps({"kind": kind, **payload}) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


RECORD_PREFIX = '{"kind": "record"'  # how Journal.write starts a record's line


def compact(path: Path, records_file: str) -> int:
    """After a finished run: the journal without its record entries (they are in
    ``records_file``, beside it), ending with an entry naming that file, so that the output
    directory holds each record once and ``--resume`` still rebuilds every run
    (:func:`runs_from_journal`). Atomic (a temp file and a rename); the bytes it freed."""
    before = path.stat().st_size
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out, path.open(encoding="utf-8") as f:
            for line in f:
                if not line.startswith(RECORD_PREFIX) and line.endswith("\n"):
                    out.write(line)
            out.write(json.dumps({"kind": "records_file", "file": records_file}) + "\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return before - path.stat().st_size


def read_journal(path: Path) -> Iterator[dict[str, Any]]:
    """The journal's entries; a torn last line (the process died mid-write) is skipped."""
    if not path.exists():
        return
    with path.open(encoding="utf-8") as f:
        for line in f:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def recorded_config(path: Path) -> dict[str, Any] | None:
    """The config the journal's run was started with (its first "config" entry), else None."""
    return next((e["config"] for e in read_journal(path) if e.get("kind") == "config"), None)


def new_session_id() -> str:
    """The marker of one interleaved session (a run and its ``--resume``): its UTC start and a
    random part, so two runs started in the same second still differ."""
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{now}-{uuid.uuid4().hex[:8]}"


def recorded_session(path: Path) -> str | None:
    """The session a journal's runs belong to (its "session" entry), else None (a journal
    written before sessions were marked)."""
    return next((e["session"] for e in read_journal(path) if e.get("kind") == "session"), None)


def runs_from_journal(path: Path) -> tuple[list[Run], set[str]]:
    """Rebuild runs from a journal: every run that started (with its end status, "interrupted"
    when it has none), and the keys of the runs that finished (ok or unsupported: not redone).

    Runs are identified by :attr:`Cell.key`, recomputed from each header: a journal written
    before cells named their model and temperature gets them from its config line, so its
    finished runs still count as done."""
    heads: dict[str, dict[str, Any]] = {}
    recs: dict[str, RecordColumns] = {}
    ends: dict[str, dict[str, Any]] = {}
    config: dict[str, Any] = {}
    alias: dict[str, str] = {}  # the key as written -> the cell's key (the same since schema 3)
    stored: str | None = None  # a compacted journal's records file (compact)
    for e in read_journal(path):
        key = alias.get(e.get("key"), e.get("key"))
        if e["kind"] == "config":
            config = e["config"]
        elif e["kind"] == "run":
            head = with_config(e["run"], config)
            key = alias[e.get("key")] = head["key"]
            heads[key] = head
            recs[key] = RecordColumns()
        elif e["kind"] == "record" and key in recs:
            recs[key].append(RequestRecord.from_json(e["record"]))
        elif e["kind"] == "end" and key in heads:
            ends[key] = e
        elif e["kind"] == "records_file":
            stored = e["file"]
    if stored is not None:  # the records of the runs before the compaction
        from harness.core.records_file import read_records

        gone = [k for k, rs in recs.items() if not rs]
        for k, rows in read_records(path.parent / stored, gone).items():
            recs[k] = RecordColumns(RequestRecord.from_json(r) for r in rows)
    runs = []
    for key, head in heads.items():  # each run's records as columns (harness.core.columns)
        run = Run.from_json({**head, "records": []})
        end = ends.get(key, {})
        runs.append(
            replace(
                run,
                records=recs.pop(key),
                status=end.get("status", "interrupted"),
                spec_metrics=end.get("spec_metrics"),
                extra=end.get("extra") or {},
                schedule=Slot.from_json(end.get("schedule")) or run.schedule,
            )
        )
    finished = {
        k
        for k, e in ends.items()
        if e.get("status") == "ok" or str(e.get("status")).startswith("unsupported")
    }
    return runs, finished

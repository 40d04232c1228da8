"""Per-request records in one columnar file per output directory (``records.parquet``, schema
4): results.json keeps the configuration, design, summaries and analysis and names this file,
so that a run of a million requests is a results.json of kilobytes and a Parquet file pandas,
polars and DuckDB read as is (``pd.read_parquet("out/records.parquet")``).

One row per request, the fields of :meth:`RequestRecord.to_json` (times relative to the run's
start) plus ``key``: the run's :attr:`Cell.key` (results.json ``runs[i].key``). Written in
batches of ``BATCH`` rows, so that writing never holds more than one batch as Python lists."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.core.results import Run

RECORDS_FILE = "records.parquet"
BATCH = 50_000  # rows per write: bounds the lists built for one batch
# to_json's fields in the file: the rest (info) is a JSON text
FIELDS = (
    "id", "send_s", "prompt_tokens", "output_tokens", "ttft_s", "e2e_s", "itl_s", "chunk_tokens",
    "output_token_ids", "usage_output_tokens", "output_text", "ok", "error", "warmup",
    "scheduled_s",
)  # fmt: skip


def _schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("key", pa.dictionary(pa.int32(), pa.string())),
            ("id", pa.string()),
            ("send_s", pa.float64()),
            ("prompt_tokens", pa.int64()),
            ("output_tokens", pa.int64()),
            ("ttft_s", pa.float64()),
            ("e2e_s", pa.float64()),
            ("itl_s", pa.list_(pa.float64())),
            ("chunk_tokens", pa.list_(pa.int32())),
            ("output_token_ids", pa.list_(pa.int64())),
            ("usage_output_tokens", pa.int64()),
            ("output_text", pa.string()),
            ("ok", pa.bool_()),
            ("error", pa.string()),
            ("warmup", pa.bool_()),
            ("scheduled_s", pa.float64()),
            ("info", pa.string()),
        ]
    )


def _columns(runs: Sequence[Run]) -> Iterable[dict[str, list[Any]]]:
    """The rows of ``runs`` as columns, ``BATCH`` rows at a time: each field read off the
    record once (what :meth:`RequestRecord.to_json` writes, without a dict per record)."""
    cols: dict[str, list[Any]] = {k: [] for k in ("key", *FIELDS, "info")}
    (key, ids, send, prompt, out, ttft, e2e, itl, tokens, token_ids, usage, text, ok, error,
     warmup, scheduled, info) = cols.values()  # fmt: skip
    for run in runs:
        k, t0 = run.cell.key, run.t0
        for rec in run.records:
            times = rec.chunk_times
            key.append(k)
            ids.append(rec.request_id)
            send.append(rec.t_send - t0)
            prompt.append(rec.prompt_tokens)
            out.append(rec.output_tokens)
            ttft.append(times[0] - rec.t_send if times else None)
            e2e.append(rec.t_end - rec.t_send)
            itl.append([b - a for a, b in zip(times, times[1:])])
            tokens.append(rec.chunk_tokens)
            token_ids.append(rec.output_token_ids)
            usage.append(rec.usage_output_tokens)
            text.append(rec.output_text)
            ok.append(rec.ok)
            error.append(rec.error)
            warmup.append(rec.warmup)
            scheduled.append(None if rec.t_scheduled is None else rec.t_scheduled - t0)
            info.append(json.dumps(dict(rec.info)) if rec.info else None)
            if len(key) >= BATCH:
                yield cols
                for col in cols.values():
                    col.clear()
    if key:
        yield cols


def write_records(path: Path, runs: Sequence[Run]) -> int:
    """Every record of ``runs`` into ``path`` (through a temp file and a rename: never half a
    file); the number of rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = _schema()
    tmp = path.with_name(f".{path.name}.tmp")
    n = 0
    try:
        with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
            for cols in _columns(runs):
                writer.write_table(pa.table(cols, schema=schema))
                n += len(cols["key"])
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return n


def read_records(path: Path, keys: Iterable[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    """The records of ``path`` per run key, as :meth:`RequestRecord.to_json` wrote them (only
    the runs of ``keys``, when given), batch by batch."""
    import pyarrow.parquet as pq

    wanted = None if keys is None else set(keys)
    out: dict[str, list[dict[str, Any]]] = {}
    for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH):
        for row in batch.to_pylist():
            key = row.pop("key")
            if wanted is not None and key not in wanted:
                continue
            info = row.pop("info")
            row["info"] = json.loads(info) if info else {}
            out.setdefault(key, []).append(row)
    return out


def with_records(data: Mapping[str, Any], base: Path) -> dict[str, Any]:
    """A results dict whose runs carry their records: those embedded (schema <= 3, a
    ``compare --json``) as they are, the others read from its records file (``base``: the
    directory results.json is in). ``FileNotFoundError`` when the file is named but gone."""
    name = data.get("records_file")
    runs = data.get("runs") or []
    if not name or all("records" in r for r in runs):
        return dict(data)
    stored = read_records(base / name, [r["key"] for r in runs if "records" not in r])
    filled = [r if "records" in r else {**r, "records": stored.get(r["key"], [])} for r in runs]
    return {**data, "runs": filled}


def load_with_records(path: Path) -> dict[str, Any]:
    """results.json at ``path`` with every run's records in it (:func:`with_records`)."""
    return with_records(json.loads(path.read_text(encoding="utf-8")), path.parent)

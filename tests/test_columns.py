"""A run's records as columns (harness.core.columns, issue 38): what goes in comes back out
record for record, and every column equals the per-record property it replaces in the
analysis, on records with every kind of gap (no chunks, one token, no token ids, failures,
warm-ups, schedules, chunks of several tokens or none)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from harness.analysis.summary import GOODPUT_METRICS, distribution, meets, summarize
from harness.core.columns import RecordColumns, seq_sum
from harness.core.records import NOT_SENT, RequestRecord


def _records(n: int, seed: int = 7, files: bool = True) -> list[RequestRecord]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        t_send = rng.uniform(0, 100)
        k = rng.choice([0, 1, 1, 3, 8])
        times = sorted(t_send + rng.uniform(1e-4, 2) for _ in range(k))
        sizes = [rng.choice([0, 1, 1, 2, 4]) for _ in range(k)]
        if k:
            sizes[0] = max(sizes[0], 1)
        end = (times[-1] if times else t_send) + rng.uniform(0, 0.5)
        ok = rng.random() > 0.1 or not k
        error = None if ok else rng.choice(["HTTP 500: boom", NOT_SENT, "cancelled at stop"])
        with_ids = rng.random() > 0.3
        if (
            files and k and rng.random() < 0.1
        ):  # a file's record (vllm bench): chunk times, no sizes
            sizes, with_ids = [], False
        out.append(
            RequestRecord(
                request_id=f"r{i}",
                t_send=t_send,
                t_end=end,
                chunk_times=tuple(times),
                chunk_tokens=tuple(sizes),
                output_token_ids=tuple(range(sum(sizes))) if with_ids else None,
                prompt_tokens=rng.choice([None, 16, 40]),
                usage_output_tokens=rng.choice([None, None, sum(sizes)]) if sizes else k,
                output_text=rng.choice([None, " t1 t2", "   \n  \n   "]),
                ok=ok,
                error=error,
                warmup=rng.random() < 0.1,
                info=rng.choice([{}, {"output_tokens_from": "server usage"}, {"replica": "a"}]),
                t_scheduled=rng.choice([None, t_send - rng.uniform(0, 0.2)]),
            )
        )
    return out


def _nan(xs: list[float | None]) -> np.ndarray:
    return np.array([np.nan if x is None else x for x in xs], dtype=float)


def test_records_come_back_as_they_went_in() -> None:
    recs = _records(400)
    cols = RecordColumns(recs)
    assert len(cols) == 400
    assert list(cols) == recs
    assert cols[5] == recs[5] and cols[-1] == recs[-1] and cols[10:13] == recs[10:13]
    assert cols == recs and cols == tuple(recs)
    assert RecordColumns.of(cols) is cols
    assert list(RecordColumns.join([recs[:100], RecordColumns(recs[100:])])) == recs
    with pytest.raises(IndexError):
        cols[400]


@pytest.mark.parametrize("files", [False, True])
def test_each_column_is_the_per_record_property(files: bool) -> None:
    recs = _records(600, files=files)
    cols = RecordColumns(recs)
    np.testing.assert_array_equal(cols.ok(), [r.ok for r in recs])
    np.testing.assert_array_equal(cols.counted(), [r.counted for r in recs])
    np.testing.assert_array_equal(cols.output_tokens(), [r.output_tokens for r in recs])
    np.testing.assert_array_equal(cols.n_chunks(), [len(r.chunk_tokens) for r in recs])
    np.testing.assert_array_equal(cols.not_sent(), [r.error == NOT_SENT for r in recs])
    for name in ("ttft", "e2e", "tpot", "user_ttft", "user_e2e"):
        want = _nan([getattr(r, name) for r in recs])
        np.testing.assert_array_equal(getattr(cols, name)(), want, err_msg=name)
    mask = cols.counted()
    chosen = [r for r, m in zip(recs, mask) if m]
    np.testing.assert_array_equal(cols.itl(mask), [x for r in chosen for x in r.itl])
    np.testing.assert_array_equal(
        cols.itl_per_token(mask), [x for r in chosen for x in r.itl_per_token]
    )
    slo = {"ttft": 900.0, "tpot": 300.0, "e2e": 1500.0}

    def one(r: RequestRecord) -> bool:
        vs = [GOODPUT_METRICS[k](r) for k in slo]
        return all(v is None or v * 1000.0 <= ms for v, ms in zip(vs, slo.values()))

    np.testing.assert_array_equal(meets(cols, slo), [one(r) for r in recs])


@pytest.mark.parametrize("files", [False, True])
def test_summary_of_columns_is_that_of_the_records(files: bool) -> None:
    """The summary from columns against the per-record definitions it replaced."""
    recs = _records(800, seed=3, files=files)
    s = summarize(recs, {"ttft": 900.0})
    counted = [r for r in recs if not r.warmup]
    ok = [r for r in counted if r.ok]
    assert s["completed"] == len(ok) and s["failed"] == len(counted) - len(ok)
    assert s["output_tokens"] == sum(r.output_tokens for r in ok)
    assert s["duration_s"] == max(r.t_end for r in counted) - min(r.t_send for r in counted)
    assert s["mean_in_flight"] == sum(r.t_end - r.t_send for r in counted) / s["duration_s"]
    assert s["ttft_s"] == distribution([r.ttft for r in ok])
    assert s["tpot_s"] == distribution([r.tpot for r in ok])
    assert s["itl_s"] == distribution([x for r in ok for x in r.itl])
    assert s["e2e_s"] == distribution([r.e2e for r in ok])
    assert s["itl_per_token_s"] == distribution([x for r in ok for x in r.itl_per_token])
    assert s["mean_chunk_tokens"] == s["output_tokens"] / max(
        1, sum(len(r.chunk_tokens) for r in ok)
    )
    events = sorted([(r.t_send, 1) for r in counted] + [(r.t_end, -1) for r in counted])
    peak = cur = 0
    for _, step in events:
        cur += step
        peak = max(peak, cur)
    assert s["peak_in_flight"] == peak
    kinds: dict[str, int] = {}
    for r in counted:
        if not r.ok:
            kind = (r.error or "error").split(":")[0].strip()
            kinds[kind] = kinds.get(kind, 0) + 1
    assert s["errors"] == kinds
    assert seq_sum(np.array([0.1, 0.2, 0.3])) == sum([0.1, 0.2, 0.3])


def test_a_stub_like_record_held_as_columns_costs_under_400_bytes() -> None:
    """Issue 38's memory bound, by allocation (not RSS, not time): a finished 8-chunk record
    held in a run's columns costs < 400 bytes (its id included; ~320 here), where the
    ``RequestRecord`` object with its tuples cost ~800."""
    import gc
    import tracemalloc

    n, info = 20_000, {"stream_end": "[DONE]", "output_tokens_from": "server usage"}

    def record(i: int) -> RequestRecord:
        t0 = 1000.0 + i * 1e-3
        times = tuple(t0 + 0.001 * (k + 1) + i * 1e-9 for k in range(8))
        text = "".join(f" t{k}" for k in range(8))
        return RequestRecord(
            str(i), t0, times[-1] + 1e-4, times, (1,) * 8, tuple(range(1000, 1008)), 17, 8,
            text, True, None, False, info,
        )  # fmt: skip

    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    cols = RecordColumns(record(i) for i in range(n))
    gc.collect()
    held = (tracemalloc.get_traced_memory()[0] - before) / n
    tracemalloc.stop()
    assert len(cols) == n and cols[n - 1] == record(n - 1)
    assert held < 400, f"{held:.0f} bytes a record"

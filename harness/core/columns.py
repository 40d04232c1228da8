"""A run's records held as columns (issue 38): flat arrays of numbers instead of one
:class:`RequestRecord` object per request, so a run of a million requests holds ~0.3 kB a
request rather than ~1 kB of Python objects (a record with eight chunks is ~600 bytes of tuples
and floats). It is a ``Sequence[RequestRecord]``: indexing or iterating builds each record
as it is read (what the journal, the sanity check and the records file read one at a time),
and the analysis reads whole columns as numpy arrays (:mod:`harness.analysis.summary`).

Absent values: ``t_scheduled`` NaN, ``prompt_tokens`` / ``usage_output_tokens`` -1; the rare
field (errors) is kept sparse; a record's ``info`` is one entry of a
table of the distinct ones (an HTTP engine's info repeats from request to request)."""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

import numpy as np

from harness.core.records import NOT_SENT, RequestRecord

NONE = -1  # an absent count


class RecordColumns(Sequence[RequestRecord]):
    """Append-only columns of records, in the order appended."""

    def __init__(self, records: Iterable[RequestRecord] = ()) -> None:
        self._ids: list[str] = []
        self._t_send, self._t_end, self._t_sched = array("d"), array("d"), array("d")
        self._prompt, self._usage, self._out = array("q"), array("q"), array("q")
        self._ok, self._warmup = array("b"), array("b")
        self._chunk_at = array("q", [0])  # record i's chunks: _times[_chunk_at[i]:_chunk_at[i+1]]
        self._sizes_at = array("q", [0])  # and their tokens (a file's record may have no sizes)
        self._times, self._sizes = array("d"), array("i")
        self._aligned = True  # every record has a size per chunk time
        self._ids_at = array("q", [0])  # record i's token ids (_has_ids[i] 0: None)
        self._tokens, self._has_ids = array("i"), array("b")  # token ids: < 2**31
        self._text: list[str | None] = []
        self._errors: dict[int, str] = {}
        self._info_of = array("l")  # index into _infos (0: empty)
        self._infos: list[dict[str, Any]] = [{}]
        self._info_index: dict[str, int] = {"{}": 0}
        self.extend(records)

    @classmethod
    def of(cls, records: Iterable[RequestRecord]) -> RecordColumns:
        """``records`` as columns (the same object when they are columns already)."""
        return records if isinstance(records, RecordColumns) else cls(records)

    @classmethod
    def join(cls, parts: Iterable[Iterable[RequestRecord]]) -> RecordColumns:
        """Several runs' records as one set of columns, in order (a pooled row); one run's
        columns are returned as they are (no copy)."""
        parts = list(parts)
        if len(parts) == 1:
            return cls.of(parts[0])
        out = cls()
        for part in parts:
            out.extend(part)
        return out

    # ---- filling ------------------------------------------------------------------------------
    def append(self, r: RequestRecord) -> None:
        i = len(self._ids)
        self._ids.append(r.request_id)
        self._t_send.append(r.t_send)
        self._t_end.append(r.t_end)
        self._t_sched.append(np.nan if r.t_scheduled is None else r.t_scheduled)
        self._prompt.append(NONE if r.prompt_tokens is None else r.prompt_tokens)
        self._usage.append(NONE if r.usage_output_tokens is None else r.usage_output_tokens)
        self._out.append(r.output_tokens)
        self._ok.append(r.ok)
        self._warmup.append(r.warmup)
        self._times.extend(r.chunk_times)
        self._sizes.extend(r.chunk_tokens)
        self._chunk_at.append(len(self._times))
        self._sizes_at.append(len(self._sizes))
        self._aligned = self._aligned and len(r.chunk_times) == len(r.chunk_tokens)
        ids = r.output_token_ids
        self._has_ids.append(ids is not None)
        if ids is not None:
            self._tokens.extend(ids)
        self._ids_at.append(len(self._tokens))
        self._text.append(r.output_text)
        if r.error is not None:
            self._errors[i] = r.error
        self._info_of.append(self._info_id(r.info) if r.info else 0)

    def extend(self, records: Iterable[RequestRecord]) -> None:
        if isinstance(records, RecordColumns):
            records = iter(records)  # built one at a time: never two copies of a run
        for r in records:
            self.append(r)

    def _info_id(self, info: Any) -> int:
        key = json.dumps(dict(info), sort_keys=True, default=str)
        k = self._info_index.get(key)
        if k is None:
            k = self._info_index[key] = len(self._infos)
            self._infos.append(dict(info))
        return k

    # ---- the Sequence -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._ids)

    @overload
    def __getitem__(self, i: int) -> RequestRecord: ...
    @overload
    def __getitem__(self, i: slice) -> list[RequestRecord]: ...
    def __getitem__(self, i: int | slice) -> RequestRecord | list[RequestRecord]:
        if isinstance(i, slice):
            return [self._record(k) for k in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(i)
        return self._record(i % n)

    def __iter__(self) -> Iterator[RequestRecord]:
        for i in range(len(self)):
            yield self._record(i)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = object.__hash__  # identity: a Run (frozen) stays hashable

    def __repr__(self) -> str:
        return f"RecordColumns({len(self)} records)"

    def _record(self, i: int) -> RequestRecord:
        a, b = self._chunk_at[i], self._chunk_at[i + 1]
        sched, prompt, usage = self._t_sched[i], self._prompt[i], self._usage[i]
        return RequestRecord(
            request_id=self._ids[i],
            t_send=self._t_send[i],
            t_end=self._t_end[i],
            chunk_times=tuple(self._times[a:b]),
            chunk_tokens=tuple(self._sizes[self._sizes_at[i] : self._sizes_at[i + 1]]),
            output_token_ids=tuple(self._tokens[self._ids_at[i] : self._ids_at[i + 1]])
            if self._has_ids[i]
            else None,
            prompt_tokens=None if prompt == NONE else prompt,
            usage_output_tokens=None if usage == NONE else usage,
            output_text=self._text[i],
            ok=bool(self._ok[i]),
            error=self._errors.get(i),
            warmup=bool(self._warmup[i]),
            info=dict(self._infos[self._info_of[i]]),
            t_scheduled=None if sched != sched else sched,  # NaN: none
        )

    # ---- columns, as numpy arrays (copies: the arrays above may still grow) -------------------
    def ok(self) -> np.ndarray:
        return np.array(self._ok, dtype=bool)

    def warmup(self) -> np.ndarray:
        return np.array(self._warmup, dtype=bool)

    def counted(self) -> np.ndarray:
        """:attr:`RequestRecord.counted`: finished and not a warm-up."""
        return self.ok() & ~self.warmup()

    def t_send(self) -> np.ndarray:
        return np.array(self._t_send, dtype=float)

    def t_end(self) -> np.ndarray:
        return np.array(self._t_end, dtype=float)

    def t_scheduled(self) -> np.ndarray:
        """NaN: no schedule (a closed loop)."""
        return np.array(self._t_sched, dtype=float)

    def output_tokens(self) -> np.ndarray:
        return np.array(self._out, dtype=np.int64)

    def prompt_tokens(self) -> np.ndarray:
        """-1 where unknown."""
        return np.array(self._prompt, dtype=np.int64)

    def n_chunks(self) -> np.ndarray:
        """``len(chunk_tokens)`` of each record."""
        return np.diff(np.array(self._sizes_at, dtype=np.int64))

    def has_token_ids(self) -> np.ndarray:
        return np.array(self._has_ids, dtype=bool)

    def errors(self) -> dict[int, str]:
        """Record index -> error (the records that have one)."""
        return dict(self._errors)

    def not_sent(self) -> np.ndarray:
        """Requests due that the client never sent (:data:`NOT_SENT`)."""
        out = np.zeros(len(self), dtype=bool)
        out[[i for i, e in self._errors.items() if e == NOT_SENT]] = True
        return out

    def first_chunk_t(self) -> np.ndarray:
        """When each record's first chunk came (NaN: none)."""
        at = np.array(self._chunk_at, dtype=np.int64)
        has = at[1:] > at[:-1]
        out = np.full(len(self), np.nan)
        out[has] = np.frombuffer(self._times, dtype=float)[at[:-1][has]]  # a copy: no view kept
        return out

    def ttft(self) -> np.ndarray:
        """:attr:`RequestRecord.ttft` (NaN: no chunk)."""
        return self.first_chunk_t() - self.t_send()

    def e2e(self) -> np.ndarray:
        return self.t_end() - self.t_send()

    def tpot(self) -> np.ndarray:
        """:attr:`RequestRecord.tpot` (NaN where it is None: no chunk, or one token)."""
        n, ttft = self.output_tokens(), self.ttft()
        out = np.full(len(self), np.nan)
        has = ~np.isnan(ttft) & (n >= 2)
        out[has] = (self.e2e()[has] - ttft[has]) / (n[has] - 1)
        return out

    def user_ttft(self) -> np.ndarray:
        """:attr:`RequestRecord.user_ttft`: from the schedule where there is one."""
        sched = self.t_scheduled()
        return np.where(np.isnan(sched), self.ttft(), self.first_chunk_t() - sched)

    def user_e2e(self) -> np.ndarray:
        """:attr:`RequestRecord.user_e2e`."""
        sched = self.t_scheduled()
        return np.where(np.isnan(sched), self.e2e(), self.t_end() - sched)

    def _gaps(self, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The inter-chunk gaps of the records in ``mask`` (in order) and the tokens of the
        chunk each gap ends at (those only where every record is aligned)."""
        at = np.array(self._chunk_at, dtype=np.int64)
        keep = np.repeat(mask, np.diff(at))  # per chunk: its record is in the mask
        keep[at[:-1][at[:-1] < at[1:]]] = False  # a record's first chunk ends no gap
        times = np.frombuffer(self._times, dtype=float)  # views of the arrays: no copy
        gaps = np.diff(times)[keep[1:]]  # a gap per chunk after a record's first
        sizes = np.frombuffer(self._sizes, dtype=np.int32)
        return gaps, sizes[1:][keep[1:]] if self._aligned else sizes[:0]

    def itl(self, mask: np.ndarray) -> np.ndarray:
        """:attr:`RequestRecord.itl` of the records in ``mask``, one after the other."""
        return self._gaps(mask)[0]

    def itl_per_token(self, mask: np.ndarray) -> np.ndarray:
        """:attr:`RequestRecord.itl_per_token` of the records in ``mask``, one after the other."""
        if not self._aligned:  # a size missing somewhere: record by record, as the property
            got = [x for i in np.flatnonzero(mask) for x in self._record(int(i)).itl_per_token]
            return np.array(got, dtype=float)
        gaps, sizes = self._gaps(mask)
        if not (sizes > 0).all():
            gaps, sizes = gaps[sizes > 0], sizes[sizes > 0]
        gaps /= sizes  # in place: a million requests' gaps are copied once, not thrice
        return gaps if (sizes == 1).all() else np.repeat(gaps, sizes)


def seq_sum(xs: np.ndarray) -> float:
    """The sum of ``xs`` added left to right, as Python's ``sum`` adds floats (numpy's pairwise
    sum differs in the last bits: stored figures stay those of the per-record code)."""
    return float(np.cumsum(xs)[-1]) if xs.size else 0

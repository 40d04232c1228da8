"""Requests held compactly (issue 38): a synthetic workload of a million requests as a list
of prompt texts and flat arrays of token ids, each :class:`Request` built when it is read
(a ``Request`` object with its tuple of ids is ~1 kB; packed, ~0.2 kB), and a lazy view that
maps each request as it is read (the length rule over a million requests, with no copy)."""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, Sequence
from typing import overload

from workloads.base import Request


class PackedRequests(Sequence[Request]):
    """Requests of one shape (a synthetic dataset's: id, prompt text, output length, prompt
    ids; ``source`` is ``{prefix}{id}``), appended one at a time."""

    def __init__(self, source_prefix: str = "synthetic#") -> None:
        self.source_prefix = source_prefix
        self._ids: list[str] = []
        self._texts: list[str] = []
        self._lengths = array("i")
        self._tokens = array("i")  # token ids: < 2**31
        self._at = array("q", [0])  # request i's ids: _tokens[_at[i]:_at[i+1]]

    def append(self, rid: str, text: str, max_new_tokens: int, ids: Sequence[int]) -> None:
        self._ids.append(rid)
        self._texts.append(text)
        self._lengths.append(max_new_tokens)
        self._tokens.extend(ids)
        self._at.append(len(self._tokens))

    def __len__(self) -> int:
        return len(self._ids)

    def _at_index(self, i: int) -> Request:
        rid = self._ids[i]
        return Request(
            rid, self._texts[i], None, self._lengths[i], None, f"{self.source_prefix}{rid}",
            prompt_token_ids=tuple(self._tokens[self._at[i] : self._at[i + 1]]),
        )  # fmt: skip

    @overload
    def __getitem__(self, i: int) -> Request: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[Request, ...]: ...
    def __getitem__(self, i: int | slice) -> Request | tuple[Request, ...]:
        if isinstance(i, slice):
            return tuple(self._at_index(k) for k in range(*i.indices(len(self))))
        n = len(self)
        if not -n <= i < n:
            raise IndexError(i)
        return self._at_index(i % n)

    def __iter__(self) -> Iterator[Request]:
        return (self._at_index(i) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = object.__hash__


class Mapped(Sequence[Request]):
    """``fn`` of each request of ``base``, computed as it is read (never stored)."""

    def __init__(self, base: Sequence[Request], fn: Callable[[Request], Request]) -> None:
        self.base, self.fn = base, fn

    def __len__(self) -> int:
        return len(self.base)

    @overload
    def __getitem__(self, i: int) -> Request: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[Request, ...]: ...
    def __getitem__(self, i: int | slice) -> Request | tuple[Request, ...]:
        if isinstance(i, slice):
            return tuple(self.fn(r) for r in self.base[i])
        return self.fn(self.base[i])

    def __iter__(self) -> Iterator[Request]:
        return (self.fn(r) for r in self.base)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = object.__hash__

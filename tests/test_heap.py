"""engines/common/heap.py: freed heap goes back to the OS where the C library can (glibc)."""

from __future__ import annotations

import pytest

from engines.common import heap


def test_trim_returns_the_freed_middle_of_the_heap() -> None:
    """100 KB chunks stay under glibc's mmap threshold, so 300 MB of them live in the heap; the
    last one kept pins its top, so freeing the rest returns nothing by itself: the trim does."""
    if heap._malloc_trim() is None:
        pytest.skip("no malloc_trim (not glibc)")
    chunks = [bytearray(100_000) for _ in range(3000)]  # bytearray: pages written (zeroed)
    for c in chunks:
        c[::4096] = b"x" * len(c[::4096])
    last = chunks[-1]
    heap.trim_heap()  # what was free before
    before = heap.rss_mb()
    del chunks[:-1]
    returned = heap.trim_heap()
    after = heap.rss_mb()
    assert returned is not None and returned > 200, (returned, before, after)
    assert before is not None and after is not None and before - after > 200
    assert len(last) == 100_000


def test_without_malloc_trim_it_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap, "_malloc_trim", lambda: None)
    assert heap.trim_heap() is None

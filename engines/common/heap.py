"""Hand the heap that closed in-process engines freed back to the OS (glibc: ``malloc_trim``).

Why: glibc keeps freed memory in its arenas. An in-process engine allocates its weights as many
chunks of a few MB (under glibc's dynamic mmap threshold, up to 32 MiB, once the first large
chunk was freed), so after its close most of it stays mapped, and ``malloc_trim(0)`` returns
most of it (docs/measurements.md). Trimmed after every block, the process's RSS between
blocks measures the memory still in use, so ``design.rss_after_block_mb`` shows a leak instead
of allocator slack, and the other processes of the machine get the memory back. Elsewhere
(musl, macOS) it is a no-op that says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os
from typing import Any


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, or None where the C library has none."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def rss_mb() -> float | None:
    """This process's resident memory (MB), where /proc has it."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


def trim_heap() -> float | None:
    """Collect garbage, then return the heap's free pages to the OS: the MB of RSS that went
    back (0.0 when none), or None where the C library cannot trim (not glibc)."""
    gc.collect()
    trim = _malloc_trim()
    if trim is None:
        return None
    before = rss_mb()
    trim(0)
    after = rss_mb()
    if before is None or after is None:
        return 0.0
    return round(max(0.0, before - after), 1)

"""Running counts of one run's finished requests, kept as each record arrives: the hot path's
questions (--max-error-rate, progress) answered in constant time per record, never by a scan
of the records so far (a scan per record made a 200,000-request run quadratic: issue 38)."""

from __future__ import annotations

from dataclasses import dataclass

from harness.core.records import NOT_SENT

MIN_SEEN = 5  # counted requests before --max-error-rate may stop a run


@dataclass
class RunCounters:
    """Counted (not warm-up) requests of one run so far, and how many of them failed."""

    counted: int = 0
    failed: int = 0
    warmup: int = 0

    def add(
        self, ok: bool, warmup: bool, limit: float | None = None, error: str | None = None
    ) -> str | None:
        """One finished record; the --max-error-rate stop reason it brings, if any. A request
        the client never sent (``error`` NOT_SENT) is the client's failing, not the engine's:
        not counted here."""
        if error == NOT_SENT:
            return None
        if warmup:
            self.warmup += 1
            return None
        self.counted += 1
        self.failed += not ok
        return self.error_rate_exceeded(limit)

    def error_rate_exceeded(self, limit: float | None) -> str | None:
        """The stop reason once more than ``limit`` of the counted requests failed (``MIN_SEEN``
        at least seen), else None (``--max-error-rate``)."""
        if limit is None or self.counted < MIN_SEEN:
            return None
        rate = self.failed / self.counted
        return f"error rate {rate:.0%} > --max-error-rate {limit:.0%}" if rate > limit else None

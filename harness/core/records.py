"""The frozen per-request record: raw timestamps in, every latency metric derived from them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The error of an open-loop request due before a --duration run's end that the client never sent
# (a full --max-concurrency, a blocked loop): a failed record with its schedule, never dropped
NOT_SENT = "not sent by the end: client behind"
# what a from-schedule figure of a closed loop (harness.core.load.open_loop false) says
NO_SCHEDULE = "closed loop: no schedule"


@dataclass(frozen=True, slots=True)  # slots: a million of them in a soak run (issue 38)
class RequestRecord:
    """What the runner saw of one request. Times are the runner's clock (seconds).

    ``chunk_times[i]`` is when chunk ``i`` (``chunk_tokens[i]`` tokens) arrived. TTFT, ITL, TPOT
    and E2E are properties, so no metric is stored twice.

    ``t_scheduled``: when an open-loop load (a rate, a ramp, a trace) scheduled the request; it
    went at ``t_send`` (later, when the client fell behind or waited for a concurrency slot).
    None for a closed loop, which has no schedule. The latencies from the schedule
    (``*_from_schedule``) are what a user arriving at the scheduled instant waited.

    A successful record with output has its first token inside the request
    (``0 < ttft <= e2e``): anything else is an engine's or the runner's bug, refused here
    (:meth:`problem`) rather than silently dropped from the TTFT statistics.
    """

    request_id: str
    t_send: float
    t_end: float
    chunk_times: tuple[float, ...] = ()
    chunk_tokens: tuple[int, ...] = ()
    output_token_ids: tuple[int, ...] | None = None
    prompt_tokens: int | None = None
    usage_output_tokens: int | None = None  # the server's own count, when it gave one
    output_text: str | None = None  # when the engine streamed text (used by the sanity check)
    ok: bool = True
    error: str | None = None
    warmup: bool = False
    info: Mapping[str, Any] = field(default_factory=dict)
    t_scheduled: float | None = None

    def __post_init__(self) -> None:
        why = self.problem()
        if why is not None:
            raise ValueError(f"request {self.request_id}: {why}")

    def problem(self) -> str | None:
        """Why this record cannot be true, else None: an ok record with output tokens has a
        first-token time after its send and no later than its end."""
        if not self.ok or self.output_tokens < 1:
            return None
        ttft = self.ttft
        if ttft is None:
            return f"record check: {self.output_tokens} output tokens but no first-token time"
        if not 0 < ttft <= self.e2e:
            return f"record check: ttft {ttft:.6g} s outside (0, e2e {self.e2e:.6g} s]"
        return None

    # ---- derived ---------------------------------------------------------------------------
    @property
    def output_tokens(self) -> int:
        """Counted from token ids (or chunk token counts); the server's usage when it says more."""
        streamed = sum(self.chunk_tokens)
        if self.output_token_ids is not None:
            streamed = len(self.output_token_ids)
        if self.usage_output_tokens is not None:
            return self.usage_output_tokens
        return streamed

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] - self.t_send if self.chunk_times else None

    @property
    def e2e(self) -> float:
        return self.t_end - self.t_send

    @property
    def client_queue(self) -> float | None:
        """Schedule to send: how long the client held the request (None: no schedule)."""
        return None if self.t_scheduled is None else self.t_send - self.t_scheduled

    @property
    def ttft_from_schedule(self) -> float | None:
        if self.t_scheduled is None or not self.chunk_times:
            return None
        return self.chunk_times[0] - self.t_scheduled

    @property
    def e2e_from_schedule(self) -> float | None:
        return None if self.t_scheduled is None else self.t_end - self.t_scheduled

    @property
    def user_ttft(self) -> float | None:
        """TTFT as the user waits it: from the schedule under an open loop, else from the send
        (the SLO search and goodput judge on this)."""
        return self.ttft if self.t_scheduled is None else self.ttft_from_schedule

    @property
    def user_e2e(self) -> float:
        """E2E as the user waits it (see :attr:`user_ttft`)."""
        e2e = self.e2e_from_schedule
        return self.e2e if e2e is None else e2e

    @property
    def itl(self) -> tuple[float, ...]:
        """Inter-chunk latencies (one per chunk after the first)."""
        t = self.chunk_times
        return tuple(b - a for a, b in zip(t, t[1:]))

    @property
    def itl_per_token(self) -> tuple[float, ...]:
        """Each inter-chunk gap spread evenly over the tokens that chunk carried."""
        out: list[float] = []
        for gap, n in zip(self.itl, self.chunk_tokens[1:]):
            out.extend([gap / n] * n if n > 0 else [])
        return tuple(out)

    @property
    def tpot(self) -> float | None:
        """(e2e - ttft) / (n - 1): time per output token after the first."""
        n, ttft = self.output_tokens, self.ttft
        if ttft is None or n < 2:
            return None
        return (self.e2e - ttft) / (n - 1)

    @property
    def counted(self) -> bool:
        """Whether the record enters statistics (finished, not a warm-up)."""
        return self.ok and not self.warmup

    # ---- JSON ------------------------------------------------------------------------------
    def to_json(self, t0: float = 0.0) -> dict[str, Any]:
        """Times relative to ``t0`` (the run's start); derived fields written for readers."""
        return {
            "id": self.request_id,
            "send_s": self.t_send - t0,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "ttft_s": self.ttft,
            "e2e_s": self.e2e,
            "itl_s": list(self.itl),
            "chunk_tokens": list(self.chunk_tokens),
            "output_token_ids": None
            if self.output_token_ids is None
            else list(self.output_token_ids),
            "usage_output_tokens": self.usage_output_tokens,
            "output_text": self.output_text,
            "ok": self.ok,
            "error": self.error,
            "warmup": self.warmup,
            "info": dict(self.info),
            "scheduled_s": None if self.t_scheduled is None else self.t_scheduled - t0,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RequestRecord:
        """Inverse of :meth:`to_json` (times relative to the run's start). A stored record that
        fails the check (written before it existed) is read back as failed, with the reason."""
        try:
            return cls._from_json(d)
        except ValueError as exc:
            if not d.get("ok", True):
                raise
            why = str(exc).split(": ", 1)[-1]
            return cls._from_json({**d, "ok": False, "error": why})

    @classmethod
    def _from_json(cls, d: Mapping[str, Any]) -> RequestRecord:
        t_send = float(d["send_s"])
        times: list[float] = []
        if d.get("ttft_s") is not None:
            t = t_send + float(d["ttft_s"])
            times.append(t)
            for gap in d.get("itl_s") or []:
                t += float(gap)
                times.append(t)
        ids = d.get("output_token_ids")
        return cls(
            request_id=str(d["id"]),
            t_send=t_send,
            t_end=t_send + float(d["e2e_s"]),
            chunk_times=tuple(times),
            chunk_tokens=tuple(int(x) for x in d.get("chunk_tokens") or []),
            output_token_ids=None if ids is None else tuple(int(x) for x in ids),
            prompt_tokens=d.get("prompt_tokens"),
            usage_output_tokens=d.get("usage_output_tokens"),
            output_text=d.get("output_text"),
            ok=bool(d.get("ok", True)),
            error=d.get("error"),
            warmup=bool(d.get("warmup", False)),
            info=dict(d.get("info") or {}),
            t_scheduled=None if d.get("scheduled_s") is None else float(d["scheduled_s"]),
        )

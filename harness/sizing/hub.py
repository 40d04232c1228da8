"""What a hub model costs before it downloads: in the HF cache already, or how many bytes of
weights will come (the hub's file list; nothing but metadata is fetched), or why that is unknown
(offline, gated without ``HF_TOKEN``). Every engine loads a hub id through the same HF cache, so
one download serves them all.

Every call to the hub before loading goes through :func:`with_deadline`: huggingface_hub retries
an unanswered request with backoff for minutes (a network that drops packets), so each call is
waited for at most ``HUB_TIMEOUT_S``, and once the hub has not answered, nothing else in this
process asks it again."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


def _timeout(default: float = 10.0) -> float:
    """$HARNESS_HUB_TIMEOUT_S (seconds > 0), else ``default``."""
    try:
        value = float(os.environ.get("HARNESS_HUB_TIMEOUT_S", default))
    except ValueError:
        return default
    return value if value > 0 else default


HUB_TIMEOUT_S = _timeout()
OFFLINE_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")  # huggingface_hub's, read at call time
UNREACHABLE_HOW = "offline? set HF_HUB_OFFLINE=1 or pass a local path"
_unreachable: dict[str, str] = {}  # endpoint -> why (this process asks it no more)
T = TypeVar("T")


class HubUnreachable(TimeoutError):
    """The hub did not answer within ``HUB_TIMEOUT_S`` (now or earlier in this process)."""


def offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) set: the HF cache only, no request."""
    return any(os.environ.get(k, "").upper() in ("1", "ON", "YES", "TRUE") for k in OFFLINE_ENV)


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def with_deadline(call: Callable[[], T], seconds: float = HUB_TIMEOUT_S) -> T:
    """``call()`` (a hub request) on a daemon thread, waited for at most ``seconds``; raises
    :class:`HubUnreachable` past it (the thread is left to huggingface_hub's retries: the run
    stops, or goes on without the hub) and at once for an endpoint that did not answer before."""
    where = endpoint()
    if where in _unreachable:
        raise HubUnreachable(_unreachable[where])
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=run, name="hub-request", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        _unreachable[where] = f"hub not reachable in {seconds:g} s"
        raise HubUnreachable(_unreachable[where])
    if "error" in box:
        raise box["error"]
    return box["value"]


def is_hub_id(name: str | None) -> bool:
    return bool(name) and not Path(str(name)).expanduser().exists() and str(name).count("/") == 1


def hub_status(name: str) -> dict[str, Any]:
    """{"model", "cached", "download_bytes" or None, "note"} for a hub id."""
    out: dict[str, Any] = {"model": name, "cached": False, "download_bytes": None, "note": ""}
    try:
        from huggingface_hub import scan_cache_dir

        cached = {r.repo_id: r for r in scan_cache_dir().repos}
    except Exception:  # noqa: BLE001 - no cache yet
        cached = {}
    if name in cached:
        out["cached"] = True
        out["note"] = f"in the HF cache ({cached[name].size_on_disk} bytes)"
        return out
    if offline():
        out["note"] = "not in the HF cache and HF_HUB_OFFLINE=1: it cannot load"
        return out
    try:
        from huggingface_hub import HfApi

        timeout = HUB_TIMEOUT_S
        info = with_deadline(lambda: HfApi().model_info(name, files_metadata=True, timeout=timeout))
        files = [s for s in info.siblings or () if s.rfilename.endswith(WEIGHT_SUFFIXES)]
        if any(s.rfilename.endswith(".safetensors") for s in files):  # what transformers takes
            files = [s for s in files if s.rfilename.endswith(".safetensors")]
        size = sum(s.size or 0 for s in files)
        out["download_bytes"] = size or None
        out["note"] = "downloads once into the HF cache (every engine reads it there)"
    except HubUnreachable as exc:
        out["note"] = f"size unknown ({exc}; {UNREACHABLE_HOW})"
    except Exception as exc:  # noqa: BLE001 - offline, gated, no such repo: said, not fatal
        kind = type(exc).__name__
        gated = "Gated" in kind or "401" in str(exc) or "403" in str(exc)
        out["note"] = (
            "gated: set HF_TOKEN to a token with access (huggingface.co/settings/tokens)"
            if gated
            else f"size unknown ({kind}: {str(exc).splitlines()[0][:120] if str(exc) else ''})"
        )
    return out

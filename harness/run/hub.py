"""What a hub model costs before it downloads: in the HF cache already, or how many bytes of
weights will come (the hub's file list; nothing but metadata is fetched), or why that is unknown
(offline, gated without ``HF_TOKEN``). Every engine loads a hub id through the same HF cache, so
one download serves them all."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


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
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        out["note"] = "not in the HF cache and HF_HUB_OFFLINE=1: it cannot load"
        return out
    try:
        from huggingface_hub import HfApi

        info = HfApi().model_info(name, files_metadata=True, timeout=10)
        files = [s for s in info.siblings or () if s.rfilename.endswith(WEIGHT_SUFFIXES)]
        if any(s.rfilename.endswith(".safetensors") for s in files):  # what transformers takes
            files = [s for s in files if s.rfilename.endswith(".safetensors")]
        size = sum(s.size or 0 for s in files)
        out["download_bytes"] = size or None
        out["note"] = "downloads once into the HF cache (every engine reads it there)"
    except Exception as exc:  # noqa: BLE001 - offline, gated, no such repo: said, not fatal
        kind = type(exc).__name__
        gated = "Gated" in kind or "401" in str(exc) or "403" in str(exc)
        out["note"] = (
            "gated: set HF_TOKEN to a token with access (huggingface.co/settings/tokens)"
            if gated
            else f"size unknown ({kind}: {str(exc).splitlines()[0][:120] if str(exc) else ''})"
        )
    return out

"""Shared fixtures: the embedded model pair (built once, never per test)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def embedded_pair() -> tuple[str, str]:
    """(target, draft) directories of the embedded pair."""
    from harness.models import ensure_embedded

    target, draft = ensure_embedded(progress=False)
    return str(target), str(draft)

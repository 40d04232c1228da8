"""Speed of light for batch-1 decoding: every weight is read once per token, so
tokens/s <= memory bandwidth / bytes of weights. Reads safetensors headers only; torch only to
time a copy in a CUDA device's memory."""

from __future__ import annotations

import json
import statistics
import struct
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def speed_of_light(n_params: float, bytes_per_param: float, bandwidth_bytes_s: float) -> float:
    """Upper bound on batch-1 decode tokens/s: all ``n_params`` weights read once per token."""
    if n_params <= 0 or bytes_per_param <= 0:
        raise ValueError("n_params and bytes_per_param must be > 0")
    return bandwidth_bytes_s / (n_params * bytes_per_param)


def measure_bandwidth(mib: int = 512, reps: int = 7, device: str = "cpu") -> dict[str, float]:
    """Copy a ``mib`` MiB buffer ``reps`` times in ``device``'s memory (host memory unless a
    ``cuda`` device); bytes/s counting read + write (best and median)."""
    if device.startswith("cuda"):
        return _cuda_bandwidth(mib, reps, device)
    src = np.ones(mib * 2**20 // 8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        rates.append(2 * src.nbytes / (time.perf_counter() - t0))
    return {"best": max(rates), "median": statistics.median(rates), "bytes": float(src.nbytes)}


def _cuda_bandwidth(mib: int, reps: int, device: str) -> dict[str, float]:
    import torch

    src = torch.ones(mib * 2**20 // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    rates = []
    for _ in range(reps):
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize(device)
        rates.append(2 * src.numel() * 4 / (time.perf_counter() - t0))
    nbytes = float(src.numel() * 4)
    del src, dst
    torch.cuda.empty_cache()
    return {"best": max(rates), "median": statistics.median(rates), "bytes": nbytes}


def weights_device(engine_infos: Iterable[Mapping[str, Any]]) -> str | None:
    """Where an in-process engine keeps the weights: its ``device`` (HF) or ``platform`` (vLLM),
    ``cuda...`` or ``cpu``; None when no engine says (a server's weights are not ours to see).
    """
    for info in engine_infos:
        where = str(info.get("device") or info.get("platform") or "")
        if where:
            return where if where.startswith("cuda") else "cpu"
    return None


def count_params(model_dir: str | Path) -> int | None:
    """Parameters stored in a local model directory's safetensors files (None if none)."""
    files = sorted(Path(model_dir).glob("*.safetensors")) if Path(model_dir).is_dir() else []
    total = 0
    for f in files:
        with f.open("rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        for name, meta in header.items():
            if name != "__metadata__":
                total += int(np.prod(meta["shape"])) if meta["shape"] else 1
    return total or None


def bound_for(
    model_dir: str, dtype: str, bandwidth: float, memory: str = "host"
) -> dict[str, Any] | None:
    """The batch-1 bound of a local model run in ``dtype`` with its weights in ``memory``
    (``host`` or a device), None when the size is unknown."""
    n = count_params(model_dir)
    if n is None or dtype not in DTYPE_BYTES:
        return None
    per_param = DTYPE_BYTES[dtype]
    return {
        "n_params": n,
        "bytes_per_param": per_param,
        "bandwidth_bytes_s": bandwidth,
        "memory": memory,
        "tok_s": speed_of_light(n, per_param, bandwidth),
    }

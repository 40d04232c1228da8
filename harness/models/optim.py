"""Training-loop pieces shared by the draft and the EAGLE-3 head (``harness.models.train``,
``harness.models.eagle3``): the thread cap, the seeded train/validation split, the warm-up +
cosine learning rate (the tiny pair's too: ``harness.models.tiny_pair``), one clipped
optimizer step."""

from __future__ import annotations

import math
import random
from typing import Any

THREADS = 1  # one core: a build must not slow a machine that measures


def torch_threads() -> Any:
    """torch, capped at THREADS threads."""
    import torch

    torch.set_num_threads(THREADS)
    return torch


def optimizer_step(opt: Any, loss: Any, params: Any) -> None:
    """One clipped step (gradient norm 1.0): the draft's and the EAGLE-3 head's training."""
    from torch.nn.utils import clip_grad_norm_

    opt.zero_grad()
    loss.backward()
    clip_grad_norm_(params, 1.0)
    opt.step()


def split(seqs: list[Any], seed: int) -> tuple[list[Any], list[Any]]:
    idx = list(range(len(seqs)))
    random.Random(seed).shuffle(idx)
    n_val = max(8, len(seqs) // 20)
    return [seqs[i] for i in idx[n_val:]], [seqs[i] for i in idx[:n_val]]


def lr_at(
    step: int, steps: int, peak: float, warmup: int | None = None, floor: float = 0.0
) -> float:
    """The one warm-up + cosine schedule of every model the harness trains (the tiny pair,
    SmolLM2's draft and EAGLE-3 head): linear up to ``peak`` over ``warmup`` steps (default:
    the first 5%), then a cosine down to ``floor`` x ``peak`` at ``steps``."""
    warm = max(1, steps // 20) if warmup is None else warmup
    if step < warm:
        return peak * (step + 1) / warm
    t = (step - warm) / max(1, steps - warm)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))

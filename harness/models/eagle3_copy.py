"""Teaching an EAGLE-3 head to copy from its context (``harness.models.eagle3.train``'s
``copy_group``).

A head trained on next-token labels alone predicts from its last few positions: SmolLM2's,
after four passes, agreed as often seeing 16 positions as seeing the whole prompt, while prompt
lookup was right on 98 of 114 matched positions of the held-out code edit. Copying needs one
attention group to find the earlier position a two-token match points at, and a few hundred
steps of labels alone never moved the attention there. So, as in induction-head supervision:

1. ``teach_attention``: only the query rows of one group (its ``heads // kv_heads`` query heads)
   and its key rows train, on ``attention_loss`` alone (the negative log of the attention those
   heads give the positions a match points at), until they point there;
2. then the whole head trains on the usual unrolled cross-entropy plus that loss (weight
   ``COPY_WEIGHT``), on sequences drawn half from those whose answers copy from their prompt
   (``copy_share`` >= 0.5): the layers after the attention learn to use what it finds.

The match: at position t (token x[t+1], predicting x[t+2]) the positions j <= t whose bigram
(x[j-1], x[j]) equals (x[t], x[t+1]) and whose next token x[j+1] is the label; the head's
input at j carries x[j+1]'s embedding, so attending j brings the token to copy.
"""

from __future__ import annotations

import random
from typing import Any

import torch
from torch import nn

COPY_STEPS = 2000  # attention-only steps (teach_attention)
COPY_LR = 3e-3
COPY_WEIGHT = 1.0  # attention_loss's weight beside the cross-entropy afterwards
HEAVY_SHARE = 0.5  # of the sequences drawn after it: answers that copy from their prompt


def match_targets(s: dict[str, Any]) -> tuple[int, list[int], list[int]]:
    """(T, rows, cols): head position ``rows[i]`` should attend ``cols[i]`` (a two-token match
    whose next token is the label there)."""
    ids, lab = s["ids"].tolist(), s["labels"].tolist()
    T = len(ids) - 2
    seen: dict[tuple[int, int], list[int]] = {}
    rows: list[int] = []
    cols: list[int] = []
    for t in range(T):
        if t >= 1:
            seen.setdefault((ids[t - 1], ids[t]), []).append(t)
        for j in seen.get((ids[t], ids[t + 1]), ()):
            if ids[j + 1] == lab[t + 1]:
                rows.append(t)
                cols.append(j)
    return T, rows, cols


def copy_share(s: dict[str, Any]) -> float:
    """The share of an answer's bigrams that occur in its prompt."""
    ids, p = s["ids"].tolist(), s["prompt_len"]
    prompt = set(zip(ids[: p - 1], ids[1:p]))
    answer = list(zip(ids[p - 1 : -1], ids[p:]))
    return sum(b in prompt for b in answer) / max(1, len(answer))


def crop(s: dict[str, Any], context: int) -> dict[str, Any]:
    """A sequence cut to at most ``context`` prompt positions (as ``eagle3._unroll`` cuts it)."""
    st = max(0, s["prompt_len"] - context)
    cut = {k: s[k][st:] for k in ("ids", "feat", "labels")}
    return {**s, **cut, "prompt_len": s["prompt_len"] - st}


def attention_loss(head: Any, s: dict[str, Any], group: int) -> torch.Tensor | None:
    """Mean over matched positions and the group's query heads of -log(attention on the
    matches), at the unroll's first step; None where the sequence has no match."""
    T, rows, cols = match_targets(s)
    if not rows:
        return None
    ids, feat = s["ids"], s["feat"]
    x = head.attention_input(ids[1 : T + 1], head.combine(feat[:T]))
    pos = torch.arange(T)
    rep, d = head.heads // head.kv_heads, head.head_dim
    q, k = head.queries_keys(x, pos)
    q, k = q[group * rep : (group + 1) * rep], k[group : group + 1]
    scores = (q @ k.transpose(1, 2)) / d**0.5
    logp = scores.masked_fill(pos[None, :] > pos[:, None], float("-inf")).log_softmax(-1)
    on = torch.full((T, T), float("-inf"))
    on[torch.tensor(rows), torch.tensor(cols)] = 0.0
    has = torch.zeros(T, dtype=torch.bool)
    has[torch.tensor(rows)] = True
    return -torch.logsumexp(logp[:, has] + on[has][None], -1).mean()


class Sampler:
    """Training sequences drawn with replacement, ``HEAVY_SHARE`` of them from those that copy
    (``copy_share`` >= 0.5); its state goes into the training checkpoint."""

    def __init__(self, train_set: list[dict[str, Any]], seed: int, context: int) -> None:
        self.train_set, self.context = train_set, context
        self.heavy = [i for i, s in enumerate(train_set) if copy_share(s) >= 0.5]
        self.rng = random.Random(seed + 1)

    def __call__(self) -> dict[str, Any]:
        if self.rng.random() < HEAVY_SHARE and self.heavy:
            return crop(self.train_set[self.rng.choice(self.heavy)], self.context)
        return crop(self.train_set[self.rng.randrange(len(self.train_set))], self.context)


def teach_attention(head: Any, sample: Sampler, group: int, steps: int = COPY_STEPS) -> float:
    """Step 1 of the recipe: only ``group``'s query and key rows train, on ``attention_loss``
    (warm-up + cosine to COPY_LR); returns the loss over the last 100 steps."""
    from harness.models.optim import lr_at

    params = [head.q_proj.weight, head.k_proj.weight]
    opt = torch.optim.AdamW(params, lr=COPY_LR, weight_decay=0.0)
    recent: list[float] = []
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, COPY_LR)
        loss = attention_loss(head, sample(), group)
        if loss is None:
            continue
        opt.zero_grad()
        loss.backward()  # other groups' rows get no gradient: the loss never reads them
        nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        recent = (recent + [float(loss.detach())])[-100:]
    return sum(recent) / max(1, len(recent))

"""An EAGLE-3 head in vLLM's layout (``vllm/model_executor/models/llama_eagle3.py``,
``LlamaForCausalLMEagle3``) for a Llama target, written in plain torch to train it here
(SmolLM2's, ``harness.models.train``; the tiny target's, ``harness.models.tiny_eagle3``); its
files on disk are ``harness.models.eagle3_checkpoint``'s.

The head sees the target's residual stream after three layers (``aux_layers``: SmolLM2's 2, 15,
27; each RMS-normed: ``fc_norm``, because those layers carry activations near 2e4), projects
them with ``fc`` to the hidden size, and runs one decoder layer whose attention takes
``[norm(embed(token)), norm(hidden)]`` (2 x hidden inputs). Its ``lm_head`` covers a reduced
vocabulary (SmolLM2: 8,192 of 49,152 tokens) mapped back by ``d2t``; it starts as the target's
tied head rows and either stays frozen there (then the committed file omits it) or trains
(``train_lm_head``, as published EAGLE-3 heads do; then it is committed as ``lm_head.weight``).

Training-time test (EAGLE-3): step k >= 2 at position t takes the step k-1 output at t-1 as its
hidden input and attends to step 1's keys up to t-k+1 plus its own chain's keys, as at inference.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from harness.models.eagle3_checkpoint import head_config, layer_ids, load_into
from harness.models.eagle3_soft import TargetTail, targets
from harness.models.eagle3_soft import loss as soft_loss

TTT_STEPS = 3
STEP_WEIGHTS = (1.0, 0.8, 0.6)
MAX_HEAD_CONTEXT = 1024  # the head attends over at most this many prompt positions in training
PEAK_LR = 1e-3


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


def _rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style rotary embedding (vLLM's Llama): x [heads, T, d]."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = pos.float()[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Eagle3Head(nn.Module):
    def __init__(
        self,
        cfg: dict[str, Any],
        embed: torch.Tensor,
        vocab: torch.Tensor,
        train_lm_head: bool = False,
    ) -> None:
        super().__init__()
        h, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.heads, self.kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.head_dim = cfg.get("head_dim") or h // self.heads
        self.theta = cfg["rope_parameters"]["rope_theta"]
        inter = cfg["intermediate_size"]
        n_aux = len(layer_ids(cfg))
        self.fc_norm = nn.ModuleList([RMSNorm(h, eps) for _ in range(n_aux)])
        self.fc = nn.Linear(h * n_aux, h, bias=False)
        self.input_layernorm, self.hidden_norm = RMSNorm(h, eps), RMSNorm(h, eps)
        self.post_attention_layernorm, self.norm = RMSNorm(h, eps), RMSNorm(h, eps)
        self.q_proj = nn.Linear(2 * h, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * h, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * h, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)
        self.gate_proj = nn.Linear(h, inter, bias=False)
        self.up_proj = nn.Linear(h, inter, bias=False)
        self.down_proj = nn.Linear(inter, h, bias=False)
        self.register_buffer("embed", embed, persistent=False)  # the target's, frozen
        if train_lm_head:
            self.lm_head = nn.Parameter(embed[vocab].clone())
        else:
            self.register_buffer("lm_head", embed[vocab].clone(), persistent=False)

    def combine(self, feat: torch.Tensor) -> torch.Tensor:
        chunks = feat.float().chunk(len(self.fc_norm), dim=-1)
        return self.fc(torch.cat([n(c) for n, c in zip(self.fc_norm, chunks)], -1))

    def attention_input(self, tokens: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """The decoder layer's input: [norm(embed(token)), norm(hidden)] per position."""
        return torch.cat([self.input_layernorm(self.embed[tokens]), self.hidden_norm(hidden)], -1)

    def queries_keys(self, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated queries [heads, T, d] and keys [kv_heads, T, d] of ``attention_input`` x."""
        T = x.shape[0]
        q = self.q_proj(x).view(T, self.heads, self.head_dim).transpose(0, 1)
        k = self.k_proj(x).view(T, self.kv_heads, self.head_dim).transpose(0, 1)
        return _rope(q, pos, self.theta), _rope(k, pos, self.theta)

    def step(
        self,
        tokens: torch.Tensor,
        hidden: torch.Tensor,
        pos: torch.Tensor,
        past: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """One unroll step over T positions: (normed out, prenorm out, this step's (k, v)).

        ``past`` holds the (k, v) of earlier steps; step k's query at t attends step 1 at
        positions <= t-k+1 and step j >= 2 at position t-k+j (its own chain).
        """
        T = tokens.shape[0]
        residual = hidden
        x = self.attention_input(tokens, hidden)
        q, k = self.queries_keys(x, pos)
        v = self.v_proj(x).view(T, self.kv_heads, self.head_dim).transpose(0, 1)
        n = len(past) + 1  # this step's number
        ks = [p[0] for p in past] + [k]
        vs = [p[1] for p in past] + [v]
        t = torch.arange(T)
        masks = [t[None, :] <= (t[:, None] - n + 1)]  # step 1: causal up to the chain origin
        masks += [t[None, :] == (t[:, None] - n + j) for j in range(2, n + 1)]
        mask = torch.cat(masks, dim=1)
        rep = self.heads // self.kv_heads
        kk = torch.cat(ks, dim=1).repeat_interleave(rep, 0)
        vv = torch.cat(vs, dim=1).repeat_interleave(rep, 0)
        att = nn.functional.scaled_dot_product_attention(q[None], kk[None], vv[None], mask[None])
        o = self.o_proj(att[0].transpose(0, 1).reshape(T, -1))
        residual = o + residual
        y = self.post_attention_layernorm(residual)
        y = self.down_proj(nn.functional.silu(self.gate_proj(y)) * self.up_proj(y))
        pre = y + residual
        return self.norm(pre), pre, (k, v)


def _unroll(
    head: Eagle3Head,
    s: dict[str, Any],
    vocab: torch.Tensor,
    steps: int,
    prompt_loss: bool = True,
    tail: TargetTail | None = None,
) -> list[Any]:
    """Per step: (logits over the draft vocab, label index, label is a generated token, the
    distribution to learn there or None: ``tail``'s soft labels, ``harness.models.eagle3_soft``).

    Position t: hidden f[t], token x[t+1], label = the target's greedy token after t+1
    (``labels[t+1]``; the generated x[t+2] in the output). Step 1 learns at every position
    (``prompt_loss``) or, as SpecForge's loss mask does, only in the output; later steps only
    in the output, where x[t+1] is what the chain would have drafted."""
    ids, p, feat, labels = s["ids"], s["prompt_len"], s["feat"], s["labels"]
    target_logits = tail.logits(feat) if tail is not None else None  # over the whole sequence
    start = max(0, p - MAX_HEAD_CONTEXT)
    ids, feat, labels, p = ids[start:], feat[start:], labels[start:], p - start
    T = len(ids) - 2
    tokens, target = ids[1 : T + 1], labels[1 : T + 1]
    pos = torch.arange(T)
    lab = torch.searchsorted(vocab, target).clamp(max=len(vocab) - 1)
    inside = vocab[lab] == target
    output = pos >= p - 2
    soft = None if target_logits is None else targets(target_logits[start + 1 : start + T + 1], lab)
    hidden = head.combine(feat[:T])
    past: list[Any] = []
    out = []
    pre = hidden
    for n in range(steps):
        if n > 0:  # step n+1 at t takes step n's output at t-1
            hidden = torch.cat([hidden[:1] * 0, pre[:-1]], 0)
        normed, pre, kv = head.step(tokens, hidden, pos, past)
        past.append(kv)
        counted = (output if n > 0 or not prompt_loss else torch.ones_like(output)) & (pos >= n)
        valid = inside & counted
        p_valid = None if soft is None else soft[valid]
        out.append((normed[valid] @ head.lm_head.T, lab[valid], output[valid], p_valid))
    return out


def evaluate(head: Eagle3Head, val: list[dict[str, Any]], vocab: torch.Tensor) -> list[float]:
    """Teacher-forced top-1 agreement with the target per unroll step, over generated tokens
    (a label outside the draft vocabulary counts as a miss)."""
    ok = [0] * TTT_STEPS
    n = [0] * TTT_STEPS
    with torch.no_grad():
        for s in val:
            T = len(s["ids"]) - 2
            for i, (logits, lab, is_out, _) in enumerate(_unroll(head, s, vocab, TTT_STEPS)):
                ok[i] += int(((logits.argmax(-1) == lab) & is_out).sum())
                n[i] += max(0, T - max(i, s["prompt_len"] - 2))
    return [round(a / max(1, b), 4) for a, b in zip(ok, n)]


def train(
    target_model: Any,
    data: list[dict[str, Any]],
    vocab: torch.Tensor,
    seed: int,
    budget_s: float,
    steps: int | None = None,
    layers: tuple[int, ...] | None = None,
    checkpoint: Path | None = None,
    every: int = 200,
    progress: bool = False,
    init: Path | None = None,
    train_lm_head: bool = False,
    peak_lr: float = PEAK_LR,
    copy_group: int | None = None,
    prompt_loss: bool = True,
    soft_labels: bool = False,
) -> tuple[Eagle3Head, dict[str, Any]]:
    """Trains for ``budget_s`` CPU seconds (the step count sized from the first 20 steps) or,
    given ``steps``, for exactly that many (reproducible on any machine). With ``checkpoint``,
    the head, the optimizer and the step are saved there every ``every`` steps and a run that
    finds the file resumes from it (each epoch's order is seeded by its number, so a resumed
    run sees the sequences a whole one would). ``init``: start from a saved head
    (``eagle3.safetensors`` of ``save``) instead of the target's last layer, with a fresh
    warm-up + cosine to ``peak_lr`` (a warm restart: how the committed head gets more passes).
    ``copy_group``: ``harness.models.eagle3_copy``'s recipe on that attention group (its
    attention taught first, then an extra loss and copy-heavy draws instead of epochs).
    ``prompt_loss``: step 1 learns at the prompt's positions too (``_unroll``).
    ``soft_labels``: it learns the target's distribution (``harness.models.eagle3_soft``)."""
    from harness.models.optim import lr_at, optimizer_step, split

    torch.manual_seed(seed)
    cfg = head_config(target_model.config.to_dict(), len(vocab), layers)
    embed = target_model.model.embed_tokens.weight.detach().clone()
    head = Eagle3Head(cfg, embed, vocab, train_lm_head=train_lm_head)
    if init is not None:
        load_into(head, init, vocab)
    else:
        with torch.no_grad():  # start the layer from the target's last one (a good prior)
            last = target_model.model.layers[-1]
            for name in ("gate_proj", "up_proj", "down_proj"):
                getattr(head, name).weight.copy_(getattr(last.mlp, name).weight)
            head.post_attention_layernorm.weight.copy_(last.post_attention_layernorm.weight)
            head.norm.weight.copy_(target_model.model.norm.weight)
    train_set, val = split(data, seed)
    tail = TargetTail(target_model, layer_ids(cfg)[-1], vocab) if soft_labels else None
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=peak_lr, weight_decay=0.0)
    t0, step, est = time.process_time(), 0, steps
    total = steps or 10**9
    spent = 0.0
    if checkpoint is not None and checkpoint.is_file():
        state = torch.load(checkpoint)
        head.load_state_dict(state["head"])
        opt.load_state_dict(state["opt"])
        step, total, est, spent = state["step"], state["total"], state["est"], state["cpu_s"]
        if progress:
            print(f"eagle3: resumed at step {step} of {total}", flush=True)
    copying: dict[str, Any] = {}
    sample = None
    if copy_group is not None:
        from harness.models import eagle3_copy as copy

        if not 0 <= copy_group < head.kv_heads:
            raise ValueError(f"copy_group {copy_group}: the head has groups 0..{head.kv_heads - 1}")

        sample = copy.Sampler(train_set, seed, MAX_HEAD_CONTEXT)
        copying = {"group": copy_group, "attention_steps": copy.COPY_STEPS,
                   "attention_lr": copy.COPY_LR, "weight": copy.COPY_WEIGHT,
                   "heavy_share": copy.HEAVY_SHARE, "heavy_sequences": len(sample.heavy)}  # fmt: skip
        if step == 0:
            copying["attention_loss_end"] = round(copy.teach_attention(head, sample, copy_group), 3)
        else:  # resumed: the draws go on where they stopped; step 1 is in the weights
            sample.rng.setstate(state["sampler"])
            copying["attention_loss_end"] = state["attention_loss_end"]
    n = len(train_set)
    order: list[int] = []
    recent: list[float] = []
    while step < total:
        epoch, k = divmod(step, n)
        if k == 0 or not order:
            order = list(range(n))
            random.Random(seed * 100_003 + epoch).shuffle(order)
        if step == 20 and steps is None:
            est = total = int(budget_s / ((time.process_time() - t0) / 20))
        for g in opt.param_groups:
            g["lr"] = lr_at(step, est or 10**4, peak_lr)
        s = sample() if sample is not None else train_set[order[k]]
        loss = torch.zeros(())
        unrolled = _unroll(head, s, vocab, TTT_STEPS, prompt_loss, tail)
        for w, (logits, lab, _, p) in zip(STEP_WEIGHTS, unrolled):
            if len(lab):
                one = (
                    nn.functional.cross_entropy(logits, lab) if p is None else soft_loss(logits, p)
                )
                loss = loss + w * one
        if (
            copy_group is not None
            and (extra := copy.attention_loss(head, s, copy_group)) is not None
        ):
            loss = loss + copy.COPY_WEIGHT * extra
        optimizer_step(opt, loss, params)
        recent = (recent + [float(loss.detach())])[-100:]
        step += 1
        if checkpoint is not None and (step % every == 0 or step == total):
            state = {
                "head": head.state_dict(),
                "opt": opt.state_dict(),
                "step": step,
                "total": total,
                "est": est,
                "cpu_s": spent + time.process_time() - t0,
                "sampler": sample.rng.getstate() if sample is not None else None,
                "attention_loss_end": copying.get("attention_loss_end"),
            }
            torch.save(state, checkpoint.with_suffix(".tmp"))
            checkpoint.with_suffix(".tmp").replace(checkpoint)
            if progress:
                mean = sum(recent) / len(recent)
                print(f"eagle3: step {step}/{total} loss {mean:.3f}", flush=True)
    head.eval()
    info = {
        "steps": step,
        "ttt_steps": TTT_STEPS,
        "train_cpu_seconds": round(spent + time.process_time() - t0),
        "draft_vocab_size": len(vocab),
        "peak_lr": peak_lr,
        "lm_head": "trained" if train_lm_head else "the target's rows, frozen",
        "loss_on": "all" if prompt_loss else "output",
        "val_sequences": len(val),
        "top1_agreement_per_step": evaluate(head, val, vocab),
    }
    if soft_labels:
        info["labels"] = "the target's distribution over the draft vocabulary (soft)"
    if copying:
        info["copy"] = copying
    return head, info

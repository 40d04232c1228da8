"""Pieces of SmolLM2's speculator data shared by the build and the offline evaluation: the
target loaded as the evaluation runs it, the held-out prompt ids, a batched greedy loop that keeps
the hidden states [2], [15], [27] at every position (``harness.models.evaluate``), and the
reduced vocabulary of the EAGLE-3 head. The training set itself is ``harness.models.distill``'s."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from harness.models import smollm as sm
from harness.models.optim import torch_threads as _torch

WORK = sm.CACHE_DIR.parent / "train"
DATA = Path(__file__).resolve().parents[2] / "workloads" / "data"
DRAFT_VOCAB = 8192


def load_target(target: Path) -> Any:
    torch = _torch()
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    m.eval()
    return m


def held_out() -> set[str]:
    """Never trained on: the first ``HELD_OUT`` prompts of each category (Spec-Bench order, then
    the code edits); the default workload draws from them, so its acceptance is held out."""
    from workloads.make_grounded import HELD_OUT

    seen: dict[str, int] = {}
    held = set()
    for r in all_prompts():
        seen[r["category"]] = seen.get(r["category"], 0) + 1
        if seen[r["category"]] <= HELD_OUT:
            held.add(r["id"])
    return held


def all_prompts() -> list[dict[str, Any]]:
    """Spec-Bench first turns + grounded code edits, as single user turns."""
    rows = []
    for line in (DATA / "specbench_question.jsonl").read_text().splitlines():
        r = json.loads(line)
        rows.append(
            {"id": str(r["question_id"]), "category": r["category"], "prompt": r["turns"][0]}
        )
    for line in (DATA / "grounded.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["category"] == "code_edit":
            rows.append({"id": r["id"], "category": r["category"], "prompt": r["prompt"]})
    return rows


def generate(
    model: Any,
    prompts: list[dict[str, Any]],
    n: int,
    batch: int = 32,
    progress: bool = True,
    parts: Path | None = None,
    deadline: float = float("inf"),
) -> list[dict[str, Any]]:
    """The target's greedy outputs and, at every position, the fp16 concat of its hidden states
    [2], [15], [27] (what vLLM hands an EAGLE-3 head): one batched HF greedy loop, left padding,
    KV cache, logits only for the last position."""
    torch = _torch()
    eos = model.config.eos_token_id
    out: list[dict[str, Any]] = []
    order = list(range(len(prompts)))  # round-robin over categories: each batch mixes them
    t0 = time.perf_counter()
    for b0 in range(0, len(order), batch):
        part = parts / f"{b0 // batch:04d}.pt" if parts else None
        if part is not None and part.is_file():
            out.extend(torch.load(part))
            continue
        if time.perf_counter() > deadline:
            break
        rows = [prompts[i] for i in order[b0 : b0 + batch]]
        first = len(out)
        L = max(len(r["prompt_ids"]) for r in rows)
        ids = torch.full((len(rows), L), eos, dtype=torch.long)
        mask = torch.zeros((len(rows), L), dtype=torch.long)
        for j, r in enumerate(rows):
            p = r["prompt_ids"]
            ids[j, L - len(p) :] = torch.tensor(p)
            mask[j, L - len(p) :] = 1
        feats, toks = [], []
        past, cur, done = None, ids, torch.zeros(len(rows), dtype=torch.bool)
        with torch.no_grad():
            for _ in range(n):
                pos = (mask.cumsum(-1) - 1).clamp(min=0)[:, -cur.shape[1] :]
                o = model.model(
                    input_ids=cur,
                    attention_mask=mask,
                    position_ids=pos,
                    past_key_values=past,
                    use_cache=True,
                    output_hidden_states=True,
                )
                past = o.past_key_values
                hs = o.hidden_states
                feats.append(torch.cat([hs[k] for k in sm.EAGLE3_LAYERS], -1).to(torch.float16))
                nxt = model.lm_head(o.last_hidden_state[:, -1]).argmax(-1)
                nxt = torch.where(done, torch.full_like(nxt, eos), nxt)
                toks.append(nxt)
                done |= nxt == eos
                if bool(done.all()):
                    break
                cur = nxt[:, None]
                mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=torch.long)], 1)
        f = torch.cat(feats, 1)
        t = torch.stack(toks, 1)
        for j, r in enumerate(rows):
            outs = t[j].tolist()
            if eos in outs:
                outs = outs[: outs.index(eos) + 1]
            p = len(r["prompt_ids"])
            seq = r["prompt_ids"] + outs
            feat = f[j, L - p : L - p + len(seq) - 1]  # positions 0..T-2 (the last feeds nothing)
            out.append(
                {
                    "id": r["id"],
                    "category": r["category"],
                    "prompt_ids": r["prompt_ids"],
                    "output_ids": outs,
                    "ids": torch.tensor(seq),
                    "prompt_len": p,
                    "feat": feat.clone(),
                }
            )
        if part is not None:  # each batch kept as it finishes: an interrupted run resumes
            part.parent.mkdir(parents=True, exist_ok=True)
            torch.save(out[first:], part.with_suffix(".tmp"))
            part.with_suffix(".tmp").rename(part)
        if progress:
            done_n = min(b0 + batch, len(order))
            print(
                f"generate {done_n}/{len(order)} {time.perf_counter() - t0:.0f}s", file=sys.stderr
            )
    return out


def draft_vocab(
    seqs: list[dict[str, Any]],
    size: int = DRAFT_VOCAB,
    vocab_size: int = 49152,
    keep: Any = None,
) -> Any:
    """The ``size`` most frequent prompt and output tokens of the target's ``vocab_size`` (ties
    by id), sorted: EAGLE-3's reduced vocab. ``keep``: a vocabulary to widen (a trained head's):
    all of it, then the most frequent of the other tokens up to ``size``."""
    torch = _torch()
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for s in seqs:
        for key in ("output_ids", "prompt_ids"):
            ids = torch.tensor(s[key], dtype=torch.long)
            counts += torch.bincount(ids, minlength=vocab_size)
    kept = set() if keep is None else set(keep.tolist())
    if len(kept) > size:
        raise ValueError(f"a draft vocabulary of {size} cannot keep {len(kept)} tokens")
    rest = sorted(set(range(vocab_size)) - kept, key=lambda i: (-int(counts[i]), i))
    return torch.tensor(sorted([*kept, *rest[: size - len(kept)]]), dtype=torch.long)

"""Trains SmolLM2's speculators by self-distillation: the target's own greedy outputs are the
labels (as in the EAGLE papers and in distilled drafts), so greedy acceptance is what improves.

1. ``generate``: vLLM batched greedy generation of the target over the shipped training prompts
   (Spec-Bench first turns and the grounded set, minus the default workload's prompts, which are
   held out to measure acceptance).
2. ``features``: one HF forward per sequence with ``output_hidden_states``; layers 2, 15, 27 (what
   vLLM hands an EAGLE-3 head) kept in fp16 for the head.
3. ``train_draft``: a 2-layer Llama made of the target's layers 0 and 1, final norm and tied
   embedding (frozen, not committed); only the layers and the norm train.
4. ``train_eagle3``: the head of ``harness.models_smollm`` (vLLM's layout) with a 3-step
   training-time-test unroll, so draft positions 2 and 3 see their own outputs as at inference.

Everything is seeded; torch uses at most 2 threads. Writes ``trained/`` (fp16 weights, configs,
BUILD.json).
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

from harness import models_smollm as sm

WORK = sm.CACHE_DIR.parent / "train"
DATA = Path(__file__).resolve().parent.parent / "workloads" / "data"
DRAFT_LAYERS = sm.DRAFT_LAYERS
DRAFT_VOCAB = 8192
GEN_TOKENS = 64
TRAIN_PROMPTS = 128
MAX_PROMPT = 192  # prompt tokens: prefill is most of the cost of each sequence
TTT_STEPS = 3
THREADS = 2


def optimizer_step(opt: Any, loss: Any, params: Any) -> None:
    """One clipped step (gradient norm 1.0): the draft's and the EAGLE-3 head's training."""
    from torch.nn.utils import clip_grad_norm_

    opt.zero_grad()
    loss.backward()
    clip_grad_norm_(params, 1.0)
    opt.step()


def _torch() -> Any:
    import torch

    torch.set_num_threads(THREADS)
    return torch


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


def pick_prompts(tok: Any, n: int, seed: int) -> list[dict[str, Any]]:
    """Up to ``n`` training prompts of at most MAX_PROMPT tokens (chat template applied), an
    even share per category, seeded; never a held-out one."""
    held = held_out()
    by_cat: dict[str, list[dict[str, Any]]] = {}
    for r in all_prompts():
        if r["id"] in held:
            continue
        text = tok.apply_chat_template(
            [{"role": "user", "content": r["prompt"]}], add_generation_prompt=True, tokenize=False
        )
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if len(ids) <= MAX_PROMPT:
            by_cat.setdefault(r["category"], []).append({**r, "prompt_ids": list(ids)})
    rng = random.Random(seed)
    for rows in by_cat.values():
        rng.shuffle(rows)
    out: list[dict[str, Any]] = []
    while len(out) < n and any(by_cat.values()):
        for cat in sorted(by_cat):
            if by_cat[cat] and len(out) < n:
                out.append(by_cat[cat].pop())
    return out


def generate(
    model: Any,
    prompts: list[dict[str, Any]],
    n: int,
    batch: int = 16,
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


def add_labels(model: Any, data: list[dict[str, Any]], progress: bool = True) -> float:
    """``labels[t]``: the target's greedy next token after position t, teacher-forced, for the
    prompt positions too (more training positions for the price of the last 3 layers: they run
    on the stored residual stream after layer 27, hidden_states[27]). Returns the share of
    output positions where it equals the generated token (~1; fp16 features)."""
    torch = _torch()
    h = model.config.hidden_size
    layers = list(model.model.layers)
    model.model.layers = torch.nn.ModuleList(layers[max(sm.EAGLE3_LAYERS) :])
    same = n = 0
    try:
        with torch.no_grad():
            for i, d in enumerate(data):
                x = d["feat"][:, 2 * h :].float()[None]
                pos = torch.arange(x.shape[1])[None]
                out = model.model(inputs_embeds=x, position_ids=pos).last_hidden_state[0]
                d["labels"] = model.lm_head(out).argmax(-1)
                p = d["prompt_len"]
                same += int((d["labels"][p - 1 :] == d["ids"][p:]).sum())
                n += len(d["ids"]) - p
                if progress and i % 16 == 0:
                    print(f"labels {i}/{len(data)}", file=sys.stderr)
    finally:
        model.model.layers = torch.nn.ModuleList(layers)
    return same / max(1, n)


def draft_vocab(seqs: list[dict[str, Any]], size: int = DRAFT_VOCAB) -> Any:
    """The ``size`` most frequent output tokens (ties by id), sorted: EAGLE-3's reduced vocab."""
    torch = _torch()
    counts = torch.zeros(49152, dtype=torch.long)
    for s in seqs:
        counts += torch.bincount(torch.tensor(s["output_ids"], dtype=torch.long), minlength=49152)
        counts += torch.bincount(torch.tensor(s["prompt_ids"], dtype=torch.long), minlength=49152)
    order = sorted(range(49152), key=lambda i: (-int(counts[i]), i))[:size]
    return torch.tensor(sorted(order), dtype=torch.long)


def _split(seqs: list[Any], seed: int) -> tuple[list[Any], list[Any]]:
    idx = list(range(len(seqs)))
    random.Random(seed).shuffle(idx)
    n_val = max(8, len(seqs) // 20)
    return [seqs[i] for i in idx[n_val:]], [seqs[i] for i in idx[:n_val]]


def _lr(step: int, steps: int, peak: float) -> float:
    warm = max(1, steps // 20)
    if step < warm:
        return peak * (step + 1) / warm
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))


# ---- the draft model ----------------------------------------------------------------------------
def make_draft(target_model: Any) -> Any:
    """A Llama of the target's layers DRAFT_LAYERS, final norm and tied embedding."""
    torch = _torch()
    from transformers import LlamaForCausalLM

    cfg = target_model.config.to_dict()
    cfg["num_hidden_layers"] = len(DRAFT_LAYERS)
    from transformers import LlamaConfig

    draft = LlamaForCausalLM(LlamaConfig(**cfg))
    sd = target_model.state_dict()
    new = {}
    for k, v in sd.items():
        if k.startswith("model.layers."):
            i = int(k.split(".")[2])
            if i in DRAFT_LAYERS:
                j = DRAFT_LAYERS.index(i)
                new[k.replace(f"model.layers.{i}.", f"model.layers.{j}.")] = v.clone()
        else:
            new[k] = v.clone()
    draft.load_state_dict(new, strict=False)
    draft.tie_weights()
    draft.model.embed_tokens.weight.requires_grad_(False)
    return draft.to(torch.float32)


def _draft_loss(draft: Any, s: dict[str, Any], vocab: Any) -> tuple[Any, int, int]:
    """CE against the target's greedy next token at every position (``add_labels``), over the
    reduced vocabulary (labels outside it skipped: the full 49,152-way softmax is 6x dearer)."""
    torch = _torch()
    ids = s["ids"]
    h = draft.model(input_ids=ids[None, :-1]).last_hidden_state[0]
    labels = s["labels"]
    w = draft.model.embed_tokens.weight
    logits = h @ w[vocab].T
    pos = torch.searchsorted(vocab, labels)
    pos = pos.clamp(max=len(vocab) - 1)
    inside = vocab[pos] == labels
    loss = torch.nn.functional.cross_entropy(logits[inside], pos[inside])
    return loss, 0, int(inside.sum())


def eval_draft(draft: Any, val: list[dict[str, Any]]) -> float:
    """Teacher-forced top-1 agreement with the target's greedy token (~ alpha at position 1)."""
    torch = _torch()
    ok = n = 0
    with torch.no_grad():
        for s in val:
            ids, p = s["ids"], s["prompt_len"]
            logits = draft(input_ids=ids[None, :-1]).logits[0, p - 1 :]
            ok += int((logits.argmax(-1) == ids[p:]).sum())
            n += len(ids) - p
    return ok / max(1, n)


def train_draft(
    target_model: Any, data: list[dict[str, Any]], vocab: Any, seed: int, budget_s: float
) -> tuple[Any, dict[str, Any]]:
    torch = _torch()
    torch.manual_seed(seed)
    train, val = _split(data, seed)
    draft = make_draft(target_model)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=2e-4, weight_decay=0.0)
    before = eval_draft(draft, val)
    steps, t0, step = 10**9, time.perf_counter(), 0
    order = list(range(len(train)))
    rng = random.Random(seed)
    draft.train()
    est_steps = None
    while step < steps:
        rng.shuffle(order)
        for i in order:
            loss, _, _ = _draft_loss(draft, train[i], vocab)
            if est_steps is None and step == 20:  # size the cosine schedule to the time budget
                est_steps = int(budget_s / ((time.perf_counter() - t0) / 20))
                steps = est_steps
            for g in opt.param_groups:
                g["lr"] = _lr(step, est_steps or 10**4, 2e-4)
            optimizer_step(opt, loss, params)
            step += 1
            if step >= steps:
                break
    draft.eval()
    after = eval_draft(draft, val)
    info = {
        "layers_from_target": list(DRAFT_LAYERS),
        "steps": step,
        "train_seconds": round(time.perf_counter() - t0),
        "val_sequences": len(val),
        "top1_agreement_before": round(before, 4),
        "top1_agreement_after": round(after, 4),
    }
    return draft, info


def save_draft(draft: Any, out: Path) -> None:
    torch = _torch()
    from safetensors.torch import save_file

    own = {
        k: v.detach().to(torch.float16).contiguous()
        for k, v in draft.state_dict().items()
        if k.startswith("model.layers.") or k == "model.norm.weight"
    }
    save_file(dict(sorted(own.items())), str(out / "draft.safetensors"))
    cfg = draft.config.to_dict()
    cfg.pop("_name_or_path", None)
    cfg.pop("dtype", None)
    cfg.update(architectures=["LlamaForCausalLM"], torch_dtype="float32")
    sm._write_json(out / "draft_config.json", cfg)


def load_data(
    target: Path, seed: int, progress: bool, data_seconds: float = float("inf")
) -> tuple[Any, list[dict[str, Any]], float]:
    """(target model, sequences with features, seconds spent generating); batches are cached
    in WORK/parts-*/ and generation stops after ``data_seconds`` (a build on a busy machine
    trains on what it has; the count is recorded)."""
    from transformers import AutoTokenizer

    model = load_target(target)
    t0 = time.perf_counter()
    prompts = pick_prompts(AutoTokenizer.from_pretrained(target), TRAIN_PROMPTS, seed)
    parts = WORK / f"parts-{seed}-{TRAIN_PROMPTS}-{MAX_PROMPT}-{GEN_TOKENS}"
    data = generate(
        model, prompts, GEN_TOKENS, progress=progress, parts=parts, deadline=t0 + data_seconds
    )
    return model, data, time.perf_counter() - t0


def train_all(
    seed: int = 0,
    progress: bool = True,
    budget_s: float = 600.0,
    data_seconds: float = float("inf"),
    out: Path | None = None,
) -> dict[str, Any]:
    """Data, draft and EAGLE-3 head from scratch into ``trained/``; returns BUILD.json."""
    from harness import models_eagle3

    t_all = time.perf_counter()
    sm.assemble()  # the target
    model, data, t_gen = load_data(sm.FAMILY_DIR / "target", seed, progress, data_seconds)
    t0 = time.perf_counter()
    agree = add_labels(model, data, progress)
    t_labels = time.perf_counter() - t0
    vocab = draft_vocab(data)
    out = out or sm.TRAINED_DIR
    out.mkdir(parents=True, exist_ok=True)
    draft, d_info = train_draft(model, data, vocab, seed, budget_s)
    save_draft(draft, out)
    del draft
    head, e_info = models_eagle3.train(model, data, vocab, seed, budget_s)
    models_eagle3.save(
        head, vocab, out, models_eagle3.head_config(model.config.to_dict(), len(vocab))
    )
    info = {
        "seed": seed,
        "wheel": sm.WHEEL,
        "wheel_sha256": sm.WHEEL_SHA256,
        "data": {
            "sequences": len(data),
            "prompt_tokens": sum(d["prompt_len"] for d in data),
            "output_tokens": sum(len(d["output_ids"]) for d in data),
            "max_prompt_tokens": MAX_PROMPT,
            "max_new_tokens": GEN_TOKENS,
            "generate_seconds": round(t_gen),
            "labels_seconds": round(t_labels),
            "labels_equal_generated_share": round(agree, 4),
            "held_out": "first 4 prompts of each category (the default workload draws there)",
        },
        "draft_model": d_info,
        "eagle3": e_info,
        "total_seconds": round(time.perf_counter() - t_all),
        "torch_threads": THREADS,
    }
    sm._write_json(out / "BUILD.json", info)
    return info

"""The tiny target's EAGLE-3 head (``tiny:eagle3``, ``harness/models/tiny/eagle3/``): SmolLM2's
head (``harness.models.eagle3``, vLLM's ``LlamaForCausalLMEagle3`` layout) sized for the 4-layer
tiny target, so ``--spec eagle3`` and ``tune --spec-config`` run on the test pair for real.

Self-distillation as for SmolLM2: the target's own greedy continuations of windows of the tiny
corpus (the Python standard library's training files) are the data; its residual stream after
the aux layers (1, 2, 3: ``eagle3_checkpoint.aux_layers``) and its greedy next token at every position are
the features and labels. Fixed step count, seeded, one thread: a rebuild gives the same head.
The directory is what vLLM loads as ``speculative_config.model`` (config.json and
model.safetensors with the target's head rows as ``lm_head``: no assembly step).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

DRAFT_VOCAB = 1024  # of the tiny target's 2,048: a reduced vocabulary, mapped back by d2t
PROMPTS = 256  # training windows
HELD_PROMPTS = 16  # windows of the held-out files, for the recorded agreement
PROMPT_LEN, GEN_TOKENS = 48, 64
STEPS = 1500
SEED_OFFSET = 2  # the pair trains with seed and seed + 1
FILE_STRIDE = 8  # windows come from every 8th training file: encoding all 3.8M tokens costs 8 s
HEAD_FILES = ("config.json", "model.safetensors")


def _windows(stream: Any, n: int, seed: int) -> Any:
    """``n`` seeded windows of PROMPT_LEN tokens of a corpus id stream: [n, PROMPT_LEN]."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(stream) - PROMPT_LEN, (n,), generator=gen).tolist()
    return torch.stack([stream[s : s + PROMPT_LEN] for s in starts])


def sequences(
    model: Any, prompts: Any, layers: tuple[int, ...], batch: int = 64
) -> list[dict[str, Any]]:
    """The target's greedy continuations (cut after an eos), each with the concat of its
    hidden states at ``layers`` and its greedy next token at every position, in
    ``harness.models.data``'s shape (``feat`` and ``labels`` for positions 0..len-2)."""
    import torch

    eos = model.config.eos_token_id
    out: list[dict[str, Any]] = []
    with torch.no_grad():
        for b in range(0, len(prompts), batch):
            x = prompts[b : b + batch]
            full = model.generate(
                input_ids=x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=GEN_TOKENS,
                do_sample=False,
                pad_token_id=model.config.pad_token_id,
            )
            o = model(input_ids=full, output_hidden_states=True)
            feat = torch.cat([o.hidden_states[i] for i in layers], -1)
            labels = o.logits.argmax(-1)
            for j in range(len(x)):
                outs = full[j, PROMPT_LEN:].tolist()
                if eos in outs:
                    outs = outs[: outs.index(eos) + 1]
                n = PROMPT_LEN + len(outs)
                out.append(
                    {
                        "prompt_ids": x[j].tolist(),
                        "output_ids": outs,
                        "ids": full[j, :n].clone(),
                        "prompt_len": PROMPT_LEN,
                        "feat": feat[j, : n - 1].clone(),
                        "labels": labels[j, : n - 1].clone(),
                    }
                )
    return out


def train_head(
    family: Path,
    seed: int = 0,
    steps: int = STEPS,
    prompts: int = PROMPTS,
    max_files: int | None = None,
) -> tuple[Any, Any, dict[str, Any], dict[str, Any]]:
    """(head, draft vocabulary, config, BUILD.json's ``eagle3`` record) for ``family/target``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from harness.models import eagle3, eagle3_checkpoint
    from harness.models.data import draft_vocab
    from harness.models.optim import THREADS, torch_threads
    from harness.models.tiny_pair import corpus_files, encode_stream, read_texts

    torch = torch_threads()
    t0, cpu0 = time.perf_counter(), time.process_time()
    target = family / "target"
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(target)
    _, train_files, held_files = corpus_files()
    train_files = train_files[::FILE_STRIDE][:max_files]  # max_files: a test's small build
    tcfg = model.config.to_dict()
    layers = eagle3_checkpoint.aux_layers(tcfg["num_hidden_layers"])
    s = seed + SEED_OFFSET
    train_ids = encode_stream(tok, read_texts(train_files))
    data = sequences(model, _windows(train_ids, prompts, s), layers)
    held_ids = encode_stream(tok, read_texts(held_files))
    held = sequences(model, _windows(held_ids, HELD_PROMPTS, s), layers)
    size = min(DRAFT_VOCAB, tcfg["vocab_size"] // 2)
    vocab = draft_vocab(data, size, tcfg["vocab_size"])
    t_data = time.perf_counter() - t0
    head, info = eagle3.train(model, data, vocab, s, budget_s=0.0, steps=steps, layers=layers)
    cfg = eagle3_checkpoint.head_config(tcfg, len(vocab), layers)
    n = sum(len(d["output_ids"]) for d in data)
    inside = sum(int(torch.isin(torch.tensor(d["output_ids"]), vocab).sum()) for d in data)
    record = {
        "recipe": {
            "layout": "vLLM LlamaForCausalLMEagle3 (one decoder layer, fc_norm), "
            "harness.models.eagle3 as SmolLM2's head",
            "aux_layers": list(layers),
            "draft_vocab_size": len(vocab),
            "data": f"{prompts} windows of {PROMPT_LEN} tokens of every {FILE_STRIDE}th training "
            f"file (seed {s}), the target's greedy continuations of {GEN_TOKENS} tokens (cut after eos); "
            "labels = the target's greedy next token at every position",
            "steps": steps,
            "ttt_steps": eagle3.TTT_STEPS,
            "optimizer": "AdamW lr 1e-3, warm-up + cosine to 0, clip 1.0; the layer's MLP and "
            "norms start from the target's last layer",
            "saved_weights": "float16 safetensors (d2t int64), lm_head = the target's tied head "
            "rows of the draft vocabulary, config dtype float32",
        },
        "params": sum(p.numel() for p in head.parameters()),
        "output_tokens_in_draft_vocab": round(inside / max(1, n), 4),
        "val_top1_agreement_per_step": info["top1_agreement_per_step"],
        "heldout_top1_agreement_per_step": eagle3.evaluate(head, held, vocab),
        "metric": "teacher-forced top-1 agreement with the target's greedy tokens per unroll "
        f"step (~ alpha at draft positions 1-3); val: {info['val_sequences']} training "
        f"sequences; heldout: {HELD_PROMPTS} windows of the held-out files",
        "wall_s": {"data": round(t_data, 1), "train": round(time.perf_counter() - t0 - t_data, 1)},
        "cpu_s": round(time.process_time() - cpu0, 1),
        "torch_threads": THREADS,
    }
    return head, vocab, cfg, record


def save(head: Any, vocab: Any, cfg: dict[str, Any], out: Path) -> None:
    """The directory vLLM loads: the head's weights, ``d2t`` and ``lm_head`` (the target's rows
    it trained against, fp16), config."""
    import torch
    from safetensors.torch import save_file

    from harness.models import eagle3_checkpoint
    from harness.models.smollm import write_json

    out.mkdir(parents=True, exist_ok=True)
    sd = eagle3_checkpoint.state_dict(head, vocab)
    sd["lm_head.weight"] = head.lm_head.to(torch.float16).contiguous()
    save_file(dict(sorted(sd.items())), str(out / "model.safetensors"))
    (out / "model.safetensors").chmod(0o644)
    write_json(out / "config.json", cfg)


def build(family: Path, seed: int = 0, **kwargs: Any) -> dict[str, Any]:
    """Trains the head for ``family/target`` into ``family/eagle3`` (built aside, then swapped
    in) and records it as ``eagle3`` in ``family/BUILD.json``; returns that record."""
    import torch

    from harness.models.smollm import atomic_dir

    threads = torch.get_num_threads()
    try:
        head, vocab, cfg, record = train_head(family, seed, **kwargs)
    finally:
        torch.set_num_threads(threads)  # train_head runs on one: the caller's count back
    atomic_dir(family / "eagle3", lambda d: save(head, vocab, cfg, d))
    build_json = family / "BUILD.json"
    info = json.loads(build_json.read_text()) if build_json.is_file() else {}
    info["eagle3"] = record
    build_json.write_text(json.dumps(info, indent=2) + "\n")
    return record

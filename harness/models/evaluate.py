"""Offline acceptance of SmolLM2's speculators, as vLLM would draft (no vLLM needed): the share
of the target's greedy tokens that each speculator predicts top-1 at draft position 1.

The EAGLE-3 head is read from its *assembled* directory by vLLM's names (``midlayer.*``,
``fc_norm.*``, ``d2t``: target id = i + d2t[i]) and fed as vLLM's proposer feeds it
(``vllm/v1/spec_decode/llm_base_proposer.py``): at position t the target's residual stream
after layers 2, 15, 27 (HF ``hidden_states[2|15|27]``, taken before any norm) paired with the
*next* token x[t+1], predicting x[t+2]. The head's earlier positions see the target's features
of the accepted tokens (teacher forcing), as vLLM's head KV cache does. The draft model is a
plain causal LM: its logits at t predict x[t+1].
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.models import smollm as sm


def load_head(eagle3: Path, embed: Any) -> Any:
    """The assembled head (vLLM's checkpoint names) as ``harness.models.eagle3.Eagle3Head``."""
    from safetensors.torch import load_file

    from harness.models.eagle3 import Eagle3Head
    from harness.models.eagle3_checkpoint import own_name, vocab_of

    cfg = json.loads((eagle3 / "config.json").read_text())
    sd = load_file(str(eagle3 / "model.safetensors"))
    vocab = vocab_of(sd.pop("d2t"))
    head = Eagle3Head(cfg, embed, vocab)
    own = {own_name(k): v.float() for k, v in sd.items() if k != "lm_head.weight"}
    head.load_state_dict(own, strict=True)
    head.lm_head = sd["lm_head.weight"].float()  # what vLLM's ParallelLMHead loads
    head.eval()
    return head, vocab


def eagle3_hits(head: Any, vocab: Any, s: dict[str, Any], token_offset: int = 1) -> Any:
    """Per output position, whether the head's first draft is the target's token: hidden f[t]
    + token x[t+1] -> x[t+2], for t >= prompt_len - 2 (x[t+2] an output token).
    ``token_offset`` 0 pairs f[t] with x[t] instead (a misalignment, for tests)."""
    import torch

    ids, p, feat = s["ids"], s["prompt_len"], s["feat"]
    T = len(ids) - 2
    with torch.no_grad():
        hidden = head.combine(feat[:T])
        tokens = ids[token_offset : T + token_offset]
        normed, _, _ = head.step(tokens, hidden, torch.arange(T), [])
        pred = vocab[(normed @ head.lm_head.T).argmax(-1)]
    return (pred == ids[2:])[max(0, p - 2) : T]


def eagle3_agreement(
    head: Any, vocab: Any, seqs: list[dict[str, Any]], token_offset: int = 1
) -> float:
    """First-position top-1 agreement over generated tokens (``eagle3_hits``)."""
    hits = [eagle3_hits(head, vocab, s, token_offset) for s in seqs]
    return sum(int(h.sum()) for h in hits) / max(1, sum(len(h) for h in hits))


def drafts_at_k1(hits: list[bool]) -> tuple[int, int]:
    """(accepted, drafted) of one-token drafts along a sequence, as vLLM counts them at K 1: a
    draft after every target pass, so an accepted draft skips the next position (the pass
    also gives the token after it) and a rejected one does not. Hence vLLM's alpha is not the
    per-token agreement: ``[True, False] * n`` drafts only the hits (alpha 1, agreement 0.5)."""
    i = accepted = drafted = 0
    while i < len(hits):
        drafted += 1
        accepted += bool(hits[i])
        i += 2 if hits[i] else 1
    return accepted, drafted


def eagle3_alpha_k1(head: Any, vocab: Any, seqs: list[dict[str, Any]]) -> float:
    """vLLM's alpha (accepted / drafted) for this head at K 1 on these sequences."""
    counts = [drafts_at_k1(eagle3_hits(head, vocab, s).tolist()) for s in seqs]
    return sum(a for a, _ in counts) / max(1, sum(d for _, d in counts))


def draft_agreement(draft: Any, seqs: list[dict[str, Any]]) -> float:
    """Top-1 agreement of a causal LM with the target's generated tokens (teacher forced)."""
    import torch

    ok = n = 0
    with torch.no_grad():
        for s in seqs:
            ids, p = s["ids"], s["prompt_len"]
            pred = draft(input_ids=ids[None, :-1]).logits[0, p - 1 :].argmax(-1)
            ok += int((pred == ids[p:]).sum())
            n += len(ids) - p
    return ok / max(1, n)


def held_out_sequences(
    target_model: Any, tok: Any, n_tokens: int = 64, n_prompts: int | None = None
) -> list[dict[str, Any]]:
    """The target's greedy continuations of the default workload's (held-out) prompts, with
    the features vLLM would hand the head."""
    from harness.models.data import generate

    prompts = default_prompt_ids(tok)[:n_prompts]
    return generate(target_model, prompts, n_tokens, batch=len(prompts), progress=False)


def default_prompt_ids(tok: Any) -> list[dict[str, Any]]:
    """The default workload's (held-out) prompts as chat prompts (id, category, prompt_ids)."""
    out = []
    for line in _default_lines():
        r = json.loads(line)
        out.append(_chat_prompt(tok, r["id"], r["category"], r["messages"]))
    return out


WIDE_MAX_PROMPT = 1024  # prompt tokens; the distill's longest training prompts


def wide_prompt_ids(tok: Any) -> list[dict[str, Any]]:
    """The other never-trained prompts (``harness.models.data.held_out``: the first of each
    Spec-Bench category and of the code edits) up to ``WIDE_MAX_PROMPT`` tokens, as chat
    prompts: 12 times the default's tokens at 64 each (a binomial standard error near 0.008
    where the default's 256 tokens have 0.03), so a change of a few points is seen."""
    from harness.models.data import all_prompts, held_out

    default = {json.loads(line)["id"] for line in _default_lines()}
    held = held_out() - default
    chats = (
        _chat_prompt(tok, r["id"], r["category"], [{"role": "user", "content": r["prompt"]}])
        for r in all_prompts()
        if r["id"] in held
    )
    return [c for c in chats if len(c["prompt_ids"]) <= WIDE_MAX_PROMPT]


def _chat_prompt(tok: Any, pid: str, category: str, messages: list[Any]) -> dict[str, Any]:
    """A prompt as ``harness.models.data.generate`` takes it: the chat template's token ids."""
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return {"id": pid, "category": category, "prompt_ids": list(ids)}


def _default_lines() -> list[str]:
    from harness.models.data import DATA

    return (DATA / "default.jsonl").read_text().splitlines()


def evaluate(
    target: Path = sm.FAMILY_DIR / "target",
    draft: Path | None = sm.FAMILY_DIR / "draft",
    eagle3: Path | None = sm.FAMILY_DIR / "eagle3",
    n_tokens: int = 64,
    wide: bool = False,
) -> dict[str, float]:
    """{"draft": ..., "eagle3": ..., "eagle3_alpha_k1": ...} on the default workload's prompts
    (assembled dirs), or with ``wide`` on the other held-out ones (``wide_prompt_ids``):
    first-position agreement, and vLLM's alpha of the head at K 1 there."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from harness.models.data import generate, load_target

    model = load_target(target)
    tok = AutoTokenizer.from_pretrained(target)
    if wide:
        seqs = generate(model, wide_prompt_ids(tok), n_tokens, batch=8, progress=False)
    else:
        seqs = held_out_sequences(model, tok, n_tokens)
    out = {}
    if draft is not None and sm.is_complete(draft):
        d = AutoModelForCausalLM.from_pretrained(draft, dtype=torch.float32)
        out["draft"] = draft_agreement(d, seqs)
    if eagle3 is not None and sm.is_complete(eagle3):
        head, vocab = load_head(eagle3, model.model.embed_tokens.weight.detach())
        out["eagle3"] = eagle3_agreement(head, vocab, seqs)
        out["eagle3_alpha_k1"] = eagle3_alpha_k1(head, vocab, seqs)
    return out


if __name__ == "__main__":
    import sys
    import time

    t0 = time.perf_counter()
    args = [a for a in sys.argv[1:] if a != "--wide"]
    tokens = int(args[0]) if args else 64  # the main job's default: 32
    result = evaluate(n_tokens=tokens, wide="--wide" in sys.argv[1:])
    agreement = {k: round(v, 4) for k, v in result.items()}
    print(json.dumps(agreement), f"{time.perf_counter() - t0:.0f} s")

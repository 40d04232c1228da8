"""Soft labels for an EAGLE-3 head: the target's own next-token distribution over the draft
vocabulary, as EAGLE's and SpecForge's training use it, where ``harness.models.eagle3.train``
otherwise learns the target's greedy token alone.

Why: where the target hesitates (a paraphrase, a summary that may copy or not) its greedy
token is one of several near-ties, and a one-hot label teaches the head that choice as if it
were sure; the distribution says how sure the target was and which tokens came close.

The features already carry the residual stream after the head's last aux layer (SmolLM2's 27
of 30), so the target's last layers run over it (3 of 30 layers, no second full pass) give its
logits at every position. The features are fp16 of a bf16 pass, so a recomputed argmax can
differ from the stored greedy label; there the label stays one-hot (``targets``).
"""

from __future__ import annotations

from typing import Any

import torch


class TargetTail:
    """The target's layers after ``start`` (its last aux layer), its final norm and its
    lm_head rows of the draft vocabulary."""

    def __init__(self, target_model: Any, start: int, vocab: torch.Tensor) -> None:
        self.start = start
        self.layers = target_model.model.layers[start:]
        self.norm = target_model.model.norm
        self.rotary = target_model.model.rotary_emb
        self.rows = target_model.lm_head.weight.detach()[vocab]
        self.hidden = target_model.config.hidden_size

    @torch.no_grad()
    def logits(self, feat: torch.Tensor) -> torch.Tensor:
        """The target's logits over the draft vocabulary at each position of ``feat`` (a
        sequence's features, the last aux layer in its last ``hidden`` columns). A sequence
        already cut to the head's context (``eagle3_copy.crop``, prompts over 1,024 tokens)
        gives logits without its cut-off start; where their argmax moves, ``targets`` falls
        back to the label."""
        x = feat[:, -self.hidden :].float()[None]
        pos = torch.arange(x.shape[1])[None]
        pe = self.rotary(x, pos)
        for layer in self.layers:
            x = layer(x, attention_mask=None, position_ids=pos, position_embeddings=pe)
        return self.norm(x)[0] @ self.rows.T


def targets(logits: torch.Tensor, lab: torch.Tensor) -> torch.Tensor:
    """Per position the distribution to learn: softmax of the target's logits where their
    argmax is the stored label, else the label one-hot."""
    p = logits.softmax(-1)
    agree = logits.argmax(-1) == lab
    hard = torch.nn.functional.one_hot(lab, logits.shape[-1]).to(p.dtype)
    return torch.where(agree[:, None], p, hard)


def loss(draft_logits: torch.Tensor, target_p: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the head's logits against ``target_p``, mean over positions."""
    return -(target_p * draft_logits.log_softmax(-1)).sum(-1).mean()

"""Where the EAGLE-3 head's first draft step learns (``--loss-on``): every position, or only the
answer's, as SpecForge's loss mask (vLLM drafts only there)."""

from __future__ import annotations

from typing import Any

import pytest

from harness.models import eagle3

pytestmark = pytest.mark.usefixtures("tiny_pair")


def _head_and_sequence(prompt_len: int = 10, n: int = 24) -> tuple[Any, Any, Any, dict[str, Any]]:
    import torch
    from transformers import AutoModelForCausalLM

    from harness.models import eagle3_checkpoint
    from harness.models import registry as models

    model = AutoModelForCausalLM.from_pretrained(models.tiny_path("target"), dtype=torch.float32)
    cfg = model.config.to_dict()
    vocab = torch.arange(cfg["vocab_size"])  # every label inside: only the loss mask decides
    torch.manual_seed(0)
    layers = eagle3_checkpoint.aux_layers(cfg["num_hidden_layers"])
    head = eagle3.Eagle3Head(
        eagle3_checkpoint.head_config(cfg, len(vocab), layers),
        model.model.embed_tokens.weight.detach(),
        vocab,
    )
    ids = torch.randint(3, cfg["vocab_size"], (n,))
    seq = {
        "ids": ids,
        "prompt_len": prompt_len,
        "feat": torch.randn(n - 1, 3 * cfg["hidden_size"]),
        "labels": torch.cat([ids[1:], ids[:1]]),
    }
    return model, head, vocab, seq


@pytest.mark.parametrize("prompt_loss", [True, False])
def test_the_first_step_learns_in_the_prompt_only_with_prompt_loss(prompt_loss: bool) -> None:
    _, head, vocab, s = _head_and_sequence()
    T, p = len(s["ids"]) - 2, s["prompt_len"]
    steps = eagle3._unroll(head, s, vocab, eagle3.TTT_STEPS, prompt_loss)
    first, later = steps[0], steps[1:]
    assert len(first[1]) == (T if prompt_loss else T - (p - 2))
    assert bool(first[2].all()) is not prompt_loss  # outside the answer only with prompt_loss
    for n, (_, lab, is_out, _) in enumerate(later, start=1):  # always the answer's positions
        assert len(lab) == T - max(n, p - 2) and bool(is_out.all())


def test_training_records_where_it_learned_and_the_mask_changes_the_weights() -> None:
    import torch

    model, _, vocab, s = _head_and_sequence()
    data = [dict(s) for _ in range(10)]  # 8 of them the validation split
    heads = {}
    for prompt_loss in (True, False):
        heads[prompt_loss], info = eagle3.train(
            model, data, vocab, 0, 0.0, steps=2, prompt_loss=prompt_loss
        )
        assert info["loss_on"] == ("all" if prompt_loss else "output")
    a, b = heads[True].state_dict(), heads[False].state_dict()
    assert any(not torch.equal(a[k], b[k]) for k in a)

"""The EAGLE-3 head's soft labels (``--labels soft``): the target's distribution, recomputed from
the stored features by its last layers, must be the target's own."""

from __future__ import annotations

from typing import Any

import pytest

from harness.models import eagle3, eagle3_checkpoint, eagle3_soft

pytestmark = pytest.mark.usefixtures("tiny_pair")


def _target() -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    from harness.models import registry as models

    path = models.tiny_path("target")
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _features(model: Any, ids: Any, layers: tuple[int, ...]) -> tuple[Any, Any]:
    """(features as distill stores them, logits) of one sequence's full forward."""
    import torch

    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
    return torch.cat([out.hidden_states[k] for k in layers], -1)[0], out.logits[0]


def test_the_tail_over_the_features_gives_the_targets_own_logits() -> None:
    import torch

    model = _target()
    cfg = model.config.to_dict()
    layers = eagle3_checkpoint.aux_layers(cfg["num_hidden_layers"])
    vocab = torch.arange(0, cfg["vocab_size"], 3)  # a draft vocabulary: every third token
    torch.manual_seed(0)
    ids = torch.randint(3, cfg["vocab_size"], (1, 40))
    feat, logits = _features(model, ids, layers)
    tail = eagle3_soft.TargetTail(model, layers[-1], vocab)
    got = tail.logits(feat)
    torch.testing.assert_close(got, logits[:, vocab], atol=1e-4, rtol=1e-4)


def test_targets_are_the_distribution_where_it_agrees_else_the_label() -> None:
    import torch

    logits = torch.tensor([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0]])
    lab = torch.tensor([0, 2])  # agrees at the first position, not at the second
    p = eagle3_soft.targets(logits, lab)
    torch.testing.assert_close(p[0], logits[0].softmax(-1))
    torch.testing.assert_close(p[1], torch.tensor([0.0, 0.0, 1.0]))
    draft = torch.tensor([[5.0, 0.0, 0.0]])
    one_hot = eagle3_soft.loss(draft, torch.tensor([[1.0, 0.0, 0.0]]))
    hard = torch.nn.functional.cross_entropy(draft, torch.tensor([0]))
    torch.testing.assert_close(one_hot, hard)  # one-hot soft labels are the usual loss


def test_soft_labels_align_with_the_labels_train_other_weights_and_say_so() -> None:
    import torch

    model = _target()
    cfg = model.config.to_dict()
    vocab = torch.arange(cfg["vocab_size"])
    torch.manual_seed(0)
    layers = eagle3_checkpoint.aux_layers(cfg["num_hidden_layers"])
    ids = torch.randint(3, cfg["vocab_size"], (1, 24))
    feat, logits = _features(model, ids, layers)
    s = {"ids": ids[0], "prompt_len": 8, "feat": feat[:-1], "labels": logits[:-1].argmax(-1)}
    tail = eagle3_soft.TargetTail(model, layers[-1], vocab)
    head = eagle3.Eagle3Head(
        eagle3_checkpoint.head_config(cfg, len(vocab), layers),
        model.model.embed_tokens.weight.detach(),
        vocab,
    )
    for _, lab, _, p in eagle3._unroll(head, s, vocab, eagle3.TTT_STEPS, True, tail):
        assert torch.equal(p.argmax(-1), lab)  # each position's own distribution (aligned) ...
        assert bool((p.max(-1).values < 0.99).all())  # ... not the one-hot fallback
    data = [dict(s) for _ in range(10)]
    heads, infos = {}, {}
    for soft in (False, True):
        heads[soft], infos[soft] = eagle3.train(
            model, data, vocab, 0, 0.0, steps=2, soft_labels=soft
        )
    assert "labels" not in infos[False]
    assert infos[True]["labels"].endswith("(soft)")
    a, b = heads[False].state_dict(), heads[True].state_dict()
    assert any(not torch.equal(a[k], b[k]) for k in a)

"""SmolLM2's speculator training data and its resumable training: the prompts are built here and
never the ones the harness evaluates on; an interrupted head training resumes to the weights an
uninterrupted one reaches."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from harness.models import corpus, eagle3
from harness.models import registry as models

DATA = Path(__file__).resolve().parents[1] / "workloads" / "data"


def test_prompts_are_seeded_distinct_and_spread_over_the_kinds() -> None:
    a, b = corpus.prompts(400, seed=0), corpus.prompts(400, seed=0)
    assert a == b and corpus.prompts(400, seed=1) != a
    assert len({r["prompt"] for r in a}) == len(a) == 400
    kinds = {r["category"] for r in a}
    assert kinds == {"open", "code", "passage", "math"}


def test_no_training_prompt_is_one_the_harness_evaluates_on() -> None:
    """Not a Spec-Bench turn, not a default or grounded workload prompt, not one of the
    grounded code edits' functions (the default workload draws there)."""
    from workloads.make_grounded import CODE_TASKS, function_source

    evaluated = set()
    for line in (DATA / "specbench_question.jsonl").read_text().splitlines():
        evaluated.update(json.loads(line)["turns"])
    for name in ("grounded.jsonl", "default.jsonl", "tiny.jsonl"):
        for line in (DATA / name).read_text().splitlines():
            r = json.loads(line)
            evaluated.update([r["prompt"]] if "prompt" in r else [])
            evaluated.update(m["content"] for m in r.get("messages", []))
    sources = [function_source(m, f)[0] for _, m, f, _, _ in CODE_TASKS]
    for r in corpus.prompts(3000, seed=0):
        assert r["prompt"] not in evaluated
        assert not any(src in r["prompt"] for src in sources), r["id"]


def _tiny_data() -> tuple[Any, list[dict[str, Any]], Any, tuple[int, ...]]:
    import torch
    from transformers import AutoModelForCausalLM

    from harness.models import tiny_eagle3
    from harness.models.data import draft_vocab

    model = AutoModelForCausalLM.from_pretrained(models.tiny_path("target"), dtype=torch.float32)
    model.eval()
    cfg = model.config.to_dict()
    layers = eagle3.aux_layers(cfg["num_hidden_layers"])
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(3, cfg["vocab_size"], (10, tiny_eagle3.PROMPT_LEN), generator=gen)
    data = tiny_eagle3.sequences(model, x, layers)
    return model, data, draft_vocab(data, 512, cfg["vocab_size"]), layers


@pytest.mark.usefixtures("tiny_pair")
def test_an_interrupted_head_training_resumes_to_the_same_weights(tmp_path: Path) -> None:
    import torch

    from harness.models import optim

    model, data, vocab, layers = _tiny_data()
    torch.set_num_threads(1)
    whole, _ = eagle3.train(model, data, vocab, 0, 0.0, steps=7, layers=layers)
    ckpt = tmp_path / "head.ckpt"
    real, calls = optim.optimizer_step, []

    def dies_after_five(*args: Any) -> None:
        calls.append(1)
        if len(calls) > 5:
            raise KeyboardInterrupt
        real(*args)

    with (
        mock.patch.object(optim, "optimizer_step", dies_after_five),
        pytest.raises(KeyboardInterrupt),
    ):
        eagle3.train(model, data, vocab, 0, 0.0, steps=7, layers=layers, checkpoint=ckpt, every=2)
    assert torch.load(ckpt)["step"] == 4  # the last checkpoint before the interruption
    resumed, info = eagle3.train(
        model, data, vocab, 0, 0.0, steps=7, layers=layers, checkpoint=ckpt, every=2
    )
    assert info["steps"] == 7
    a, b = whole.state_dict(), resumed.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.usefixtures("tiny_pair")
def test_more_passes_start_from_the_saved_head(tmp_path: Path) -> None:
    """``models build --train --more``: the head starts from the saved weights (its trained
    lm_head too), not from the target's last layer; a file of another vocabulary is refused."""
    import torch

    model, data, vocab, layers = _tiny_data()
    torch.set_num_threads(1)
    first, _ = eagle3.train(model, data, vocab, 0, 0.0, steps=5, layers=layers, train_lm_head=True)
    eagle3.save(
        first, vocab, tmp_path, eagle3.head_config(model.config.to_dict(), len(vocab), layers)
    )
    saved = tmp_path / "eagle3.safetensors"
    cfg = eagle3.head_config(model.config.to_dict(), len(vocab), layers)
    emb = model.model.embed_tokens.weight.detach()
    again = eagle3.Eagle3Head(cfg, emb, vocab, train_lm_head=True)
    eagle3.load_into(again, saved, vocab)
    half = {k: v.half().float() for k, v in first.state_dict().items()}  # saved as fp16
    assert not torch.equal(half["lm_head"], emb[vocab].half().float())  # it trained
    assert all(torch.equal(half[k], v) for k, v in again.state_dict().items())
    more, info = eagle3.train(
        model,
        data,
        vocab,
        0,
        0.0,
        steps=1,
        layers=layers,
        train_lm_head=True,
        init=saved,
        peak_lr=1e-9,
    )  # one step at a negligible rate: still (about) the saved head
    assert torch.allclose(more.fc.weight, half["fc.weight"], atol=1e-6)
    assert info["lm_head"] == "trained"
    frozen = eagle3.Eagle3Head(cfg, emb, vocab)  # a trained lm_head cannot be dropped
    with pytest.raises(ValueError, match="trained lm_head"):
        eagle3.load_into(frozen, saved, vocab)
    with pytest.raises(ValueError, match="vocabulary"):
        eagle3.load_into(again, saved, vocab[:-1])


def test_alpha_at_k1_counts_drafts_as_vllm_does() -> None:
    """vLLM's alpha at K 1 drafts after every target pass: an accepted draft's pass also gives
    the next token, so the position after a hit is never drafted (known truths)."""
    from harness.models.evaluate import drafts_at_k1

    assert drafts_at_k1([True] * 6) == (3, 3)
    assert drafts_at_k1([False] * 6) == (0, 6)
    assert drafts_at_k1([True, False] * 4) == (4, 4)  # agreement 0.5, alpha 1
    assert drafts_at_k1([False, True] * 4) == (4, 5)
    assert drafts_at_k1([True, True, False, False, True]) == (2, 4)
    assert drafts_at_k1([]) == (0, 0)

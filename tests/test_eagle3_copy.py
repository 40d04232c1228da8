"""The copy recipe of an EAGLE-3 head (harness/models/eagle3_copy.py), on the tiny target."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from harness.models import cli as models_cli
from harness.models import eagle3
from harness.models import eagle3_copy as copy


def _seq(ids: list[int], prompt_len: int, width: int = 4) -> dict[str, Any]:
    import torch

    t = torch.tensor(ids)
    return {
        "ids": t,
        "prompt_len": prompt_len,
        "feat": torch.zeros(len(ids) - 1, width),
        "labels": torch.cat([t[1:], t[:0]]),  # the target's greedy token: here the next one
    }


def test_a_match_points_at_the_position_holding_the_token_to_copy() -> None:
    """Head position t holds x[t+1] and predicts x[t+2]; it should attend j where (x[j-1],
    x[j]) = (x[t], x[t+1]), whose input holds x[j+1], when x[j+1] is the label."""
    #      0  1  2  3  4  5  6  7
    ids = [7, 3, 4, 5, 9, 3, 4, 5]  # "3 4 5" again: at t = 5 (holding 4, after 3) copy 5
    T, rows, cols = copy.match_targets(_seq(ids, 4))
    assert T == 6 and list(zip(rows, cols)) == [(5, 2)]
    other = _seq(ids, 4)
    other["labels"][6] = 8  # the target would not copy there: no match to learn
    assert copy.match_targets(other)[1] == []
    assert copy.copy_share(_seq(ids, 4)) == 0.5  # (3,4), (4,5) in the prompt; (5,9), (9,3) not


def _repeating(n: int) -> tuple[Any, list[dict[str, Any]], Any, tuple[int, ...]]:
    """Tiny-target sequences whose answer (second half) repeats the prompt (first half),
    labelled with the next token (the tiny target does not copy; the recipe's mechanics are
    what is tested)."""
    import torch
    from transformers import AutoModelForCausalLM

    from harness.models import eagle3_checkpoint, tiny_eagle3
    from harness.models import registry as models
    from harness.models.data import draft_vocab

    model = AutoModelForCausalLM.from_pretrained(models.tiny_path("target"), dtype=torch.float32)
    model.eval()
    cfg = model.config.to_dict()
    layers = eagle3_checkpoint.aux_layers(cfg["num_hidden_layers"])
    gen = torch.Generator().manual_seed(0)
    half = torch.randint(3, cfg["vocab_size"], (n, tiny_eagle3.PROMPT_LEN // 2), generator=gen)
    n_all = tiny_eagle3.PROMPT_LEN
    data = tiny_eagle3.sequences(model, torch.cat([half, half], 1), layers)
    for s in data:  # the features of the repeat, cut before the tiny target's own answer
        s["ids"] = s["ids"][:n_all]
        s["feat"], s["labels"] = s["feat"][: n_all - 1], s["ids"][1:].clone()
        s["prompt_len"] = n_all // 2
    return model, data, draft_vocab(data, 512, cfg["vocab_size"]), layers


@pytest.mark.usefixtures("tiny_pair")
def test_teaching_moves_only_one_groups_attention_onto_the_matches() -> None:
    import torch

    from harness.models import eagle3_checkpoint

    model, data, vocab, layers = _repeating(8)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = eagle3_checkpoint.head_config(model.config.to_dict(), len(vocab), layers)
    head = eagle3.Eagle3Head(cfg, model.model.embed_tokens.weight.detach(), vocab)
    before = {k: v.clone() for k, v in head.state_dict().items()}
    sample = copy.Sampler(data, 0, eagle3.MAX_HEAD_CONTEXT)
    assert len(sample.heavy) == len(data)  # every one copies its prompt
    loss_before = float(sum(copy.attention_loss(head, s, 1).detach() for s in data)) / len(data)
    end = copy.teach_attention(head, sample, group=1, steps=150)
    loss_after = float(sum(copy.attention_loss(head, s, 1).detach() for s in data)) / len(data)
    assert loss_after < 0.5 * loss_before, (loss_before, loss_after, end)
    after = head.state_dict()
    d = head.head_dim
    for name in before:
        same = torch.equal(before[name], after[name])
        if name in ("q_proj.weight", "k_proj.weight"):
            assert torch.equal(before[name][:d], after[name][:d])  # group 0 untouched
            assert not torch.equal(before[name][d:], after[name][d:])  # group 1 taught
        else:
            assert same, name


@pytest.mark.usefixtures("tiny_pair")
def test_a_copy_run_resumes_to_the_same_weights(tmp_path: Path) -> None:
    """The recipe draws sequences at random: an interrupted run resumes the draws too."""
    import torch

    from harness.models import optim

    model, data, vocab, layers = _repeating(12)  # 8 of them the validation split
    torch.set_num_threads(1)
    kw: dict[str, Any] = {"steps": 6, "layers": layers, "copy_group": 0}
    with mock.patch.object(copy, "COPY_STEPS", 20):
        whole, info = eagle3.train(model, data, vocab, 0, 0.0, **kw)
        ckpt = tmp_path / "head.ckpt"
        real, calls = optim.optimizer_step, []

        def dies_after_three(*args: Any) -> None:
            calls.append(1)
            if len(calls) > 3:
                raise KeyboardInterrupt
            real(*args)

        with (
            mock.patch.object(optim, "optimizer_step", dies_after_three),
            pytest.raises(KeyboardInterrupt),
        ):
            eagle3.train(model, data, vocab, 0, 0.0, checkpoint=ckpt, every=2, **kw)
        resumed, again = eagle3.train(model, data, vocab, 0, 0.0, checkpoint=ckpt, every=2, **kw)
    assert again["copy"] == info["copy"]  # a resumed build still records step 1's loss
    assert info["copy"]["group"] == 0 and info["copy"]["attention_steps"] == 20
    a, b = whole.state_dict(), resumed.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("bad", ["3", "-1"])
def test_a_copy_group_the_head_lacks_is_one_line_and_exit_2(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert models_cli.main(["build", "--train", "--copy-group", bad]) == 2  # SmolLM2: 3 groups
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--copy-group" in err[0] and "0..2" in err[0], err

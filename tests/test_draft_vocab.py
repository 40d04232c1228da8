"""A trained EAGLE-3 head's draft vocabulary widened on a warm restart (``models build --train
--more --train-lm-head --draft-vocab N``), on the tiny target."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.models import cli as models_cli
from harness.models import eagle3


def test_a_widened_vocabulary_keeps_the_old_one_and_adds_the_most_frequent_others() -> None:
    import torch

    from harness.models.data import draft_vocab

    seqs = [{"prompt_ids": [1, 2, 2], "output_ids": [3, 3, 3, 4, 9, 9]}]
    assert draft_vocab(seqs, 3, 10).tolist() == [2, 3, 9]  # 3 x3, 2 x2, 9 x2 (ties by id)
    wide = draft_vocab(seqs, 4, 10, keep=torch.tensor([0, 7]))
    assert wide.tolist() == [0, 2, 3, 7]  # the kept two, then 3 (x3) and 2 (x2, id before 9)
    with pytest.raises(ValueError, match="cannot keep"):
        draft_vocab(seqs, 1, 10, keep=torch.tensor([0, 7]))


def _tiny() -> tuple[Any, dict[str, Any], Any, tuple[int, ...]]:
    import torch
    from transformers import AutoModelForCausalLM

    from harness.models import eagle3_checkpoint
    from harness.models import registry as models

    model = AutoModelForCausalLM.from_pretrained(models.tiny_path("target"), dtype=torch.float32)
    cfg = model.config.to_dict()
    layers = eagle3_checkpoint.aux_layers(cfg["num_hidden_layers"])
    return model, cfg, model.model.embed_tokens.weight.detach(), layers


@pytest.mark.usefixtures("tiny_pair")
def test_a_saved_head_loads_into_a_wider_vocabulary_its_rows_on_their_tokens(
    tmp_path: Path,
) -> None:
    import torch

    from harness.models import eagle3_checkpoint as files

    model, tcfg, embed, layers = _tiny()
    torch.manual_seed(0)
    narrow = torch.arange(0, 1024, 2)  # 512 even ids
    cfg = files.head_config(tcfg, len(narrow), layers)
    saved = eagle3.Eagle3Head(cfg, embed, narrow, train_lm_head=True)
    with torch.no_grad():
        for p in saved.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # a trained head: its rows are not the target's
    files.save(saved, narrow, tmp_path, cfg)
    path = tmp_path / "eagle3.safetensors"

    wide = torch.sort(torch.cat([narrow, torch.arange(1, 600, 2)])).values  # + 300 odd ids
    head = eagle3.Eagle3Head(files.head_config(tcfg, len(wide), layers), embed, wide, True)
    files.load_into(head, path, wide)
    at = torch.searchsorted(wide, narrow)
    assert torch.equal(head.lm_head[at], saved.lm_head.detach().half().float())
    new = torch.ones(len(wide), dtype=torch.bool)
    new[at] = False
    assert torch.equal(head.lm_head[new], embed[wide[new]])  # added tokens: the target's rows
    assert torch.equal(head.fc.weight, saved.fc.weight.detach().half().float())

    # the widened head saves with its own d2t (what training writes)
    out = tmp_path / "out"
    out.mkdir()
    files.save(head, wide, out, files.head_config(tcfg, len(wide), layers))
    assert torch.equal(files.saved_vocab(out / "eagle3.safetensors"), wide)

    missing_one = wide[wide != 2]  # lacks a saved token
    lacking = eagle3.Eagle3Head(cfg | {"draft_vocab_size": len(missing_one)}, embed,
                                missing_one, True)  # fmt: skip
    with pytest.raises(ValueError, match="must hold all of it"):
        files.load_into(lacking, path, missing_one)
    frozen = eagle3.Eagle3Head(cfg, embed, wide)
    with pytest.raises(ValueError, match="train it"):
        files.load_into(frozen, path, wide)


@pytest.mark.parametrize(
    ("args", "size"),
    [
        (["--train"], 60000),
        (["--train", "--more"], 60000),
        (["--train", "--more", "--train-lm-head"], 0),  # the committed size: no wider
        (["--train", "--more", "--train-lm-head"], 49153),
    ],
)
def test_a_draft_vocab_that_cannot_widen_the_head_is_one_line_and_exit_2(
    args: list[str], size: int, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from harness.models import smollm

    cfg = json.loads((smollm.TRAINED_DIR / "eagle3_config.json").read_text())
    n = size or cfg["draft_vocab_size"]
    assert models_cli.main(["build", *args, "--draft-vocab", str(n)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    says = "--more --train-lm-head" if len(args) < 3 else f"{cfg['draft_vocab_size'] + 1}..49152"
    assert len(err) == 1 and f"--draft-vocab {n}:" in err[0] and says in err[0], err

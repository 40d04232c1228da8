"""vLLM's own alpha for an EAGLE-3 head on the held-out prompts, without the main job:
``python -m harness.models.vllm_alpha [--k K] [--tokens N] [--wide] [--head DIR] [--json]``.

Why beside ``harness.models.evaluate``: the offline agreement counts every position, while vLLM
counts a draft where each K-token step begins; at K > 1 those starts skip the easy runs a
step accepted whole, so vLLM's alpha at K 2 sits below the offline alpha at K 1. This runs the
head in in-process vLLM with the main job's engine settings (on CPU: fp32, the capped context,
the fixed KV cache), greedy, one prompt at a time, and reads vLLM's counters per prompt: the
main job's alpha at the main job's K in about a minute. The default workload's 4 prompts at 32
tokens give under a hundred drafts; ``--wide`` runs the other held-out prompts
(``evaluate.wide_prompt_ids``), a sample over ten times larger.

Run from the project root; ``--head`` is a directory as ``models build --train`` writes it
(``eagle3.safetensors``, ``eagle3_config.json``; default the committed ``trained/``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness.models import smollm as sm


def measure(
    target: Path, head: Path, prompts: list[dict[str, Any]], k: int, tokens: int
) -> dict[str, Any]:
    """vLLM's counters for ``head`` (an assembled EAGLE-3 directory) drafting ``k`` tokens
    for ``target`` over ``prompts`` (id, category, prompt_ids), ``tokens`` each, one at a
    time: drafts and accepted per position, in all and per category, and alpha."""
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    from engines.base import SpecCounters
    from engines.common.vllm_args import CPU_DTYPE, cpu_defaults
    from engines.vllm.metrics import spec_counters_from_snapshot

    cpu = current_platform.is_cpu()  # the settings the main job's in-process engine gets there
    kwargs = cpu_defaults(str(target), {}) if cpu else {}
    spec = {"method": "eagle3", "model": str(head), "num_speculative_tokens": k}
    llm = LLM(model=str(target), dtype=CPU_DTYPE if cpu else "auto", disable_log_stats=False,
              speculative_config=spec, seed=0, **kwargs)  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=tokens)
    total = {"drafts": 0, "accepted_per_pos": [0] * k}
    per_category: dict[str, dict[str, Any]] = {}
    try:
        for p in prompts:
            before = spec_counters_from_snapshot(llm.get_metrics())
            llm.generate([{"prompt_token_ids": p["prompt_ids"]}], params, use_tqdm=False)
            after = spec_counters_from_snapshot(llm.get_metrics())
            if after is None:
                raise RuntimeError("vLLM exposed no speculative-decoding counters")
            delta = after - (before or SpecCounters())  # this prompt's own counts
            drafts, acc = delta.num_drafts, (list(delta.accepted_per_pos) + [0] * k)[:k]
            cat = per_category.setdefault(p["category"], {"drafts": 0, "accepted_per_pos": [0] * k})
            for row in (total, cat):
                row["drafts"] += drafts
                row["accepted_per_pos"] = [a + b for a, b in zip(row["accepted_per_pos"], acc)]
    finally:
        llm.llm_engine.engine_core.shutdown()
    for row in (total, *per_category.values()):
        row["alpha"] = row["accepted_per_pos"][0] / max(1, row["drafts"])
    return {"k": k, "tokens": tokens, "prompts": len(prompts), **total,
            "per_category": per_category}  # fmt: skip


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.models.vllm_alpha", description=__doc__)
    ap.add_argument("--head", type=Path, default=sm.TRAINED_DIR, help="a trained/-style directory")
    ap.add_argument("--k", type=int, default=1, help="draft tokens per step (default 1)")
    ap.add_argument("--tokens", type=int, default=32, help="tokens per prompt (the main job's 32)")
    ap.add_argument("--wide", action="store_true", help="the other held-out prompts")
    ap.add_argument("--json", action="store_true", help="the result as one JSON line")
    args = ap.parse_args(argv)
    error = None
    if args.k < 1 or args.tokens < 2:
        error = f"--k {args.k} --tokens {args.tokens}: K must be >= 1 and TOKENS >= 2"
    elif not (args.head / "eagle3.safetensors").is_file():
        error = f"{args.head / 'eagle3.safetensors'}: no such head"
    if error:
        print(f"vllm_alpha: {error}", file=sys.stderr)
        return 2
    from transformers import AutoTokenizer

    from harness.models import evaluate

    sm.assemble()
    target = sm.FAMILY_DIR / "target"
    tok = AutoTokenizer.from_pretrained(target)
    prompts = evaluate.wide_prompt_ids(tok) if args.wide else evaluate.default_prompt_ids(tok)
    with tempfile.TemporaryDirectory() as tmp:
        sm.assemble_eagle3(Path(tmp) / "eagle3", target, args.head)
        res = measure(target, Path(tmp) / "eagle3", prompts, args.k, args.tokens)
    if args.json:
        print(json.dumps(res))
        return 0
    for name, row in sorted(res["per_category"].items()) + [("all", res)]:
        per_pos = ", ".join(f"{a / max(1, row['drafts']):.3f}" for a in row["accepted_per_pos"])
        print(f"{name:>16}: alpha {row['accepted_per_pos'][0]}/{row['drafts']} = "
              f"{row['alpha']:.4f}; accepted per position {per_pos}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""``python -m bench.gpu_check [--cpu] [--json PATH]``: the HF engine's CUDA path on the blog
post's pair, in one command (<= 8 minutes on a GPU; a minute or two on a CPU, smaller sizes).

The pair is built from ``transformers.OPTConfig`` with random weights (OPT-1.3b target, OPT-125m
draft; no hub access needed): a forward pass costs the same whatever the weights. Each block's
output projections (attention ``out_proj``, ``fc2``) and the positional embeddings are zeroed,
so both models repeat the last prompt token and agree on every greedy token (with all weights
random, blocks swamp the tied embedding and two models agree on nothing). Measured:

- per-step time of one decode forward of each (``HFEngine.step_costs``), hence c = draft/target;
- batch-1 decode tok/s through the harness (1/median TPOT) against the bandwidth bound
  (``harness.analysis.theory.sol.speed_of_light``, weights read per token / measured device bandwidth);
- plain vs assisted generation (K=4 constant, and HF's default heuristic schedule), interleaved.
  With alpha = 1 the assisted speedup here is the ceiling of that pair on that device, next to
  the post's 1.34x and the Leviathan prediction (K+1)/(K*c+1);
- the harness's CPU per output token at that rate: the event loop's thread CPU (request set-up,
  hand-over, records); the generating thread's streamer adds one ``tolist`` and one clock
  reading per step.

On a machine without CUDA (or with ``--cpu``) the same steps run with small sizes, so the script
stays working where it is tested (tests/test_cost.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import prompts, requests, table
from bench.sol import weights_read_per_token
from harness.analysis.theory.sol import measure_bandwidth, speed_of_light

OPT_VOCAB = 50272
SIZES: dict[str, dict[str, dict[str, int]]] = {
    "cuda": {  # facebook/opt-1.3b and facebook/opt-125m
        "target": {"hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 32,
                   "ffn_dim": 8192, "vocab_size": OPT_VOCAB},
        "draft": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                  "ffn_dim": 3072, "vocab_size": OPT_VOCAB},
    },
    "cpu": {  # same shape of pair (target 4x wider and 2x deeper), small enough for 2 cores
        "target": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
                   "ffn_dim": 1024, "vocab_size": OPT_VOCAB},
        "draft": {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
                  "ffn_dim": 512, "vocab_size": OPT_VOCAB},
    },
}  # fmt: skip
K = 4
DEADLINE_S = 6 * 60  # stop adding rounds after this (the whole check stays under 8 minutes)


def build(out: Path, dims: dict[str, int], dtype: Any, device: str, seed: int) -> str:
    """A random-weight OPT written to ``out`` with the tiny pair's tokenizer (ids < its vocab)."""
    import torch
    from transformers import OPTConfig, OPTForCausalLM

    from harness.models.registry import tiny_path

    if (out / "config.json").exists():
        return str(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = OPTConfig(**dims, word_embed_proj_dim=dims["hidden_size"], max_position_embeddings=2048,
                    pad_token_id=1, bos_token_id=2, eos_token_id=2)  # fmt: skip
    torch.manual_seed(seed)
    with torch.device(device):
        model = OPTForCausalLM(cfg).to(dtype)
    with torch.no_grad():  # blocks add nothing: both models repeat the last token (alpha = 1)
        model.model.decoder.embed_positions.weight.zero_()
        for layer in model.model.decoder.layers:
            for lin in (layer.self_attn.out_proj, layer.fc2):
                lin.weight.zero_()
                lin.bias.zero_()
    model.save_pretrained(out)
    tok = Path(tiny_path("target"))
    for f in tok.iterdir():
        if "token" in f.name or f.name == "chat_template.jinja":
            shutil.copy(f, out / f.name)
    del model
    return str(out)


def bandwidth(device: str) -> float:
    """Best read + write bytes/s of a large copy on ``device`` (1 GiB on CUDA)."""
    if device.startswith("cuda"):
        return measure_bandwidth(1024, 6, device)["best"]
    return measure_bandwidth(256, 5)["best"]


async def _harness(engine: Any, reqs: list[Any], tokens: int) -> dict[str, float]:
    from engines.base import GenParams
    from harness.core.load import Synchronous
    from harness.run.runner import Runner

    params = GenParams(ignore_eos=True)  # each request carries its length
    l0, t0 = time.thread_time(), time.perf_counter()
    recs = await Runner(engine).run(reqs, params, Synchronous())
    dt = time.perf_counter() - t0
    bad = [r.error for r in recs if not r.ok]
    assert not bad, bad[:3]
    n = sum(r.output_tokens for r in recs)
    tpot = statistics.median(r.tpot for r in recs if r.tpot)
    return {"tok_s": n / dt, "decode_tok_s": 1 / tpot, "tokens": n,
            "loop_us": (time.thread_time() - l0) / n * 1e6}  # fmt: skip


def _raw(engine: Any, reqs: list[Any], tokens: int) -> dict[str, float]:
    """Plain ``model.generate`` per prompt, no streamer, no event loop."""
    import torch

    tok, m = engine.tokenizer, engine.model
    gc = engine.generator.gen_config(_params(), tokens)
    t0, n = time.perf_counter(), 0
    with torch.inference_mode():
        for r in reqs:
            enc = tok(r.prompt, return_tensors="pt").to(engine.device)
            out = m.generate(**enc, generation_config=gc)
            n += out.shape[1] - enc["input_ids"].shape[1]
    if str(engine.device).startswith("cuda"):
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    return {"tok_s": n / dt, "tokens": n}


def _params() -> Any:
    from engines.base import GenParams

    return GenParams(ignore_eos=True)


async def check(device: str, sizes: dict[str, dict[str, int]], n_prompts: int, tokens: int,
                rounds: int, workdir: Path) -> dict[str, Any]:  # fmt: skip
    """Every measurement; returns plain data (the markdown is made from it)."""
    import torch

    from engines.base import EngineConfig
    from engines.hf.engine import HFEngine

    t_start = time.perf_counter()
    dtype_name = "float16" if device.startswith("cuda") else "float32"
    dtype = getattr(torch, dtype_name)
    tag = "x".join(str(sizes["target"][k]) for k in sorted(sizes["target"])) + "-zeroed"
    target = build(workdir / f"target-{tag}-{dtype_name}", sizes["target"], dtype, device, 0)
    draft = build(workdir / f"draft-{tag}-{dtype_name}", sizes["draft"], dtype, device, 1)
    bw = bandwidth(device)

    def cfg(spec: dict[str, Any] | None) -> EngineConfig:
        return EngineConfig("hf", target, spec_config=spec, device=device, dtype=dtype_name)

    dm = {"method": "draft_model", "model": draft}
    engines = {
        "plain": HFEngine(cfg(None)),
        f"assisted K={K}": HFEngine(cfg({**dm, "num_speculative_tokens": K})),
        "assisted, HF defaults": HFEngine(cfg({**dm, "hf_defaults": True})),
    }
    for e in engines.values():
        await e.start()
    try:
        plain = engines["plain"]
        n_params, nbytes = weights_read_per_token(plain.model)
        costs = engines[f"assisted K={K}"].step_costs(10 if device == "cpu" else 30)
        reqs = requests(prompts(n_prompts, tag="gpu"), tokens)
        # warm-up: a whole untimed round. On a GPU a thread's first pass through each new
        # shape (every KV length) runs several times slower (engines/hf/thread.py); one short
        # request left the first timed rounds far below the later ones (docs/measurements.md).
        for e in engines.values():
            await _harness(e, reqs, tokens)
        _raw(plain, reqs, tokens)
        sides: dict[str, list[dict[str, float]]] = {name: [] for name in engines}
        sides["raw generate"] = []
        counters = {name: e.spec_counters() for name, e in engines.items()}
        for k in range(rounds):
            order = list(sides) if k % 2 == 0 else list(reversed(sides))
            for name in order:
                if name == "raw generate":
                    sides[name].append(_raw(plain, reqs, tokens))
                else:
                    sides[name].append(await _harness(engines[name], reqs, tokens))
            if time.perf_counter() - t_start > DEADLINE_S:
                break
        alphas = {}
        for name, e in engines.items():
            before, after = counters[name], e.spec_counters()
            if before is not None and after is not None:
                alphas[name] = (after - before).to_metrics()
    finally:
        for e in engines.values():
            await e.close()
    return {
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
        "dtype": dtype_name, "sizes": sizes, "n_params_read": n_params, "bytes_per_param": nbytes,
        "bandwidth_bytes_s": bw, "bound_tok_s": speed_of_light(n_params, nbytes, bw),
        "step_costs": costs, "sides": sides, "spec": alphas, "prompts": n_prompts,
        "tokens": tokens, "rounds": len(sides["plain"]), "target": target, "draft": draft,
        "seconds": time.perf_counter() - t_start,
    }  # fmt: skip


def markdown(d: dict[str, Any]) -> str:
    med = statistics.median
    sides = d["sides"]
    c = d["step_costs"]
    plain = sides["plain"]
    rows = []
    for name, runs in sides.items():
        ratio = [r["tok_s"] / p["tok_s"] for r, p in zip(runs, plain)]
        spec = d["spec"].get(name) or {}
        alpha = spec.get("alpha")
        rows.append([name, med(r["tok_s"] for r in runs),
                     med(r["decode_tok_s"] for r in runs) if "decode_tok_s" in runs[0] else None,
                     f"{med(ratio):.3f} [{min(ratio):.3f}, {max(ratio):.3f}]",
                     "" if alpha is None else f"{alpha:.2f}",
                     med(r["loop_us"] for r in runs) if "loop_us" in runs[0] else None])  # fmt: skip
    lev = (K + 1) / (K * c["c"] + 1) if c.get("c") else None
    decode = med(r["decode_tok_s"] for r in plain)
    lines = [
        f"GPU check on {d['device']} ({d['dtype']}), {d['prompts']} prompts x {d['tokens']} "
        f"tokens, {d['rounds']} interleaved rounds, {d['seconds']:.0f} s.",
        "",
        f"- Per decode step: target {c['target_step_s'] * 1e3:.2f} ms, draft "
        f"{c['draft_step_s'] * 1e3:.2f} ms, c = {c['c']:.3f}; Leviathan ceiling at alpha = 1, "
        f"K = {K}: (K+1)/(K*c+1) = {lev:.2f}x (the post measured 1.34x on its pair).",
        f"- Batch-1 bound: {d['n_params_read']:,} parameters x {d['bytes_per_param']} bytes read "
        f"per token at {d['bandwidth_bytes_s'] / 1e9:.0f} GB/s = {d['bound_tok_s']:.0f} tok/s; "
        f"plain decode through the harness {decode:.0f} tok/s ({decode / d['bound_tok_s']:.1%} "
        "of the bound).",
        f"- Harness CPU per output token at that rate: event loop "
        f"{med(r['loop_us'] for r in plain):.1f} us ({d['tokens']} tokens per request: "
        "request set-up and the record are part of it).",
        "",
        table(
            [
                "side",
                "tok/s (e2e)",
                "decode tok/s (1/TPOT)",
                "tok/s / plain [min, max]",
                "alpha",
                "event-loop CPU us/token",
            ],
            rows,
        ),  # fmt: skip
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m bench.gpu_check", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--cpu", action="store_true", help="small sizes on the CPU even with CUDA")
    ap.add_argument("--json", default=None, help="also write the measurements here")
    ap.add_argument("--workdir", default="/tmp/bench_gpu_check", help="where the pair is built")
    args = ap.parse_args(argv)
    import torch

    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    if device == "cpu":
        torch.set_num_threads(min(2, torch.get_num_threads()))
        n, tokens, rounds = 2, 24, 2
    else:
        n, tokens, rounds = 4, 128, 3
    d = asyncio.run(check(device, SIZES[device], n, tokens, rounds, Path(args.workdir)))
    from bench.gpu_harness import harness_lanes
    from bench.gpu_harness import markdown as harness_markdown

    d["harness"] = harness_lanes(
        device, d["target"], d["draft"], tokens, Path(args.workdir) / "run"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(d, indent=1))
    sys.stdout.write(markdown(d) + "\n".join(harness_markdown(d["harness"])) + "\n")


if __name__ == "__main__":
    main()

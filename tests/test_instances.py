"""Fresh engine instances per block, on a fake clock: an engine instance keeps a speed offset of
a few % for its whole life (real A/A runs, docs/measurements.md), so the CI (over blocks) can only see it when
every block runs on instances of its own."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import numpy as np
import pytest

from engines import base as engines_base
from engines.base import Capabilities, Chunk, EngineConfig, EngineError, GenParams, Request
from harness.analysis.comparisons.paired import comparisons
from harness.core.design import ONE, PER_BLOCK, build_order, build_orders, lane_order
from harness.flags.options import UsageError
from harness.flags.parser import build_parser
from harness.flags.plan import build_plan
from harness.run.session import Lane, Session
from tests.clock import FakeClock, ScriptedEngine
from tests.test_design import _plan

PROMPTS = [Request(f"p{i}", f"prompt number {i} with some words") for i in range(4)]
LABELS = ["baseline", "ngram", "draft_model"]


class Instance(ScriptedEngine):
    """A scripted engine that is cheap to rebuild; each instance steps at its own speed
    (``offset``: its per-token time factor), and logs its life."""

    name: ClassVar[str] = "rebuilt"
    capabilities: ClassVar[Capabilities] = Capabilities(coexist=True, rebuild_per_block=True)

    def __init__(self, clock: FakeClock, label: str, log: list[Any], offset: float = 1.0):
        super().__init__(clock, {})
        self.label, self.log, self.offset, self.closed = label, log, offset, False
        self.fail_start = False

    async def start(self) -> None:
        self.log.append(("start", self.label, id(self)))
        if self.fail_start:
            raise EngineError("no memory")

    async def close(self) -> None:
        self.closed = True
        self.log.append(("close", self.label, id(self)))

    async def stream(
        self, request: Request, params: GenParams, clock: Any = None
    ) -> AsyncIterator[Chunk]:
        assert not self.closed
        self.log.append(("req", self.label, id(self), request.id))
        for i in range(4):
            self.clock.now += 0.01 * self.offset
            await asyncio.sleep(0)
            yield Chunk(token_ids=(i,))


@pytest.fixture(autouse=True)
def _registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(engines_base.REGISTRY, "rebuilt", "tests.test_instances:Instance")


def _run(
    plan: Any,
    labels: list[str],
    offset: Any = None,
    fail: Any = None,
    done: set[str] | None = None,
    engine: str = "rebuilt",
    methods: dict[str, str] | None = None,
    log: list[Any] | None = None,
) -> tuple[Session, list[Any], list[Instance]]:
    clock, made = FakeClock(), []
    log = [] if log is None else log

    def factory(config: EngineConfig) -> Instance:
        label = config.options["label"]
        inst = Instance(clock, label, log, offset(label) if offset else 1.0)
        inst.fail_start = bool(fail and fail(label, len(made)))
        made.append(inst)
        return inst

    session = Session(
        plan, PROMPTS, progress=False, clock=clock, engine_factory=factory, done=done or set()
    )
    methods = methods or {}
    configs = [
        (lb, EngineConfig(engine=engine, model="m", options={"label": lb},
                          spec_config={"method": methods[lb]} if lb in methods else None))
        for lb in labels
    ]  # fmt: skip
    asyncio.run(session.execute(configs))
    return session, log, made


def test_every_block_builds_fresh_instances_in_its_own_seeded_order() -> None:
    session, log, made = _run(_plan(engines=("rebuilt",)), LABELS)
    runs = sorted(session.runs, key=lambda r: r.schedule.seq)
    assert len(runs) == 2 * 3 * 3 and all(r.status == "ok" for r in runs)
    assert len(made) == 3 * 3  # blocks x lanes, not x points
    orders = [[f"rebuilt/{LABELS[k]}" for k in build_order(3, 0, b)] for b in range(3)]
    assert session.built == orders and {o[0] for o in orders} == {f"rebuilt/{lb}" for lb in LABELS}
    record = session.design_record([f"rebuilt/{lb}" for lb in LABELS])
    assert record["build_order"] == orders and set(record["instances"].values()) == {PER_BLOCK}
    assert "inside the CI" in record["instances_description"]
    assert len(record["rss_after_block_mb"]) == 3  # measured after every block's close
    # each block: its instances start, run every point's repeat, close before the next block
    for b in range(3):
        block_ids = {id(m) for m in made[3 * b : 3 * b + 3]}
        assert [e[1] for e in log if e[0] == "start" and e[2] in block_ids] == [
            o.split("/")[1] for o in orders[b]
        ]
        for run in (r for r in runs if r.schedule.block == b):
            ids = {
                e[2] for e in log if e[0] == "req" and e[3] in {x.request_id for x in run.records}
            }
            assert ids & block_ids
    starts = [i for i, e in enumerate(log) if e[0] == "start"]
    closes = [i for i, e in enumerate(log) if e[0] == "close"]
    assert all(c < s for c in closes[:3] for s in starts[3:6])  # block 0 closed before block 1
    assert all(m.closed for m in made)
    # the rotation per point, each lane leading one block; every run warmed up (fresh instance)
    for point in (0, 1):
        blocks = [[r for r in runs if r.schedule.point == point and r.schedule.block == b]
                  for b in range(3)]  # fmt: skip
        for b, block in enumerate(blocks):
            assert [LABELS.index(r.cell.label) for r in block] == lane_order(3, b + point, 0)
        assert {blk[0].cell.label for blk in blocks} == set(LABELS)
    assert all(sum(x.warmup for x in r.records) == 2 for r in runs)
    starts_t = [r.schedule.t_start_s for r in runs]
    assert starts_t == sorted(starts_t)
    assert all(a.cell.label != b.cell.label for a, b in zip(runs, runs[1:])
               if a.schedule.block == b.schedule.block and a.schedule.point == b.schedule.point)  # fmt: skip


def test_the_heap_is_trimmed_after_every_block_before_its_rss_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Closed engines leave freed heap in glibc's arenas (engines/common/heap.py): each block's close
    is followed by one trim, before the next block builds, and what it returned is recorded."""
    from harness.run import blocks

    log: list[Any] = []
    monkeypatch.setattr(blocks, "trim_heap", lambda: log.append(("trim",)) or 12.5)
    session, _, _ = _run(_plan(engines=("rebuilt",)), LABELS, log=log)
    kinds = [e[0] for e in log if e[0] != "req"]
    assert kinds == (["start"] * 3 + ["close"] * 3 + ["trim"]) * 3
    record = session.design_record([f"rebuilt/{lb}" for lb in LABELS])
    assert record["heap_trimmed_mb"] == [12.5] * 3 and len(record["rss_after_block_mb"]) == 3


def test_instances_one_keeps_one_instance_per_lane() -> None:
    plan = dataclasses.replace(_plan(engines=("rebuilt",)), instances=ONE)
    session, _, made = _run(plan, LABELS)
    assert len(made) == 3 and len(session.built) == 1
    assert set(session.design_record(LABELS)["instances"].values()) == {ONE}
    assert "NOT inside the CI" in session.design_record(LABELS)["instances_description"]
    runs = sorted(session.runs, key=lambda r: r.schedule.seq)
    # points outer, as before: a point's repeats all run before the next point's
    assert [r.schedule.point for r in runs] == sorted(r.schedule.point for r in runs)
    assert sum(sum(x.warmup for x in r.records) for r in runs) == 2 * 3 * 2  # per lane and point


def test_http_engines_default_to_one_instance_in_process_ones_to_per_block() -> None:
    def lane(engine: str) -> Lane:
        return Lane("x", EngineConfig(engine=engine, model="m"))

    assert {e: lane(e).instances(None) for e in ("vllm", "hf", "openai", "vllm-server")} == {
        "vllm": PER_BLOCK, "hf": PER_BLOCK, "openai": ONE, "vllm-server": ONE,
    }  # fmt: skip
    assert lane("vllm-server").instances(PER_BLOCK) == PER_BLOCK
    assert lane("vllm").instances(ONE) == ONE
    parse = build_parser().parse_args
    assert build_plan(parse(["--engine", "hf", "--instances", "one"]), "m", None).instances == ONE
    assert build_plan(parse(["--engine", "hf"]), "m", None).instances is None
    with pytest.raises(UsageError):
        parse(["--engine", "hf", "--instances", "two"])


def test_a_failed_build_in_block_2_fails_that_lane_from_there_on() -> None:
    session, _, made = _run(
        _plan(engines=("rebuilt",)), LABELS, fail=lambda label, n: label == "ngram" and n >= 6
    )
    by = {(r.cell.label, r.cell.repeat, r.cell.mode): r.status for r in session.runs}
    assert all(by[("ngram", b, m)] == "ok" for b in (0, 1) for m in ("latency", "throughput"))
    assert all(by[("ngram", 2, m)].startswith("failed: engine did not start") for m in
               ("latency", "throughput"))  # fmt: skip
    assert all(by[(lb, 2, m)] == "ok" for lb in ("baseline", "draft_model") for m in
               ("latency", "throughput"))  # fmt: skip
    assert len(made) == 9 and all(m.closed for m in made)
    assert "rebuilt/ngram" in session.built[1] and "rebuilt/ngram" not in session.built[2]
    assert sorted(session.built[2]) == ["rebuilt/baseline", "rebuilt/draft_model"]


def test_orders_balance_over_the_lanes_that_run_when_one_is_unsupported() -> None:
    """Lanes a, b and x, whose method the engine lacks: x is recorded once (repeat 0 of each
    point) and neither built nor in the rotation, so over 6 blocks a and b each run first 3
    times at every point and each is built first 3 times (the reviewer's case gave 2 and 4)."""
    plan = _plan(engines=("rebuilt",), repeats=6, max_repeats=6)
    session, _, made = _run(plan, ["a", "b", "x"], methods={"x": "ngram"})
    x = [r for r in session.runs if r.cell.label == "x"]
    assert sorted((r.cell.mode, r.cell.repeat) for r in x) == [("latency", 0), ("throughput", 0)]
    assert all(r.status.startswith("unsupported") for r in x)
    assert len(made) == 2 * 6 and all("rebuilt/x" not in b for b in session.built)
    assert sorted(b[0] for b in session.built) == ["rebuilt/a"] * 3 + ["rebuilt/b"] * 3
    ran = [r for r in session.runs if r.schedule is not None]
    for point in (0, 1):
        first = [
            r.cell.label for r in ran if r.schedule.point == point and r.schedule.position == 0
        ]
        assert sorted(first) == ["a"] * 3 + ["b"] * 3
    plan = _plan(engines=("rebuilt",), repeats=4, max_repeats=4)  # reviewer: built a, a, b, a
    session, _, _ = _run(plan, ["a", "b", "x"], methods={"x": "ngram"})
    assert sorted(b[0] for b in session.built) == ["rebuilt/a"] * 2 + ["rebuilt/b"] * 2


def test_a_cancelled_close_still_closes_every_other_engine() -> None:
    """Ctrl-C cancels the session while a block's engines close (vLLM: seconds each): the
    engines after the cancelled one are closed all the same, the RSS is recorded, and the
    cancellation goes on."""
    clock, log, made = FakeClock(), [], []

    def log_closing() -> list[Any]:
        return [e for e in log if e[0] == "closing"]

    class SlowClose(Instance):
        async def close(self) -> None:
            self.log.append(("closing", self.label, id(self)))
            if len(log_closing()) == 1:  # block 0's first close hangs until cancelled
                await asyncio.sleep(3600)
            await super().close()

    def factory(config: EngineConfig) -> Instance:
        made.append(SlowClose(clock, config.options["label"], log))
        return made[-1]

    plan = _plan(engines=("rebuilt",))
    session = Session(plan, PROMPTS, progress=False, clock=clock, engine_factory=factory)
    configs = [(lb, EngineConfig(engine="rebuilt", model="m", options={"label": lb}))
               for lb in LABELS]  # fmt: skip

    async def main() -> None:
        task = asyncio.create_task(session.execute(configs))
        while not log_closing():
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert len(made) == 3 and [m.closed for m in made].count(False) == 1  # only the hung one
    assert len(log_closing()) == 3
    assert len(session.rss_after_block_mb) == 1


def test_per_block_is_refused_for_an_engine_that_cannot_start_a_fresh_instance() -> None:
    """A remote server (openai) keeps running: a new engine object is the same instance, so
    the record must not say the instance effect is in the CI."""
    assert Lane("x", EngineConfig(engine="openai", model="m")).instances(PER_BLOCK) == ONE
    args = build_parser().parse_args(
        ["--engine", "openai", "--instances", "per-block", "--base-url", "http://h:1/v1"]
    )
    with pytest.raises(UsageError, match=r"--instances per-block: --engine openai"):
        build_plan(args, "m", None)


def test_resume_builds_only_for_cells_not_yet_done() -> None:
    plan = _plan(engines=("rebuilt",))
    first, _, _ = _run(plan, LABELS)
    done = {r.cell.key for r in first.runs if r.cell.repeat == 0}
    done |= {r.cell.key for r in first.runs if r.cell.repeat == 1 and r.cell.label == "ngram"}
    session, _, made = _run(plan, LABELS, done=done)
    assert [sorted(b) for b in session.built] == [
        [],
        ["rebuilt/baseline", "rebuilt/draft_model"],
        sorted(f"rebuilt/{lb}" for lb in LABELS),
    ]
    assert len(made) == 5
    assert sorted(r.cell.key for r in session.runs) == sorted(
        r.cell.key for r in first.runs if r.cell.key not in done
    )


def test_target_ci_adds_blocks_of_fresh_instances_for_imprecise_points_only() -> None:
    """An A/A pair whose instances differ by a random few %: both points stay imprecise and
    keep adding blocks to --max-repeats, each on fresh instances (the next test has a point
    that stops)."""
    rng = np.random.default_rng(3)
    plan = dataclasses.replace(
        _plan(engines=("rebuilt",), repeats=3), target_ci=0.005, max_repeats=6
    )
    session, _, made = _run(
        plan,
        ["baseline", "baseline-aa"],
        offset=lambda label: float(rng.lognormal(0, 0.05)),
    )
    reps = {m: {r.cell.repeat for r in session.runs if r.cell.mode == m} for m in
            ("latency", "throughput")}  # fmt: skip
    assert reps["latency"] == set(range(6)) and reps["throughput"] == set(range(6))
    assert len(made) == 2 * 6 and len(session.built) == 6


def test_target_ci_adds_blocks_only_for_the_imprecise_point() -> None:
    """Two points: at 8 new tokens every instance runs at the same speed (the A/A ratio is
    exactly 1, precise after --repeats 3); at 16 each instance has its own offset (noisy). Only
    the noisy point gets blocks 3-5, and both lanes get the same repeats at each point."""
    rng = np.random.default_rng(3)

    class Offset(Instance):
        async def stream(self, request: Request, params: GenParams, clock: Any = None) -> Any:
            offset = self.offset
            if request.max_new_tokens == 8:
                self.offset = 1.0
            try:
                async for c in super().stream(request, params, clock):
                    yield c
            finally:
                self.offset = offset

    clock, log, made = FakeClock(), [], []

    def factory(config: EngineConfig) -> Instance:
        made.append(Offset(clock, config.options["label"], log, float(rng.lognormal(0, 0.05))))
        return made[-1]

    plan = dataclasses.replace(
        _plan(engines=("rebuilt",), modes=("latency",), max_new_tokens=(8, 16), repeats=3),
        target_ci=0.005,
        max_repeats=6,
    )
    session = Session(plan, PROMPTS, progress=False, clock=clock, engine_factory=factory)
    labels = ["baseline", "baseline-aa"]
    configs = [(lb, EngineConfig(engine="rebuilt", model="m", options={"label": lb}))
               for lb in labels]  # fmt: skip
    asyncio.run(session.execute(configs))
    assert all(r.status == "ok" for r in session.runs)
    reps = {(lb, n): {r.cell.repeat for r in session.runs
                      if r.cell.label == lb and r.schedule.point == n} for lb in labels
            for n in (0, 1)}  # fmt: skip
    assert reps[("baseline", 0)] == reps[("baseline-aa", 0)] == {0, 1, 2}
    assert reps[("baseline", 1)] == reps[("baseline-aa", 1)] == set(range(6))
    assert len(made) == 2 * 6 and len(session.built) == 6


def test_per_block_instances_put_the_instance_effect_into_the_ci() -> None:
    """Seeded simulation with known truth (no difference): each instance runs 4% faster or
    slower for its whole life. One instance per lane: the blocks' log ratios are all alike, so
    the t-interval is narrow around a false difference; fresh instances per block: the offsets
    vary between blocks and the CI covers 1."""

    def run(instances: str, seed: int) -> dict[str, Any]:
        rng = np.random.default_rng(seed)
        plan = dataclasses.replace(
            _plan(engines=("rebuilt",), modes=("throughput",), repeats=6, max_repeats=6),
            instances=instances,
        )
        session, _, _ = _run(
            plan, ["baseline", "baseline-aa"], offset=lambda lb: float(rng.choice([0.96, 1.04]))
        )
        (comp,) = [c for c in comparisons(session.runs) if c["decides"]]
        return comp

    false_one = sum(run(ONE, s)["verdict"] != "no significant difference" for s in range(6))
    false_per_block = sum(
        run(PER_BLOCK, s)["verdict"] != "no significant difference" for s in range(6)
    )
    assert false_one >= 2 and false_per_block <= 1


def test_build_orders_reads_old_and_new_records() -> None:
    assert build_orders({"build_order": ["a", "b"]}) == [["a", "b"]]
    assert build_orders({"build_order": [["a", "b"], ["b", "a"]]}) == [["a", "b"], ["b", "a"]]
    assert build_orders({}) == []


def test_instances_flag_is_recorded_in_the_config() -> None:
    plan = build_plan(build_parser().parse_args(["--engine", "vllm", "--instances", "one"]),
                      "m", None)  # fmt: skip
    assert plan.to_json()["instances"] == ONE


def test_the_header_line_says_which_instances() -> None:
    from harness.core.design import design_record
    from harness.report.markdown import _design_lines

    def line(instances: dict[str, str]) -> str:
        rec = design_record(
            "interleaved", 0, "reset", list(instances), [list(instances)], instances
        )
        return _design_lines({"design": rec})[1]

    assert "a fresh instance per block" in line(
        {"vllm/baseline": PER_BLOCK, "vllm/ngram": PER_BLOCK}
    )
    one = line({"vllm-server/baseline": ONE, "vllm-server/ngram": ONE})
    assert "instance effect not in the CI" in one and "vllm-server/ngram" in one
    old = design_record("interleaved", 0, "reset", ["a"], [["a"]])
    assert "Engines:" not in _design_lines({"design": old})[1]


def _requests_seen(plan: Any) -> tuple[Session, list[Request]]:
    """Run ``plan`` with one lane; every request its engines were sent, warm-ups included."""
    seen: list[Request] = []

    class Spy(Instance):
        async def stream(self, request: Request, params: GenParams, clock: Any = None) -> Any:
            seen.append(request)
            async for c in super().stream(request, params, clock):
                yield c

    clock, log = FakeClock(), []
    s = Session(plan, PROMPTS, progress=False, clock=clock,
                engine_factory=lambda c: Spy(clock, "x", log))  # fmt: skip
    asyncio.run(s.execute([("baseline", EngineConfig(engine="rebuilt", model="m"))]))
    return s, seen


def test_warmup_tokens_caps_the_warmup_requests_only() -> None:
    from harness.core.design import warmup_requests

    reqs = [Request("a", "x y"), Request("b", "y z", max_new_tokens=4)]
    assert [w.max_new_tokens for w in warmup_requests(reqs, 2)] == [None, 4]  # as before
    resolved = [dataclasses.replace(reqs[0], max_new_tokens=40), reqs[1]]
    assert [w.max_new_tokens for w in warmup_requests(resolved, 2, 8)] == [8, 4]
    plan = build_plan(build_parser().parse_args(["--engine", "hf", "--warmup-tokens", "8"]),
                      "m", None)  # fmt: skip
    assert plan.warmup_tokens == 8 and plan.to_json()["warmup_tokens"] == 8
    plan = dataclasses.replace(
        _plan(engines=("rebuilt",), repeats=1, max_repeats=1), warmup_tokens=3
    )
    _, seen = _requests_seen(plan)
    warm = [r for r in seen if r.id.startswith("warmup-")]
    assert warm and {r.max_new_tokens for r in warm} == {3}
    measured = {r.max_new_tokens for r in seen if not r.id.startswith("warmup-")}
    assert measured == {plan.max_new_tokens[0]}  # the point's: no --warmup-tokens cap


@pytest.mark.parametrize("instances", [PER_BLOCK, ONE])
def test_fresh_instances_warm_up_short_by_default(instances: str) -> None:
    """Per-block instances warm up before every point of every block: at the point's length
    that took the main job past 10 minutes, so their default cap is PER_BLOCK_WARMUP_TOKENS; one
    instance per lane keeps the point's length. The record says which."""
    from harness.core.design import PER_BLOCK_WARMUP_TOKENS

    plan = dataclasses.replace(
        _plan(engines=("rebuilt",), repeats=1, max_repeats=1, max_new_tokens=(24,)),
        instances=instances,
    )
    s, seen = _requests_seen(plan)
    cap = PER_BLOCK_WARMUP_TOKENS if instances == PER_BLOCK else None
    warm = [r for r in seen if r.id.startswith("warmup-")]
    assert warm and {r.max_new_tokens for r in warm} == {cap or 24}  # uncapped: the point's
    assert s.design_record(["rebuilt/baseline"])["warmup_tokens"] == {"rebuilt/baseline": cap}

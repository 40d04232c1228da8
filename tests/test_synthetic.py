"""Synthetic workloads (vLLM bench's random and prefix_repetition) and cycling past the file."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from engines.base import GenParams, Request
from harness.core.load import Concurrent
from harness.run.plan import STEADY_WAVES, Point
from harness.run.runner import Runner
from tests.clock import FakeClock, ScriptedEngine
from workloads import Cycled, WorkloadError, load_workload, synthetic_workload
from workloads.synthetic import (
    PrefixRepetitionSpec,
    RandomSpec,
    load_tokenizer,
    parse_range_ratio,
)


@pytest.fixture(scope="module")
def tok(tiny_pair: tuple[str, str]):
    return load_tokenizer(tiny_pair[0])


def test_random_lengths_within_range_ratio_and_exact_ids(tok) -> None:
    spec = RandomSpec(input_len=256, output_len=32, range_ratio=0.25)
    w = synthetic_workload("random", tok.name_or_path, 64, spec, seed=0)
    ins = [len(r.prompt_token_ids) for r in w.requests]
    outs = [r.max_new_tokens for r in w.requests]
    # vLLM: input uniform in [floor(255 * 0.75), ceil(255 * 1.25)] + 1 special (BOS) token
    assert all(191 + 1 <= n <= 319 + 1 + 1 for n in ins), ins
    assert all(24 <= n <= 40 for n in outs) and len(set(outs)) > 5
    assert max(ins) - min(ins) > 64  # the range is used, not one length
    for r in w.requests:  # an HTTP engine's text tokenizes to the in-process engine's ids
        assert tuple(tok.encode(r.prompt)) == r.prompt_token_ids
        assert not set(r.prompt_token_ids[1:]) & set(tok.all_special_ids)
    again = synthetic_workload("random", tok.name_or_path, 64, spec, seed=0)
    other = synthetic_workload("random", tok.name_or_path, 64, spec, seed=1)
    assert again.requests == w.requests and again.fingerprint == w.fingerprint
    assert other.fingerprint != w.fingerprint
    assert w.params["input_len"] == 256 and w.fmt == "random"


def test_random_fixed_lengths_and_shared_prefix(tok) -> None:
    spec = RandomSpec(input_len=65, output_len=8, range_ratio=0.0, prefix_len=32)
    w = synthetic_workload("random", tok.name_or_path, 16, spec, seed=3)
    lens = Counter(len(r.prompt_token_ids) for r in w.requests)
    assert lens.most_common(1)[0][0] == 32 + 65  # prefix + (64 + BOS)
    assert {r.max_new_tokens for r in w.requests} == {8}
    assert len({r.prompt_token_ids[1:33] for r in w.requests}) == 1  # one shared prefix
    assert len({r.prompt_token_ids for r in w.requests}) == 16


def test_prefix_repetition(tok) -> None:
    spec = PrefixRepetitionSpec(prefix_len=24, suffix_len=16, num_prefixes=4, output_len=8)
    w = synthetic_workload("prefix_repetition", tok.name_or_path, 22, spec, seed=0)
    assert len(w) == 20  # 22 // 4 = 5 per prefix, as vLLM
    prefixes = Counter(r.prompt_token_ids[1:25] for r in w.requests)
    assert sorted(prefixes.values()) == [5, 5, 5, 5]
    assert {r.max_new_tokens for r in w.requests} == {8}
    with pytest.raises(WorkloadError, match="--num-prompts 3 is below"):
        synthetic_workload("prefix_repetition", tok.name_or_path, 3, spec)


def test_range_ratio_parse() -> None:
    assert parse_range_ratio("0.3") == 0.3
    assert parse_range_ratio('{"input": 0.1, "output": 0.5}') == (0.1, 0.5)
    for bad in ("1.0", "-0.1", "abc", '{"input": 0.1}'):
        with pytest.raises(WorkloadError, match="--random-range-ratio"):
            parse_range_ratio(bad)


def test_cycled_more_prompts_than_the_file() -> None:
    base = load_workload("default")
    w = load_workload("default", num_prompts=200, seed=5)
    ids = [r.id for r in w.requests]
    assert len(ids) == 200 and len(set(ids)) == 200  # fresh ids
    n = len(base)
    assert w.requests[:n] == base.requests  # the file first, in order
    origin = Counter(i.split("~")[0] for i in ids)
    assert set(origin.values()) <= {200 // n, 200 // n + 1}  # every prompt used evenly
    assert ids == [r.id for r in load_workload("default", num_prompts=200, seed=5).requests]
    other = [r.id for r in load_workload("default", num_prompts=200, seed=6).requests]
    assert other != ids and len(set(other)) == 200  # seeded order
    c = Cycled(base.requests, 10**6)
    assert len(c) == 10**6 and c[-1].id.endswith(f"~{(10**6 - 1) // n}") and len(c[:3]) == 3


def _scripted(ids: list[str], seconds: float, clock: FakeClock) -> ScriptedEngine:
    return ScriptedEngine(clock, {i: [(seconds / 2, 1), (seconds / 2, 1)] for i in ids})


def test_duration_stops_arrivals_and_lets_in_flight_finish() -> None:
    clock = FakeClock()
    reqs = Cycled([Request("a", "x"), Request("b", "y")], 1000)
    engine = _scripted([r.id for r in reqs], 1.0, clock)
    runner = Runner(engine, clock=clock, sleep=clock.sleep)
    recs = asyncio.run(runner.run(reqs, GenParams(), Concurrent(2), duration=5.0))
    t0 = min(r.t_send for r in recs)
    assert max(r.t_send for r in recs) - t0 < 5.0  # no arrival at or after 5 s
    assert max(r.t_end for r in recs) - t0 >= 5.0 and all(r.ok for r in recs)
    assert 4 <= len(recs) <= 12  # of 1000 asked: ~1 s each, 2 in flight, for 5 s


def test_throughput_point_sends_several_waves(tiny_pair) -> None:
    from harness.run.plan import RunPlan

    def plan(**kw) -> RunPlan:
        base = dict(
            engines=("vllm",), model="m", draft_model=None, tokenizer=None, spec_methods=(),
            num_spec_tokens=(4,), spec_config=None, baseline=True, modes=("throughput",),
            concurrency=(16,), request_rates=(), burstiness=1.0, max_new_tokens=(8,),
            repeats=1, warmup=0, target_ci=None, max_repeats=1, seed=0, workload="default",
        )  # fmt: skip
        return RunPlan(**{**base, **kw})

    reqs = load_workload("default").requests
    p = Point("throughput", Concurrent(16), 8)
    assert len(plan().point_requests(p, reqs)) == STEADY_WAVES * 16
    assert len(plan(fill_concurrency=False).point_requests(p, reqs)) == len(reqs)
    assert len(plan().point_requests(Point("latency", Concurrent(1), 8), reqs)) == len(reqs)
    assert len(plan(duration=3.0).point_requests(p, reqs)) >= 100_000


def test_random_requests_are_packed_and_read_back_whole(tok) -> None:
    """Issue 38: a random workload is held packed (texts and flat id arrays, no Request object
    per prompt); each request read back is the one the per-request code built, the
    fingerprint is the JSON list's hash as before, and the length rule is a view."""
    import hashlib
    import json

    from harness.run.plan import RunPlan
    from workloads import fingerprint
    from workloads.packed import Mapped, PackedRequests
    from workloads.synthetic import SOURCE

    w = synthetic_workload("random", tok.name_or_path, 40, RandomSpec(16, 8, 0.5), seed=3)
    assert isinstance(w.requests, PackedRequests)
    whole = tuple(w.requests)
    for r in whole:
        assert r == Request(r.id, r.prompt, None, r.max_new_tokens, None, f"{SOURCE}{r.id}",
                            prompt_token_ids=tuple(tok.encode(r.prompt)))  # fmt: skip
    assert w.requests[-1] == whole[-1] and w.requests[2:5] == whole[2:5] and w.requests == whole
    rows = [[r.id, r.prompt, []] for r in whole]  # the one-blob hash it replaced
    blob = json.dumps(rows, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    assert fingerprint(w.requests) == hashlib.sha256(blob.encode()).hexdigest() == w.fingerprint
    plan = RunPlan(
        engines=("vllm",), model="m", draft_model=None, tokenizer=None, spec_methods=(),
        num_spec_tokens=(4,), spec_config=None, baseline=True, modes=("throughput",),
        concurrency=(4,), request_rates=(), burstiness=1.0, max_new_tokens=(5,),
        repeats=1, warmup=0, target_ci=None, max_repeats=1, seed=0, workload="default",
    )  # fmt: skip
    view = plan.resolve_lengths(Point("throughput", Concurrent(4), 5), w.requests)
    assert isinstance(view, Mapped) and len(view) == 40
    assert [r.max_new_tokens for r in view] == [5] * 40 and view[3].id == whole[3].id

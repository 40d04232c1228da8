"""The HF engine on real (tiny) models: streaming, losslessness of both speculative methods,
static batches, and the acceptance arithmetic of the counting candidate generator."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from engines.base import EngineConfig, EngineError, GenParams, Request, UnsupportedError  # noqa: E402
from engines.hf.engine import HFEngine  # noqa: E402
from engines.hf.spec import AcceptanceCounter, instrument  # noqa: E402
from engines.hf.thread import generation_thread  # noqa: E402

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "one two three one two three one two",
]
N = 24


@pytest.fixture(scope="module")
def pair(tiny_pair: tuple[str, str]) -> tuple[str, str]:
    return tiny_pair


def _start(cfg: EngineConfig) -> HFEngine:
    eng = HFEngine(cfg)
    asyncio.run(eng.start())
    return eng


@pytest.fixture(scope="module")
def engines(pair: tuple[str, str]) -> dict[str, HFEngine]:
    target, draft = pair
    spec_dm = {"method": "draft_model", "model": draft, "num_speculative_tokens": 4}
    spec_ng = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}
    out = {
        "baseline": _start(EngineConfig("hf", target, device="cpu")),
        "draft_model": _start(EngineConfig("hf", target, spec_config=spec_dm, device="cpu")),
        "ngram": _start(EngineConfig("hf", target, spec_config=spec_ng, device="cpu")),
    }
    yield out
    for e in out.values():
        asyncio.run(e.close())


def _collect(eng: HFEngine, req: Request, params: GenParams) -> list:
    async def go() -> list:
        return [c async for c in eng.stream(req, params)]

    return asyncio.run(go())


def _ids(chunks: list) -> list[int]:
    return [t for c in chunks for t in c.token_ids]


def _timed(chunks: list) -> list:
    """The chunks that carry tokens (the last one carries only the decoded text)."""
    return [c for c in chunks if c.size]


GREEDY = GenParams(ignore_eos=True)  # the length: each request carries its own


def test_acceptance_arithmetic() -> None:
    """Drafts of 4, 4, 2 tokens with 3, 4, 0 matches, plus one step that drafts nothing."""

    class Scripted:
        def __init__(self) -> None:
            self.drafts = iter([4, 4, 0, 2])
            self.updates: list[int] = []

        def get_candidates(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, None]:
            k = next(self.drafts)
            return torch.cat([input_ids, torch.zeros(1, k, dtype=torch.long)], dim=1), None

        def update_candidate_strategy(self, input_ids, scores, num_matches) -> None:
            self.updates.append(int(num_matches))

    counter = AcceptanceCounter(4)
    gen = instrument(Scripted(), counter)
    x = torch.zeros(1, 5, dtype=torch.long)
    for m in (3, 4, 0, 0):
        gen.get_candidates(x)
        gen.update_candidate_strategy(x, None, torch.tensor(m))
    s = counter.snapshot()
    assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (3, 10, 7)
    assert s.accepted_per_pos == (2, 2, 2, 1)
    assert gen.updates == [3, 4, 0, 0]  # the wrapped methods still run
    assert s.to_metrics()["mean_acceptance_length"] == pytest.approx(1 + 7 / 3)


def test_baseline_stream_matches_generate(engines: dict[str, HFEngine]) -> None:
    eng = engines["baseline"]
    req = Request(id="a", prompt=PROMPTS[0], max_new_tokens=N)
    chunks = _collect(eng, req, GREEDY)
    ids = eng.tokenizer(PROMPTS[0], return_tensors="pt")
    ref = eng.model.generate(
        **ids, max_new_tokens=N, do_sample=False, eos_token_id=[], pad_token_id=0
    )
    assert _ids(chunks) == ref[0, ids["input_ids"].shape[1] :].tolist()
    assert len(_timed(chunks)) == N and all(c.size == 1 for c in _timed(chunks))
    assert chunks[-1].size == 0 and chunks[-1].text == eng.tokenizer.decode(_ids(chunks))
    assert all(c.t is None for c in chunks)  # no clock given: the consumer times arrival
    assert chunks[0].prompt_tokens == ids["input_ids"].shape[1]
    assert chunks[0].info == {"chat_template": False}
    assert eng.spec_counters() is None and eng.max_batch() is None


@pytest.mark.parametrize("method", ["draft_model", "ngram"])
def test_spec_is_lossless_and_counts(engines: dict[str, HFEngine], method: str) -> None:
    base, eng = engines["baseline"], engines[method]
    before = eng.spec_counters()
    multi = False
    for i, p in enumerate(PROMPTS):
        req = Request(id=str(i), prompt=p, max_new_tokens=N)
        ref = _ids(_collect(base, req, GREEDY))
        b = eng.spec_counters()
        chunks = _collect(eng, req, GREEDY)
        assert _ids(chunks) == ref, p
        multi |= any(c.size > 1 for c in chunks)
        # one chunk per verification step, carrying the accepted drafts plus the target's token
        s = eng.spec_counters() - b
        assert sum(c.size for c in chunks) == len(_timed(chunks)) + s.num_accepted_tokens
    d = eng.spec_counters() - before
    assert d.num_drafts > 0
    assert 0 <= d.num_accepted_tokens <= d.num_draft_tokens <= 4 * d.num_drafts
    assert sum(d.accepted_per_pos) == d.num_accepted_tokens
    assert list(d.accepted_per_pos) == sorted(d.accepted_per_pos, reverse=True)
    if d.num_accepted_tokens:
        assert multi  # an accepted draft token arrives in a multi-token chunk
    assert eng.max_batch() == 1


def test_draft_model_yields_multi_token_chunks(engines: dict[str, HFEngine]) -> None:
    """Repetitive text: the draft agrees with the target somewhere, so a step emits > 1 token."""
    eng = engines["draft_model"]
    req = Request(id="r", prompt=PROMPTS[2], max_new_tokens=32)
    chunks = _collect(eng, req, GREEDY)
    assert sum(c.size for c in chunks) == 32
    assert any(c.size > 1 for c in chunks)


def test_stamped_stream_is_delivered_in_batches(
    engines: dict[str, HFEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given the runner's clock, each step's ids are stamped on the generating thread when they
    exist, and reach the event loop in batches (far fewer wake-ups than tokens)."""
    import time

    from engines.hf import stream as hf_stream

    pushes: list[str] = []
    orig = hf_stream.QueueStreamer.push

    def push(self, kind, value=None):
        pushes.append(kind)
        orig(self, kind, value)

    monkeypatch.setattr(hf_stream.QueueStreamer, "push", push)
    monkeypatch.setattr(hf_stream, "DELIVERY_S", 10.0)  # one batch for the whole request
    eng = engines["baseline"]

    async def go() -> tuple[float, list, float]:
        t0 = time.perf_counter()
        chunks = [
            c
            async for c in eng.stream(
                Request("c", PROMPTS[0], max_new_tokens=N), GREEDY, time.perf_counter
            )
        ]
        return t0, chunks, time.perf_counter()

    t0, chunks, t1 = asyncio.run(go())
    stamps = [t for c in _timed(chunks) for t in (c.times or (c.t,))]
    assert len(stamps) == N and None not in stamps
    assert t0 < stamps[0] and stamps == sorted(stamps) and len(set(stamps)) == N and stamps[-1] < t1
    # the first step goes at once, the other N - 1 in one batch at the end, then the end marker
    assert pushes.count("tokens") == 2 and pushes[-1] == "end"
    # a chunk per hand-over, a stamp per step: the second carries N - 1 steps of one token
    assert [c.size for c in _timed(chunks)] == [1, N - 1] and chunks[1].sizes == (1,) * (N - 1)


def test_stream_batch_matches_single(engines: dict[str, HFEngine]) -> None:
    eng = engines["baseline"]
    reqs = [Request(id=str(i), prompt=p, max_new_tokens=N) for i, p in enumerate(PROMPTS)]

    async def go() -> dict[int, list[int]]:
        rows: dict[int, list[int]] = {}
        async for i, c in eng.stream_batch(reqs, GREEDY):
            if i not in rows:
                assert c.prompt_tokens is not None
            rows.setdefault(i, []).extend(c.token_ids)
        return rows

    rows = asyncio.run(go())
    for i, r in enumerate(reqs):
        single = _ids(_collect(eng, r, GREEDY))
        assert len(rows[i]) == N
        # Left padding changes the fp32 reduction order slightly, so a near-tie argmax can
        # flip late in the sequence; the first tokens must agree.
        assert rows[i][:8] == single[:8]

    eos = eng.generator.eos_ids()

    async def until_eos() -> dict[int, list[int]]:
        rows: dict[int, list[int]] = {}
        async for i, c in eng.stream_batch(reqs, GenParams()):
            rows.setdefault(i, []).extend(c.token_ids)
        return rows

    rows = asyncio.run(until_eos())
    assert sorted(rows) == list(range(len(PROMPTS)))
    for ids in rows.values():
        # a row stops at its EOS: no padding after it is counted
        assert len(ids) == N or (ids[-1] in eos and not eos & set(ids[:-1]))


def test_sampling_seeded_and_early_close(engines: dict[str, HFEngine]) -> None:
    eng = engines["draft_model"]
    req = Request(id="s", prompt=PROMPTS[0], max_new_tokens=8)
    params = GenParams(temperature=1.0, top_p=0.9, seed=7, ignore_eos=True)
    a, b = _ids(_collect(eng, req, params)), _ids(_collect(eng, req, params))
    assert a == b and len(a) == 8

    async def first_then_close() -> None:
        agen = eng.stream(replace(req, max_new_tokens=10_000), GREEDY)
        async for _ in agen:
            break
        await agen.aclose()  # stops the worker thread (or this test would take minutes)

    asyncio.run(first_then_close())
    assert len(_ids(_collect(eng, replace(req, max_new_tokens=N), GREEDY))) == N


def test_spec_batch_unsupported(engines: dict[str, HFEngine]) -> None:
    async def go() -> None:
        async for _ in engines["ngram"].stream_batch(
            [Request(id="x", prompt="a", max_new_tokens=N)], GREEDY
        ):
            pass

    with pytest.raises(UnsupportedError, match="batch size 1"):
        asyncio.run(go())


def test_messages_and_describe(engines: dict[str, HFEngine]) -> None:
    eng = engines["draft_model"]
    req = Request(id="m", messages=({"role": "user", "content": "Hello there"},), max_new_tokens=4)
    chunks = _collect(eng, req, GREEDY)
    assert chunks[0].info == {"chat_template": bool(eng.tokenizer.chat_template)}
    d = eng.describe()
    assert d["device"] == "cpu" and d["dtype"] == "float32"
    assert d["generation_kwargs"]["num_assistant_tokens"] == 4
    assert d["generation_kwargs"]["assistant_confidence_threshold"] == 0
    costs = eng.step_costs(n=2)
    assert costs["target_step_s"] > 0 and costs["c"] > 0


def test_validate(pair: tuple[str, str], tmp_path: Path) -> None:
    target, _ = pair
    HFEngine.validate(EngineConfig("hf", target))
    HFEngine.validate(EngineConfig("hf", "org/some-model"))  # a hub id: checked at load time
    with pytest.raises(EngineError, match="not found"):
        HFEngine.validate(EngineConfig("hf", str(tmp_path / "missing")))
    with pytest.raises(EngineError, match="not supported"):
        HFEngine.validate(EngineConfig("hf", target, spec_config={"method": "eagle"}))
    with pytest.raises(EngineError, match="draft"):
        HFEngine.validate(
            EngineConfig(
                "hf", target, spec_config={"method": "draft_model", "num_speculative_tokens": 2}
            )
        )
    missing = {
        "method": "draft_model",
        "model": str(tmp_path / "nodraft"),
        "num_speculative_tokens": 2,
    }
    with pytest.raises(EngineError, match="not found"):
        HFEngine.validate(EngineConfig("hf", target, spec_config=missing))


def test_every_forward_runs_on_the_one_generation_thread(engines: dict[str, HFEngine]) -> None:
    """A new thread's first forwards ran 5-10x slower on CUDA (engines/hf/thread.py): every
    request of every engine, static batches and ``step_costs`` run on one long-lived thread."""
    seen: set[int] = set()
    hooks = [
        m.register_forward_pre_hook(lambda *_: seen.add(threading.get_ident()))
        for e in engines.values()
        for m in (e.model, e.draft)
        if m is not None
    ]
    try:
        for eng in engines.values():
            for p in PROMPTS[:2]:
                _collect(eng, Request(id="t", prompt=p, max_new_tokens=4), GenParams())

        async def batch() -> None:
            reqs = [Request(id=str(i), prompt=p, max_new_tokens=4) for i, p in enumerate(PROMPTS)]
            async for _ in engines["baseline"].stream_batch(reqs, GenParams()):
                pass

        asyncio.run(batch())
        engines["draft_model"].step_costs(2)
        asyncio.run(asyncio.to_thread(engines["baseline"].step_costs, 2))
    finally:
        for h in hooks:
            h.remove()
    assert len(seen) == 1 and threading.get_ident() not in seen


def test_a_request_left_while_queued_does_not_generate(engines: dict[str, HFEngine]) -> None:
    """A consumer that goes away before its ``generate`` reached the thread costs no forward."""
    eng = engines["baseline"]
    forwards: list[int] = []
    hook = eng.model.register_forward_pre_hook(lambda *_: forwards.append(1))
    release = threading.Event()

    async def go() -> None:
        generation_thread().submit(release.wait, 10)  # the thread is busy elsewhere

        async def consume() -> None:
            async for _ in eng.stream(Request(id="q", prompt=PROMPTS[0], max_new_tokens=N), GREEDY):
                pass

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.05)
        task.cancel()
        asyncio.get_running_loop().call_later(0.05, release.set)
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(go())
    finally:
        hook.remove()
        release.set()
    assert forwards == []
    assert (
        len(_ids(_collect(eng, Request(id="n", prompt=PROMPTS[0], max_new_tokens=N), GREEDY))) == N
    )

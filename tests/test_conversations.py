"""Multi-turn conversations: the reader (ShareGPT, Spec-Bench's MT-bench), located errors, the
driver (turn k carries the variant's own answers), and the per-turn table (known truth on a fake
clock)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import pytest

from engines.base import Chunk, Engine, EngineConfig, GenParams, Request
from harness.analysis.workload.turns import turn_tables
from harness.core.design import INTERLEAVED, Slot
from harness.core.load import Concurrent, Synchronous
from harness.core.records_file import load_with_records
from harness.core.results import Cell, Run
from harness.run.conversations import Conversations
from harness.run.runner import Runner
from tests.clock import FakeClock
from tests.inprocess import run_harness
from workloads import WorkloadError, conversation_workload
from workloads.conversations import split_turn, turn_id


class Answering(Engine):
    """Answers every request with a text naming itself, the turn and the last user message, and
    keeps every request it was sent (the real engines cannot say what they received). Each
    answer token takes ``tpot[turn]`` seconds of virtual time."""

    name: ClassVar[str] = "answering"
    spec_methods: ClassVar[tuple[str, ...]] = ()

    def __init__(self, tag: str, clock: FakeClock, tpot: dict[int, float] | None = None) -> None:
        self.tag, self.clock, self.tpot = tag, clock, tpot or {}
        self.received: list[Request] = []
        self.config = EngineConfig(engine="answering", model="none")

    @classmethod
    def validate(cls, config: EngineConfig) -> None:
        return None

    async def start(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"engine": "answering"}

    async def stream(
        self, request: Request, params: GenParams, clock: Any = None
    ) -> AsyncIterator[Chunk]:
        self.received.append(request)
        turn = split_turn(request.id)[1]
        last = request.messages[-1]["content"]
        for i in range(4):
            self.clock.now += self.tpot.get(turn, 0.01)
            await asyncio.sleep(0)
            text = f"[{self.tag} says {i} to '{last}']" if i == 0 else f" {i}"
            yield Chunk(token_ids=(10 + i,), text=text)

    async def close(self) -> None:
        return None

    def spec_counters(self) -> None:
        return None

    def max_batch(self) -> int | None:
        return None


def _convs() -> list[Request]:
    return list(conversation_workload("conversations").requests)


def drive(engine: Answering, clock: FakeClock, strategy: Any, think: float = 0.0) -> list:
    runner = Runner(engine, clock=clock, sleep=clock.sleep)
    driver = Conversations(runner, {"think_time_s": think})
    convs = [replace(c, max_new_tokens=4) for c in _convs()]
    return asyncio.run(driver.run(convs, GenParams(), strategy))


def test_turn_two_carries_the_variants_own_turn_one_answer() -> None:
    """Two variants answer differently; each one's turn 2 holds its own turn-1 answer (never
    the other's, never the file's recorded answer), then the next user turn."""
    clock = FakeClock()
    base, spec = Answering("base", clock), Answering("spec", clock)
    recs = {e.tag: drive(e, clock, Concurrent(3)) for e in (base, spec)}
    for engine in (base, spec):
        other = "spec" if engine.tag == "base" else "base"
        by_id = {r.request_id: r for r in recs[engine.tag]}
        sent = {r.id: r for r in engine.received}
        assert len(sent) == 22  # 8 two-turn + 2 three-turn conversations
        for conv in _convs():
            t1, t2 = sent[turn_id(conv.id, 1)], sent[turn_id(conv.id, 2)]
            answer = by_id[turn_id(conv.id, 1)].output_text
            assert answer.startswith(f"[{engine.tag} says 0") and answer.endswith(" 1 2 3")
            assert t2.messages[: len(t1.messages)] == t1.messages  # the history, unchanged
            assert t2.messages[len(t1.messages)] == {"role": "assistant", "content": answer}
            assert t2.messages[-1] == {"role": "user", "content": conv.next_turns[0]}
            assert not any(other in m["content"] for m in t2.messages)
            assert "recorded by another model" not in json.dumps(t2.messages)
            assert t1.cache_salt == t2.cache_salt == f"conversation-{conv.id}"
        c09 = sent[turn_id("c09", 3)].messages
        assert [m["role"] for m in c09] == [
            "system",
            "user",
            "assistant",
            "user",
            "assistant",
            "user",
        ]


def test_conversations_in_flight_and_think_time_on_the_fake_clock() -> None:
    clock = FakeClock()
    engine = Answering("base", clock)
    one = drive(engine, clock, Synchronous(), think=2.0)
    by_id = {r.request_id: r for r in one}
    # one conversation at a time, and 2 s between an answer and the next turn
    assert by_id["c01@t2"].t_send == pytest.approx(by_id["c01@t1"].t_end + 2.0)
    assert by_id["c02@t1"].t_send >= by_id["c01@t2"].t_end
    assert {split_turn(r.request_id)[0] for r in one} == {c.id for c in _convs()}


def _runs(clock: FakeClock, label: str, tpot: dict[int, float], repeats: int) -> list[Run]:
    out = []
    for rep in range(repeats):
        records = drive(Answering(label, clock, tpot), clock, Synchronous())
        cell = Cell("answering", label, "latency", {"concurrency": 1}, 4, rep, "conversations")
        spec = None if label == "baseline" else {"method": "ngram"}
        out.append(Run(cell, spec, tuple(records), schedule=Slot(INTERLEAVED, 0, rep, 0, rep)))
    return out


def test_turn_table_known_truth_speedup_on_later_turns_only() -> None:
    """The candidate is as fast on turn 1 and twice as fast on later turns: the table says
    1.0x on turn 1 and 2.0x on turns 2 and 3 and 'later', with a CI at 3 repeats."""
    clock = FakeClock()
    runs = _runs(clock, "baseline", {1: 0.02, 2: 0.02, 3: 0.02}, 3)
    runs += _runs(clock, "ngram", {1: 0.02, 2: 0.01, 3: 0.01}, 3)
    tables = {t["name"]: t for t in turn_tables(runs, min_effect=0.02)}
    ngram = tables["answering/ngram"]
    assert set(ngram["turns"]) == {"1", "2", "3", "later"} and ngram["conversations"] == 10
    assert ngram["turns"]["1"]["requests"] == 30 and ngram["turns"]["later"]["requests"] == 36
    for turn, want in (("1", 1.0), ("2", 2.0), ("3", 2.0), ("later", 2.0)):
        s = ngram["turns"][turn]["speedup"]
        assert s["tpot"]["estimate"] == pytest.approx(want)
        assert s["output_tok_s"]["estimate"] == pytest.approx(want)
        assert s["tpot"]["n"] == 3 and s["tpot"]["lo"] is not None
    assert ngram["turns"]["2"]["speedup"]["tpot"]["verdict"] == "faster"
    assert tables["answering/baseline"]["turns"]["2"]["speedup"] is None
    assert ngram["turns"]["2"]["tpot_s"] == pytest.approx(0.01)


def test_readers_sharegpt_and_specbench_second_turns() -> None:
    w = conversation_workload("conversations")
    assert len(w) == 10 and w.fmt == "sharegpt"
    c01 = w.requests[0]
    assert c01.messages[0] == {"role": "system", "content": "You are a helpful assistant."}
    assert c01.next_turns == ("Now repeat the poem, but add a title on top.",)
    with pytest.warns(UserWarning, match="skipped 400 conversations"):
        mt = conversation_workload("specbench")
    assert len(mt) == 80 and all(len(r.next_turns) == 1 for r in mt.requests)
    assert conversation_workload("conversations", max_turns=2).params["turns"] == 20


BAD = {
    "no conversations": ({"id": "a"}, "entry 1: conversations: missing"),
    "bad speaker": (
        {"id": "a", "conversations": [{"from": "robot", "value": "x"}]},
        "entry 1: conversations[0].from: unknown speaker",
    ),
    "empty turn": (
        {"id": "a", "conversations": [{"from": "human", "value": "  "}]},
        "entry 1: conversations[0].value: empty turn",
    ),
    "missing value": (
        {"id": "a", "conversations": [{"from": "human", "value": "x"}, {"from": "human"}]},
        "entry 1: conversations[1].value: missing",
    ),
    "no human": (
        {"id": "a", "conversations": [{"from": "gpt", "value": "x"}]},
        "entry 1: conversations: no human turn",
    ),
    "duplicate": (
        {"id": "ok", "conversations": [{"from": "human", "value": "x"}] * 2},
        "entry 1: id: duplicate id 'ok'",
    ),
}
GOOD = {
    "id": "ok",
    "conversations": [{"from": "human", "value": "a"}, {"from": "human", "value": "b"}],
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_conversations_one_located_line(tmp_path: Path, case: str) -> None:
    bad, want = BAD[case]
    p = tmp_path / "c.json"
    p.write_text(json.dumps([GOOD, bad]))
    with pytest.raises(WorkloadError) as e:
        conversation_workload(p)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(str(p)) and want in msg


def test_bad_specbench_turn_names_its_line(tmp_path: Path) -> None:
    p = tmp_path / "q.jsonl"
    p.write_text('{"question_id": 1, "turns": ["a", "b"]}\n{"question_id": 2, "turns": ["a", 3]}\n')
    with pytest.raises(WorkloadError, match=r"q\.jsonl:2: turns\[1\]: must be a string"):
        conversation_workload(p)


def test_bad_conversation_through_the_cli_exits_2(tmp_path, capsys) -> None:
    p = tmp_path / "c.json"
    p.write_text(json.dumps([GOOD, BAD["empty turn"][0]]))
    ran = run_harness(
        ["--engine", "vllm", "--model", "tiny", "--multi-turn", "--workload", str(p)], capsys
    )
    assert ran.returncode == 2
    err = [x for x in ran.stderr.splitlines() if x.strip()]
    assert len(err) == 1 and f"{p}: entry 1: conversations[0].value: empty turn" in err[0]


@pytest.mark.slow
def test_multi_turn_ngram_on_vllm_prints_the_turn_table(tiny_pair, tmp_path, capsys) -> None:
    """8 two-turn conversations, baseline and ngram on in-process vLLM: the per-turn table with
    paired speedups by turn, and turn 2's prompt holds turn 1 and its answer (longer)."""
    out = tmp_path / "out"
    ran = run_harness(
        ["--engine", "vllm", "--model", "tiny", "--multi-turn", "--workload", "conversations",
         "--max-turns", "2", "--num-prompts", "8", "--spec", "ngram", "--mode", "latency",
         "--max-new-tokens", "24", "--repeats", "1", "--warmup", "1", "--output-dir", str(out),
         "--no-plots", "--quiet"],
        capsys,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-2000:]
    res = load_with_records(out / "results.json")
    tables = {t["name"]: t for t in res["turns"]}
    ngram = tables["vllm/ngram"]
    assert ngram["conversations"] == 8 and set(ngram["turns"]) == {"1", "2"}
    assert ngram["turns"]["2"]["speedup"]["tpot"]["estimate"] is not None
    t1, t2 = (tables["vllm/baseline"]["turns"][k]["prompt_tokens"] for k in ("1", "2"))
    assert t2 > t1
    assert "## By turn" in ran.stdout and "TPOT speedup" in ran.stdout
    assert "each its own cache salt" in res["design"]["prefix_cache_description"]
    # the real engine got each variant's own answer: turn 2's prompt token count is that of
    # the chat template over turn 1 and the answer this run recorded for turn 1
    from transformers import AutoTokenizer

    from engines.common.local_model import prompt_ids
    from harness.run.conversations import history

    tok = AutoTokenizer.from_pretrained(tiny_pair[0])
    convs = {c.id: c for c in conversation_workload("conversations").requests}
    for run in res["runs"]:
        recs = {r["id"]: r for r in run["records"] if not r["warmup"]}
        checked = 0
        for cid in {split_turn(i)[0] for i in recs}:
            answer = recs[turn_id(cid, 1)]["output_text"]
            want = history(convs[cid], [answer], 2)
            n = len(prompt_ids(tok, Request("x", messages=want))[0])
            assert recs[turn_id(cid, 2)]["prompt_tokens"] == n
            checked += 1
        assert checked == 8


def test_a_conversations_first_turn_keeps_its_scheduled_arrival() -> None:
    """--multi-turn with --request-rate: each conversation's first turn is due at the rate's
    schedule (its record keeps it: the wait for a conversation slot is in its client queue and
    its latency from the schedule); later turns are sent on the answer, with no schedule."""
    from harness.core.load import Poisson

    clock = FakeClock()
    strategy = Poisson(100.0, seed=1, max_concurrency=1)  # 10 ms apart; a conversation ~80 ms
    recs = drive(Answering("base", clock), clock, strategy)
    firsts = [r for r in recs if split_turn(r.request_id)[1] == 1]
    assert len(firsts) == len(_convs()) and all(r.t_scheduled is not None for r in firsts)
    assert max(r.client_queue for r in firsts) > 0.3  # ten conversations through one slot
    assert all(r.e2e_from_schedule >= r.e2e for r in firsts)
    assert all(r.t_scheduled is None for r in recs if split_turn(r.request_id)[1] > 1)

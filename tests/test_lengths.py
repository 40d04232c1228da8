"""One length per request, resolved once before any engine sees it: a request's own
``max_new_tokens``, ``--max-new-tokens`` and a dataset's output length (with
``--random-range-ratio`` one sampled per request) each win where they should, and under
``--duration`` every cycled copy keeps its request's, for every registered engine
(``harness.run.plan.RunPlan.resolve_lengths``); and every engine reads that one field
(``engines.base.new_tokens``), nothing else.

The flags go through the run pipeline's front (``harness.cli.pipeline.prepare``: the real
parser, plan and dataset) and the real session; the engine each lane gets records what it was
handed. ``openai`` is the real engine on the repo's fake server (what reaches the wire); the
others' real starts are slow, so tests/test_engine_contract.py checks each started engine
generates to its request's ``max_new_tokens``, and the source check below that no engine reads a
length from anywhere else.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import json
import re
from collections.abc import AsyncIterator
from dataclasses import fields
from pathlib import Path
from typing import Any, ClassVar

import pytest

from engines.base import (
    REGISTRY,
    Capabilities,
    Chunk,
    Engine,
    EngineConfig,
    GenParams,
    Request,
    new_tokens,
)
from harness.cli.pipeline import prepare
from harness.flags.parser import build_parser
from harness.flags.plan import DEFAULT_MAX_NEW_TOKENS
from harness.run.session import Session
from tests.fake_server import Behaviour, FakeServer

OWN = (5, None, 9)  # the request file's own lengths (None: the entry has none)
RANDOM = ["--dataset-name", "random", "--random-input-len", "8", "--num-prompts", "3"]
CASES = {
    # flags -> the length each measured request is generated to, in file order
    "file: own lengths, default for the rest": ([], [5, DEFAULT_MAX_NEW_TOKENS, 9]),
    "file: --max-new-tokens wins over own": (["--max-new-tokens", "7"], [7, 7, 7]),
    "random: the dataset's output length": (RANDOM + ["--random-output-len", "6"], [6, 6, 6]),
    "random: --max-new-tokens wins over it": (
        RANDOM + ["--random-output-len", "6", "--max-new-tokens", "4"],
        [4, 4, 4],
    ),
    # lengths sampled in [3, 9] (vLLM's range), seeded: each request its own
    "random: --random-range-ratio, each its sampled length": (
        RANDOM + ["--random-output-len", "6", "--random-range-ratio", "0.5"],
        [4, 5, 3],
    ),
    "random: --max-new-tokens wins over the sampled lengths": (
        RANDOM
        + ["--random-output-len", "6", "--random-range-ratio", "0.5", "--max-new-tokens", "7"],
        [7, 7, 7],
    ),
}
# --duration: the prompts cycled (fresh ids ``q1~2``) for as long as it lasts; every copy keeps
# the length of the request it copies (request id -> length)
DURATION = ["--mode", "throughput", "--concurrency", "2", "--duration", "0.3"]
DURATION_CASES = {
    "file: own lengths, default for the rest": (
        [],
        {"q0": 5, "q1": DEFAULT_MAX_NEW_TOKENS, "q2": 9},
    ),
    "file: --max-new-tokens wins over own": (
        ["--max-new-tokens", "7"],
        {"q0": 7, "q1": 7, "q2": 7},
    ),
}


class Recorder(Engine):
    """Stands in for the lane's engine: records each request it is handed and generates what
    every engine generates, ``new_tokens(request)`` tokens."""

    name: ClassVar[str] = "recorder"
    capabilities: ClassVar[Capabilities] = Capabilities()
    seen: ClassVar[list[Request]] = []

    def __init__(self, config: EngineConfig) -> None:
        self.config = config

    @classmethod
    def validate(cls, config: EngineConfig) -> None:
        return None

    async def start(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"engine": self.name}

    async def stream(
        self, request: Request, params: GenParams, clock: Any = None
    ) -> AsyncIterator[Chunk]:
        self.seen.append(request)
        for i in range(new_tokens(request)):
            await asyncio.sleep(0)
            yield Chunk(token_ids=(i,), prompt_tokens=1 if i == 0 else None)

    async def close(self) -> None:
        return None


def _workload(tmp: Path) -> Path:
    path = tmp / "own.jsonl"
    rows = [{"id": f"q{i}", "prompt": f"prompt {i}"} for i in range(len(OWN))]
    for row, n in zip(rows, OWN):
        if n is not None:
            row["max_new_tokens"] = n
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _argv(engine: str, flags: list[str], model: str, tmp: Path) -> list[str]:
    data = [] if "--dataset-name" in flags else ["--workload", str(_workload(tmp))]
    return ["--engine", engine, "--model", model, "--mode", "latency", "--repeats", "1",
            "--warmup", "1", "--quiet", "--output-dir", str(tmp / "out"), *data, *flags]  # fmt: skip


def _run(engine: str, argv: list[str]) -> tuple[list[int | None], list[Any]]:
    """The front of a run for ``argv`` and the real session; the lengths the lane's engine was
    handed (warm-up first), and the runs."""
    if engine == "openai":
        return asyncio.run(_openai(argv))
    prepared = prepare(build_parser().parse_args(argv))
    Recorder.seen = []
    session = Session(prepared.plan, prepared.workload.requests, progress=False,
                      engine_factory=Recorder)  # fmt: skip
    runs = asyncio.run(session.execute(prepared.plan.engine_configs({})))
    return [r.max_new_tokens for r in Recorder.seen], runs


async def _openai(argv: list[str]) -> tuple[list[int | None], list[Any]]:
    """The real openai engine on the fake server: the lengths as they reached the wire."""
    fake = FakeServer(Behaviour(tokens=64, obey_max_tokens=True))
    async with fake as url:
        prepared = prepare(build_parser().parse_args([*argv, "--base-url", url]))
        session = Session(prepared.plan, prepared.workload.requests, progress=False)
        runs = await session.execute(prepared.plan.engine_configs({}))
    return [r.body["max_tokens"] for r in fake.requests], runs


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("engine", sorted(REGISTRY))
def test_each_length_wins_where_it_should(
    engine: str, case: str, tiny_pair: tuple[str, str], tmp_path: Path
) -> None:
    flags, want = CASES[case]
    seen, runs = _run(engine, _argv(engine, flags, tiny_pair[0], tmp_path))
    assert seen == [want[0], *want], case  # the warm-up first: shaped like the first request
    (run,) = runs
    assert run.status == "ok", run.status
    assert [rec.output_tokens for rec in run.counted] == want


@pytest.mark.parametrize("case", list(DURATION_CASES))
@pytest.mark.parametrize("engine", sorted(REGISTRY))
def test_under_duration_every_copy_keeps_its_requests_length(
    engine: str, case: str, tiny_pair: tuple[str, str], tmp_path: Path
) -> None:
    flags, want = DURATION_CASES[case]
    seen, runs = _run(engine, _argv(engine, [*DURATION, *flags], tiny_pair[0], tmp_path))
    (run,) = runs
    assert run.status == "ok", run.status
    got = [(rec.request_id.split("~")[0], rec.output_tokens) for rec in run.counted]
    assert any("~" in rec.request_id for rec in run.counted), len(got)  # cycled past one pass
    assert got == [(rid, want[rid]) for rid, _ in got], case
    assert set(seen) == set(want.values()), case  # handed (warm-up included) as generated


# ---- every engine reads that one field ---------------------------------------------------------
def _source(module: str) -> str:
    spec = importlib.util.find_spec(module)  # read, not imported (vLLM's engines import vLLM)
    assert spec is not None and spec.origin is not None, module
    return Path(spec.origin).read_text()


def _engine_modules(name: str) -> list[str]:
    """The engine's module and every engines.* module it imports, transitively."""
    todo, found = [REGISTRY[name].partition(":")[0]], []
    while todo:
        mod = todo.pop()
        if mod in found or mod == "engines.base":
            continue
        found.append(mod)
        for node in ast.walk(ast.parse(_source(mod))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("engines"):
                package = Path(__file__).resolve().parents[1] / Path(*str(node.module).split("."))
                if package.is_dir():  # from engines.openai import prom: the module prom
                    todo += [f"{node.module}.{a.name}" for a in node.names
                             if (package / f"{a.name}.py").exists()]  # fmt: skip
                else:
                    todo.append(str(node.module))
            elif isinstance(node, ast.Import):
                todo += [a.name for a in node.names if a.name.startswith("engines.")]
    return found


@pytest.mark.parametrize("engine", sorted(REGISTRY))
def test_every_engine_reads_only_the_requests_length(engine: str) -> None:
    assert "max_new_tokens" not in {f.name for f in fields(GenParams)}  # no second length
    modules = _engine_modules(engine)
    assert len(modules) > 1, modules  # the walk follows imports
    for mod in modules:
        reads = re.findall(r"\w+\.max_new_tokens\b", _source(mod))
        assert not reads, f"{mod} reads {reads}: read the length with engines.base.new_tokens"

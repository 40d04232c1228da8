"""--target-ci: a point is repeated until the comparison's own CI is narrow enough."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from engines.base import Chunk, EngineConfig, GenParams, Request
from harness.flags.parser import build_parser
from harness.flags.plan import build_plan
from harness.run.session import Session
from tests.clock import FakeClock, ScriptedEngine

PROMPTS = [Request(f"p{i}", "x") for i in range(4)]


class NoisyEngine(ScriptedEngine):
    """Every request's delays scaled by its own lognormal draw (sd ``noise``; 0: exact)."""

    def __init__(self, clock: FakeClock, per_token: float, noise: float, seed: int):
        super().__init__(clock, {r.id: [(per_token, 1)] * 8 for r in PROMPTS})
        self.per_token, self.noise = per_token, noise
        self.rng = np.random.default_rng(seed)

    async def stream(
        self, request: Request, params: GenParams, clock: Any = None
    ) -> AsyncIterator[Chunk]:
        f = float(self.rng.lognormal(0.0, self.noise)) if self.noise else 1.0
        self.script[request.id] = [(self.per_token * f, 1)] * 8
        async for chunk in super().stream(request, params, clock):
            yield chunk


def _repeats_run(noise: float) -> Counter[str]:
    args = build_parser().parse_args(
        ["--engine", "hf", "--spec", "ngram", "--mode", "latency", "--repeats", "3",
         "--target-ci", "0.05", "--max-repeats", "6", "--warmup", "0"]
    )  # fmt: skip
    plan = build_plan(args, "model", None)
    clock = FakeClock()

    built: list[NoisyEngine] = []

    def factory(config: EngineConfig) -> NoisyEngine:  # a fresh instance per block: own draws
        spec = config.spec_config is not None
        built.append(NoisyEngine(clock, 0.01 if spec else 0.02, noise if spec else 0.0, len(built)))
        return built[-1]

    base = EngineConfig(engine="hf", model="model")
    cand = EngineConfig(engine="hf", model="model", spec_config={"method": "ngram"})
    session = Session(plan, PROMPTS, engine_factory=factory, clock=clock, progress=False)
    runs = asyncio.run(session.execute([("baseline", base), ("ngram", cand)]))
    return Counter(r.cell.label for r in runs if r.status == "ok")


@pytest.mark.parametrize(("noise", "expect"), [(0.0, 3), (0.4, 6)])
def test_target_ci_stops_on_the_comparisons_ci(noise: float, expect: int) -> None:
    """Exact timings: the comparison's CI is narrow at 3 repeats, so the point stops there;
    a noisy candidate keeps both lanes repeating up to --max-repeats."""
    assert _repeats_run(noise) == {"baseline": expect, "ngram": expect}

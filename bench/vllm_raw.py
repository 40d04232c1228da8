"""vLLM without the harness: the raw paths the benchmarks compare the in-process engine with.

Runs on the engine's stepping thread (``VLLMEngine.call_on_stepper``; one per process, shared by
its in-process engines), so it shares the engine's loaded model and needs it idle.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engines.base import EngineError, GenParams, Request
from engines.vllm.engine import VLLMEngine


async def generate_batch(
    engine: VLLMEngine, requests: Sequence[Request], params: GenParams, *, streamed: bool = False
) -> list[list[int]]:
    """Each request's output ids. ``streamed=False``: one plain ``llm.generate`` over all
    prompts. ``streamed=True``: the same requests stepped with the DELTA outputs that
    ``VLLMEngine.stream`` asks for, nothing handed to the event loop: streaming's cost in vLLM."""

    def run(llm: Any) -> list[list[int]]:
        core = llm.llm_engine
        if core.has_unfinished_requests():
            raise EngineError("vllm: generate_batch needs an idle engine")
        if not streamed:
            prompts = [engine.lane.prompt_input(r) for r in requests]
            sps = [engine.sampling_params(r, params, delta=False) for r in requests]
            outs = llm.generate(prompts, sps, use_tqdm=False)
            return [list(o.outputs[0].token_ids) for o in outs]
        ids: dict[str, list[int]] = {}
        for i, r in enumerate(requests):
            rid = f"raw-{i}"  # unique while they run: the engine is idle before and after
            engine.lane.add_request(rid, r, engine.sampling_params(r, params, delta=True))
            ids[rid] = []
        while core.has_unfinished_requests():
            for out in core.step():
                ids[out.request_id].extend(out.outputs[0].token_ids)
        return list(ids.values())

    return await engine.call_on_stepper(run)

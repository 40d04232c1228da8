"""A step simulator: the in-process vLLM engine's own code driving a fake engine core that runs
at GPU step rates, so the harness's cost per token and its slowdown of the stepping loop can be
measured on a machine without a GPU.

``StepSimEngine`` is :class:`engines.vllm.engine.VLLMEngine` (its stepping thread, stamping, hand-over
to the event loop: everything the harness adds) with ``LLM`` replaced by :class:`SimLLM`. Each
``step()`` of the fake core gives one token to every running request (at most ``max_seqs``),
holds the GIL for ``gil_share`` of ``step_s`` (a pure-Python spin measured in the thread's own
CPU time, as vLLM's scheduler and output processing hold it), then sleeps for the rest (the GIL
released, like a wait on the GPU). A step therefore lasts ``step_s`` unless another thread of the
process takes the GIL from it: that lengthening is the slowdown the harness causes.

The core records when each step started and the CPU time its thread spent inside ``step()``, so
the benchmark can separate the stepping thread's time outside ``step()`` (the harness's
engine-side work) from the simulated engine's own.
"""

from __future__ import annotations

import time
import types
from collections.abc import Mapping
from typing import Any, ClassVar

from engines.base import EngineConfig, GenParams, Request, new_tokens
from engines.vllm.engine import VLLMEngine


class _Completion:
    """``vllm.CompletionOutput``'s shape (DELTA: the step's new tokens and text)."""

    __slots__ = ("token_ids", "text", "finish_reason")

    def __init__(self, token_ids: list[int], text: str, finish_reason: str | None) -> None:
        self.token_ids, self.text, self.finish_reason = token_ids, text, finish_reason


class _Output:
    """``vllm.RequestOutput``'s shape."""

    __slots__ = ("request_id", "outputs", "prompt_token_ids", "finished")

    def __init__(self, rid: str, comp: _Completion, prompt: list[int], finished: bool) -> None:
        self.request_id, self.outputs = rid, [comp]
        self.prompt_token_ids, self.finished = prompt, finished


class SimCore:
    """``LLMEngine``'s shape: ``add_request``, ``abort_request``, ``has_unfinished_requests``,
    ``step``. Requests beyond ``max_seqs`` wait, as in vLLM's scheduler."""

    def __init__(self, step_s: float, gil_share: float, max_seqs: int) -> None:
        self.step_s, self.cpu_s, self.max_seqs = step_s, step_s * gil_share, max_seqs
        self._waiting: dict[str, list[Any]] = {}
        self._running: dict[str, list[Any]] = {}
        self.engine_core = types.SimpleNamespace(shutdown=lambda: None)
        self.reset_stats()

    def reset_stats(self) -> None:
        self.starts: list[float] = []  # perf_counter at each step's start
        self.cpu_in_step = 0.0  # thread CPU seconds spent inside step()
        self.tokens = 0

    def add_request(self, rid: str, prompt: Mapping[str, Any], sp: Any) -> None:
        self._waiting[rid] = [list(prompt["prompt_token_ids"]), sp.max_tokens, 0]

    def abort_request(self, rids: list[str]) -> None:
        for rid in rids:
            self._waiting.pop(rid, None)
            self._running.pop(rid, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self._running or self._waiting)

    def step(self) -> list[_Output]:
        c0 = time.thread_time()
        self.starts.append(time.perf_counter())
        while self._waiting and len(self._running) < self.max_seqs:
            rid = next(iter(self._waiting))
            self._running[rid] = self._waiting.pop(rid)
        outs = []
        done = []
        for rid, st in self._running.items():
            st[2] += 1
            fin = st[2] >= st[1]
            comp = _Completion([st[2] % 1000], "x", "length" if fin else None)
            outs.append(_Output(rid, comp, st[0], fin))
            if fin:
                done.append(rid)
        for rid in done:
            del self._running[rid]
        self.tokens += len(outs)
        while time.thread_time() - c0 < self.cpu_s:  # the GIL-holding share, in CPU time
            pass
        c1 = time.thread_time()
        time.sleep(max(0.0, self.step_s - self.cpu_s))  # the "GPU": GIL released
        self.cpu_in_step += c1 - c0 + (time.thread_time() - c1)
        return outs


class _Tokenizer:
    chat_template = None

    def encode(self, text: str, **_: Any) -> list[int]:
        return [1] * max(1, min(64, len(text) // 4))


class SimLLM:
    """``vllm.LLM``'s shape, as far as :class:`VLLMEngine` uses it."""

    def __init__(self, core: SimCore) -> None:
        self.llm_engine = core

    def get_tokenizer(self) -> _Tokenizer:
        return _Tokenizer()


class StepSimEngine(VLLMEngine):
    """:class:`VLLMEngine` over :class:`SimCore`: the harness's in-process path at GPU rates."""

    name: ClassVar[str] = "stepsim"
    spec_methods: ClassVar[tuple[str, ...]] = ()

    def __init__(self, step_s: float, gil_share: float, max_seqs: int) -> None:
        super().__init__(EngineConfig(engine="stepsim", model="stepsim"))
        self.core = SimCore(step_s, gil_share, max_seqs)

    @classmethod
    def validate(cls, config: EngineConfig) -> None:
        return None

    def build(self) -> tuple[SimLLM, dict[str, Any], dict[str, Any], dict[str, Any]]:
        return SimLLM(self.core), {}, {}, {}

    def sampling_params(self, request: Request, params: GenParams, delta: bool) -> Any:
        return types.SimpleNamespace(max_tokens=new_tokens(request))

    def describe(self) -> Mapping[str, Any]:
        c = self.core
        return {"engine": self.name, "step_s": c.step_s, "cpu_s": c.cpu_s, "max_seqs": c.max_seqs}

    def stepper_cpu(self) -> float:
        """CPU seconds of the stepping thread so far (read from any thread). The thread is the
        process's, shared by every in-process engine: bench/cost.py runs one at a time."""
        thread = self.lane.thread
        assert thread is not None and thread.ident is not None
        return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))

"""In-process vLLM engine: one ``LLMEngine`` driven request by request, streamed per id.

Design: on CPU the engine core runs in this process, on CUDA each engine's in its own process
(``VLLM_ENABLE_V1_MULTIPROCESSING``: engines/vllm/process.py). The process's one stepping thread
(engines/vllm/stepper.py: shared, so no lane owns a thread's CPU placement) builds the engine,
adds and aborts requests, calls ``step()`` while requests are unfinished and stamps each step's
outputs (DELTA) right after it returns, with the clock the runner passed to :meth:`stream`. The
stamped steps reach the event loop at most every ``DELIVERY_S`` and at once when a request
finishes; there each output is filed into its request's ``Pending`` and each stream takes what
it has as one chunk (engines/common/handover.py): no per-token object or wake-up, no timestamp moved.
``LLMEngine.add_request`` mutates the scheduler that ``step()`` walks, so :meth:`stream` only
enqueues it for the thread. Spec counters: ``step()`` records its stats before it returns its
outputs, so a request's last chunk arrives after the counters cover every step it used.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import Future
from typing import Any, ClassVar

from engines.base import (
    SPEC_METHODS,
    Capabilities,
    Chunk,
    Clock,
    Engine,
    EngineConfig,
    EngineError,
    GenParams,
    Request,
    SpecCounters,
)
from engines.common.handover import DELIVERY_S, Pending
from engines.vllm.lane import Built, SteppedLane, load_llm
from engines.vllm.messages import Abort, Add, Call, Step, Stop
from engines.vllm.process import ENV, core_mode, engine_process_default
from engines.vllm.setup import (
    VLLMFlags,
    sampling_params,
    torch_threads_kept,
    validate_config,
)
from engines.vllm.stepper import STEPPER, Open

# Before vLLM is imported: where the engine core runs (engines/vllm/process.py); vLLM's log goes
os.environ.setdefault(ENV, engine_process_default())  # to stderr (stdout: the summary)
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

SHARED = "one stepping thread shared by this process's in-process vLLM engines"


class VLLMEngine(VLLMFlags, Engine):
    """vLLM ``LLM`` in this process, driven request by request (see module docstring)."""

    name: ClassVar[str] = "vllm"
    spec_methods: ClassVar[tuple[str, ...]] = SPEC_METHODS
    # several engines live in one process (stepped by one shared thread, idle while another
    # lane runs): its counters come from its own stats tap, and shutdown spares the others
    capabilities: ClassVar[Capabilities] = Capabilities(
        coexist=True, tunable=True, rebuild_per_block=True, device_memory="budget"
    )

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        # the stepping thread's side: the LLM, its live requests and steps, the stats tap
        self.lane = SteppedLane(self.build, self.deliver, self.fail)
        # the event loop's side: each request's Pending, when the streams were last woken
        self._streams: dict[str, Pending] = {}
        self._woken_at: float | None = None
        self._ids = itertools.count()

    def build(self) -> Built:
        """Build vLLM's ``LLM`` (on the stepping thread); bench/stepsim.py overrides this with
        a step simulator of the same shape (``llm_engine.step()`` & co.)."""
        return load_llm(self.config)

    @property
    def stepper_native_id(self) -> int | None:
        """The stepping thread's OS id while this engine runs (every engine of the process: one)."""
        return self.lane.stepper_native_id

    # ---- validation & start -----------------------------------------------------------------
    @classmethod
    def validate(cls, config: EngineConfig) -> None:
        validate_config(config, cls.spec_methods)

    async def start(self) -> None:
        self.validate(self.config)
        if self.lane.thread is not None:
            raise EngineError("vllm: engine already started")
        ready: Future[None] = Future()
        try:
            with torch_threads_kept():  # the stepping thread sets its own
                STEPPER.send(self.lane, Open(ready))
                await asyncio.wrap_future(ready)
        except Exception as e:  # (a refused second start leaves the first one's engine)
            raise EngineError(f"vllm: engine failed to start: {type(e).__name__}: {e}") from e

    def describe(self) -> Mapping[str, Any]:
        import vllm
        from vllm.platforms import current_platform

        def plain(v: Any) -> Any:
            return v if isinstance(v, (str, int, float, bool, type(None), list, dict)) else str(v)

        return {
            "engine": self.name,
            "vllm_version": vllm.__version__,
            "platform": str(current_platform.device_type),
            "mode": f"{core_mode()}, {SHARED}, DELTA outputs",
            "stepping_thread": self.stepper_native_id,
            "VLLM_ENABLE_V1_MULTIPROCESSING": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING"),
            "defaults_chosen": {"stepping": SHARED, **self.lane.defaults},
            "engine_kwargs": {k: plain(v) for k, v in self.lane.kwargs.items()},
            **self.lane.facts,
        }

    # ---- on the event loop (posted by the lane: engines/vllm/lane.py) -----------------------
    def deliver(self, steps: list[Step]) -> None:
        """File ``steps``; if that fails, fail the streams they were for (else they would wait
        forever) and abort their requests."""
        try:
            self._file(steps)
        except Exception as e:  # noqa: BLE001 - reported to the affected streams
            error = EngineError(f"vllm: hand-over failed: {type(e).__name__}: {e}")
            try:
                rids = {o.request_id for step in steps for o in step.outputs}
            except Exception:  # noqa: BLE001 - outputs unreadable: every stream is affected
                rids = set(self._streams)
            for rid in rids:
                if (p := self._streams.get(rid)) is not None:
                    p.fail(error)
                    if not p.done:
                        STEPPER.send(self.lane, Abort(rid))

    def _file(self, steps: list[Step]) -> None:
        """File each output into its request's Pending; wake the requests that ended, and every
        request with outputs once ``DELIVERY_S`` has passed."""
        streams = self._streams
        for step in steps:
            t = step.t
            for o in step.outputs:
                p = streams.get(o.request_id)
                if p is None:  # aborted
                    continue
                comp = o.outputs[0]
                ids = comp.token_ids
                if ids:
                    p.ids += ids
                    p.times.append(t)
                    p.sizes.append(len(ids))
                if comp.text:
                    p.text.append(comp.text)
                if p.prompt_tokens is None and o.prompt_token_ids is not None:
                    p.prompt_tokens = len(o.prompt_token_ids)
                if o.finished:
                    p.finish_reason, p.done = comp.finish_reason, True
                    spec = getattr(comp, "spec_decode_metrics", None)
                    if spec is not None:  # this request's own acceptance (on its last output)
                        p.info = {"spec_decode": spec.to_dict()}  # per_request_spec_decode_metrics
                    p.wake()
        t = steps[-1].t
        if t is None or self._woken_at is None or t - self._woken_at >= DELIVERY_S:
            self._woken_at = t
            for p in streams.values():
                if p.times:
                    p.wake()

    def fail(self, exc: BaseException, rid: str | None = None) -> None:
        """Fail request ``rid``'s stream, or every open stream."""
        for p in self._streams.values() if rid is None else filter(None, [self._streams.get(rid)]):
            p.fail(exc)

    def _usable(self) -> None:
        if self.lane.dead is not None or self.lane.thread is None:
            raise self.lane.dead or EngineError("vllm: engine not started")

    async def call_on_stepper(self, fn: Callable[[Any], Any]) -> Any:
        """Run ``fn(llm)`` on the stepping thread (between steps) and await its result."""
        self._usable()
        fut: Future[Any] = Future()
        STEPPER.send(self.lane, Call(fn, fut))  # an engine that ends meanwhile answers it (late())
        return await asyncio.wrap_future(fut)

    # ---- requests ---------------------------------------------------------------------------
    def sampling_params(self, request: Request, params: GenParams, delta: bool) -> Any:
        """vLLM's ``SamplingParams``; ``delta``: each output carries only the new tokens."""
        return sampling_params(request, params, delta)

    async def stream(
        self, request: Request, params: GenParams, clock: Clock | None = None
    ) -> AsyncIterator[Chunk]:
        self._usable()
        self.lane.attach(asyncio.get_running_loop(), clock)  # one runner at a time
        rid = f"{request.id}#{next(self._ids)}"
        sp = self.sampling_params(request, params, delta=True)
        pending = self._streams[rid] = Pending()
        STEPPER.send(self.lane, Add(rid, request, sp))  # an engine that ends meanwhile fails it
        try:
            info = {"chat_template": self.lane.has_template and request.messages is not None}
            async for chunk in pending.chunks(info):
                yield chunk
        finally:
            del self._streams[rid]
            if not (pending.done or pending.error) and self.lane.thread is not None:
                STEPPER.send(self.lane, Abort(rid))

    # ---- counters & lifecycle ---------------------------------------------------------------
    def spec_counters(self) -> SpecCounters | None:
        lane = self.lane
        if self.config.spec_config is None or lane.llm is None or not lane.tapped:
            return None
        return lane.tap.spec_counters()

    def prefix_cache_counters(self) -> dict[str, int] | None:
        """This engine's cumulative prefix-cache queries and hits (prompt tokens)."""
        return self.lane.tap.prefix_cache() if self.lane.tapped else None

    async def reset_prefix_cache(self) -> str:
        """Empty the prefix cache between runs (idle engine: nothing holds a block)."""
        ok = await self.call_on_stepper(lambda llm: llm.reset_prefix_cache())
        return "reset" if ok else "reset refused by vLLM (blocks in use)"

    async def close(self) -> None:
        if not self.lane.detach():
            return
        done: Future[None] = Future()
        STEPPER.send(self.lane, Stop(done))  # the stepping thread shuts the engine down
        try:
            await asyncio.wrap_future(done)
        except Exception as e:
            raise EngineError(f"vllm: shutdown failed: {e}") from e

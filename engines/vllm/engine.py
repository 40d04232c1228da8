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
import threading
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
from engines.vllm.lane import SteppedLane
from engines.vllm.messages import Abort, Add, Call, Step, Stop
from engines.vllm.metrics import StatsTap
from engines.vllm.process import ENV, core_mode, engine_process_default
from engines.vllm.setup import (
    VLLMFlags,
    sampling_params,
    torch_threads_kept,
    validate_config,
)
from engines.vllm.stepper import STEPPER, Open
from engines.vllm.threads import StepThreads

# Before vLLM is imported: where the engine core runs (engines/vllm/process.py); vLLM's log goes
os.environ.setdefault(ENV, engine_process_default())  # to stderr (stdout: the summary)
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

SHARED = "one stepping thread shared by this process's in-process vLLM engines"


class VLLMEngine(SteppedLane, VLLMFlags, Engine):
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
        self._llm: Any = None
        self._thread: threading.Thread | None = None  # the shared stepping thread, once built
        self.stepper_native_id: int | None = None  # its OS id: every engine of the process, one
        # the event loop's side: its loop, the clock to stamp with, each request's Pending
        self._loop: asyncio.AbstractEventLoop | None = None
        self._clock: Clock | None = None
        self._streams: dict[str, Pending] = {}
        self._woken_at: float | None = None
        # the stepping thread's side: requests added and not finished, steps not handed over
        self._live: set[str] = set()
        self._steps: list[Step] = []
        self._sent_at: float | None = None
        self._ids = itertools.count()
        self._kwargs: dict[str, Any] = {}
        self._defaults: dict[str, Any] = {}
        self._facts: dict[str, Any] = {}
        self._has_template = False
        self._dead: BaseException | None = None
        self._tap = StatsTap()
        self._tapped = False
        self._threads: StepThreads | None = None  # the stepping thread's OpenMP count, kept

    # ---- validation & start -----------------------------------------------------------------
    @classmethod
    def validate(cls, config: EngineConfig) -> None:
        validate_config(config, cls.spec_methods)

    async def start(self) -> None:
        self.validate(self.config)
        if self._thread is not None:
            raise EngineError("vllm: engine already started")
        ready: Future[None] = Future()
        try:
            with torch_threads_kept():  # the stepping thread sets its own
                STEPPER.send(self, Open(ready))
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
            "defaults_chosen": {"stepping": SHARED, **self._defaults},
            "engine_kwargs": {k: plain(v) for k, v in self._kwargs.items()},
            **self._facts,
        }

    # ---- on the event loop (the stepping thread's side: engines/vllm/lane.py) ---------------
    def _deliver(self, steps: list[Step]) -> None:
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
                        STEPPER.send(self, Abort(rid))

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

    def _fail(self, exc: BaseException, rid: str | None = None) -> None:
        """Fail request ``rid``'s stream, or every open stream."""
        for p in self._streams.values() if rid is None else filter(None, [self._streams.get(rid)]):
            p.fail(exc)

    def _usable(self) -> None:
        if self._dead is not None or self._thread is None:
            raise self._dead or EngineError("vllm: engine not started")

    async def call_on_stepper(self, fn: Callable[[Any], Any]) -> Any:
        """Run ``fn(llm)`` on the stepping thread (between steps) and await its result."""
        self._usable()
        fut: Future[Any] = Future()
        STEPPER.send(self, Call(fn, fut))  # an engine that ends meanwhile answers it (late())
        return await asyncio.wrap_future(fut)

    # ---- requests ---------------------------------------------------------------------------
    def sampling_params(self, request: Request, params: GenParams, delta: bool) -> Any:
        """vLLM's ``SamplingParams``; ``delta``: each output carries only the new tokens."""
        return sampling_params(request, params, delta)

    async def stream(
        self, request: Request, params: GenParams, clock: Clock | None = None
    ) -> AsyncIterator[Chunk]:
        self._usable()
        self._loop = asyncio.get_running_loop()
        self._clock = clock  # one runner at a time: its clock stamps every step
        rid = f"{request.id}#{next(self._ids)}"
        sp = self.sampling_params(request, params, delta=True)
        pending = self._streams[rid] = Pending()
        STEPPER.send(self, Add(rid, request, sp))  # an engine that ends meanwhile fails it
        try:
            info = {"chat_template": self._has_template and request.messages is not None}
            async for chunk in pending.chunks(info):
                yield chunk
        finally:
            del self._streams[rid]
            if not (pending.done or pending.error) and self._thread is not None:
                STEPPER.send(self, Abort(rid))

    # ---- counters & lifecycle ---------------------------------------------------------------
    def spec_counters(self) -> SpecCounters | None:
        if self.config.spec_config is None or self._llm is None or not self._tapped:
            return None
        return self._tap.spec_counters()

    def prefix_cache_counters(self) -> dict[str, int] | None:
        """This engine's cumulative prefix-cache queries and hits (prompt tokens)."""
        return self._tap.prefix_cache() if self._tapped else None

    async def reset_prefix_cache(self) -> str:
        """Empty the prefix cache between runs (idle engine: nothing holds a block)."""
        ok = await self.call_on_stepper(lambda llm: llm.reset_prefix_cache())
        return "reset" if ok else "reset refused by vLLM (blocks in use)"

    async def close(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        done: Future[None] = Future()
        STEPPER.send(self, Stop(done))  # the stepping thread shuts the engine down
        try:
            await asyncio.wrap_future(done)
        except Exception as e:
            raise EngineError(f"vllm: shutdown failed: {e}") from e

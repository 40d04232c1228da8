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
import contextlib
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
from engines.common.local_model import has_chat_template, prompt_ids
from engines.vllm.messages import Abort, Add, Call, Command, Step, Stop
from engines.vllm.metrics import StatsTap
from engines.vllm.process import ENV, core_mode, engine_process_default
from engines.vllm.setup import (
    VLLMFlags,
    build_llm,
    free_dist_state,
    keep_dist_state,
    one_thread_stepping,
    release_memory,
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
_ALIVE: set[int] = set()  # ids of this process's engines that hold vLLM's process-wide state


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

    # ---- on the stepping thread (engines/vllm/stepper.py's Lane) -----------------------------
    def open(self) -> None:
        """Build the engine (on the process's stepping thread)."""
        try:
            self._llm = self._load()
            _ALIVE.add(id(self))
            self._tapped = self._tap.install(getattr(self._llm.llm_engine, "logger_manager", None))
            self._has_template = has_chat_template(self._llm.get_tokenizer())
        except BaseException:
            if self._llm is not None:
                with contextlib.suppress(BaseException):
                    self._shutdown()
            self._llm = None
            _ALIVE.discard(id(self))
            if not _ALIVE:  # other live engines still need vLLM's distributed state
                free_dist_state()
            raise
        self._thread = threading.current_thread()
        self.stepper_native_id = threading.get_native_id()
        self._threads = StepThreads.for_engine(self._defaults)

    def _load(self) -> Any:
        """Build vLLM's ``LLM`` on the stepping thread. bench/stepsim.py overrides this with a
        step simulator of the same shape (``llm_engine.step()`` & co.)."""
        try:
            llm, self._kwargs, self._defaults, self._facts = build_llm(self.config)
        except BaseException:  # a partial build may have set this thread's OpenMP count, and
            with contextlib.suppress(Exception):  # the other engines step on it too
                one_thread_stepping({})
            raise
        return llm

    def busy(self) -> bool:
        return bool(self._llm.llm_engine.has_unfinished_requests())

    def step(self) -> None:
        """One ``step()``: stamp its outputs, hand them over when a request ended or
        ``DELIVERY_S`` has passed since the last hand-over."""
        try:
            outs = self._llm.llm_engine.step()
        finally:  # a failing step too: the other engines step on this thread next
            if self._threads is not None:
                self._threads.keep()
        if not outs:
            return
        clock = self._clock
        t = clock() if clock is not None else None  # the step's outputs exist now
        self._steps.append(Step(outs, t))
        ended = [o.request_id for o in outs if o.finished]
        if ended:
            self._live.difference_update(ended)
        if ended or t is None or self._sent_at is None or t - self._sent_at >= DELIVERY_S:
            self._sent_at = t
            self._flush()

    def idle(self) -> None:
        self._flush()  # only leftovers of aborted requests can wait here

    def end(self, cause: BaseException | None, stop: Future[None] | None) -> None:
        """Fail the open streams, shut the engine down; report to ``stop`` (close())."""
        if cause is None:
            error = EngineError("vllm: engine closed")
        else:  # a failed step (or command) leaves the engine unusable
            error = EngineError(f"vllm: engine failed: {type(cause).__name__}: {cause}")
        self._dead, failed = error, None
        self._fail_all(error)
        try:
            self._shutdown()
        except BaseException as e:  # noqa: BLE001 - reported to close()
            failed = e
        self._thread = self.stepper_native_id = None  # shut down: no longer stepped
        if stop is not None and stop.set_running_or_notify_cancel():  # else close() gave up
            stop.set_exception(failed) if failed else stop.set_result(None)

    def late(self, cmd: Command) -> None:
        """A command sent after the engine ended (a failed step, or close())."""
        error = self._dead or EngineError("vllm: engine closed")
        if isinstance(cmd, Add):
            self._post(self._fail, error, cmd.rid)
        elif isinstance(cmd, (Call, Stop)) and cmd.done.set_running_or_notify_cancel():
            cmd.done.set_exception(error) if isinstance(cmd, Call) else cmd.done.set_result(None)

    def handle(self, cmd: Command) -> None:
        if isinstance(cmd, Add):
            try:
                self.add_request(cmd.rid, cmd.request, cmd.sampling)
                self._live.add(cmd.rid)
            except Exception as e:  # noqa: BLE001 - this request fails, the engine goes on
                self._post(self._fail, e, cmd.rid)
        elif isinstance(cmd, Abort):
            if cmd.rid in self._live:
                self._live.discard(cmd.rid)
                self._llm.llm_engine.abort_request([cmd.rid])
        elif isinstance(cmd, Call) and cmd.done.set_running_or_notify_cancel():  # else cancelled
            try:
                result = cmd.fn(self._llm)
            except BaseException as e:  # noqa: BLE001 - reported to the caller
                cmd.done.set_exception(e)
                return
            cmd.done.set_result(result)

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on the event loop (nothing if it is gone: nobody listens)."""
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(fn, *args)

    def _flush(self) -> None:
        """Hand the steps not yet handed over to the event loop: one wake-up for all."""
        if self._steps:
            steps, self._steps = self._steps, []
            self._post(self._deliver, steps)

    # ---- on the event loop ------------------------------------------------------------------
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

    def prompt_input(self, request: Request) -> dict[str, Any]:
        """What vLLM is given as the prompt: token ids (engines/common/local_model.py's rule, the HF
        engine's too) and the request's cache salt."""
        ids, _ = prompt_ids(self._llm.get_tokenizer(), request)
        prompt: dict[str, Any] = {"prompt_token_ids": ids}
        if request.cache_salt:
            prompt["cache_salt"] = request.cache_salt
        return prompt

    def add_request(self, rid: str, request: Request, sampling: Any) -> None:
        """Add a request to the engine: on the stepping thread only (see module docstring)."""
        prompt = self.prompt_input(request)
        preprocess = getattr(self._llm, "_preprocess_cmpl_one", None)
        self._llm.llm_engine.add_request(
            rid, preprocess(prompt) if preprocess else prompt, sampling
        )

    def _fail_all(self, exc: BaseException) -> None:
        self._flush()  # the tokens made before the failure reach their records first
        self._post(self._fail, exc)
        self._live.clear()

    def _shutdown(self) -> None:
        llm, self._llm = self._llm, None
        _ALIVE.discard(id(self))
        try:
            # tears down vLLM's distributed state too, unless other engines still live
            with keep_dist_state() if _ALIVE else contextlib.nullcontext():
                llm.llm_engine.engine_core.shutdown()
        finally:
            del llm
            release_memory()

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

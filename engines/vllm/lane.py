"""The in-process vLLM engine's side on the process's one stepping thread (the ``Lane`` that
engines/vllm/stepper.py drives): the engine built there, each ``step()``'s outputs stamped and
handed to the event loop, requests added and aborted between steps, the engine shut down."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from engines.base import Clock, EngineConfig, EngineError, Request
from engines.common.handover import DELIVERY_S
from engines.common.local_model import has_chat_template, prompt_ids
from engines.vllm.messages import Abort, Add, Call, Command, Step, Stop
from engines.vllm.metrics import StatsTap
from engines.vllm.setup import (
    build_llm,
    free_dist_state,
    keep_dist_state,
    one_thread_stepping,
    release_memory,
)
from engines.vllm.threads import StepThreads

_ALIVE: set[int] = set()  # ids of this process's engines that hold vLLM's process-wide state


Built = tuple[Any, dict[str, Any], dict[str, Any], dict[str, Any]]  # llm, kwargs, defaults, facts


def load_llm(config: EngineConfig) -> Built:
    """Build vLLM's ``LLM`` on the stepping thread (engines/vllm/setup.py: build_llm); a failed
    build leaves the thread one OpenMP thread, as a good one does."""
    try:
        return build_llm(config)
    except BaseException:  # a partial build may have set this thread's OpenMP count, and
        with contextlib.suppress(Exception):  # the other engines step on it too
            one_thread_stepping({})
        raise


class SteppedLane:
    """One :class:`engines.vllm.engine.VLLMEngine`'s side on the stepping thread (the ``Lane``
    engines/vllm/stepper.py drives): it owns the ``LLM``, the requests added and not finished,
    the steps not yet handed over, the stats tap and the thread's state. ``build`` makes the
    ``LLM`` (bench/stepsim.py gives a step simulator of the same shape); ``deliver(steps)`` and
    ``fail(exc, rid=None)`` are the engine's, run on the event loop, posted from here."""

    def __init__(
        self,
        build: Callable[[], Built],
        deliver: Callable[[list[Step]], None],
        fail: Callable[..., None],
    ) -> None:
        self.build = build
        self.deliver = deliver
        self.fail = fail
        self.llm: Any = None
        self.thread: threading.Thread | None = None  # the shared stepping thread, once built
        self.stepper_native_id: int | None = None  # its OS id: every engine of the process, one
        self.kwargs: dict[str, Any] = {}
        self.defaults: dict[str, Any] = {}
        self.facts: dict[str, Any] = {}
        self.has_template = False
        self.dead: BaseException | None = None  # why the engine ended (a failed step), if so
        self.tap = StatsTap()
        self.tapped = False
        self.threads: StepThreads | None = None  # the stepping thread's OpenMP count, kept
        # the event loop to post to and the clock to stamp with (the runner's, set per stream)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._clock: Clock | None = None
        # requests added and not finished, steps not handed over, when the last hand-over went
        self._live: set[str] = set()
        self._steps: list[Step] = []
        self._sent_at: float | None = None

    # ---- from the event loop ----------------------------------------------------------------
    def attach(self, loop: asyncio.AbstractEventLoop, clock: Clock | None) -> None:
        """The loop the hand-overs go to and the clock that stamps every step (one runner at
        a time)."""
        self._loop, self._clock = loop, clock

    def detach(self) -> bool:
        """Mark the lane closed (close()): whether it was running, so Stop is sent once."""
        running, self.thread = self.thread is not None, None
        return running

    # ---- on the stepping thread -------------------------------------------------------------
    def open(self) -> None:
        """Build the engine (on the process's stepping thread)."""
        try:
            self.llm, self.kwargs, self.defaults, self.facts = self.build()
            _ALIVE.add(id(self))
            self.tapped = self.tap.install(getattr(self.llm.llm_engine, "logger_manager", None))
            self.has_template = has_chat_template(self.llm.get_tokenizer())
        except BaseException:
            if self.llm is not None:
                with contextlib.suppress(BaseException):
                    self._shutdown()
            self.llm = None
            _ALIVE.discard(id(self))
            if not _ALIVE:  # other live engines still need vLLM's distributed state
                free_dist_state()
            raise
        self.thread = threading.current_thread()
        self.stepper_native_id = threading.get_native_id()
        self.threads = StepThreads.for_engine(self.defaults)

    def busy(self) -> bool:
        return bool(self.llm.llm_engine.has_unfinished_requests())

    def step(self) -> None:
        """One ``step()``: stamp its outputs, hand them over when a request ended or
        ``DELIVERY_S`` has passed since the last hand-over."""
        try:
            outs = self.llm.llm_engine.step()
        finally:  # a failing step too: the other engines step on this thread next
            if self.threads is not None:
                self.threads.keep()
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
        self.dead, failed = error, None
        self._fail_all(error)
        try:
            self._shutdown()
        except BaseException as e:  # noqa: BLE001 - reported to close()
            failed = e
        self.thread = self.stepper_native_id = None  # shut down: no longer stepped
        if stop is not None and stop.set_running_or_notify_cancel():  # else close() gave up
            stop.set_exception(failed) if failed else stop.set_result(None)

    def late(self, cmd: Command) -> None:
        """A command sent after the engine ended (a failed step, or close())."""
        error = self.dead or EngineError("vllm: engine closed")
        if isinstance(cmd, Add):
            self._post(self.fail, error, cmd.rid)
        elif isinstance(cmd, (Call, Stop)) and cmd.done.set_running_or_notify_cancel():
            cmd.done.set_exception(error) if isinstance(cmd, Call) else cmd.done.set_result(None)

    def handle(self, cmd: Command) -> None:
        if isinstance(cmd, Add):
            try:
                self.add_request(cmd.rid, cmd.request, cmd.sampling)
                self._live.add(cmd.rid)
            except Exception as e:  # noqa: BLE001 - this request fails, the engine goes on
                self._post(self.fail, e, cmd.rid)
        elif isinstance(cmd, Abort):
            if cmd.rid in self._live:
                self._live.discard(cmd.rid)
                self.llm.llm_engine.abort_request([cmd.rid])
        elif isinstance(cmd, Call) and cmd.done.set_running_or_notify_cancel():  # else cancelled
            try:
                result = cmd.fn(self.llm)
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
            self._post(self.deliver, steps)

    def prompt_input(self, request: Request) -> dict[str, Any]:
        """What vLLM is given as the prompt: token ids (engines/common/local_model.py's rule, the HF
        engine's too) and the request's cache salt."""
        ids, _ = prompt_ids(self.llm.get_tokenizer(), request)
        prompt: dict[str, Any] = {"prompt_token_ids": ids}
        if request.cache_salt:
            prompt["cache_salt"] = request.cache_salt
        return prompt

    def add_request(self, rid: str, request: Request, sampling: Any) -> None:
        """Add a request to the engine: on the stepping thread only (see module docstring)."""
        prompt = self.prompt_input(request)
        preprocess = getattr(self.llm, "_preprocess_cmpl_one", None)
        self.llm.llm_engine.add_request(rid, preprocess(prompt) if preprocess else prompt, sampling)

    def _fail_all(self, exc: BaseException) -> None:
        self._flush()  # the tokens made before the failure reach their records first
        self._post(self.fail, exc)
        self._live.clear()

    def _shutdown(self) -> None:
        llm, self.llm = self.llm, None
        _ALIVE.discard(id(self))
        try:
            # tears down vLLM's distributed state too, unless other engines still live
            with keep_dist_state() if _ALIVE else contextlib.nullcontext():
                llm.llm_engine.engine_core.shutdown()
        finally:
            del llm
            release_memory()

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


class SteppedLane:
    """What :class:`engines.vllm.engine.VLLMEngine` (which holds these fields) does on the
    stepping thread; ``_fail`` and ``_deliver`` run on the event loop, posted from here."""

    config: EngineConfig
    _llm: Any
    _thread: threading.Thread | None
    stepper_native_id: int | None
    _loop: asyncio.AbstractEventLoop | None
    _clock: Clock | None
    _live: set[str]
    _steps: list[Step]
    _sent_at: float | None
    _kwargs: dict[str, Any]
    _defaults: dict[str, Any]
    _facts: dict[str, Any]
    _has_template: bool
    _dead: BaseException | None
    _tap: StatsTap
    _tapped: bool
    _threads: StepThreads | None
    _fail: Callable[..., None]
    _deliver: Callable[..., None]

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

"""In-process vLLM engine: one ``LLMEngine`` stepped by one thread, requests streamed per id.

Design: ``LLM`` is built with ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` so the engine core runs in
this process (no busy engine process fighting for the CPU). A single stepping thread owns the
engine: it builds it, adds and aborts requests, calls ``step()`` while requests are unfinished
and hands each ``RequestOutput`` (``RequestOutputKind.DELTA``) to its request's asyncio queue,
stamped right after ``step()`` returns with the clock the runner passed to :meth:`stream`.
Stamped outputs reach the event loop in one batch at most every ``DELIVERY_S``, and at once
when a request finishes (a concurrency slot frees): the event loop's work then competes for the
GIL with the stepping thread a few times per second, not after every step.
``LLMEngine.add_request`` mutates the scheduler that ``step()`` walks, so it is never called from
the event loop: :meth:`stream` enqueues a command and the thread adds it before its next step.
Requests added while others run join the next step (continuous batching).

Spec counters: ``LLMEngine.step()`` records the step's scheduler stats (spec decoding included)
into vLLM's Prometheus registry before it returns its outputs, so when a request's last chunk
is delivered the counters already cover every step that produced it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import gc
import itertools
import os
import queue
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, ClassVar

from engines.base import (
    SPEC_METHODS,
    Chunk,
    Clock,
    EngineConfig,
    EngineError,
    GenParams,
    Request,
    SpecCounters,
)
from engines.vllm_metrics import StatsTap
from engines.vllm_setup import (
    engine_kwargs,
    free_dist_state,
    keep_dist_state,
    patch_kernel_rebinding,
    validate_config,
)

# Must be set before vLLM is imported: the engine core then runs in this process.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# vLLM logs to stdout by default; the harness's stdout is the markdown summary.
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

DELIVERY_S = 0.05  # stamped outputs reach the event loop at most this often (and when one ends)
_ALIVE: set[int] = set()  # ids of this process's engines that hold vLLM's process-wide state


@dataclasses.dataclass(frozen=True)
class _Sink:
    """Where one request's outputs go: an asyncio queue on the event loop's thread."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Any]
    clock: Clock | None = None  # the runner's; None = outputs go out unstamped, at once

    def __call__(self, item: Any) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


def _deliver(batch: list[tuple[_Sink, Any]]) -> None:
    """On the event loop: hand a step's outputs to their requests' queues."""
    for sink, item in batch:
        sink.queue.put_nowait(item)


class VLLMEngine:
    """vLLM ``LLM`` in this process, driven request by request (see module docstring)."""

    name: ClassVar[str] = "vllm"
    spec_methods: ClassVar[tuple[str, ...]] = SPEC_METHODS
    # several engines live in one process (each its own stepping thread, idle while another
    # lane runs): its counters come from its own stats tap, and shutdown spares the others
    coexist: ClassVar[bool] = True

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._llm: Any = None
        self._thread: threading.Thread | None = None
        self._cmds: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._sinks: dict[str, _Sink] = {}
        self._pending: list[tuple[_Sink, Any]] = []  # stamped outputs not yet handed over
        self._ids = itertools.count()
        self._kwargs: dict[str, Any] = {}
        self._defaults: dict[str, Any] = {}
        self._facts: dict[str, Any] = {}
        self._has_template = False
        self._dead: BaseException | None = None
        self._tap = StatsTap()
        self._tapped = False

    # ---- validation & start -----------------------------------------------------------------
    @classmethod
    def validate(cls, config: EngineConfig) -> None:
        validate_config(config, cls.spec_methods)

    async def start(self) -> None:
        self.validate(self.config)
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name="vllm-stepper", daemon=True
        )
        self._thread.start()
        try:
            await asyncio.wrap_future(ready)
        except Exception as e:
            self._thread.join()
            self._thread = None
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
            "mode": "in-process LLMEngine (V1), one stepping thread, DELTA outputs",
            "VLLM_ENABLE_V1_MULTIPROCESSING": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING"),
            "defaults_chosen": dict(self._defaults),
            "engine_kwargs": {k: plain(v) for k, v in self._kwargs.items()},
            **self._facts,
        }

    # ---- the stepping thread ----------------------------------------------------------------
    def _run(self, ready: concurrent.futures.Future[None]) -> None:
        """Build the engine, then serve commands and step until told to stop."""
        try:
            self._llm = self._load()
            _ALIVE.add(id(self))
            logger_manager = getattr(self._llm.llm_engine, "logger_manager", None)
            self._tapped = self._tap.install(logger_manager)
            tok = self._llm.get_tokenizer()
            self._has_template = bool(getattr(tok, "chat_template", None))
        except BaseException as e:  # noqa: BLE001 - reported to start()
            if self._llm is not None:
                with contextlib.suppress(BaseException):
                    self._shutdown()
            self._llm = None
            _ALIVE.discard(id(self))
            if not _ALIVE:  # other live engines still need vLLM's distributed state
                free_dist_state()
            ready.set_exception(e)
            return
        ready.set_result(None)
        error: BaseException = EngineError("vllm: engine closed")
        stop: concurrent.futures.Future[None] | None = None
        try:
            stop = self._serve()
        except BaseException as e:  # noqa: BLE001 - a failed step leaves the engine unusable
            error = EngineError(f"vllm: engine failed: {type(e).__name__}: {e}")
        self._dead = error
        self._fail_all(error)
        while True:  # commands that arrived too late
            try:
                cmd = self._cmds.get_nowait()
            except queue.Empty:
                break
            if cmd[0] == "add":
                cmd[4](error)
            elif cmd[0] == "call":
                cmd[2].set_exception(error)
            elif cmd[0] == "stop":
                cmd[1].set_result(None)
        try:
            self._shutdown()
        except BaseException as e:  # noqa: BLE001 - reported to close()
            if stop is not None:
                stop.set_exception(e)
                return
        if stop is not None:
            stop.set_result(None)

    def _load(self) -> Any:
        """Build vLLM's ``LLM`` on the stepping thread. bench/stepsim.py overrides this with a
        step simulator of the same shape (``llm_engine.step()`` & co.)."""
        from vllm import LLM

        self._kwargs, self._defaults = engine_kwargs(self.config)
        patched = patch_kernel_rebinding()
        llm = LLM(**self._kwargs)
        mc = llm.llm_engine.model_config
        cc = llm.llm_engine.vllm_config.cache_config
        self._facts = {
            "dtype": str(mc.dtype),
            "max_model_len": mc.max_model_len,
            "enable_prefix_caching": bool(cc.enable_prefix_caching),
        }
        if patched:
            self._facts["workarounds"] = [patched]
        return llm

    def _serve(self) -> concurrent.futures.Future[None]:
        """Serve commands and step while requests are unfinished; return the stop future."""
        engine = self._llm.llm_engine
        sent_at: float | None = None
        while True:
            busy = engine.has_unfinished_requests()
            if not busy:  # only leftovers of aborted requests can wait here
                self._flush()
            cmd = self._cmds.get() if not busy else None  # idle: block until there is work
            while True:
                if cmd is None:
                    try:
                        cmd = self._cmds.get_nowait()
                    except queue.Empty:
                        break
                if cmd[0] == "stop":
                    return cmd[1]
                self._handle(cmd)
                cmd = None
            if not engine.has_unfinished_requests():
                continue
            outs = engine.step()
            stamps: dict[Clock, float] = {}
            now = False  # deliver this step at once: a request ended, or an output is unstamped
            for out in outs:
                if (d := self._dispatch(out, stamps)) is not None:
                    self._pending.append(d)
                    now = now or d[1][3] or d[0].clock is None
            if not self._pending:
                continue
            t = next(iter(stamps.values()), None)
            if now or sent_at is None or t is None or t - sent_at >= DELIVERY_S:
                sent_at = t
                self._flush()

    def _flush(self) -> None:
        """Hand the pending outputs to the event loop: one wake-up for all of them."""
        if self._pending:
            batch, self._pending = self._pending, []
            batch[0][0].loop.call_soon_threadsafe(_deliver, batch)

    def _handle(self, cmd: tuple[Any, ...]) -> None:
        kind = cmd[0]
        if kind == "add":
            _, rid, request, sp, sink = cmd
            try:
                self._add(rid, request, sp)
                self._sinks[rid] = sink
            except Exception as e:  # noqa: BLE001 - this request fails, the engine goes on
                sink(e)
        elif kind == "abort":
            if self._sinks.pop(cmd[1], None) is not None:
                self._llm.llm_engine.abort_request([cmd[1]])
        elif kind == "call":
            _, fn, fut = cmd
            try:
                fut.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - reported to the caller
                fut.set_exception(e)

    def _add(self, rid: str, request: Request, sp: Any) -> None:
        prompt = {"prompt_token_ids": self._encode(request)}
        preprocess = getattr(self._llm, "_preprocess_cmpl_one", None)
        self._llm.llm_engine.add_request(rid, preprocess(prompt) if preprocess else prompt, sp)

    def _dispatch(self, out: Any, stamps: dict[Clock, float]) -> tuple[_Sink, Any] | None:
        sink = self._sinks.get(out.request_id)
        if sink is None:
            return None
        t = None
        if sink.clock is not None:  # one reading per clock per step: the step's outputs exist now
            t = stamps.get(sink.clock)
            if t is None:
                t = stamps[sink.clock] = sink.clock()
        comp = out.outputs[0]
        n_prompt = len(out.prompt_token_ids) if out.prompt_token_ids is not None else None
        if out.finished:
            del self._sinks[out.request_id]
        spec = getattr(comp, "spec_decode_metrics", None) if out.finished else None
        spec = None if spec is None else spec.to_dict()  # --per-request-spec-decode-metrics
        item = (tuple(comp.token_ids), n_prompt, comp.finish_reason, out.finished, comp.text, t)
        return sink, (*item, spec)

    def _fail_all(self, exc: BaseException) -> None:
        self._flush()  # the tokens made before the failure reach their records first
        for sink in self._sinks.values():
            sink(exc)
        self._sinks.clear()

    def _shutdown(self) -> None:
        llm, self._llm = self._llm, None
        _ALIVE.discard(id(self))
        try:
            # tears down vLLM's distributed state too, unless other engines still live
            with keep_dist_state() if _ALIVE else contextlib.nullcontext():
                llm.llm_engine.engine_core.shutdown()
        finally:
            del llm
            gc.collect()

    def _encode(self, request: Request) -> list[int]:
        """Prompt token ids: chat template for messages when the tokenizer has one."""
        if request.prompt_token_ids is not None:  # a synthetic workload's exact ids
            return list(request.prompt_token_ids)
        tok = self._llm.get_tokenizer()
        if request.messages is not None:
            msgs = [dict(m) for m in request.messages]
            if self._has_template:
                text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
                return list(tok.encode(text, add_special_tokens=False))
            return list(tok.encode("\n".join(m.get("content", "") for m in msgs)))
        return list(tok.encode(request.prompt or ""))

    async def _call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the stepping thread (between steps) and await its result."""
        if self._thread is None:
            raise EngineError("vllm: engine not started")
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._cmds.put(("call", fn, fut))
        if self._dead is not None:
            raise self._dead
        return await asyncio.wrap_future(fut)

    # ---- requests ---------------------------------------------------------------------------
    def _sampling_params(self, request: Request, params: GenParams, delta: bool) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        max_tokens = request.max_new_tokens or params.max_new_tokens
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            ignore_eos=params.ignore_eos,
            seed=params.seed if params.temperature > 0 else None,
            output_kind=RequestOutputKind.DELTA if delta else RequestOutputKind.FINAL_ONLY,
        )

    async def stream(
        self, request: Request, params: GenParams, clock: Clock | None = None
    ) -> AsyncIterator[Chunk]:
        if self._thread is None:
            raise EngineError("vllm: engine not started")
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[Any] = asyncio.Queue()
        rid = f"{request.id}#{next(self._ids)}"
        sp = self._sampling_params(request, params, delta=True)
        self._cmds.put(("add", rid, request, sp, _Sink(loop, q, clock)))
        if self._dead is not None:
            raise self._dead
        first, finished = True, False
        try:
            while not finished:
                item = await q.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                ids, n_prompt, reason, finished, text, t, spec = item
                info: dict[str, Any] = {}
                if first:
                    info["chat_template"] = self._has_template and request.messages is not None
                if spec is not None:  # this request's own acceptance (on its last output)
                    info["spec_decode"] = spec
                yield Chunk(
                    token_ids=ids,
                    text=text or "",
                    t=t,
                    prompt_tokens=n_prompt if first else None,
                    finish_reason=reason if finished else None,
                    info=info or None,
                )
                first = False
        finally:
            if not finished and self._thread is not None:
                self._cmds.put(("abort", rid))

    async def generate_batch(
        self, requests: Sequence[Request], params: GenParams, *, streamed: bool = False
    ) -> list[list[int]]:
        """The raw paths (bench/overhead.py). ``streamed=False``: one plain ``llm.generate`` over
        all prompts. ``streamed=True``: the same requests stepped with the DELTA outputs that
        :meth:`stream` asks for, nothing handed to the event loop: streaming's cost in vLLM."""

        def run() -> list[list[int]]:
            engine = self._llm.llm_engine
            if engine.has_unfinished_requests():
                raise EngineError("vllm: generate_batch needs an idle engine")
            if not streamed:
                prompts = [{"prompt_token_ids": self._encode(r)} for r in requests]
                sps = [self._sampling_params(r, params, delta=False) for r in requests]
                outs = self._llm.generate(prompts, sps, use_tqdm=False)
                return [list(o.outputs[0].token_ids) for o in outs]
            ids: dict[str, list[int]] = {}
            for r in requests:
                rid = f"raw-{next(self._ids)}"
                self._add(rid, r, self._sampling_params(r, params, delta=True))
                ids[rid] = []
            while engine.has_unfinished_requests():
                for out in engine.step():
                    ids[out.request_id].extend(out.outputs[0].token_ids)
            return list(ids.values())

        return await self._call(run)

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
        ok = await self._call(lambda: self._llm.reset_prefix_cache())
        return "reset" if ok else "reset refused by vLLM (blocks in use)"

    def max_batch(self) -> int | None:
        return None

    async def close(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._cmds.put(("stop", done))
        await asyncio.to_thread(thread.join)  # the thread shuts the engine down before it ends
        if done.done() and done.exception() is not None:
            raise EngineError(f"vllm: shutdown failed: {done.exception()}")

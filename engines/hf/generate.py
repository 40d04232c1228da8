"""The HF engine's ``generate`` calls on the process's one generation thread: the generation
config for a request's parameters, the call itself (stoppable from the event loop), and its
stamped steps handed back to the event loop (engines/hf/stream.py). A :class:`Generator` is
built by the engine once its models are loaded and holds what a call needs."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

from engines.base import Clock, GenParams
from engines.hf.models import Held
from engines.hf.stream import END, ERROR, Steps, streamer_class
from engines.hf.thread import generation_thread


class Generator:
    """Generates for one :class:`engines.hf.engine.HFEngine` (``owner``) with the models it
    loaded; ``held`` is the target shared with the process's other lanes, whose lock makes one
    generate at a time and whose counts go to the owner while it generates."""

    def __init__(
        self,
        model: Any,
        draft: Any,
        tokenizer: Any,
        device: str,
        spec: dict[str, Any],
        held: Held,
        owner: Any,
    ) -> None:
        self.model = model
        self.draft = draft
        self.tokenizer = tokenizer
        self.device = device
        self.spec = spec
        self.held = held
        self.owner = owner

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """The shared model to this engine alone: its lock held, its counts to the owner."""
        with self.held.lock:
            self.held.current = self.owner
            yield

    def eos_ids(self) -> set[int]:
        ids = self.model.generation_config.eos_token_id
        ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
        if self.tokenizer.eos_token_id is not None:
            ids.append(self.tokenizer.eos_token_id)
        return set(ids)

    def gen_config(self, params: GenParams, max_new: int) -> Any:
        gc_ = copy.deepcopy(self.model.generation_config)
        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = next(iter(sorted(self.eos_ids())), 0)
        kw: dict[str, Any] = {
            "max_new_tokens": max_new,
            "pad_token_id": pad,
            "min_new_tokens": None,
        }
        if params.temperature > 0:
            kw.update(do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=0)
        else:
            kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if params.ignore_eos:
            # An empty EOS list (None would be refilled from the model's defaults): EOS can
            # still be generated and generation continues, as vLLM's ignore_eos does.
            kw["eos_token_id"] = []
        kw.update(self.spec)
        gc_.update(**kw)
        return gc_

    def _run(
        self,
        inputs: dict[str, Any],
        params: GenParams,
        max_new: int,
        streamer: Any,
        stop: threading.Event,
    ) -> None:
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        class _Stop(StoppingCriteria):
            def __call__(self, input_ids: Any, scores: Any, **kw: Any) -> Any:
                return torch.full((input_ids.shape[0],), stop.is_set(), device=input_ids.device)

        try:
            if stop.is_set():  # the consumer left while this call waited for the thread
                return
            with self.hold(), torch.inference_mode():  # as cheap as generate can be made
                extra: dict[str, Any] = {}
                if self.draft is not None:
                    # the heuristic schedule and the confidence threshold live on (and are
                    # mutated in) the assistant's own generation_config: re-set them each call
                    for k in (
                        "num_assistant_tokens",
                        "num_assistant_tokens_schedule",
                        "assistant_confidence_threshold",
                    ):
                        setattr(self.draft.generation_config, k, self.spec[k])
                    extra["assistant_model"] = self.draft
                if params.temperature > 0:
                    torch.manual_seed(params.seed)
                self.model.generate(
                    **{k: v.to(self.device) for k, v in inputs.items()},
                    generation_config=self.gen_config(params, max_new),
                    streamer=streamer,
                    stopping_criteria=StoppingCriteriaList([_Stop()]),
                    **extra,
                )
        except BaseException as e:  # forwarded to the generator, re-raised there
            streamer.push(ERROR, e)
        finally:
            streamer.push(END)

    async def generate(
        self, rows: list[list[int]], params: GenParams, max_new: int, clock: Clock | None
    ) -> AsyncIterator[Steps]:
        """Left-padded ``generate`` on the generation thread; yields each hand-over of stamped steps
        (one step at a time when unstamped)."""
        import torch

        width = max(len(r) for r in rows)
        pad = self.tokenizer.pad_token_id
        pad = pad if pad is not None else 0
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], dtype=torch.long)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        streamer = streamer_class()(loop, queue, clock)
        stop = threading.Event()
        inputs = {"input_ids": ids, "attention_mask": mask}
        job = generation_thread().submit(self._run, inputs, params, max_new, streamer, stop)
        try:
            while True:
                kind, value = await queue.get()
                if kind == END:
                    return
                if kind == ERROR:
                    raise value
                yield value
        finally:
            stop.set()
            await asyncio.wrap_future(job)

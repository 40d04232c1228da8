"""In-process HF transformers engine: ``model.generate`` streamed, with assisted generation
(``draft_model``) and prompt lookup (``ngram``) as the speculative methods.

``generate`` runs on the process's one generation thread (engines/hf/thread.py: a new thread's
first forwards on CUDA ran 5-10x slower); its streamer stamps each step's ids with the clock the
runner passed to ``stream`` (when the ids are on the host) and hands them to the event loop at
most every ``DELIVERY_S``: one cross-thread wake-up per token cost 10-15% of a tiny model's
decode speed on 2 cores (bench/RESULTS.md, section 1). Each hand-over becomes one chunk per
request with a stamp per step (``Chunk.times``), not a chunk per token (engines/hf/stream.py).
``step_costs`` is a separate micro-measurement, called outside runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, ClassVar

from engines.base import (
    Capabilities,
    Chunk,
    Clock,
    Engine,
    EngineConfig,
    EngineError,
    GenParams,
    Request,
    SpecCounters,
    UnsupportedError,
    new_tokens,
)
from engines.common.local_model import missing_path, prompt_ids
from engines.hf.generate import Generator
from engines.hf.models import FROM_PRETRAINED, Held, check_args, dtype_name, load, release
from engines.hf.spec import SPEC_METHODS, AcceptanceCounter, len_hint, spec_settings
from engines.hf.stream import request_chunk
from engines.hf.thread import generation_thread

_DTYPES = ("float32", "float16", "bfloat16")


class HFEngine(Engine):
    """HF transformers ``generate``; static batches for the baseline, batch 1 when speculative."""

    name: ClassVar[str] = "hf"
    spec_methods: ClassVar[tuple[str, ...]] = SPEC_METHODS
    # several configurations fit one process (runs interleave); baseline batches are static
    capabilities: ClassVar[Capabilities] = Capabilities(
        coexist=True, static_batching=True, rebuild_per_block=True, device_memory="shared"
    )
    engine_arg_names = classmethod(lambda cls: FROM_PRETRAINED)  # what from_pretrained gets

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._spec = spec_settings(config.spec_config) if config.spec_config else {}
        self.counter = AcceptanceCounter(len_hint(config.spec_config))
        self._passes = 0
        self._held: Held | None = None  # the target, shared with the other lanes of this process
        self._held_draft: Held | None = None
        self.generator: Generator | None = None  # once the models are loaded
        self.tokenizer: Any = None
        self.model: Any = None
        self.draft: Any = None
        self.device: str | None = None
        self.dtype: Any = None

    # ---- set-up ----------------------------------------------------------------------------
    @classmethod
    def validate(cls, config: EngineConfig) -> None:
        method = config.spec_method
        if method is not None and method not in cls.spec_methods:
            raise EngineError(
                f"hf engine: speculative method {method!r} not supported; choose from: "
                + ", ".join(cls.spec_methods)
            )
        spec_settings(config.spec_config)
        if config.dtype not in ("auto", *_DTYPES):
            raise EngineError(f"hf engine: dtype {config.dtype!r}; choose auto or {_DTYPES}")
        check_args(config.engine_args, _DTYPES)
        paths = [("model", config.model), ("tokenizer", config.tokenizer)]
        if method == "draft_model":
            draft = cls._draft_name(config)
            if not draft:
                raise EngineError("hf engine: draft_model needs a draft model (spec 'model')")
            paths.append(("draft model", draft))
        for what, name in paths:
            if missing_path(name):
                raise EngineError(f"hf engine: {what} path not found: {name}")

    @staticmethod
    def _draft_name(config: EngineConfig) -> str | None:
        spec = config.spec_config or {}
        return config.draft_model or spec.get("model")

    async def start(self) -> None:
        self.validate(self.config)
        await asyncio.to_thread(self._load)

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()  # generate()'s advisory warnings are not the user's
        hf_logging.disable_progress_bar()  # no "Loading weights" bar per variant on stderr
        cfg = self.config
        dev = cfg.device
        self.device = ("cuda" if torch.cuda.is_available() else "cpu") if dev == "auto" else dev
        on_cuda = self.device.startswith("cuda")
        kwargs = {k: v for k, v in cfg.engine_args.items() if k != "dtype"}
        self.dtype = getattr(torch, dtype_name(cfg.engine_args.get("dtype") or cfg.dtype, on_cuda))

        tok_name = cfg.tokenizer or cfg.model
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(tok_name)
        except Exception as e:
            raise EngineError(f"hf engine: cannot load tokenizer {tok_name}: {e}") from e
        # one object per (model, dtype, device, settings) in this process: lanes share it
        self._held = load(AutoModelForCausalLM, cfg.model, self.dtype, self.device, kwargs)
        self.model = self._held.model
        if cfg.spec_method == "draft_model":
            draft = str(self._draft_name(cfg))
            self._held_draft = load(AutoModelForCausalLM, draft, self.dtype, self.device, {})
            self.draft = self._held_draft.model
            tv = self.model.config.get_text_config().vocab_size
            dv = self.draft.config.get_text_config().vocab_size
            if tv != dv:
                raise EngineError(f"hf engine: draft vocabulary ({dv}) != target vocabulary ({tv})")
        if cfg.spec_config is not None:
            self._held.count()  # its counts go to the engine generating (hf_models.Held)
        self.generator = Generator(
            self.model, self.draft, self.tokenizer, self.device, self._spec, self._held, self
        )

    def count_pass(self) -> None:
        """Forward hook: one target pass (each verifies a whole draft)."""
        self._passes += 1

    async def close(self) -> None:
        on_cuda = bool(self.device and self.device.startswith("cuda"))
        self.model = self.draft = self.tokenizer = self.generator = None
        freed = [release(self._held), release(self._held_draft)]
        self._held = self._held_draft = None
        if not any(freed):  # other lanes still hold the models
            return
        gc.collect()
        if on_cuda:
            import torch

            torch.cuda.empty_cache()

    def describe(self) -> Mapping[str, Any]:
        import torch
        import transformers

        spec = dict(self._spec)
        if self.config.spec_method == "ngram" and self.config.spec_config:
            spec["prompt_lookup_min_ignored"] = self.config.spec_config.get("prompt_lookup_min")
        return {
            "engine": self.name,
            "device": self.device,
            "dtype": str(self.dtype).removeprefix("torch.") if self.dtype else self.config.dtype,
            "model": self.config.model,
            "draft": self._draft_name(self.config)
            if self.config.spec_method == "draft_model"
            else None,
            "spec_method": self.config.spec_method,
            "generation_kwargs": spec,
            "ignore_eos": "eos_token_id=[] (EOS may be generated; generation goes on)",
            "max_batch": self.max_batch(),
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "resolved_config": self.resolved_config(spec),
        }

    def resolved_config(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """What this lane runs with, read from the loaded model (harness.analysis.lanes diffs
        the lanes): dtype, device, attention implementation, the generation config; the
        method's generate() arguments under ``generation.spec.``."""
        out: dict[str, Any] = {
            "dtype": str(self.dtype).removeprefix("torch.") if self.dtype else self.config.dtype,
            "device": self.device,
            **{f"engine_args.{k}": str(v) for k, v in sorted(self.config.engine_args.items())},
        }
        model = self.model
        if model is not None:
            out["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
            gen = getattr(model, "generation_config", None)
            if gen is not None:
                for k, v in sorted(gen.to_diff_dict().items()):
                    if k != "transformers_version":
                        out[f"generation.{k}"] = (
                            v if isinstance(v, (int, float, str, bool)) else str(v)
                        )
        for k, v in sorted(spec.items()):
            out[f"generation.spec.{k}"] = v if isinstance(v, (int, float, str, bool)) else str(v)
        return out

    def spec_counters(self) -> SpecCounters | None:
        if self.config.spec_config is None:
            return None
        return dataclasses.replace(self.counter.snapshot(), target_passes=self._passes)

    def max_batch(self) -> int | None:
        return None if self.config.spec_config is None else 1

    # ---- generation (engines.hf.generate.Generator) ----------------------------------------
    def _started(self) -> Generator:
        if self.generator is None:
            raise EngineError("hf engine: not started")
        return self.generator

    async def stream(
        self, request: Request, params: GenParams, clock: Clock | None = None
    ) -> AsyncIterator[Chunk]:
        gen = self._started()
        ids, chat = prompt_ids(self.tokenizer, request)
        max_new = new_tokens(request)
        out: list[int] = []
        async for steps in gen.generate([ids], params, max_new, clock):
            n0 = len(out)
            times: list[float] = []
            sizes: list[int] = []
            for new, t in steps:
                if new:
                    out += new
                    times.append(t)  # type: ignore[arg-type]
                    sizes.append(len(new))
            if len(out) > n0:
                first = n0 == 0
                yield request_chunk(
                    out[n0:], times, sizes, len(ids) if first else None, chat, first
                )
        # the text once, decoded whole: a byte-level token split across chunks decodes right
        if out:
            yield Chunk(text=self.tokenizer.decode(out, skip_special_tokens=True))

    async def stream_batch(
        self, requests: Sequence[Request], params: GenParams, clock: Clock | None = None
    ) -> AsyncIterator[tuple[int, Chunk]]:
        if self.config.spec_config is not None:
            raise UnsupportedError(
                f"hf engine: {self.config.spec_method} supports batch size 1 only"
            )
        gen = self._started()
        encoded = [prompt_ids(self.tokenizer, r) for r in requests]
        limits = [new_tokens(r) for r in requests]
        eos = set() if params.ignore_eos else gen.eos_ids()
        outs: list[list[int]] = [[] for _ in requests]
        done = [False] * len(requests)
        rows = [e[0] for e in encoded]
        async for steps in gen.generate(rows, params, max(limits), clock):
            times: list[list[float]] = [[] for _ in requests]
            n0 = [len(o) for o in outs]
            for step, t in steps:
                for i, tok in enumerate(step):
                    if done[i]:
                        continue  # padding after this row's EOS / limit
                    outs[i].append(tok)
                    times[i].append(t)  # type: ignore[arg-type]
                    done[i] = tok in eos or len(outs[i]) >= limits[i]
            for i, ts in enumerate(times):
                if ts:
                    first = n0[i] == 0
                    prompt = len(encoded[i][0]) if first else None
                    yield (
                        i,
                        request_chunk(
                            outs[i][n0[i] :], ts, [1] * len(ts), prompt, encoded[i][1], first
                        ),
                    )
            if all(done):
                break
        for i, out in enumerate(outs):
            if out:
                yield i, Chunk(text=self.tokenizer.decode(out, skip_special_tokens=True))

    # ---- theory vs measurement ---------------------------------------------------------------
    def step_costs(self, n: int = 20) -> dict[str, Any] | None:
        """Average single-token decode forward time of the target and the draft (KV cache of a
        short prompt), and their ratio ``c``, timed on the generation thread. A micro-measurement
        called outside runs, so this is the one place the engine reads the clock
        (time.perf_counter)."""
        import time

        import torch

        gen = self.generator
        if gen is None:
            return None
        ids = torch.tensor(
            [prompt_ids(self.tokenizer, Request(id="c", prompt="The quick brown fox"))[0]]
        )

        def per_step(model: Any) -> float:
            x = ids.to(self.device)
            sync = torch.cuda.synchronize if self.device.startswith("cuda") else (lambda: None)
            with torch.inference_mode():
                out = model(input_ids=x, use_cache=True)
                past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
                model(input_ids=tok, past_key_values=past, use_cache=True)  # warm-up
                past.crop(-1)
                sync()
                t0 = time.perf_counter()  # allowed: micro-measurement outside request timing
                for _ in range(n):
                    model(input_ids=tok, past_key_values=past, use_cache=True)
                    past.crop(-1)  # back to the prompt: every step sees the same cache length
                sync()
                return (time.perf_counter() - t0) / n

        def both() -> tuple[float, float | None]:
            with gen.hold():
                return per_step(self.model), (
                    per_step(self.draft) if self.draft is not None else None
                )

        # on the thread that generates: the forwards it times are the ones requests run
        target, draft = generation_thread().call(both)
        return {
            "target_step_s": target,
            "draft_step_s": draft,
            "c": None if draft is None else draft / target,
        }

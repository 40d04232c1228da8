"""Speculative decoding for the HF engine: vLLM-schema settings and acceptance counting.

transformers exposes no acceptance figures, so they are counted at the candidate generator that
``generate`` builds for assisted generation / prompt lookup (``_assisted_decoding`` calls
``get_candidates`` once per step, then ``update_candidate_strategy(input_ids, logits, n_matches)``
with ``n_matches`` already cropped to the length / EOS budget).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from engines.base import EngineError, SpecCounters

SPEC_METHODS = ("draft_model", "ngram")


class AcceptanceCounter:
    """Cumulative drafts / drafted tokens / accepted tokens, in vLLM's schema (thread-safe)."""

    def __init__(self, num_positions: int = 0) -> None:
        self._lock = threading.Lock()
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * num_positions
        self._pending = 0  # tokens drafted by the last get_candidates call

    def drafted(self, n: int) -> None:
        """One ``get_candidates`` call proposed ``n`` tokens (0 = no draft: plain decoding)."""
        with self._lock:
            self._pending = max(0, n)
            if n > 0:
                self.num_drafts += 1
                self.num_draft_tokens += n
                if len(self.accepted_per_pos) < n:
                    self.accepted_per_pos.extend([0] * (n - len(self.accepted_per_pos)))

    def verified(self, num_matches: int) -> None:
        """The target accepted the first ``num_matches`` drafted tokens of the last draft."""
        with self._lock:
            m = min(max(0, int(num_matches)), self._pending)
            self._pending = 0
            self.num_accepted_tokens += m
            for i in range(m):
                self.accepted_per_pos[i] += 1

    def snapshot(self) -> SpecCounters:
        with self._lock:
            return SpecCounters(
                self.num_drafts,
                self.num_draft_tokens,
                self.num_accepted_tokens,
                tuple(self.accepted_per_pos),
            )


def instrument(generator: Any, counter: AcceptanceCounter) -> Any:
    """Wrap ``generator``'s two strategy methods in place (its type is kept) so they count."""
    get_candidates: Callable[..., Any] = generator.get_candidates
    update: Callable[..., Any] = generator.update_candidate_strategy

    def counting_get_candidates(input_ids: Any, *args: Any, **kwargs: Any) -> Any:
        out = get_candidates(input_ids, *args, **kwargs)
        counter.drafted(int(out[0].shape[-1]) - int(input_ids.shape[-1]))
        return out

    def counting_update(input_ids: Any, scores: Any, num_matches: Any) -> Any:
        counter.verified(int(num_matches))
        return update(input_ids, scores, num_matches)

    generator.get_candidates = counting_get_candidates
    generator.update_candidate_strategy = counting_update
    return generator


def patch_candidate_generator(model: Any, counter: AcceptanceCounter) -> None:
    """Make every candidate generator ``model.generate`` builds count into ``counter``."""
    original = model._get_candidate_generator  # noqa: SLF001 - transformers has no public hook into assisted generation's drafts

    def counting_factory(*args: Any, **kwargs: Any) -> Any:
        return instrument(original(*args, **kwargs), counter)

    model._get_candidate_generator = counting_factory  # noqa: SLF001 - transformers has no public hook into assisted generation's drafts


def hf_default_assistant_settings() -> dict[str, Any]:
    """transformers' own assisted-generation defaults (20 tokens, constant, threshold 0.4)."""
    from transformers import GenerationConfig

    d = GenerationConfig._get_default_generation_params()  # noqa: SLF001 - transformers' own assisted defaults have no public accessor
    return {
        "num_assistant_tokens": d["num_assistant_tokens"],
        "num_assistant_tokens_schedule": d["num_assistant_tokens_schedule"],
        "assistant_confidence_threshold": d["assistant_confidence_threshold"],
    }


def spec_settings(spec: Mapping[str, Any] | None) -> dict[str, Any]:
    """The generation settings a vLLM ``speculative_config`` maps to; raises EngineError."""
    if spec is None:
        return {}
    method = spec.get("method")
    if method not in SPEC_METHODS:
        raise EngineError(
            f"hf engine: speculative method {method!r} not supported; choose from: "
            + ", ".join(SPEC_METHODS)
        )
    if method == "draft_model" and spec.get("hf_defaults"):
        return hf_default_assistant_settings()
    k = spec.get("num_speculative_tokens")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise EngineError(f"hf engine: {method} needs num_speculative_tokens >= 1, got {k!r}")
    if method == "draft_model":
        return {
            "num_assistant_tokens": k,
            "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": 0.0,
        }
    n = spec.get("prompt_lookup_max")
    if n is not None and (not isinstance(n, int) or n < 1):
        raise EngineError(f"hf engine: prompt_lookup_max must be >= 1, got {n!r}")
    # HF has no minimum n-gram size: prompt_lookup_min is ignored (it tries max..1).
    return {"prompt_lookup_num_tokens": k, "max_matching_ngram_size": n or 2}


def len_hint(spec: Mapping[str, Any] | None) -> int:
    """accepted_per_pos length to start with: K (it grows if more tokens are drafted)."""
    k = (spec or {}).get("num_speculative_tokens")
    return k if isinstance(k, int) and k > 0 and not (spec or {}).get("hf_defaults") else 0

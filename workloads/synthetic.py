"""Synthetic workloads with vLLM bench's names and meanings: ``random`` and ``prefix_repetition``.

Why synthetic: a serving study often fixes the lengths (1,024 in, 128 out) rather than the text.
The prompts are real token ids of the target's tokenizer (special ids excluded), so an in-process
engine gets exactly those ids (``Request.prompt_token_ids``) and an HTTP engine gets their decoded
text (``Request.prompt``), re-encoded to the same ids as vLLM's own generator does.

``random`` follows ``vllm.benchmarks.datasets.RandomDataset``: input lengths uniform in
``[floor(L*(1-r)), ceil(L*(1+r))]`` with ``L = input_len - num_special_tokens``, output lengths
likewise around ``output_len``, a shared random prefix of ``prefix_len`` ids, the rest a run of
consecutive vocabulary ids from a random offset; ``numpy.random.default_rng(seed)``, so the same
(tokenizer, n, lengths, seed) gives the same prompts. ``prefix_repetition`` follows
``PrefixRepetitionRandomDataset``: ``num_prefixes`` random prefixes of ``prefix_len`` ids, each
followed by ``n // num_prefixes`` random suffixes of ``suffix_len`` ids, shuffled (seeded).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np

from workloads.base import Request
from workloads.packed import PackedRequests
from workloads.readers import WorkloadError

SOURCE = "synthetic#"  # a synthetic request's source: this and its id

SYNTHETIC = ("random", "prefix_repetition")


class Tokenizer(Protocol):
    """The part of an HF tokenizer the generators use."""

    vocab_size: int
    all_special_ids: list[int]

    def decode(self, ids: list[int]) -> str: ...

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def num_special_tokens_to_add(self) -> int: ...


@dataclass(frozen=True)
class RandomSpec:
    """``--random-input-len/-output-len/-range-ratio/-prefix-len`` (vLLM's defaults)."""

    input_len: int = 1024
    output_len: int = 128
    range_ratio: float | tuple[float, float] = 0.0  # one for both, or (input, output)
    prefix_len: int = 0


@dataclass(frozen=True)
class PrefixRepetitionSpec:
    """``--prefix-repetition-prefix-len/-suffix-len/-num-prefixes/-output-len``."""

    prefix_len: int = 256
    suffix_len: int = 256
    num_prefixes: int = 10
    output_len: int = 128


def describe(spec: RandomSpec | PrefixRepetitionSpec) -> dict[str, Any]:
    """The spec as JSON (for results.json)."""
    d = asdict(spec)
    if isinstance(d.get("range_ratio"), tuple):
        d["range_ratio"] = {"input": d["range_ratio"][0], "output": d["range_ratio"][1]}
    return d


def parse_range_ratio(text: str) -> float | tuple[float, float]:
    """``0.3`` or vLLM's JSON ``{"input": 0.3, "output": 0.5}``; each in [0, 1)."""
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if isinstance(value, Mapping) and set(value) == {"input", "output"}:
        pair = (value["input"], value["output"])
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        pair = (value, value)
    else:
        raise WorkloadError(
            None,
            f'expected a number or {{"input": R, "output": R}}, got {text!r}',
            field="--random-range-ratio",
        )
    for r in pair:
        if not isinstance(r, (int, float)) or not 0.0 <= float(r) < 1.0:
            raise WorkloadError(None, f"{r!r} is not in [0, 1)", field="--random-range-ratio")
    a, b = float(pair[0]), float(pair[1])
    return a if a == b else (a, b)


def _ratios(spec: RandomSpec) -> tuple[float, float]:
    r = spec.range_ratio
    return (float(r[0]), float(r[1])) if isinstance(r, tuple) else (float(r), float(r))


def _allowed(tok: Tokenizer) -> np.ndarray:
    special = set(tok.all_special_ids)
    return np.array([i for i in range(tok.vocab_size) if i not in special], dtype=np.int64)


def _exact(
    tok: Tokenizer, ids: list[int], target: int, rng: np.random.Generator
) -> tuple[str, list[int]]:
    """Decode, re-encode and pad/truncate until the text re-encodes to ``target`` ids (vLLM's
    ``gen_prompt_decode_to_target_len``: some id runs merge or split when re-tokenized)."""
    for _ in range(10):
        text = tok.decode(ids)
        ids = list(tok.encode(text, add_special_tokens=False))
        if len(ids) == target:
            return text, ids
        if len(ids) < target:  # as vLLM: any id of the vocabulary
            ids += rng.integers(0, tok.vocab_size, size=target - len(ids)).tolist()
        else:
            ids = ids[:target]
    text = tok.decode(ids)
    return text, list(tok.encode(text, add_special_tokens=False))


def _prompt_ids(tok: Tokenizer, text: str) -> list[int]:
    """The ids an OpenAI server would make of the text (special tokens included)."""
    return list(tok.encode(text, add_special_tokens=True))


def _request(tok: Tokenizer, rid: str, text: str, out_len: int) -> Request:
    ids = tuple(_prompt_ids(tok, text))
    return Request(rid, text, None, out_len, None, f"{SOURCE}{rid}", prompt_token_ids=ids)


def random_requests(tok: Tokenizer, n: int, spec: RandomSpec, seed: int = 0) -> PackedRequests:
    """``n`` prompts of vLLM bench's ``random`` dataset, packed (a million in a soak run:
    :class:`PackedRequests`); raises WorkloadError on bad lengths."""
    rin, rout = _ratios(spec)
    if spec.input_len < 1 or spec.output_len < 1 or spec.prefix_len < 0:
        raise WorkloadError(None, "input/output lengths must be >= 1, prefix >= 0", field="random")
    special = int(tok.num_special_tokens_to_add())
    real = max(0, spec.input_len - special)
    in_low, in_high = math.floor(real * (1 - rin)), math.ceil(real * (1 + rin))
    out_low = max(1, math.floor(spec.output_len * (1 - rout)))
    out_high = max(1, math.ceil(spec.output_len * (1 + rout)))
    if spec.prefix_len + in_low < 1:
        raise WorkloadError(
            None,
            f"--random-input-len {spec.input_len} leaves no prompt token after the tokenizer's "
            f"{special} special token(s) and range ratio {rin:g}",
            field="random",
        )
    rng = np.random.default_rng(seed)
    in_lens = rng.integers(in_low, in_high + 1, size=n)
    out_lens = rng.integers(out_low, out_high + 1, size=n)
    offsets = rng.integers(0, tok.vocab_size, size=n)
    vocab = _allowed(tok)
    prefix: list[int] = []
    if spec.prefix_len > 0:
        raw = vocab[rng.integers(0, len(vocab), size=spec.prefix_len)].tolist()
        prefix = _exact(tok, raw, spec.prefix_len, rng)[1]
    out = PackedRequests(SOURCE)
    for i in range(n):
        inner = vocab[(offsets[i] + i + np.arange(in_lens[i])) % len(vocab)].tolist()
        text, _ = _exact(tok, prefix + inner, spec.prefix_len + int(in_lens[i]), rng)
        out.append(str(i), text, int(out_lens[i]), _prompt_ids(tok, text))
    return out


def prefix_repetition_requests(
    tok: Tokenizer, n: int, spec: PrefixRepetitionSpec, seed: int = 0
) -> tuple[Request, ...]:
    """``n // num_prefixes`` prompts per shared prefix (vLLM bench's ``prefix_repetition``)."""
    if min(spec.prefix_len, spec.suffix_len, spec.num_prefixes, spec.output_len) < 1:
        raise WorkloadError(
            None,
            "lengths and --prefix-repetition-num-prefixes must be >= 1",
            field="prefix_repetition",
        )
    per = n // spec.num_prefixes
    if per == 0:
        raise WorkloadError(
            None,
            f"--num-prompts {n} is below --prefix-repetition-num-prefixes {spec.num_prefixes}",
            field="prefix_repetition",
        )
    rng = np.random.default_rng(seed)
    vocab = _allowed(tok)

    def draw(length: int) -> list[int]:
        raw = vocab[rng.integers(0, len(vocab), size=length)].tolist()
        return _exact(tok, raw, length, rng)[1]

    texts = []
    for _ in range(spec.num_prefixes):
        prefix = draw(spec.prefix_len)
        texts.extend(tok.decode(prefix + draw(spec.suffix_len)) for _ in range(per))
    order = rng.permutation(len(texts))
    return tuple(_request(tok, str(i), texts[j], spec.output_len) for i, j in enumerate(order))


def load_tokenizer(name: str) -> Tokenizer:
    """The target's tokenizer (HF id or local path); a one-line error when it cannot load."""
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(name)
    except Exception as exc:  # noqa: BLE001 - reported as one line
        msg = " ".join(str(exc).split())[:200]
        raise WorkloadError(
            None, f"cannot load tokenizer {name!r}: {msg}", field="tokenizer"
        ) from None

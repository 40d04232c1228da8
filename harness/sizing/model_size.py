"""A model's size read from its config.json alone (no weights loaded, nothing downloaded but the
config): parameters, bytes per dtype, the KV cache a token costs. The memory plan
(:mod:`harness.sizing.memory`) adds these up per lane before any engine starts."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.sizing.hub import (
    HUB_TIMEOUT_S,
    UNREACHABLE_HOW,
    HubUnreachable,
    offline,
    with_deadline,
)

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
# --dtype auto on CUDA when the config stores float32 (or nothing): half precision, as vLLM's
# auto does; one value for every engine of the run (HF's own auto would pick float16)
CUDA_FALLBACK_DTYPE = "bfloat16"
CPU_DTYPE = "float32"  # --dtype auto on CPU: what both engines ran before a dtype was resolved


class ConfigUnavailable(LookupError):
    """No config.json to read (a hub id offline and not in the HF cache, a hub that does not
    answer). ``fatal``: the model cannot load either (the hub did not answer): the run stops."""

    def __init__(self, message: str, fatal: bool = False) -> None:
        super().__init__(message)
        self.fatal = fatal


@dataclass(frozen=True)
class ModelSize:
    """What one model costs in memory, per parameter and per token of KV cache."""

    name: str
    params: int
    kv_bytes_per_token_per_byte: int  # layers x 2 (K, V) x kv heads x head_dim: x dtype bytes
    max_positions: int | None
    config_dtype: str | None

    def weight_bytes(self, dtype: str) -> int:
        return self.params * DTYPE_BYTES[dtype]

    def kv_bytes_per_token(self, dtype: str) -> int:
        return self.kv_bytes_per_token_per_byte * DTYPE_BYTES[dtype]

    def to_json(self) -> dict[str, Any]:
        return {
            "params": self.params,
            "kv_elements_per_token": self.kv_bytes_per_token_per_byte,
            "max_positions": self.max_positions,
            "config_dtype": self.config_dtype,
        }


def read_config(name: str) -> dict[str, Any]:
    """config.json of a local directory, else of a hub id from the HF cache, else fetched alone
    (a few kB, no weights; not under ``HF_HUB_OFFLINE``), waited for at most
    ``hub.HUB_TIMEOUT_S``; raises :class:`ConfigUnavailable`."""
    path = Path(name).expanduser()
    if path.is_dir():
        file = path / "config.json"
        if not file.exists():
            raise ConfigUnavailable(f"{name}: no config.json")
        return json.loads(file.read_text(encoding="utf-8"))
    unreadable = f"{name}: config.json not readable"
    try:
        from huggingface_hub import hf_hub_download

        try:
            got = hf_hub_download(name, "config.json", local_files_only=True)
        except Exception:  # noqa: BLE001 - not cached: fetch the config alone
            if offline():
                raise ConfigUnavailable(
                    f"{unreadable} (HF_HUB_OFFLINE=1 and not in the HF cache)"
                ) from None
            got = with_deadline(
                lambda: hf_hub_download(name, "config.json", etag_timeout=HUB_TIMEOUT_S)
            )
    except ConfigUnavailable:
        raise
    except HubUnreachable as exc:
        raise ConfigUnavailable(f"{unreadable} ({exc}; {UNREACHABLE_HOW})", fatal=True) from None
    except Exception as exc:  # noqa: BLE001 - gated without HF_TOKEN, no such repo
        text = str(exc)
        first = type(exc).__name__ if not text else text.splitlines()[0][:100]
        if "local cache" in text or "offline" in text.lower():
            first = "offline and not in the HF cache"
        elif "401" in text or "403" in text or "gated" in text.lower():
            first = "gated: set HF_TOKEN to a token with access"
        raise ConfigUnavailable(f"{unreadable} ({first})") from None
    return json.loads(Path(got).read_text(encoding="utf-8"))


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's part of a (multimodal) config."""
    inner = config.get("text_config")
    return inner if isinstance(inner, Mapping) else config


def model_size(name: str, config: Mapping[str, Any]) -> ModelSize:
    """Parameters and KV cache per token of a decoder-only transformer from its config: a
    Llama-style layer (grouped-query attention, gated MLP, mixture of experts where the config
    says so), embeddings tied or not; an EAGLE-3 head (``draft_vocab_size``) as its one layer
    over the concatenated embedding and hidden state, ``fc`` over three target layers and its own
    lm_head (the embedding is the target's)."""
    c = text_config(config)
    h = int(c["hidden_size"])
    layers = int(c.get("num_hidden_layers", 1))
    heads = int(c.get("num_attention_heads", 1))
    kv_heads = int(c.get("num_key_value_heads") or heads)
    head_dim = int(c.get("head_dim") or h // heads)
    inter = int(c.get("intermediate_size") or 4 * h)
    vocab = int(c.get("vocab_size", 0))
    eagle3 = "draft_vocab_size" in c or any("Eagle3" in a for a in c.get("architectures") or ())
    attn_in = 2 * h if eagle3 else h
    attn = attn_in * heads * head_dim + 2 * attn_in * kv_heads * head_dim + heads * head_dim * h
    if c.get("attention_bias"):
        attn += heads * head_dim + 2 * kv_heads * head_dim
    experts = int(c.get("num_local_experts") or c.get("num_experts") or 0)
    if experts:
        expert_inter = int(c.get("moe_intermediate_size") or inter)
        mlp = experts * 3 * h * expert_inter + experts * h
        shared = int(c.get("shared_expert_intermediate_size") or 0)
        mlp += 3 * h * shared
    else:
        mlp = 3 * h * inter
    per_layer = attn + mlp + 2 * h
    if eagle3:
        target_h = int(c.get("target_hidden_size") or h)
        draft_vocab = int(c.get("draft_vocab_size") or vocab)
        params = per_layer * layers + 3 * target_h * h + draft_vocab * h + h
    else:
        embed = vocab * h
        head = 0 if c.get("tie_word_embeddings", False) else vocab * h
        params = embed + per_layer * layers + h + head
    limit = c.get("max_position_embeddings")
    dtype = config.get("torch_dtype") or config.get("dtype") or c.get("torch_dtype")
    return ModelSize(
        name=name,
        params=params,
        kv_bytes_per_token_per_byte=2 * layers * kv_heads * head_dim,
        max_positions=int(limit) if limit else None,
        config_dtype=str(dtype) if dtype else None,
    )


def resolve_dtype(flag: str, config_dtype: str | None, on_cuda: bool) -> tuple[str, str]:
    """(dtype, why): one dtype for every engine of the run. An explicit --dtype is kept; auto is
    float32 on CPU (as before), the config's half precision on CUDA, else bfloat16."""
    if flag != "auto":
        return flag, f"--dtype {flag}"
    if not on_cuda:
        return CPU_DTYPE, "--dtype auto on CPU: float32"
    if config_dtype in ("float16", "bfloat16"):
        return config_dtype, f"--dtype auto: the model's config.json torch_dtype ({config_dtype})"
    return CUDA_FALLBACK_DTYPE, (
        f"--dtype auto on CUDA: config.json says {config_dtype or 'no dtype'}; "
        f"{CUDA_FALLBACK_DTYPE} for every engine"
    )


def gib(n: float) -> str:
    """Bytes as GiB, or MiB / KiB below one GiB (the tiny models are a few MB)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size or unit == "KiB":
            return f"{n / size:.1f} {unit}"
    return f"{n} B"

"""An EAGLE-3 head on disk in vLLM's layout (``LlamaForCausalLMEagle3``): its config.json
(dimensions, draft vocabulary size, the target layers it reads) and its weights by vLLM's
checkpoint names with ``d2t`` (target id = i + d2t[i]). The one place both names and the draft
vocabulary are derived: training (``harness.models.eagle3``), the build
(``harness.models.train``, ``harness.models.tiny_eagle3``) and the offline evaluation
(``harness.models.evaluate``) read and write through it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from harness.models import smollm as sm


def aux_layers(num_layers: int) -> tuple[int, int, int]:
    """The target layers whose output the head reads, written into its config.

    vLLM 0.32 reads them from the head's config, else defaults to (2, N//2, N-3) and then takes
    ``sorted(set(...))`` (``SupportsEagle3``): for N < 7 that default repeats a layer and hands
    the head fewer features than its ``fc`` expects. So: the default where its three layers are
    distinct and increasing (SmolLM2's 30 -> 2, 15, 27), else (1, N//2, N-1) (the tiny 4 -> 1, 2,
    3). Layer i means the residual stream after i decoder layers (HF ``hidden_states[i]``)."""
    n = num_layers
    for ids in ((2, n // 2, n - 3), (1, n // 2, n - 1)):
        if 0 < ids[0] < ids[1] < ids[2] < n:
            return ids
    raise ValueError(f"an EAGLE-3 head needs a target of at least 4 layers, not {n}")


def layer_ids(cfg: dict[str, Any]) -> tuple[int, ...]:
    """The aux layers a head's config names (``eagle_config``, as vLLM reads them)."""
    return tuple(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"])


def head_config(
    target_cfg: dict[str, Any], vocab_size: int, layers: tuple[int, ...] | None = None
) -> dict[str, Any]:
    """The head's config.json from the target's: its dimensions, the draft vocabulary's size and
    the aux layers (default ``aux_layers`` of the target's depth), always written out."""
    layers = layers or aux_layers(target_cfg["num_hidden_layers"])
    if list(layers) != sorted(set(layers)):  # vLLM sorts them: the features' order
        raise ValueError(f"aux layers must be distinct and increasing, not {layers}")
    keep = (
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "rms_norm_eps",
        "rope_parameters",
        "max_position_embeddings",
        "hidden_act",
        "vocab_size",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "attention_bias",
        "mlp_bias",
    )
    cfg = {k: target_cfg[k] for k in keep if k in target_cfg}
    cfg.update(
        architectures=["LlamaForCausalLMEagle3"],
        model_type="llama",
        num_hidden_layers=1,
        draft_vocab_size=vocab_size,
        target_hidden_size=target_cfg["hidden_size"],
        tie_word_embeddings=False,
        fc_norm=True,
        eagle_config={"eagle_aux_hidden_state_layer_ids": list(layers)},
        torch_dtype="float32",
    )
    return cfg


def state_dict(head: nn.Module, vocab: torch.Tensor) -> dict[str, torch.Tensor]:
    """The head's own weights by vLLM's checkpoint names (fp16) and ``d2t`` (target id =
    i + d2t[i]); ``lm_head`` only when trained (the target's frozen rows are added by whoever
    writes the directory vLLM loads)."""
    sd = {}
    for name, p in head.named_parameters():
        if name == "lm_head":  # trained (``train_lm_head``): committed; frozen rows are not
            key = "lm_head.weight"
        elif name.startswith("fc_norm.") or name.startswith("fc.") or name.startswith("norm."):
            key = name
        elif name.split(".")[0] in ("q_proj", "k_proj", "v_proj", "o_proj"):
            key = "midlayer.self_attn." + name
        elif name.split(".")[0] in ("gate_proj", "up_proj", "down_proj"):
            key = "midlayer.mlp." + name
        else:  # the three layer norms
            key = "midlayer." + name
        sd[key] = p.detach().to(torch.float16).contiguous()
    sd["d2t"] = (vocab - torch.arange(len(vocab))).to(torch.long)
    return dict(sorted(sd.items()))


def own_name(key: str) -> str:
    """vLLM's checkpoint name -> ``Eagle3Head``'s parameter name (the inverse of
    ``state_dict``)."""
    if key == "lm_head.weight":
        return "lm_head"
    return key.removeprefix("midlayer.").removeprefix("self_attn.").removeprefix("mlp.")


def vocab_of(d2t: torch.Tensor) -> torch.Tensor:
    """The draft vocabulary (sorted target ids) a checkpoint's ``d2t`` maps to: i + d2t[i]."""
    d2t = d2t.to(torch.long)
    return torch.arange(len(d2t)) + d2t


def saved_vocab(path: Path) -> torch.Tensor:
    """A saved head's draft vocabulary: more passes keep it."""
    from safetensors.torch import load_file

    return vocab_of(load_file(str(path))["d2t"])


def load_into(head: nn.Module, path: Path, vocab: torch.Tensor) -> None:
    """A saved head's weights (``save``'s ``eagle3.safetensors``) into ``head``: its draft
    vocabulary must be ``vocab``, or lie inside it when ``head`` trains its ``lm_head`` (a
    widened vocabulary: the saved rows go to their tokens, the added tokens keep the target's
    rows ``head`` starts with); a frozen-``lm_head`` file into a head that trains it starts
    that from the target's rows."""
    from safetensors.torch import load_file

    sd = load_file(str(path))
    saved = vocab_of(sd["d2t"])
    own = {own_name(k): v.float() for k, v in sd.items() if k != "d2t"}
    if "lm_head" in own and not isinstance(head.lm_head, nn.Parameter):
        raise ValueError(f"{path} has a trained lm_head: train it (train_lm_head) to go on")
    if not torch.equal(saved, vocab):
        at = torch.searchsorted(vocab, saved).clamp(max=len(vocab) - 1)
        if not isinstance(head.lm_head, nn.Parameter) or not torch.equal(vocab[at], saved):
            raise ValueError(
                f"{path}: its draft vocabulary differs from this training set's (a wider one "
                "must hold all of it, with the lm_head trained)"
            )
        if "lm_head" in own:
            rows = head.lm_head.detach().clone()
            rows[at] = own["lm_head"]
            own["lm_head"] = rows
    missing = head.load_state_dict(own, strict=False).missing_keys
    if [k for k in missing if k != "lm_head"] or set(own) - set(head.state_dict()):
        raise ValueError(f"{path}: not this head's layout (missing {missing})")


def save(
    head: nn.Module, vocab: torch.Tensor, out: Path, cfg: dict[str, Any] | None = None
) -> None:
    """SmolLM2's committed form: ``trained/eagle3.safetensors`` + ``eagle3_config.json``."""
    from safetensors.torch import save_file

    save_file(state_dict(head, vocab), str(out / "eagle3.safetensors"))
    sm.write_json(out / "eagle3_config.json", cfg or head_config_from(head, len(vocab)))


def head_config_from(head: nn.Module, vocab_size: int) -> dict[str, Any]:
    cfg = json.loads((sm.FAMILY_DIR / "target" / "config.json").read_text())
    return head_config(cfg, vocab_size)

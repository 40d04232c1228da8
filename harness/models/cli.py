"""``python -m harness models``: build a shipped family (``build``, with ``--train`` the
SmolLM2 speculators' training, ``harness.models.train``) or print a model's directory
(``path``). The families themselves are ``harness.models.registry``'s."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from harness.models import registry, smollm


def main(argv: list[str]) -> int:
    """``models build [--family F] [--force] [--train]`` or ``models path KIND [--family F]``."""
    p = argparse.ArgumentParser(prog="python -m harness models", description=registry.__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="assemble/train a shipped family (skipped when present)")
    b.add_argument("--family", choices=(*registry.FAMILIES, "all"), default=registry.DEFAULT_FAMILY)
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
    b.add_argument(
        "--labels",
        choices=("greedy", "soft"),
        default="greedy",
        help="with --train: what the head learns at each position: the target's greedy token "
        "(the default) or its distribution over the draft vocabulary (soft, as EAGLE's training)",
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
    pp.add_argument("--family", choices=registry.FAMILIES, default=registry.DEFAULT_FAMILY)
    args = p.parse_args(argv)
    if args.cmd == "path":
        try:
            print(registry.model_path(args.family, args.which))
        except (registry.ShippedModelMissing, ValueError) as e:
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
    families = registry.FAMILIES if args.family == "all" else (args.family,)
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
                    soft_labels=args.labels == "soft",
                    sets=tuple(args.sets.split(",")) if args.sets else None,
                    command=shlex.join(["python", "-m", "harness", "models", *argv]),
                )
            smollm.assemble(force=args.force)  # a new trained/ reassembles the speculators
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

    out: Path = args.out or registry.TINY_DIR
    pair = all(registry.tiny_complete(out / k) for k in registry.TINY_PAIR)
    if not args.force and not args.eagle3 and pair and registry.tiny_complete(out / "eagle3"):
        print(f"tiny family already present at {out} (use --force to rebuild)")
        return
    if pair and (args.eagle3 or not args.force):  # the head alone, on the target present
        steps = {} if args.eagle3_steps is None else {"steps": args.eagle3_steps}
        head = tiny_eagle3.build(out, seed=args.seed, **steps)
        print(f"built {out / 'eagle3'}: top-1 agreement {head['heldout_top1_agreement_per_step']}")
        return
    info = registry.build_atomic(
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

"""Trains SmolLM2's speculators by self-distillation: the target's own greedy outputs are the
labels (as in the EAGLE papers and in distilled drafts), so greedy acceptance is what improves.

1. ``harness.models.corpus``: the training prompts of ``distill.SETS``, built here (open tasks
   from this project's templates and topics, edits and summaries of CPython standard-library
   sources and docstrings, arithmetic, long sections of the Python reference), never the
   prompts the harness evaluates on.
2. ``harness.models.distill``: the target's greedy answers by in-process vLLM (batches of 256),
   then one teacher-forced pass per sequence for the concat of hidden states [2], [15], [27] at
   every position (what vLLM hands an EAGLE-3 head) and the target's greedy next token there.
3. ``harness.models.eagle3.train``: the head in vLLM's layout with a 3-step training-time-test
   unroll, so draft positions 2 and 3 see their own outputs as at inference; checkpointed.
4. ``train_draft`` (optional, ``draft_s``): a 2-layer Llama made of the target's layers 0 and 1,
   final norm and tied embedding (a layer-skip draft; the embedding stays the target's, not
   committed); only the layers and the norm train.
5. ``harness.models.evaluate``: each speculator's first-position top-1 agreement with the target
   on the held-out default prompts, fed as vLLM feeds it.

Everything is seeded and every stage resumes from what it wrote under ``.cache/train/``.
Writes ``trained/`` (fp16 weights, configs, BUILD.json).
"""

from __future__ import annotations

import json
import os
import platform
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.models import smollm as sm
from harness.models.data import draft_vocab, load_target
from harness.models.optim import lr_at, optimizer_step, split, torch_threads


def _torch() -> Any:
    """torch as ``train_all`` set it: ``--threads`` (``torch_threads`` caps every call at one,
    which ran the draft's steps on one thread whatever ``--threads`` said)."""
    import torch

    return torch


DRAFT_LAYERS = sm.DRAFT_LAYERS
DRAFT_LR = 5e-4
METRIC = (
    "top1_agreement_per_step: teacher-forced share of the target's greedy tokens predicted "
    "top-1 per step of the 3-step unroll, on the validation sequences of the training sets "
    "(val_sequences); held_out_first_position_agreement: draft position 1 on the default "
    "workload's 4 prompts x 64 tokens, fed as vLLM feeds the assembled speculators "
    "(harness/models/evaluate.py); held_out_alpha_at_k1: vLLM's alpha of the head at K 1 on the "
    "same tokens (a draft after every target pass, harness/models/evaluate.py)"
)


def stamp(entries: tuple[dict[str, Any], ...], made: str, before: str) -> None:
    """Each speculator's ``made_on``: this build's line where it trained, and where it was
    kept, its own (or, from a BUILD.json older than these lines, that build's ``before``)."""
    for entry in entries:
        if "kept" in entry:
            entry.setdefault("made_on", before)
        else:
            entry["made_on"] = made


def made_on(start: float, end: float, command: str) -> str:
    """BUILD.json's line on a stage: when (UTC), on what machine, by which command."""
    first, last = (time.strftime("%Y-%m-%d %H:%M", time.gmtime(t)) for t in (start, end))
    if last[:10] == first[:10]:
        last = last[11:]  # the same day: its time alone
    return f"{first}-{last} UTC on {os.cpu_count()} cores ({platform.machine()}): `{command}`"


# ---- the draft model ----------------------------------------------------------------------------
def make_draft(target_model: Any) -> Any:
    """A Llama of the target's layers DRAFT_LAYERS, final norm and tied embedding."""
    torch = _torch()
    from transformers import LlamaForCausalLM

    cfg = target_model.config.to_dict()
    cfg["num_hidden_layers"] = len(DRAFT_LAYERS)
    from transformers import LlamaConfig

    draft = LlamaForCausalLM(LlamaConfig(**cfg))
    sd = target_model.state_dict()
    new = {}
    for k, v in sd.items():
        if k.startswith("model.layers."):
            i = int(k.split(".")[2])
            if i in DRAFT_LAYERS:
                j = DRAFT_LAYERS.index(i)
                new[k.replace(f"model.layers.{i}.", f"model.layers.{j}.")] = v.clone()
        else:
            new[k] = v.clone()
    draft.load_state_dict(new, strict=False)
    draft.tie_weights()
    draft.model.embed_tokens.weight.requires_grad_(False)
    return draft.to(torch.float32)


def _draft_loss(draft: Any, s: dict[str, Any], vocab: Any) -> tuple[Any, int, int]:
    """CE against the target's greedy next token at every position (``harness.models.distill``), over the
    reduced vocabulary (labels outside it skipped: the full 49,152-way softmax is 6x dearer)."""
    torch = _torch()
    ids = s["ids"]
    h = draft.model(input_ids=ids[None, :-1]).last_hidden_state[0]
    labels = s["labels"]
    w = draft.model.embed_tokens.weight
    logits = h @ w[vocab].T
    pos = torch.searchsorted(vocab, labels)
    pos = pos.clamp(max=len(vocab) - 1)
    inside = vocab[pos] == labels
    loss = torch.nn.functional.cross_entropy(logits[inside], pos[inside])
    return loss, 0, int(inside.sum())


def eval_draft(draft: Any, val: list[dict[str, Any]]) -> float:
    """Teacher-forced top-1 agreement with the target's greedy token (~ alpha at position 1)."""
    torch = _torch()
    ok = n = 0
    with torch.no_grad():
        for s in val:
            ids, p = s["ids"], s["prompt_len"]
            logits = draft(input_ids=ids[None, :-1]).logits[0, p - 1 :]
            ok += int((logits.argmax(-1) == ids[p:]).sum())
            n += len(ids) - p
    return ok / max(1, n)


def train_draft(
    target_model: Any, data: list[dict[str, Any]], vocab: Any, seed: int, budget_s: float
) -> tuple[Any, dict[str, Any]]:
    torch = _torch()
    torch.manual_seed(seed)
    train, val = split(data, seed)
    draft = make_draft(target_model)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=DRAFT_LR, weight_decay=0.0)
    before = eval_draft(draft, val)
    steps, t0, step = 10**9, time.process_time(), 0
    order = list(range(len(train)))
    rng = random.Random(seed)
    draft.train()
    est_steps = None
    while step < steps:
        rng.shuffle(order)
        for i in order:
            loss, _, _ = _draft_loss(draft, train[i], vocab)
            if est_steps is None and step == 20:  # size the cosine schedule to the time budget
                est_steps = int(budget_s / ((time.process_time() - t0) / 20))
                steps = est_steps
            for g in opt.param_groups:
                g["lr"] = lr_at(step, est_steps or 10**4, DRAFT_LR)
            optimizer_step(opt, loss, params)
            step += 1
            if step >= steps:
                break
    draft.eval()
    after = eval_draft(draft, val)
    info = {
        "layers_from_target": list(DRAFT_LAYERS),
        "steps": step,
        "train_cpu_seconds": round(time.process_time() - t0),
        "torch_threads": torch.get_num_threads(),
        "val_sequences": len(val),
        "top1_agreement_before": round(before, 4),
        "top1_agreement_after": round(after, 4),
    }
    return draft, info


def save_draft(draft: Any, out: Path) -> None:
    torch = _torch()
    from safetensors.torch import save_file

    own = {
        k: v.detach().to(torch.float16).contiguous()
        for k, v in draft.state_dict().items()
        if k.startswith("model.layers.") or k == "model.norm.weight"
    }
    save_file(dict(sorted(own.items())), str(out / "draft.safetensors"))
    cfg = draft.config.to_dict()
    cfg.pop("_name_or_path", None)
    cfg.pop("dtype", None)
    cfg.update(architectures=["LlamaForCausalLM"], torch_dtype="float32")
    sm.write_json(out / "draft_config.json", cfg)


def _train_head(model: Any, data: list[dict[str, Any]], vocab: Any, seed: int, steps: int,
                ckpt: Path, progress: bool, init: Path | None, train_lm_head: bool, peak: float,
                out: Path, copy_group: int | None = None, prompt_loss: bool = True,
                soft_labels: bool = False) -> dict[str, Any]:  # fmt: skip
    """The EAGLE-3 head's ``steps`` (``harness.models.eagle3.train``), saved into ``out``."""
    from harness.models import eagle3
    from harness.models import eagle3_checkpoint as files

    head, info = eagle3.train(model, data, vocab, seed, float("inf"), steps=steps,
                              checkpoint=ckpt, progress=progress, init=init,
                              train_lm_head=train_lm_head, peak_lr=peak,
                              copy_group=copy_group, prompt_loss=prompt_loss,
                              soft_labels=soft_labels)  # fmt: skip
    files.save(head, vocab, out, files.head_config(model.config.to_dict(), len(vocab)))
    return info


def _keep_committed(out: Path, names: tuple[str, ...]) -> None:
    """A speculator not retrained: its committed files into ``out`` (nothing where it is
    ``trained/`` itself)."""
    import shutil

    if out != sm.TRAINED_DIR:
        for f in names:
            shutil.copy2(sm.TRAINED_DIR / f, out / f)


def earlier_stages(old: dict[str, Any]) -> list[dict[str, Any]]:
    """The committed head's training stages, oldest first, for a ``--more`` stage's BUILD.json:
    the last one with the ``data`` it trained on (BUILD.json's top-level ``data`` describes the
    newest stage's sets alone, so without this each stage's provenance went with the next)."""
    last = dict(old.get("eagle3", {}))
    before = last.pop("earlier_stages", [])
    if "data" in old:
        last["data"] = old["data"]
    return [*before, last]


def train_all(
    seed: int = 0,
    progress: bool = True,
    epochs: float = 1.0,
    threads: int = 2,
    out: Path | None = None,
    draft_s: float | None = None,
    sets: tuple[str, ...] | None = None,
    more: bool = False,
    train_lm_head: bool = False,
    peak_lr: float | None = None,
    command: str = "python -m harness models build --train",
    copy_group: int | None = None,
    draft_vocab_size: int | None = None,
    prompt_loss: bool = True,
    soft_labels: bool = False,
) -> dict[str, Any]:
    """Answers, features, the EAGLE-3 head (``epochs`` passes over the training sequences) and,
    given ``draft_s`` CPU seconds, the draft (else the committed draft stays), into
    ``trained/``; then their offline first-position agreement with the target on the held-out
    default prompts (``harness.models.evaluate``); returns BUILD.json.

    ``sets``: the training sets (default ``distill.SETS``), each generated, featurized and
    resumed on its own. ``more``: the head starts from the committed one (``trained/eagle3.safetensors``, whose
    BUILD.json stages are kept in ``eagle3.earlier_stages``) for ``epochs`` more passes, a warm
    restart of the learning rate; ``train_lm_head``: its lm_head rows train too (committed).
    ``copy_group``: the head learns to copy (``harness.models.eagle3_copy``).
    ``draft_vocab_size``: with ``more``, the committed head's draft vocabulary widened to this
    many tokens (the most frequent others of these sets), its rows trained from the target's
    (``train_lm_head``). ``prompt_loss``: False, the head's first step learns only on the
    answers' positions (``harness.models.eagle3._unroll``). ``soft_labels``: the head learns
    the target's distribution, not only its greedy token (``harness.models.eagle3_soft``). ``command``: what
    ran it, for the ``made_on`` lines (the build's and each retrained speculator's; a kept one
    keeps its own)."""
    import math
    import resource

    from harness.models import distill, eagle3
    from harness.models import eagle3_checkpoint as files
    from harness.models import evaluate as evaluation

    torch = torch_threads()
    torch.set_num_threads(threads)
    sets = sets or distill.SETS
    t_all, started = time.perf_counter(), time.time()
    sm.assemble()  # the target
    target = sm.FAMILY_DIR / "target"
    data: list[dict[str, Any]] = []
    per_set = {}
    for name in sets:
        kind, set_seed, n = distill.parse_set(name)
        t0 = time.perf_counter()
        distill.generate_answers(target, set_seed, n, progress, kind)
        t_answers = time.perf_counter() - t0
        t0 = time.perf_counter()
        distill.make_features(target, set_seed, n, threads, progress, kind)
        part = distill.load_features(set_seed, n, kind)
        per_set[name] = {
            "sequences": len(part),
            "prompt_tokens": sum(d["prompt_len"] for d in part),
            "output_tokens": sum(len(d["output_ids"]) for d in part),
            **distill.set_settings(name),
            "answers_ended_by_eos": sum(
                1 for d in part if len(d["output_ids"]) < distill.answer_tokens(kind)
            ),
            "answers_seconds": round(t_answers),
            "features_seconds": round(time.perf_counter() - t0),
        }
        data += part
    model = load_target(target)
    torch.set_num_threads(threads)
    committed = sm.TRAINED_DIR / "eagle3.safetensors"
    init = committed if more else None
    keep_head = epochs == 0  # the committed head stays (only the draft retrains)
    vocab = files.saved_vocab(committed) if init or keep_head else draft_vocab(data)
    widened_from = len(vocab) if init and (draft_vocab_size or 0) > len(vocab) else None
    if widened_from:
        vocab = draft_vocab(data, draft_vocab_size, keep=vocab)
    outputs = [len(d["output_ids"]) for d in data]
    data_info = {
        "prompts": distill.prompts_line(sets),
        "sets": per_set,
        "sequences": len(data),
        "prompt_tokens": sum(d["prompt_len"] for d in data),
        "output_tokens": sum(outputs),
        "answers_ended_by_eos": sum(s["answers_ended_by_eos"] for s in per_set.values()),
        "max_new_tokens": max(s["answers"]["max_tokens"] for s in per_set.values()),
        "answers": "vLLM 0.32 in-process, greedy, bf16, batches of 256",
        "features": "HF teacher-forced pass, bf16; labels the target's greedy next token",
        "held_out": "the default workload's prompts (workloads/data/default.jsonl)",
    }
    out = out or sm.TRAINED_DIR
    out.mkdir(parents=True, exist_ok=True)
    train_n = len(split(data, seed)[0])
    steps = math.ceil(epochs * train_n)
    peak = peak_lr or eagle3.PEAK_LR
    init_sha = sm.sha256_file(init) if init else ""
    tag = f"-after-{init_sha[:12]}" if init else ""
    tag += ("-lm_head" if train_lm_head else "") + (f"-lr{peak:g}" if peak_lr else "")
    tag += f"-copy{copy_group}" if copy_group is not None else ""
    tag += f"-vocab{len(vocab)}" if widened_from else ""
    tag += ("" if prompt_loss else "-outloss") + ("-soft" if soft_labels else "")
    sets_tag = "" if sets == ("mixed-0-3000",) else "-" + "+".join(sets)  # the first build's name
    ckpt = distill.WORK / f"eagle3-{seed}-{distill.PROMPTS}{sets_tag}-{steps}{tag}.ckpt"
    build = sm.TRAINED_DIR / "BUILD.json"  # the committed speculators' record
    old = json.loads(build.read_text()) if build.is_file() else {}
    earlier = earlier_stages(old) if init is not None else []
    if keep_head:
        _keep_committed(out, ("eagle3.safetensors", "eagle3_config.json"))
        e_info = {**old.get("eagle3", {}), "kept": "the committed head (not retrained)"}
    else:
        e_info = _train_head(model, data, vocab, seed, steps, ckpt, progress, init,
                             train_lm_head, peak, out, copy_group, prompt_loss,
                             soft_labels)  # fmt: skip
        e_info["epochs"] = epochs
        if init is not None:
            e_info["started_from"] = f"the committed head, sha256 {init_sha}"
            if widened_from:
                e_info["draft_vocab_widened_from"] = widened_from
            e_info["earlier_stages"] = earlier
            e_info["total_epochs"] = epochs + sum(st.get("epochs", 0) for st in earlier)
            e_info["total_train_cpu_seconds"] = e_info["train_cpu_seconds"] + sum(
                st.get("train_cpu_seconds", 0) for st in earlier
            )
    if draft_s:
        draft, d_info = train_draft(model, data, vocab, seed, draft_s)
        save_draft(draft, out)
        del draft
    else:
        _keep_committed(out, ("draft.safetensors", "draft_config.json"))
        d_info = {**old.get("draft_model", {}), "kept": "the committed draft (not retrained)"}
    del data
    with tempfile.TemporaryDirectory() as tmp:  # what models build assembles from ``out``
        sm.assemble_draft(Path(tmp) / "draft", target, out)
        sm.assemble_eagle3(Path(tmp) / "eagle3", target, out)
        held = evaluation.evaluate(target, Path(tmp) / "draft", Path(tmp) / "eagle3")
    usage = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    made = made_on(started, time.time(), command)
    stamp((e_info, d_info), made, old.get("made_on", ""))
    info = {
        "seed": seed,
        "wheel": sm.WHEEL,
        "wheel_sha256": sm.WHEEL_SHA256,
        "data": data_info,
        "draft_model": d_info,
        "eagle3": e_info,
        "held_out_alpha_at_k1": {"eagle3": round(held.pop("eagle3_alpha_k1", 0.0), 4)},
        "held_out_first_position_agreement": {k: round(v, 4) for k, v in held.items()},
        "total_seconds": round(time.perf_counter() - t_all),
        "total_cpu_seconds": round(sum(u.ru_utime + u.ru_stime for u in usage)),
        "torch_threads": threads,
        "made_on": made,
        "metric": METRIC,
    }
    sm.write_json(out / "BUILD.json", info)
    return info

"""Builds the tiny model pair (``--model tiny``, the tests' pair): a byte-level BPE tokenizer,
a small Llama target trained on the Python standard library's sources, and a 2-layer draft
distilled from it.

Everything is seeded and runs for a fixed number of steps, so a rebuild is reproducible up to
floating-point nondeterminism. Heavy imports (torch, transformers, tokenizers) stay inside
functions.
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

from harness.models.optim import lr_at

SPECIALS = {"bos": "<|bos|>", "eos": "<|eos|>", "pad": "<|pad|>", "unk": "<|unk|>"}
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)
HOLDOUT_MOD = 20  # a file is held out when md5(relative path) % 20 == 0
EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__"}

TARGET_DIMS: dict[str, int] = {
    "vocab_size": 2048,
    "hidden_size": 128,
    "intermediate_size": 352,
    "num_hidden_layers": 4,
    "num_attention_heads": 2,  # head_dim 64
    "max_position_embeddings": 2048,
}
DRAFT_LAYERS = 2
SEQ_LEN = 256
BATCH = 8
# Sized for 2 AVX2 cores without bf16 support: fp32, about ten minutes in all.


def corpus_files() -> tuple[Path, list[Path], list[Path]]:
    """(stdlib root, training files, held-out files), sorted and deterministic."""
    root = Path(sysconfig.get_paths()["stdlib"])
    train: list[Path] = []
    held: list[Path] = []
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root)
        if any(p in EXCLUDED_DIRS or p.startswith("test") for p in rel.parts[:-1]):
            continue
        h = int(hashlib.md5(rel.as_posix().encode()).hexdigest(), 16)
        (held if h % HOLDOUT_MOD == 0 else train).append(f)
    return root, train, held


def read_texts(files: list[Path]) -> list[str]:
    return [f.read_text(encoding="utf-8", errors="replace") for f in files]


def train_tokenizer(texts: list[str], vocab_size: int, out_dirs: list[Path]) -> Any:
    """Trains a byte-level BPE tokenizer and saves it as PreTrainedTokenizerFast in out_dirs."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=SPECIALS["unk"]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIALS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos = SPECIALS["bos"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token=SPECIALS["eos"],
        pad_token=SPECIALS["pad"],
        unk_token=SPECIALS["unk"],
        model_max_length=TARGET_DIMS["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    for d in out_dirs:
        fast.save_pretrained(d)
        _portable_tokenizer_files(Path(d))
    return fast


def _portable_tokenizer_files(d: Path) -> None:
    """Names the generic fast tokenizer class and writes special_tokens_map.json, so that
    transformers 4.x (and tools that read these files) load the tokenizer too."""
    cfg_path = d / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    names = {f"{k}_token": v for k, v in SPECIALS.items()}
    (d / "special_tokens_map.json").write_text(json.dumps(names, indent=2, sort_keys=True) + "\n")


def encode_stream(tok: Any, texts: list[str]) -> Any:
    """All documents as one id stream: bos doc eos bos doc eos ..."""
    import torch

    ids: list[int] = []
    backend = tok.backend_tokenizer  # the Rust tokenizer; its post-processor prepends bos
    for text in texts:
        ids.extend(backend.encode(text).ids)
        ids.append(tok.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


def _batch(data: Any, gen: Any, batch: int, seq: int) -> Any:
    import torch

    starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=gen)
    return torch.stack([data[s : s + seq] for s in starts.tolist()])


def _train(
    model: Any,
    data: Any,
    steps: int,
    lr: float,
    seed: int,
    desc: str,
    progress: bool,
    teacher: Any = None,
) -> None:
    """Trains model for a fixed number of steps; with teacher: KL distillation on its logits."""
    import torch
    import torch.nn.functional as F
    from tqdm import tqdm

    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = max(1, min(100, steps // 10))
    model.train()
    bar = tqdm(range(steps), desc=desc, disable=not progress, file=sys.stderr, mininterval=2)
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, warmup, floor=0.1)
        x = _batch(data, gen, BATCH, SEQ_LEN)
        # fp32: bf16 autocast is ~3x slower on CPUs without native bf16 (AVX2 only here)
        logits = model(input_ids=x).logits.float()
        if teacher is None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), x[:, 1:].flatten())
        else:
            with torch.no_grad():
                t = teacher(input_ids=x).logits.float()
            loss = F.kl_div(
                F.log_softmax(logits, -1).flatten(0, 1),
                F.log_softmax(t, -1).flatten(0, 1),
                log_target=True,
                reduction="batchmean",
            )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 10 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()


def perplexity(model: Any, data: Any, windows: int = 64, seq: int = SEQ_LEN) -> float:
    """Perplexity over the first `windows` consecutive windows of the held-out stream."""
    import torch
    import torch.nn.functional as F

    seq = min(seq, len(data) - 1)
    n = min(windows, (len(data) - 1) // seq)
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, n, 8):
            x = torch.stack([data[j * seq : j * seq + seq + 1] for j in range(i, min(n, i + 8))])
            logits = model(input_ids=x[:, :-1]).logits.float()
            loss = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten(), reduction="sum")
            total, count = total + loss.item(), count + x[:, 1:].numel()
    return math.exp(total / count)


def greedy_acceptance(
    target: Any, draft: Any, prompts: list[list[int]], new_tokens: int = 64, k: int = 4
) -> dict[str, float]:
    """Greedy speculative decoding with k draft tokens (what HF assisted generation does with a
    constant schedule and confidence threshold 0): acceptance = accepted / proposed."""
    import torch

    drafted = accepted = rounds = 0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny single-sequence forwards: extra threads only spin-wait
    try:
        with torch.no_grad():
            for p in prompts:
                ids = list(p)
                end = len(p) + new_tokens
                while len(ids) < end:
                    kk = min(k, end - len(ids) - 1)
                    prop: list[int] = []
                    for _ in range(kk):
                        prop.append(
                            int(draft(input_ids=torch.tensor([ids + prop])).logits[0, -1].argmax())
                        )
                    logits = target(input_ids=torch.tensor([ids + prop])).logits[0]
                    want = logits[len(ids) - 1 :].argmax(-1).tolist()
                    n = 0
                    while n < kk and prop[n] == want[n]:
                        n += 1
                    ids += prop[:n] + [want[n]]
                    drafted, accepted, rounds = drafted + kk, accepted + n, rounds + 1
    finally:
        torch.set_num_threads(threads)
    return {
        "acceptance": accepted / max(1, drafted),
        "mean_accepted_length": (accepted + rounds) / max(1, rounds),
        "drafted": drafted,
        "accepted": accepted,
    }


def _save(model: Any, out: Path) -> None:
    """Saves float16 weights with a float32 config (loaders upcast) and a generation config."""
    import torch

    half = type(model)(model.config).to(torch.float16)
    half.load_state_dict({k: v.to(torch.float16) for k, v in model.state_dict().items()})
    half.generation_config.do_sample = False
    half.save_pretrained(out)
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["dtype"] = "float32"
    cfg["torch_dtype"] = "float32"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def build(
    out_dir: Path,
    seed: int = 0,
    target_steps: int = 2000,
    draft_steps: int = 300,
    progress: bool = True,
    dims: dict[str, int] | None = None,
    lr: float = 3e-3,
    max_files: int | None = None,
) -> dict[str, Any]:
    """Builds target/ and draft/ under out_dir and writes BUILD.json; returns its content."""
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    dims = {**TARGET_DIMS, **(dims or {})}
    out_dir = Path(out_dir)
    tdir, ddir = out_dir / "target", out_dir / "draft"
    for d in (tdir, ddir):
        d.mkdir(parents=True, exist_ok=True)
    root, train_files, held_files = corpus_files()
    if max_files is not None:
        train_files, held_files = train_files[:max_files], held_files[: max(1, max_files // 20)]
    t0 = time.perf_counter()
    train_texts, held_texts = read_texts(train_files), read_texts(held_files)
    tok = train_tokenizer(train_texts, dims["vocab_size"], [tdir, ddir])
    train_ids, held_ids = encode_stream(tok, train_texts), encode_stream(tok, held_texts)
    t_tok = time.perf_counter() - t0

    cfg = LlamaConfig(
        **dims,
        num_key_value_heads=dims["num_attention_heads"],
        tie_word_embeddings=True,
        rope_theta=10000.0,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    target = LlamaForCausalLM(cfg)
    t1 = time.perf_counter()
    _train(target, train_ids, target_steps, lr, seed, "target", progress)
    t_target = time.perf_counter() - t1

    dcfg = LlamaConfig.from_dict({**cfg.to_dict(), "num_hidden_layers": DRAFT_LAYERS})
    draft = LlamaForCausalLM(dcfg)
    missing = draft.load_state_dict(target.state_dict(), strict=False)
    assert not missing.missing_keys, missing.missing_keys
    for p in target.parameters():
        p.requires_grad_(False)
    t2 = time.perf_counter()
    _train(draft, train_ids, draft_steps, lr / 3, seed + 1, "draft", progress, teacher=target)
    t_draft = time.perf_counter() - t2

    # Evaluate what is saved: float16 weights, run in float32.
    for m in (target, draft):
        m.load_state_dict({k: v.half().float() for k, v in m.state_dict().items()})
    _save(target, tdir)
    _save(draft, ddir)
    t3 = time.perf_counter()
    ppl_t, ppl_d = perplexity(target, held_ids), perplexity(draft, held_ids)
    stride = max(1, (len(held_ids) - 48) // 8)
    prompts = [held_ids[i * stride : i * stride + 48].tolist() for i in range(8)]
    acc = greedy_acceptance(target, draft, prompts)
    info: dict[str, Any] = {
        "seed": seed,
        "recipe": {
            "target": {**dims, "tie_word_embeddings": True, "arch": "LlamaForCausalLM"},
            "draft": f"target's first {DRAFT_LAYERS} layers + embeddings + final norm, "
            "then KL-distilled on the target's logits",
            "target_steps": target_steps,
            "draft_steps": draft_steps,
            "batch": BATCH,
            "seq_len": SEQ_LEN,
            "optimizer": "AdamW(0.9,0.95, wd 0.1), warm-up + cosine to 10%, clip 1.0",
            "lr_target": lr,
            "lr_draft": lr / 3,
            "precision": "float32 (bf16 autocast is slower on AVX2-only CPUs)",
            "saved_weights": "float16 safetensors, config dtype float32",
        },
        "params": {
            "target": sum(p.numel() for p in target.parameters()),
            "draft": sum(p.numel() for p in draft.parameters()),
        },
        "corpus": {
            "description": "Python standard library *.py sources of the building interpreter "
            f"(test dirs excluded); held out: md5(relative path) % {HOLDOUT_MOD} == 0; "
            "documents are bos+text+eos",
            "root": str(root),
            "train_files": len(train_files),
            "heldout_files": len(held_files),
            "train_tokens": len(train_ids),
            "heldout_tokens": len(held_ids),
        },
        "heldout_perplexity": {"target": round(ppl_t, 2), "draft": round(ppl_d, 2)},
        "greedy_acceptance_hf_k4": {
            "method": "greedy speculative decoding, 4 draft tokens per round, constant schedule, "
            "confidence threshold 0 (= HF assisted generation), 8 held-out prompts of 48 tokens, "
            "64 new tokens",
            **{k: round(v, 4) for k, v in acc.items()},
        },
        "wall_s": {
            "tokenizer_and_encode": round(t_tok, 1),
            "target": round(t_target, 1),
            "draft": round(t_draft, 1),
            "eval": round(time.perf_counter() - t3, 1),
        },
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
    }
    (out_dir / "BUILD.json").write_text(json.dumps(info, indent=2) + "\n")
    return info

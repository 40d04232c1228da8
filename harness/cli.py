"""Command line: `python -m harness [run flags]`, `... report`, `... compare`, `... models`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from harness import vllm_flags

# Repeats are the unit of every CI (harness/stats.py). 4 detect a 10% speedup of tokens/s with
# 75-79% power at 3% run-to-run noise and a 20% one with 90% at 5% (README, Statistics;
# tests/test_calibration.py); 8 would give 89% at 10%/5% but not fit the main job's 10 minutes.
DEFAULT_REPEATS = 4

EPILOG = """\
subcommands:
  python -m harness report results.json        re-render summary.md from a results file
  python -m harness compare A.json B.json ...  runs of several files side by side
  python -m harness models build|path ...      the shipped models (SmolLM2 family, tiny pair)
  python -m harness tune --engine vllm         best (method, K) per load -> speculative_config

examples:
  python -m harness --engine vllm --spec                      the main job (SmolLM2 family)
  python -m harness --engine hf --spec --model tiny --workload tiny   seconds: the test pair
  python -m harness --engine hf,vllm --spec ngram --mode latency --num-prompts 8
  python -m harness --engine vllm --spec --concurrency 1 4 16 --max-new-tokens 50 200
  python -m harness --engine openai --base-url http://127.0.0.1:8000/v1 --concurrency 32
  python -m harness --engine vllm --dataset-name random --random-input-len 256 --random-output-len 32 --max-concurrency 4 --num-prompts 64
"""


class UsageError(Exception):
    """Bad flags or input: printed as one line, exit code 2."""


def _json_arg(flag: str, text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}" if exc.lineno > 1 else f"column {exc.colno}"
        raise UsageError(f"{flag}: invalid JSON ({exc.msg} at {where})") from None
    if not isinstance(value, dict):
        raise UsageError(f"{flag}: expected a JSON object, got {type(value).__name__}")
    return value


def _kv_args(items: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--engine-arg: expected KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def _variant_urls(items: Sequence[str] | None) -> dict[str, list[str]] | None:
    """``--base-url baseline=URL ngram=URL`` -> {label: [URL, ...]}; plain URLs -> None."""
    if not items:
        return None
    labelled = [i.partition("=") for i in items]
    named = [(k, u) for k, sep, u in labelled if sep and "/" not in k and ":" not in k]
    if not named:
        return None
    if len(named) != len(items):
        raise UsageError("--base-url: label every URL (baseline=URL ngram=URL) or none")
    out: dict[str, list[str]] = {}
    for label, url in named:
        out.setdefault(label, []).append(url)  # a label given twice: replicas of one variant
    return out


def _goodput(items: Sequence[str] | None) -> dict[str, float] | None:
    if not items:
        return None
    out = {}
    for item in items:
        name, sep, ms = item.partition(":")
        name = "e2e" if name == "e2el" else name  # vllm bench serve's name
        if not sep or name not in ("ttft", "tpot", "e2e"):
            raise UsageError(
                f"--goodput: expected ttft:MS, tpot:MS or e2el:MS (e2e:MS), got {item!r}"
            )
        try:
            out[name] = float(ms)
        except ValueError:
            raise UsageError(
                f"--goodput: {item!r}: {ms!r} is not a number of milliseconds"
            ) from None
    return out


def _number(text: str, cast: type, low: float, strict: bool) -> Any:
    try:
        v = cast(text)
    except ValueError:
        kind = "an integer" if cast is int else "a number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {kind}") from None
    if v < low or (strict and v == low):
        raise argparse.ArgumentTypeError(f"{v:g} must be {'>' if strict else '>='} {low:g}")
    return v


def positive_int(text: str) -> int:
    return _number(text, int, 0, strict=True)


def non_negative_int(text: str) -> int:
    return _number(text, int, 0, strict=False)


def positive_float(text: str) -> float:
    return _number(text, float, 0, strict=True)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage too)
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m harness",
        description="Benchmark LLM serving engines on the same workloads, with and without "
        "speculative decoding, and compare them with confidence intervals.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = p.add_argument_group("engines and models")
    g.add_argument(
        "--engine",
        default="vllm",
        help="engine(s), comma-separated: hf, vllm, openai, vllm-server, transformers-server, "
        "transformers-server-cb (default: vllm)",
    )
    g.add_argument(
        "--model",
        default="embedded",
        help="HF id or local path of the target model; shipped: 'embedded' (default) = "
        "SmolLM2-135M-Instruct with its draft and EAGLE-3 head, 'tiny' = the 1M-parameter test pair",
    )
    g.add_argument(
        "--draft-model",
        default=None,
        help="HF id or local path of the draft model (default: the shipped draft of a shipped --model)",
    )
    g.add_argument("--tokenizer", default=None, help="tokenizer id or path (default: the model's)")
    g.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="weights dtype (auto: float32 on CPU, float16 on GPU for hf; vLLM's choice for vllm)",
    )
    g.add_argument("--device", default="auto", help="hf engine device: auto, cpu, cuda, cuda:N")
    g.add_argument(
        "--engine-args",
        default=None,
        metavar="JSON",
        help="JSON object passed untouched to the engine (vLLM EngineArgs, e.g. '{\"tensor_parallel_size\": 2}')",
    )
    g.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one engine argument (repeatable); VALUE parsed as JSON when it can be",
    )
    s = p.add_argument_group("speculative decoding")
    s.add_argument(
        "--spec",
        nargs="?",
        const="all",
        default=None,
        metavar="METHODS",
        help="run speculative variants: alone = every method that applies (draft_model, eagle3 with a "
        "shipped head, ngram); or a comma list of ngram, draft_model, eagle, eagle3, mtp, suffix",
    )
    s.add_argument(
        "--num-spec-tokens",
        type=positive_int,
        nargs="+",
        default=[4],
        metavar="K",
        help="draft tokens per step (list = sweep; default 4)",
    )
    s.add_argument(
        "--spec-config",
        default=None,
        metavar="JSON|@FILE",
        help="a speculative_config passed verbatim to vLLM (one more variant): inline JSON, "
        "@file.json or a path (e.g. the speculative_config.json that `harness tune` writes)",
    )
    s.add_argument("--no-baseline", action="store_true", help="skip the baseline variant")
    w = p.add_argument_group("workload")
    w.add_argument(
        "--workload",
        default="default",
        help="shipped workload name (default, specbench, grounded, tiny) or a file path",
    )
    w.add_argument(
        "--workload-format",
        default=None,
        help="force the file format (native, specbench, sharegpt, vllm-custom)",
    )
    w.add_argument(
        "--num-prompts",
        type=positive_int,
        default=None,
        help="use N prompts, the same N for a given --seed",
    )
    w.add_argument(
        "--turn",
        type=non_negative_int,
        default=0,
        help="which turn of multi-turn files (Spec-Bench) to use (default 0)",
    )
    w.add_argument(
        "--seed", type=int, default=0, help="seed for prompt choice, arrivals and sampling"
    )
    m = p.add_argument_group("modes and load")
    m.add_argument(
        "--mode",
        default="both",
        choices=["latency", "throughput", "both"],
        help="latency: one request at a time; throughput: many in flight (default both)",
    )
    m.add_argument(
        "--concurrency",
        "--max-concurrency",
        type=positive_int,
        nargs="+",
        default=None,
        help="throughput mode: requests in flight (list = sweep; default 16; with --request-rate: a cap)",
    )
    m.add_argument(
        "--request-rate",
        type=positive_float,
        nargs="+",
        default=None,
        help="throughput mode: open-loop arrivals per second (list = sweep)",
    )
    m.add_argument(
        "--duration",
        type=positive_float,
        default=None,
        metavar="S",
        help="throughput mode: send for S seconds per point (cycling the prompts with fresh "
        "ids), then let what is in flight finish",
    )
    m.add_argument(
        "--burstiness",
        type=positive_float,
        default=1.0,
        help="gamma shape of arrival gaps: 1 = Poisson (as vllm bench serve)",
    )
    m.add_argument(
        "--max-new-tokens",
        type=positive_int,
        nargs="+",
        default=None,
        help="output length (list = sweep; default 64, or the workload's own lengths)",
    )
    m.add_argument(
        "--ignore-eos", action="store_true", help="generate exactly max-new-tokens tokens"
    )
    m.add_argument(
        "--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)"
    )
    r = p.add_argument_group("statistics and output")
    r.add_argument(
        "--repeats",
        type=positive_int,
        default=DEFAULT_REPEATS,
        help=f"repeats of each cell (default {DEFAULT_REPEATS}: see README, Statistics)",
    )
    r.add_argument(
        "--target-ci",
        type=positive_float,
        default=None,
        metavar="W",
        help="keep repeating a point until the 95%% CI of every candidate-vs-baseline speedup "
        "that decides there (tok/s; E2E at a request rate) has a half-width under W (log scale, "
        "0.05 ~ +-5%%), up to --max-repeats",
    )
    r.add_argument(
        "--max-repeats", type=positive_int, default=20, help="cap for --target-ci (default 20)"
    )
    r.add_argument(
        "--warmup",
        "--num-warmups",
        type=non_negative_int,
        default=2,
        help="warm-up requests before each point, recorded but not counted (default 2)",
    )
    r.add_argument(
        "--min-effect",
        type=float,
        default=0.02,
        help="smallest speedup effect called significant (default 0.02 = 2%%)",
    )
    r.add_argument(
        "--goodput",
        nargs="+",
        default=None,
        metavar="METRIC:MS",
        help="SLOs for goodput, e.g. ttft:500 tpot:50 e2el:2000",
    )
    r.add_argument(
        "--output-dir",
        "--result-dir",
        default=None,
        help="where results.json and summary.md go (default results/<timestamp>)",
    )
    r.add_argument(
        "--resume",
        default=None,
        metavar="DIR",
        help="continue an interrupted run in DIR: finished cells are not redone",
    )
    r.add_argument(
        "--max-error-rate",
        type=float,
        default=None,
        help="stop the run cleanly once this share of requests failed",
    )
    r.add_argument(
        "--sequential",
        action="store_true",
        help="run variants one after the other (each variant's repeats in one block) instead of "
        "interleaving them run by run in a rotated order (the default, so machine drift hits all "
        "alike; every variant's engine is then alive at once)",
    )
    r.add_argument(
        "--aa",
        action="store_true",
        help="A/A run: the baseline configuration twice (baseline, baseline-aa), interleaved and "
        "compared as usual; a verdict other than 'no significant difference' is a false one",
    )
    r.add_argument(
        "--prefix-cache",
        default="reset",
        choices=["reset", "off", "keep"],
        help="prefix cache of vLLM engines: reset before every measured run (default), off "
        "(disabled), keep (never reset: repeats hit what earlier runs cached)",
    )
    r.add_argument("--no-plots", action="store_true", help="do not draw PNG plots")
    r.add_argument("--quiet", action="store_true", help="no progress bars")
    h = p.add_argument_group("HTTP engines (openai and the servers the harness starts)")
    h.add_argument(
        "--base-url",
        nargs="+",
        default=None,
        help="server base URL(s), e.g. http://127.0.0.1:8000/v1; several = round-robin replicas; "
        "with --spec one server per variant: baseline=URL ngram=URL (a server cannot be compared "
        "with itself)",
    )
    h.add_argument(
        "--api-key-env",
        default="OPENAI_API_KEY",
        help="environment variable holding the API key (never written anywhere)",
    )
    h.add_argument("--api-key-file", default=None, help="file holding the API key")
    h.add_argument(
        "--served-model",
        "--served-model-name",
        default=None,
        help="model name to request (default: the first of /v1/models)",
    )
    h.add_argument(
        "--endpoint",
        default=None,
        type=vllm_flags.endpoint_arg,
        help="force an endpoint: completions (/v1/completions) or chat (/v1/chat/completions); "
        "default: completions for prompts, chat for messages",
    )
    h.add_argument(
        "--request-timeout",
        type=positive_float,
        default=600.0,
        help="seconds before a request is recorded as timed out",
    )
    h.add_argument(
        "--sample-server-load",
        type=positive_float,
        default=None,
        metavar="SECONDS",
        help="sample the server's running/waiting gauges from /metrics every SECONDS during each "
        "run (default: off, counters are read at each run's start and end only: every scrape "
        "costs the server a /metrics render while it is measured)",
    )
    h.add_argument(
        "--server-start-timeout",
        type=positive_float,
        default=600.0,
        help="vllm-server, transformers-server: seconds to wait for /health",
    )
    vllm_flags.add_group(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "tune":
            from harness import tune_app

            return tune_app.main(argv[1:])
        if argv and argv[0] in ("report", "compare", "models"):
            from harness import commands

            return commands.main(argv)
        args = build_parser().parse_args(argv)
        from harness.app import run_main

        return run_main(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `python -m harness report ... | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0

"""The run's flags (argparse): engines and models, speculative decoding, workload, modes and
load, statistics and output, HTTP engines, and vllm bench serve's names (``harness.flags.vllm_bench``)."""

from __future__ import annotations

import argparse

from harness.flags import capacity, stop, vllm_bench, workload
from harness.flags.engine_args import ARGS_HELP, DTYPE_HELP, DTYPES, MAX_MODEL_LEN_HELP
from harness.flags.help import EPILOG, DefaultsFormatter, add_help
from harness.flags.options import Given, Parser, non_negative_int, positive_float, positive_int
from harness.flags.plan import DEFAULT_CONCURRENCY, DEFAULT_MAX_NEW_TOKENS


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m harness",
        description="Benchmark LLM serving engines on the same workloads, with and without "
        "speculative decoding, and compare them with confidence intervals.",
        epilog=EPILOG,
        formatter_class=DefaultsFormatter,
        add_help=False,
    )
    add_help(p)
    _engines(p)
    _speculative(p)
    _workload(p)
    _modes_and_load(p)
    _statistics_and_output(p)
    _http_engines(p)
    for group in (vllm_bench, workload, capacity):  # groups with modules of their own
        group.add_group(p)
    p.set_defaults(model_named=False)
    return p


def _engines(p: argparse.ArgumentParser) -> None:
    """Which engines run which models."""
    g = p.add_argument_group("engines and models")
    g.add_argument(
        "--engine",
        action="joined",
        nargs="+",
        default="vllm",
        help="engine(s): hf, vllm, openai, vllm-server, transformers-server, "
        "transformers-server-cb (default: vllm)",
    )
    g.add_argument(
        "--model",
        default="embedded",
        action=Given,  # sets args.model_named
        help="HF id or local path of the target model; shipped: 'embedded' (default) = "
        "SmolLM2-135M-Instruct with its draft and EAGLE-3 head, 'tiny' = the 1M-parameter test pair",
    )
    g.add_argument(
        "--draft-model",
        default=None,
        help="HF id or local path of the draft model (default: the shipped draft of a shipped --model)",
    )
    g.add_argument("--tokenizer", default=None, help="tokenizer id or path (default: the model's)")
    g.add_argument("--dtype", default="auto", choices=DTYPES, help=DTYPE_HELP)
    g.add_argument("--device", default="auto", help="hf engine device: auto, cpu, cuda, cuda:N")
    g.add_argument(
        "--max-model-len", type=positive_int, default=None, metavar="N", help=MAX_MODEL_LEN_HELP
    )
    g.add_argument("--engine-args", action="append", metavar="[ENGINE=]JSON", help=ARGS_HELP)
    g.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one engine argument (repeatable); VALUE parsed as JSON when it can be",
    )


def _speculative(p: argparse.ArgumentParser) -> None:
    """Which speculative variants run, and their settings."""
    s = p.add_argument_group("speculative decoding")
    s.add_argument(
        "--spec",
        action="joined",
        nargs="*",
        const="all",
        default=None,
        metavar="METHODS",
        help="run speculative variants: alone = every method that applies (draft_model, eagle3 with a "
        "shipped head, ngram); or a list of ngram, draft_model, eagle, eagle3, mtp, suffix (default: "
        "off: the baseline only)",
    )
    s.add_argument(
        "--num-spec-tokens",
        type=positive_int,
        nargs="+",
        distinct=True,
        default=None,
        metavar="K",
        help="draft tokens per step (list = sweep; default: each method's K from the shipped "
        "family's committed tune result, else 4)",
    )
    s.add_argument(
        "--spec-config",
        default=None,
        metavar="JSON|@FILE",
        help="a speculative_config passed verbatim to vLLM (one more variant): inline JSON, "
        "@file.json or a path (e.g. the speculative_config.json that `harness tune` writes)",
    )
    s.add_argument("--no-baseline", action="store_true", help="skip the baseline variant")


def _workload(p: argparse.ArgumentParser) -> None:
    """What is sent: the prompts, their lengths, the dataset."""
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
        help="use N prompts, the same N for a given --seed (default: the whole workload; "
        "--dataset-name random, prefix_repetition: 1000)",
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


def _modes_and_load(p: argparse.ArgumentParser) -> None:
    """How it is sent: latency/throughput modes, concurrency, rates."""
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
        distinct=True,
        default=None,
        help=f"throughput mode: requests in flight (list = sweep; default {DEFAULT_CONCURRENCY}; "
        "with --request-rate: a cap)",
    )
    m.add_argument(
        "--request-rate",
        type=positive_float,
        nargs="+",
        distinct=True,
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
        distinct=True,
        default=None,
        help=f"output length (list = sweep; default: the workload's own lengths, else "
        f"{DEFAULT_MAX_NEW_TOKENS}; --dataset-name random: --random-output-len)",
    )
    m.add_argument(
        "--ignore-eos", action="store_true", help="generate exactly max-new-tokens tokens"
    )
    m.add_argument(
        "--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)"
    )


def _statistics_and_output(p: argparse.ArgumentParser) -> None:
    """Repeats, the verdict's settings, the caches and the files written."""
    r = p.add_argument_group("statistics and output")
    stop.add(r)
    r.add_argument(
        "--warmup",
        "--num-warmups",
        type=non_negative_int,
        default=2,
        help="warm-up requests before each point, recorded but not counted (default 2)",
    )
    r.add_argument(
        "--warmup-tokens",
        type=positive_int,
        default=None,
        metavar="N",
        help="cap on the new tokens of each warm-up request (default: 8 with fresh engine "
        "instances per block, which warm up before every point of every block; else the "
        "point's length)",
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
        "--price-per-hour",
        nargs="+",
        default=None,
        metavar="USD|ENGINE=USD",
        help="price of an hour of the hardware a lane holds (or per engine: vllm=2.5 hf=1.2): "
        "cost per million output tokens and the cost ratio with its CI (docs/cost.md)",
    )
    r.add_argument(
        "--max-error-rate",
        type=float,
        default=None,
        help="stop the run cleanly once this share of requests failed",
    )
    what = "lanes, engines built, memory per lane, requests, time, what will not run"
    r.add_argument("--dry-run", action="store_true", help=f"print the plan ({what}); load nothing")
    r.add_argument(
        "--sequential",
        action="store_true",
        help="run variants one after the other (each variant's repeats in one block) instead of "
        "interleaving them run by run in a rotated order (the default, so machine drift hits all "
        "alike; every variant's engine is then alive at once)",
    )
    r.add_argument(
        "--instances",
        default=None,
        choices=["per-block", "one"],
        help="engine instances: a fresh one per block (repeat) for every variant, so an "
        "instance's own speed offset is inside the CI, or one per variant for the whole run; "
        "default: per-block where a start is cheap (vllm, hf), one for servers",
    )
    r.add_argument(
        "--aa",
        action="store_true",
        help="A/A run: the baseline configuration twice (baseline, baseline-aa), interleaved and "
        "compared as usual; 'faster', 'slower' (or 'within' from an interval that excludes 1) is "
        "a false verdict",
    )
    r.add_argument(
        "--prefix-cache",
        default="reset",
        choices=["reset", "off", "keep"],
        help="prefix cache of vLLM engines: reset before every measured run (default), off "
        "(disabled), keep (never reset: repeats hit what earlier runs cached)",
    )
    r.add_argument(
        "--async-scheduling",
        default="auto",
        choices=["auto", "on", "off"],
        help="vLLM's async scheduling, one value for every vLLM lane (left to vLLM it differs "
        "per method on a GPU): auto (default: on where every lane's method supports it on this "
        "platform, else off for all; off on CPU), on (refused with ngram, suffix), off",
    )
    r.add_argument("--no-plots", action="store_true", help="do not draw PNG plots")
    r.add_argument("--quiet", action="store_true", help="no progress bars")


def _http_engines(p: argparse.ArgumentParser) -> None:
    """Settings of the HTTP engines: URLs, keys, endpoints, client processes."""
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
        help="model name to request (default: --model if /v1/models lists it, else the one "
        "model listed; with several listed, pass this)",
    )
    h.add_argument(
        "--endpoint",
        default=None,
        type=vllm_bench.endpoint_arg,
        help="force an endpoint: completions (/v1/completions) or chat (/v1/chat/completions); "
        "default: completions for prompts, chat for messages",
    )
    h.add_argument(
        "--extra-body",
        default=None,
        metavar="JSON",
        help="a JSON object merged into every request body of the HTTP engines (recorded in the "
        """config), e.g. '{"ignore_eos": true}' for a server that takes it but is not vLLM""",
    )
    h.add_argument(
        "--request-timeout",
        type=positive_float,
        default=600.0,
        help="seconds before a request is recorded as timed out",
    )
    h.add_argument(
        "--token-ids",
        default="auto",
        choices=["auto", "on", "off"],
        help="ask a vLLM server for each chunk's token ids (return_token_ids): auto (default) = "
        "when the run compares outputs (several variants or engines) or has a speculative "
        "variant or the server speculates (its /metrics; several tokens per event); off: "
        "counts from the server's usage, no lossless "
        "check, no repetition check",
    )
    h.add_argument(
        "--client-workers",
        type=positive_int,
        default=1,
        metavar="N",
        help="HTTP engines: send from N client processes on this host, each its share of one "
        "schedule, records merged (default 1: this process; for loads beyond one asyncio "
        "client, ~1,000+ req/s of short streams per core)",
    )
    h.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="place the --client-workers N workers (N in total, default 1) as Ray actors spread "
        "over this Ray cluster's nodes (e.g. 127.0.0.1:6379 or auto); each host's clock offset "
        "is estimated and corrected (needs the [distributed] extra: ray)",
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

"""``vllm bench serve``'s flag names where the meaning is the same, so a vLLM user keeps theirs.

Aliases of the harness's own flags sit on those flags (``--max-concurrency``, ``--num-warmups``,
``--served-model-name``, ``--result-dir``); this module adds the group of names the harness had
no flag for (datasets, synthetic lengths, percentiles, result files) and turns them into the
harness's terms (:func:`dataset_choice`). Where vLLM means something else by a name (its
``--endpoint`` is a URL path) the harness follows vLLM or says in one line that it cannot.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

DATASETS = (
    "custom", "sharegpt", "spec_bench", "random", "prefix_repetition", "mooncake", "timed_trace"
)  # fmt: skip
SYNTHETIC = ("random", "prefix_repetition")
TRACES = ("mooncake", "timed_trace")  # a trace's prompts are made with the target's tokenizer
FILE_FORMATS = {"custom": "vllm-custom", "sharegpt": "sharegpt", "spec_bench": "specbench"}
PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")  # the default table
# vllm bench serve's client queue and E2E including it: ours from each scheduled arrival
SCHEDULE_METRICS = ("client_queue_time", "e2el_including_client_queue")
ENDPOINTS = {
    "completions": "completions",
    "chat": "chat",
    "/v1/completions": "completions",
    "/v1/chat/completions": "chat",
}


def endpoint_arg(text: str) -> str:
    """Ours (completions, chat) or vllm bench serve's URL path for the same two endpoints."""
    if text in ENDPOINTS:
        return ENDPOINTS[text]
    raise argparse.ArgumentTypeError(
        f"{text!r}: vllm bench serve's --endpoint is a URL path; the harness speaks "
        "/v1/completions and /v1/chat/completions (or completions, chat)"
    )


def api_root(item: str) -> str:
    """vllm bench serve's ``--base-url`` is the server root (its ``--endpoint`` adds ``/v1/...``):
    a URL without a path gets ``/v1``, the harness's form. ``label=URL`` keeps its label."""
    from urllib.parse import urlsplit

    label, sep, url = item.partition("=")
    if not sep or "/" in label or ":" in label:
        label, url = "", item
    parts = urlsplit(url)
    if parts.scheme in ("http", "https") and parts.path in ("", "/") and not parts.query:
        url = url.rstrip("/") + "/v1"
    return f"{label}={url}" if label else url


def metric_percentiles(text: str) -> tuple[float, ...]:
    """``50,90,99,99.9`` -> (50.0, 90.0, 99.0, 99.9); each in (0, 100)."""
    try:
        ps = tuple(float(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 50,90,99, got {text!r}") from None
    if not ps or any(not 0 < p < 100 for p in ps):
        raise argparse.ArgumentTypeError(f"each percentile must be in (0, 100), got {text!r}")
    return tuple(dict.fromkeys(ps))


def percentile_metrics(text: str) -> tuple[str, ...]:
    names = tuple(m.strip() for m in text.split(",") if m.strip())
    known = (*PERCENTILE_METRICS, *SCHEDULE_METRICS)
    bad = [m for m in names if m not in known] or ([] if names else [text])
    if bad:
        raise argparse.ArgumentTypeError(
            f"unknown metric {bad[0]!r} (choose from {','.join(known)})"
        )
    return names


def metadata_item(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` (the value stays a string, as vllm bench serve keeps it)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def _at_least(low: int):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"{v} must be >= {low}")
        return v

    return parse


def add_group(p: argparse.ArgumentParser) -> None:
    """The vllm bench serve names without a harness flag of their own."""
    v = p.add_argument_group(
        "vllm bench serve names",
        "Datasets, synthetic lengths, percentiles and result files as vllm bench serve names "
        "them. Also: --max-concurrency (= --concurrency), --num-warmups (= --warmup), "
        "--served-model-name (= --served-model), --result-dir (= --output-dir), --endpoint "
        "/v1/completions or /v1/chat/completions, --goodput e2el:MS, --num-prompts, "
        "--request-rate, --burstiness, --seed, --ignore-eos, --temperature, --extra-body.",
    )
    from workloads.synthetic import PrefixRepetitionSpec, RandomSpec

    one, zero = _at_least(1), _at_least(0)
    rnd, rep = RandomSpec(), PrefixRepetitionSpec()  # vLLM's defaults, written once there
    v.add_argument(
        "--dataset-name",
        default=None,
        choices=DATASETS,
        help="custom, sharegpt, spec_bench read --dataset-path (spec_bench: the shipped set "
        "without one); random and prefix_repetition are made with the target's tokenizer "
        "(--num-prompts 1000 unless given, as vLLM) and imply --ignore-eos: their lengths are the point; "
        "mooncake (= timed_trace) replays a trace (see 'trace replay and conversations')",
    )
    v.add_argument("--dataset-path", default=None, help="the dataset file (= --workload FILE)")
    v.add_argument("--random-input-len", type=one, default=rnd.input_len, metavar="N")
    v.add_argument("--random-output-len", type=one, default=rnd.output_len, metavar="N")
    v.add_argument(
        "--random-range-ratio",
        default="0.0",
        metavar="R",
        help='lengths uniform in [L*(1-R), L*(1+R)]; one R in [0, 1) or \'{"input": R, "output": R}\'',
    )
    v.add_argument("--random-prefix-len", type=zero, default=rnd.prefix_len, metavar="N")
    v.add_argument("--prefix-repetition-prefix-len", type=one, default=rep.prefix_len, metavar="N")
    v.add_argument("--prefix-repetition-suffix-len", type=one, default=rep.suffix_len, metavar="N")
    v.add_argument(
        "--prefix-repetition-num-prefixes", type=one, default=rep.num_prefixes, metavar="N"
    )
    v.add_argument("--prefix-repetition-output-len", type=one, default=rep.output_len, metavar="N")
    v.add_argument(
        "--percentile-metrics",
        action="joined",
        nargs="+",
        type=percentile_metrics,
        default=None,
        help="with either flag, a table per point shows these metrics at --metric-percentiles "
        "(default ttft,tpot,itl,e2el)",
    )
    v.add_argument(
        "--metric-percentiles",
        action="joined",
        nargs="+",
        type=metric_percentiles,
        default=None,
        help="percentiles kept for every metric in results.json beside 50,90,99, and shown",
    )
    v.add_argument(
        "--metadata",
        nargs="*",
        split=False,  # a value may hold a comma
        type=metadata_item,
        default=[],
        metavar="KEY=VALUE",
        help="stored in results.json and in each vLLM-shaped result file",
    )
    v.add_argument(
        "--save-result",
        "--save-vllm-json",
        dest="save_vllm_json",
        action="store_true",
        help="also write each run in vllm bench serve's result shape (results.json is always "
        "written): OUTPUT_DIR/vllm/<config>/run=R.json and summary.json (vllm bench sweep plot)",
    )
    v.add_argument(
        "--result-filename",
        default=None,
        help="with --save-result: also every run's vLLM-shaped result in one file, one JSON object "
        "a line (as vllm bench serve --append-result), at RESULT_DIR/F as vllm bench serve "
        "places it (an absolute F as given)",
    )
    v.add_argument(
        "--save-detailed",
        action="store_true",
        help="accepted for vllm bench serve's sake: per-request detail is always kept",
    )


@dataclass(frozen=True)
class DatasetChoice:
    """What --dataset-name/--dataset-path (or --workload) asked for, in the harness's terms."""

    workload: str  # shipped name, file path, or a synthetic dataset name
    fmt: str | None
    synthetic: bool


def dataset_choice(
    workload: str, workload_set: bool, fmt: str | None, name: str | None, path: str | None
) -> DatasetChoice:
    """Resolve --dataset-name/--dataset-path against --workload/--workload-format; raises
    ValueError with one line on a clash."""
    if name is None and path is None:
        return DatasetChoice(workload, fmt, False)
    if workload_set:
        raise ValueError("give --workload or --dataset-name/--dataset-path, not both")
    if name in SYNTHETIC:
        if path is not None:
            raise ValueError(f"--dataset-name {name} is synthetic: it takes no --dataset-path")
        return DatasetChoice(name, None, True)
    if name in TRACES:
        if path is None:
            raise ValueError(
                f"--dataset-name {name} needs --dataset-path FILE (shipped: trace_tiny)"
            )
        return DatasetChoice(path, "mooncake", True)
    want = FILE_FORMATS.get(name or "")
    if fmt is not None and want is not None and fmt != want:
        raise ValueError(f"--workload-format {fmt} contradicts --dataset-name {name}")
    if path is None:
        if name == "spec_bench":
            return DatasetChoice("specbench", "specbench", False)
        raise ValueError(f"--dataset-name {name} needs --dataset-path FILE")
    return DatasetChoice(path, fmt or want, False)


def metadata_dict(items: Sequence[tuple[str, str]]) -> dict[str, str]:
    return dict(items)

"""vLLM bench's result files, in and out, so old results join new ones and vLLM's tools read ours.

In: a file written by ``vllm bench serve --save-result`` (one JSON object; ``--append-result``
files hold one per line) becomes one run each, with the same field meanings: milliseconds become
seconds, the acceptance rate in percent becomes a fraction. With ``--save-detailed`` the
per-request lists become records (request ``i`` gets id ``str(i)``: vLLM keeps the dataset's
order, and the harness's ``random`` and custom-file ids are the same indices), so ``compare``
pairs them; a file without them is refused in one line (aggregates cannot be paired).

Out: each run of a results.json in vLLM's shape (aggregates from the stored summary, per-request
lists from the records), as ``<dir>/vllm/<engine>-<label>-<point>/run=R.json`` plus a
``summary.json`` list per configuration and point, the layout ``vllm bench sweep plot`` reads.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

MS_METRICS = {
    "ttft": "ttft_s", "tpot": "tpot_s", "itl": "itl_s", "e2el": "e2e_s",
    # written out: ours, from each request's scheduled arrival under any open loop
    "client_queue_time": "client_queue_s", "e2el_including_client_queue": "e2e_from_schedule_s",
}  # fmt: skip
# read in: vLLM's own, under their own names: its client queue runs from when its client got
# round to the request (only with --max-concurrency), not from the schedule, so never ours
VLLM_OWN = {
    "client_queue_time": "vllm_client_queue_s",
    "e2el_including_client_queue": "vllm_e2e_including_client_queue_s",
}
MS_IN = {**MS_METRICS, **VLLM_OWN}
VLLM_KEYS = ("completed", "duration", "output_throughput")
PER_POINT = ("ttft_s", "tpot_s", "itl_s", "e2e_s")  # always written (null when missing)


def is_vllm_result(data: Any) -> bool:
    """A ``vllm bench serve`` result dict (and not a harness results.json)."""
    return (
        isinstance(data, dict)
        and "schema_version" not in data
        and all(k in data for k in VLLM_KEYS)
        and ("backend" in data or "endpoint_type" in data or "date" in data)
    )


def read_vllm_file(text: str) -> list[dict[str, Any]] | None:
    """The result dicts of a vLLM bench file (one object, or one per line), else None."""
    try:
        data = json.loads(text)
        items = data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        try:
            items = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError:
            return None
    return items if items and all(is_vllm_result(d) for d in items) else None


# ---- in ----------------------------------------------------------------------------------------
def _ms_to_s(d: Mapping[str, Any], metric: str) -> dict[str, Any]:
    """vLLM's ``mean_ttft_ms``, ``p99_ttft_ms``, ... as the harness's distribution in seconds."""
    out: dict[str, Any] = {}
    pat = re.compile(rf"^(mean|median|std|p[0-9.]+)_{metric}_ms$")
    for key, value in d.items():
        m = pat.match(key)
        if m and isinstance(value, (int, float)):
            name = {"std": "stdev"}.get(m.group(1), m.group(1))
            out[name] = value / 1000.0
    return out


def _load(d: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """(mode, load) in the harness's terms: one at a time is the latency mode."""
    rate = d.get("request_rate", "inf")
    cap = d.get("max_concurrency")
    if rate in ("inf", None) or rate == float("inf"):
        if cap == 1:
            return "latency", {"concurrency": 1}
        return "throughput", {"concurrency": cap if cap else 10**6}
    burst = float(d.get("burstiness", 1.0))
    return "throughput", {
        "request_rate": float(rate),
        "arrivals": "poisson" if burst == 1.0 else "gamma",
        "burstiness": burst,
        "seed": int(d.get("seed", 0)),
        "concurrency": cap,
    }


def _records(d: Mapping[str, Any]) -> list[dict[str, Any]]:
    starts = d.get("start_times")
    lat = d.get("latencies")
    if not starts or not lat:
        return []
    t0 = min(starts)
    n = len(starts)

    def col(key: str, default: Any = None) -> list[Any]:
        xs = d.get(key)
        return list(xs) if isinstance(xs, list) and len(xs) == n else [default] * n

    ttfts, itls, outs, ins = col("ttfts"), col("itls", []), col("output_lens"), col("input_lens")
    errors, texts = col("errors", ""), col("generated_texts")
    out = []
    for i in range(n):
        ok = not errors[i]
        ttft = ttfts[i] if ok and ttfts[i] else None
        out.append(
            {
                "id": str(i),
                "send_s": starts[i] - t0,
                "prompt_tokens": ins[i],
                "output_tokens": outs[i],
                "usage_output_tokens": outs[i],
                "ttft_s": ttft,
                "e2e_s": lat[i] if ok else 0.0,
                "itl_s": list(itls[i] or []) if ttft is not None else [],
                # vLLM keeps no chunk sizes: the first chunk carries the rest of the count
                "chunk_tokens": [],
                "output_token_ids": None,
                "output_text": texts[i],
                "ok": ok,
                "error": errors[i] or None,
                "warmup": False,
                "info": {"source": "vllm bench serve"},
            }
        )
    return out


def _spec(d: Mapping[str, Any]) -> dict[str, Any] | None:
    if "spec_decode_num_drafts" not in d:
        return None
    drafts = int(d["spec_decode_num_drafts"])
    per_pos = [float(x) for x in d.get("spec_decode_per_position_acceptance_rates") or []]
    rate = d.get("spec_decode_acceptance_rate")
    return {
        "num_drafts": drafts,
        "num_draft_tokens": int(d.get("spec_decode_draft_tokens", 0)),
        "num_accepted_tokens": int(d.get("spec_decode_accepted_tokens", 0)),
        "accepted_per_pos": [round(x * drafts) for x in per_pos],
        "acceptance_rate": None if rate is None else float(rate) / 100.0,  # percent -> fraction
        "mean_acceptance_length": d.get("spec_decode_acceptance_length"),
        "acceptance_per_pos": per_pos,
        "alpha": per_pos[0] if per_pos else None,
        "target_passes": None,
    }


def to_run(d: Mapping[str, Any], index: int = 0) -> dict[str, Any]:
    """One vLLM result as a harness run (results.json's ``runs[]`` shape)."""
    mode, load = _load(d)
    records = _records(d)
    outs = [r["output_tokens"] for r in records if r["ok"] and r["output_tokens"] is not None]
    mnt = d.get("max_new_tokens") or (max(outs) if outs else 0)
    spec = _spec(d)
    # the harness's own export names its variant; vLLM's --label names a whole run, not a variant
    label = str(d.get("spec_method") or ("spec" if spec else "baseline"))
    summary = {
        "completed": d.get("completed"),
        "failed": d.get("failed", 0),
        "duration_s": d.get("duration"),
        "output_tokens": d.get("total_output_tokens"),
        "request_throughput": d.get("request_throughput"),
        "output_tok_s": d.get("output_throughput"),
        "total_tok_s": d.get("total_token_throughput"),
        "goodput": d.get("request_goodput"),
        "peak_in_flight": d.get("max_concurrent_requests"),
        **{h: x for v, h in MS_IN.items() if (x := _ms_to_s(d, v)) or h in PER_POINT},
    }
    engine = "vllm-bench"
    return {
        "key": f"{engine}/{label}/{mode}/{index}",
        "engine": engine,
        "variant": "spec" if spec else "baseline",
        "label": label,
        "spec_config": {"method": "unknown (vllm bench serve)"} if spec else None,
        "mode": mode,
        "workload": d.get("workload") or d.get("dataset_name") or "",
        "max_new_tokens": int(mnt),
        "load": load,
        "repeat": int(d.get("run_number", index) or 0),
        "session": d.get("harness_session"),  # the harness's export; vLLM's own: None
        "status": "ok",
        "engine_info": {
            "source": "vllm bench serve",
            "backend": d.get("backend") or d.get("endpoint_type"),
            "model": d.get("model_id"),
            "date": d.get("date"),
            "label": d.get("label"),
        },
        "extra": {},
        "summary": summary,
        "spec_metrics": spec,
        "records": records,
    }


def to_results(items: Sequence[Mapping[str, Any]], path: str) -> dict[str, Any]:
    """A vLLM bench file as a harness results dict (runs only; no fingerprint: vLLM keeps none)."""
    runs = [to_run(d, i) for i, d in enumerate(items)]
    first = items[0]
    return {
        "schema_version": 1,
        "created": str(first.get("date", "")),
        "status": "complete",
        "source": "vllm bench serve",
        "environment": {"vllm": first.get("vllm_version")},
        "config": {"model": first.get("model_id"), "tokenizer": first.get("tokenizer_id")},
        "workload": {"name": "", "path": path, "fingerprint": None, "num_requests": None},
        "runs": runs,
        "comparisons": [],
    }


# ---- out ---------------------------------------------------------------------------------------
def _stats_ms(summary: Mapping[str, Any], percentiles: Sequence[float]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for metric, key in MS_METRICS.items():
        # ours; a vLLM file read in has only vLLM's own (VLLM_OWN): back under its name
        dist = summary.get(key) or summary.get(VLLM_OWN.get(metric, "")) or {}
        if not dist and key not in PER_POINT:  # a closed loop has no schedule: vLLM omits them
            continue
        for name, vname in (("mean", "mean"), ("median", "median"), ("std", "stdev")):
            v = dist.get(vname)
            out[f"{name}_{metric}_ms"] = None if v is None else v * 1000.0
        for p in percentiles:
            word = str(int(p)) if float(p).is_integer() else f"{p:g}"
            v = dist.get(f"p{word}")
            out[f"p{word}_{metric}_ms"] = None if v is None else v * 1000.0
    return out


def from_run(results: Mapping[str, Any], run: Mapping[str, Any]) -> dict[str, Any]:
    """One harness run in ``vllm bench serve --save-result --save-detailed``'s shape."""
    cfg = results.get("config") or {}
    s = run.get("summary") or {}
    load = run.get("load") or {}
    recs = [r for r in run.get("records") or [] if not r.get("warmup")]
    created = results.get("created") or ""
    try:
        date = dt.datetime.fromisoformat(created).strftime("%Y%m%d-%H%M%S")
    except ValueError:
        date = created
    spec = run.get("spec_metrics") or {}
    out: dict[str, Any] = {
        "date": date,
        "endpoint_type": run["engine"],
        "backend": run["engine"],
        "label": f"{run['engine']}/{run['label']}",
        "model_id": cfg.get("model"),
        "tokenizer_id": cfg.get("tokenizer") or cfg.get("model"),
        "num_prompts": len(recs),
        **dict(results.get("metadata") or {}),
        "request_rate": load.get("request_rate", "inf"),
        "burstiness": load.get("burstiness", cfg.get("burstiness", 1.0)),
        "max_concurrency": load.get("concurrency"),
        "duration": s.get("duration_s"),
        "completed": s.get("completed"),
        "failed": s.get("failed"),
        "total_input_tokens": sum(r.get("prompt_tokens") or 0 for r in recs if r.get("ok")),
        "total_output_tokens": s.get("output_tokens"),
        "request_throughput": s.get("request_throughput"),
        "request_goodput": s.get("goodput"),
        "output_throughput": s.get("output_tok_s"),
        "total_token_throughput": s.get("total_tok_s"),
        "max_concurrent_requests": s.get("peak_in_flight"),
        **_stats_ms(s, cfg.get("metric_percentiles") or (50, 90, 99)),
        "input_lens": [r.get("prompt_tokens") for r in recs],
        "output_lens": [r.get("output_tokens") if r.get("ok") else 0 for r in recs],
        "ttfts": [r.get("ttft_s") or 0.0 for r in recs],
        "itls": [r.get("itl_s") or [] for r in recs],
        "latencies": [r.get("e2e_s") if r.get("ok") else 0.0 for r in recs],
        "start_times": [r.get("send_s") for r in recs],
        "generated_texts": [r.get("output_text") or "" for r in recs],
        "errors": [r.get("error") or "" for r in recs],
        # the harness's own names, for whoever reads the file next
        "harness_key": run.get("key"),
        "harness_session": run.get("session"),  # compare pairs runs of one session only
        "mode": run.get("mode"),
        "spec_method": run["label"],
        "max_new_tokens": run.get("max_new_tokens"),
        "workload": run.get("workload"),
        "run_number": run.get("repeat", 0),
    }
    if spec.get("num_drafts"):
        rate = spec.get("acceptance_rate")
        out.update(
            spec_decode_acceptance_rate=None if rate is None else rate * 100.0,
            spec_decode_acceptance_length=spec.get("mean_acceptance_length"),
            spec_decode_num_drafts=spec.get("num_drafts"),
            spec_decode_draft_tokens=spec.get("num_draft_tokens"),
            spec_decode_accepted_tokens=spec.get("num_accepted_tokens"),
            spec_decode_per_position_acceptance_rates=spec.get("acceptance_per_pos") or [],
        )
    return out


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", text).strip("_")


EXPORT_SUBDIR = "vllm"  # --save-result: OUTPUT_DIR/vllm/<config>/run=R.json


def export_dir(results: Mapping[str, Any], result_dir: Path, filename: str | None = None) -> Path:
    """Write every run as vLLM bench JSON under ``result_dir/vllm`` (sweep-plot layout);
    ``filename`` (``--result-filename``): also every run, one JSON object a line, at
    ``result_dir/filename`` as vllm bench serve places it (an absolute path stays as given).
    Returns the ``vllm`` directory."""
    out = result_dir / EXPORT_SUBDIR
    groups: dict[str, list[dict[str, Any]]] = {}
    for run in results.get("runs", []):
        if not run.get("records") or str(run.get("status")).startswith(("unsupported", "failed")):
            continue
        load = run.get("load") or {}
        point = ",".join(f"{k}={v}" for k, v in sorted(load.items()) if v is not None)
        name = _slug(
            f"{run['engine']}-{run['label']}-{run['mode']}-{point}-{run['max_new_tokens']}tok"
        )
        groups.setdefault(name, []).append(from_run(results, run))
    lines = []
    for name, items in groups.items():
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        for item in items:
            (d / f"run={item['run_number']}.json").write_text(json.dumps(item))
            lines.append(json.dumps(item))
        (d / "summary.json").write_text(json.dumps(items))
    if filename:
        path = result_dir / Path(filename).expanduser()  # vLLM: os.path.join(result_dir, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
    return out

"""The flags of the two workloads that are more than a prompt set: a trace replay (``--dataset-name
mooncake`` or vLLM bench's ``timed_trace``; :mod:`workloads.trace`) and multi-turn conversations
(``--multi-turn``; :mod:`workloads.conversations`), and what each sets in the plan."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from harness.flags.options import UsageError, positive_float, positive_int
from harness.run.plan import RunPlan

TRACE_NAMES = ("mooncake", "timed_trace")  # ours (SGLang's, AIPerf's) and vllm bench serve's


def add_group(p: argparse.ArgumentParser) -> None:
    t = p.add_argument_group(
        "trace replay and conversations",
        "--dataset-name mooncake (= timed_trace) --dataset-path FILE replays a Mooncake-format "
        "trace: each line one request at its timestamp, its prompt token ids built block by "
        "block from hash_ids (equal id = equal block), its output_length forced (EOS ignored); "
        "--num-prompts N keeps the first N lines. --multi-turn sends conversations (ShareGPT "
        "files, --workload specbench's two-turn questions, shipped: conversations): turn k "
        "carries the variant's own answers to turns 1..k-1; --concurrency N = N conversations "
        "in flight.",
    )
    t.add_argument(
        "--trace-block-size",
        "--timed-trace-chunk-hash-size",
        type=positive_int,
        default=512,
        metavar="N",
        help="tokens per hash id (default 512, Mooncake's; vllm bench's default is 16)",
    )
    t.add_argument(
        "--trace-time-scale",
        type=positive_float,
        default=None,
        metavar="S",
        help="multiply every gap by S (0.5 = twice as fast; default 1)",
    )
    t.add_argument(
        "--timed-trace-sec-multiplier",
        type=positive_float,
        default=None,
        metavar="M",
        help="vllm bench's: seconds per timestamp unit (0.001 = milliseconds = time scale 1)",
    )
    t.add_argument(
        "--trace-input-scale",
        type=positive_float,
        default=1.0,
        metavar="F",
        help="scale input lengths and the block size alike (blocks stay whole; default 1)",
    )
    t.add_argument(
        "--trace-max-input-len",
        type=positive_int,
        default=None,
        metavar="N",
        help="cap input lengths at N tokens (rounded down to whole blocks when N >= one block)",
    )
    t.add_argument(
        "--trace-window",
        default=None,
        metavar="START:END",
        help="keep the lines whose timestamp lies in [START, END) seconds after the first line",
    )
    t.add_argument(
        "--multi-turn",
        action="store_true",
        help="send whole conversations, each turn with the variant's own earlier answers",
    )
    t.add_argument(
        "--think-time",
        type=float,
        default=0.0,
        metavar="S",
        help="--multi-turn: seconds between an answer and the next turn (default 0)",
    )
    t.add_argument(
        "--max-turns",
        type=positive_int,
        default=None,
        metavar="N",
        help="--multi-turn: keep the first N user turns of each conversation",
    )


def is_trace(args: argparse.Namespace) -> bool:
    return getattr(args, "dataset_name", None) in TRACE_NAMES


def window_arg(text: str | None) -> tuple[float, float] | None:
    if text is None:
        return None
    start, sep, end = text.partition(":")
    try:
        lo, hi = float(start or 0), float(end) if end else float("inf")
    except ValueError:
        raise UsageError(f"--trace-window: expected START:END in seconds, got {text!r}") from None
    if not sep or lo < 0 or hi <= lo:
        raise UsageError(f"--trace-window: expected 0 <= START < END, got {text!r}")
    return lo, hi


def time_scale(args: argparse.Namespace) -> float:
    ours, vllm = args.trace_time_scale, args.timed_trace_sec_multiplier
    if ours is not None and vllm is not None:
        raise UsageError("give --trace-time-scale or --timed-trace-sec-multiplier, not both")
    return vllm / 0.001 if vllm is not None else (ours or 1.0)


def trace_spec(args: argparse.Namespace) -> Any:
    from workloads.trace import TraceSpec

    return TraceSpec(
        block_size=args.trace_block_size,
        time_scale=time_scale(args),
        input_scale=args.trace_input_scale,
        max_input_len=args.trace_max_input_len,
        first=args.num_prompts,
        window=window_arg(args.trace_window),
        seed=args.seed,
    )


def check(args: argparse.Namespace) -> None:
    """What a replay or a conversation run needs of the other flags (called once the dataset
    is resolved): a replay is open loop (throughput mode, EOS ignored, no --request-rate)."""
    if args.think_time < 0:
        raise UsageError("--think-time: must be >= 0")
    _unused(args)
    if is_trace(args):
        if args.multi_turn:
            raise UsageError("--multi-turn takes conversations, not a trace")
        if args.mode == "latency":
            raise UsageError("a trace replay is open loop: use --mode throughput (the default)")
        if args.request_rate or args.duration:
            raise UsageError(
                "a trace replay sends at the trace's times: drop --request-rate/--duration"
            )
        if args.max_new_tokens:
            raise UsageError("a trace's output lengths are its own: drop --max-new-tokens")
        from workloads import check_trace

        check_trace(args.dataset.workload, trace_spec(args))  # a bad line: before models load
        args.mode = "throughput"
        args.ignore_eos = True  # output_length is forced
        return
    if args.multi_turn:
        if args.turn:
            raise UsageError(
                "--multi-turn sends every turn: drop --turn (--max-turns: the first N)"
            )
        if args.dataset.synthetic:
            raise UsageError("--multi-turn needs conversations (a ShareGPT file or specbench)")
        if args.duration:
            raise UsageError("--multi-turn: each conversation runs to its end; drop --duration")
        if getattr(args, "client_workers", 1) > 1:
            raise UsageError("--multi-turn: the conversation driver sends from one process")


# flag -> (its default, what it needs): a flag that would be ignored is refused instead
NEEDS = {
    "trace_block_size": (512, "a trace"),
    "trace_time_scale": (None, "a trace"),
    "timed_trace_sec_multiplier": (None, "a trace"),
    "trace_input_scale": (1.0, "a trace"),
    "trace_max_input_len": (None, "a trace"),
    "trace_window": (None, "a trace"),
    "think_time": (0.0, "--multi-turn"),
    "max_turns": (None, "--multi-turn"),
}


def _unused(args: argparse.Namespace) -> None:
    for key, (default, needs) in NEEDS.items():
        given = getattr(args, key, default) != default
        has = is_trace(args) if needs == "a trace" else args.multi_turn
        if given and not has:
            flag = "--" + key.replace("_", "-")
            what = "--dataset-name mooncake (a trace)" if needs == "a trace" else needs
            raise UsageError(f"{flag} applies to {what}")


def load(args: argparse.Namespace, model: str) -> Any:
    """The trace's or the conversations' workload, or None for any other dataset."""
    from workloads import conversation_workload, trace_workload

    if is_trace(args):
        return trace_workload(args.dataset.workload, args.tokenizer or model, trace_spec(args))
    if args.multi_turn:
        return conversation_workload(
            args.dataset.workload,
            fmt=args.dataset.fmt,
            num_prompts=args.num_prompts,
            seed=args.seed,
            max_turns=args.max_turns,
        )
    return None


def with_workload(plan: RunPlan, workload: Any, args: argparse.Namespace) -> RunPlan:
    """The plan with what the workload decides: a replay's schedule (the same for every
    variant) and fitting, a conversation run's settings."""
    if is_trace(args):
        params = dict(workload.params or {})
        keep = ("block_size", "time_scale", "input_scale", "max_input_len", "first", "window")
        return replace(
            plan,
            trace_schedule=tuple(float(r.send_s or 0.0) for r in workload.requests),
            trace={k: params.get(k) for k in keep},
        )
    if args.multi_turn:
        return replace(
            plan, conversations={"think_time_s": args.think_time, "max_turns": args.max_turns}
        )
    return plan

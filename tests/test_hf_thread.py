"""The HF engines' one generation thread: calls run in order on one thread, errors reach the
caller, a call cancelled while queued never runs, and a call made on the thread runs inline."""

from __future__ import annotations

import threading

import pytest

from engines.hf.thread import GenerationThread, generation_thread


def test_calls_run_in_order_on_one_thread() -> None:
    gt = GenerationThread()
    seen: list[tuple[int, int]] = []
    futs = [gt.submit(lambda i=i: seen.append((i, threading.get_ident()))) for i in range(20)]
    for f in futs:
        f.result(timeout=10)
    assert [i for i, _ in seen] == list(range(20))
    assert {t for _, t in seen} == {gt.thread.ident}
    assert gt.thread.ident != threading.get_ident() and gt.thread.daemon


def test_an_error_reaches_the_caller_and_the_thread_goes_on() -> None:
    gt = GenerationThread()

    def boom() -> None:
        raise ValueError("x")

    with pytest.raises(ValueError):
        gt.call(boom)
    assert gt.call(lambda: 3) == 3


def test_a_call_cancelled_while_queued_never_runs() -> None:
    gt = GenerationThread()
    release, ran = threading.Event(), []
    gt.submit(release.wait, 10)
    queued = gt.submit(lambda: ran.append(1))
    assert queued.cancel()
    release.set()
    gt.call(lambda: None)  # everything before it has been taken off the queue
    assert ran == []


def test_a_call_made_on_the_thread_runs_inline() -> None:
    gt = GenerationThread()
    assert gt.call(lambda: gt.call(lambda: threading.get_ident())) == gt.thread.ident


def test_the_process_has_one() -> None:
    assert generation_thread() is generation_thread()

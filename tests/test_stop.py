"""Every way a run stops ends the same way: stop sending, a grace period for the requests in
flight, then each one still running cancelled and recorded as failed (``cancelled at stop``), the
journal closed after the last record, results written, the documented exit code, no traceback.

A real run in a subprocess (the harness's own signal handling), against a scripted server whose
third request answers one token and then goes silent: slower than any grace period.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import ClassVar

import pytest

from engines.base import Capabilities, Chunk, GenParams, Request
from harness.core.load import Concurrent
from harness.core.records_file import load_with_records
from harness.run.runner import CANCELLED, Runner
from tests.clock import ScriptedEngine
from tests.fake_server import Behaviour, FakeServer
from tests.test_faults import ServerThread, run_harness, workload

ROOT = Path(__file__).resolve().parents[1]
SLOW = 2  # the arrival index of the request that stalls
FAST = Behaviour(tokens=4, delay=0.001)


def script(i: int) -> Behaviour:
    return Behaviour(tokens=4, fault="stall", fault_after=1) if i == SLOW else FAST


def start(tmp_path: Path, url: str, grace: float, *extra: str) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / "out"
    args = [
        *("--engine", "openai", "--base-url", url, "--model", "fake-model"),
        *("--workload", workload(tmp_path, 4), "--num-prompts", "4", "--mode", "latency"),
        *("--repeats", "1", "--warmup", "0", "--max-new-tokens", "4"),
        *("--output-dir", str(out), "--quiet", "--no-plots", *extra),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HARNESS_STOP_GRACE_S": str(grace)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, out


def wait_for(what, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not what():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() < deadline, "the run never reached the slow request"
        time.sleep(0.05)


def until_said(proc: subprocess.Popen, text: str) -> str:
    """stderr read line by line until a line holds ``text`` (pytest-timeout bounds the wait);
    what was read, for ``check_stopped``."""
    assert proc.stderr is not None
    read = ""
    while text not in read:
        line = proc.stderr.readline()
        assert line, f"the run ended without saying {text!r}: {read[-3000:]}"
        read += line
    return read


def check_stopped(
    proc: subprocess.Popen, out: Path, name: str, code: int, grace: float = 0.5, before: str = ""
) -> None:
    """``before``: what was read of stderr already (``until_said``)."""
    _, err = proc.communicate(timeout=120)  # the grace of the second-signal case is far longer
    err = before + err
    assert proc.returncode == code, err[-3000:]
    assert "Traceback" not in err and "unhandled exception" not in err, err[-3000:]
    assert f"interrupted by {name}; partial results in" in err
    lines = (out / "journal.jsonl").read_text().splitlines()
    entries = [json.loads(line) for line in lines]  # every line whole
    journalled = [e["record"] for e in entries if e["kind"] == "record"]
    res = load_with_records(out / "results.json")
    assert res["status"] == f"interrupted ({name})"
    assert res["config"]["stop_grace_s"] == grace  # the plan holds the setting it ran with
    (run,) = res["runs"]
    for records in (journalled, run["records"]):
        assert [r["id"] for r in records] == ["r0", "r1", "r2"]  # r3 was never sent
        assert [r["ok"] for r in records] == [True, True, False]
        assert records[2]["error"] == CANCELLED
    assert run["summary"]["errors"] == {CANCELLED: 1}


@pytest.mark.parametrize(
    "sig, code, extra",
    [
        (signal.SIGTERM, 143, ()),
        (signal.SIGINT, 130, ()),
        (signal.SIGTERM, 143, ("--client-workers", "2")),  # the requests sent by other processes
    ],
)
def test_a_signal_cancels_the_request_past_the_grace_and_keeps_every_record(
    tmp_path, sig, code, extra
):
    server = FakeServer(script)
    with ServerThread(server) as url:
        proc, out = start(tmp_path, url, 0.5, *extra)
        wait_for(lambda: len(server.requests) > SLOW, proc)
        proc.send_signal(sig)
        check_stopped(proc, out, sig.name, code)
    assert len(server.requests) == SLOW + 1  # it stopped sending


def test_a_second_signal_cancels_at_once(tmp_path):
    """A grace far longer than the test may take: only the second SIGTERM ends it."""
    server = FakeServer(script)
    with ServerThread(server) as url:
        proc, out = start(tmp_path, url, 3600)
        wait_for(lambda: len(server.requests) > SLOW, proc)
        proc.send_signal(signal.SIGTERM)
        # the second only once the first was handled: two sent before the process ran would
        # be one pending signal (a fixed 0.5 s apart was a bet on the machine's load)
        said = until_said(proc, "SIGTERM: stopping")
        proc.send_signal(signal.SIGTERM)
        check_stopped(proc, out, "SIGTERM", 143, grace=3600, before=said)


@pytest.mark.slow
def test_sigterm_during_an_hf_generate_keeps_its_record(tmp_path, tiny_pair):
    """The race of a real engine: an assisted ``generate`` on its thread ends after the cancel
    (at its next step), so its record comes late; it must still be journalled, as cancelled."""
    out = tmp_path / "out"
    args = [
        *("--model", "tiny", "--workload", "tiny", "--engine", "hf", "--spec", "draft_model"),
        *("--mode", "latency", "--num-prompts", "2", "--max-new-tokens", "1500", "--ignore-eos"),
        *("--repeats", "1", "--warmup", "0", "--output-dir", str(out), "--quiet", "--no-plots"),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HARNESS_STOP_GRACE_S": "0.2"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    journal = out / "journal.jsonl"
    # the first record journalled, the second request is generating (1500 tokens take over a
    # second even on a fast machine; a fixed sleep after the run began missed it there)
    wait_for(lambda: journal.exists() and '"kind": "record"' in journal.read_text(), proc, 600)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err[-3000:]
    assert "Traceback" not in err and "unhandled exception" not in err, err[-3000:]
    entries = [json.loads(line) for line in journal.read_text().splitlines()]
    records = [e["record"] for e in entries if e["kind"] == "record"]
    assert records and records[-1]["error"] == CANCELLED, records
    (run,) = load_with_records(out / "results.json")["runs"]
    assert [r["error"] for r in run["records"]] == [r["error"] for r in records]


def test_max_error_rate_ends_like_a_signal(tmp_path, monkeypatch, capsys):
    """The same end after --max-error-rate: the stalled request is cancelled after the grace
    and recorded; the run is 'stopped', exit code 1, every record in the journal and results."""
    monkeypatch.setenv("HARNESS_STOP_GRACE_S", "0.2")
    stall = Behaviour(tokens=4, fault="stall", fault_after=1)
    server = FakeServer(lambda i: stall if i == 0 else Behaviour(status=500))
    with ServerThread(server) as url:
        code, out = run_harness(tmp_path, url, 40, "--concurrency", "2", "--max-error-rate", "0.2")
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err, err
    res = load_with_records(out / "results.json")
    assert res["status"].startswith("stopped: error rate")
    (run,) = res["runs"]
    entries = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
    journalled = [e["record"] for e in entries if e["kind"] == "record"]
    assert len(journalled) == len(run["records"]) == len(server.requests) < 40
    (cancelled,) = [r for r in run["records"] if r["id"] == "r0"]
    assert cancelled["error"] == CANCELLED and cancelled["output_tokens"] == 1


# ---- the runner's part: nothing it sent outlives it, nothing is recorded after it returns ----


class Hanging(ScriptedEngine):
    """Requests named "slow*" produce one token, then nothing until cancelled."""

    async def stream(self, request, params, clock=None):
        yield Chunk(token_ids=(7,), t=time.perf_counter())
        if request.id.startswith("slow"):
            await asyncio.Event().wait()


class HangingBatches(ScriptedEngine):
    """Static batches (as HF generate) that produce a token each, then nothing until cancelled."""

    capabilities: ClassVar[Capabilities] = Capabilities(static_batching=True)

    async def stream_batch(self, requests, params, clock=None):
        for i in range(len(requests)):
            yield i, Chunk(token_ids=(7,), t=time.perf_counter())
        await asyncio.Event().wait()


def stop_runner(engine, cancel_after: float) -> tuple[Runner, list, dict]:
    """A runner whose stop comes with the first record, its grace ending ``cancel_after`` later."""
    state = {"stop": False, "cancel": False}
    emitted: list = []

    def on_record(rec) -> None:
        emitted.append(rec)
        if not state["stop"]:
            state["stop"] = True
            asyncio.get_running_loop().call_later(cancel_after, state.update, {"cancel": True})

    runner = Runner(
        engine,
        on_record=on_record,
        should_stop=lambda: state["stop"],
        cancel_now=lambda: state["cancel"],
    )
    return runner, emitted, state


def test_the_grace_end_cancels_in_flight_requests_and_records_them():
    engine = Hanging(None, {})
    runner, emitted, _ = stop_runner(engine, 0.1)
    reqs = [Request(i, "x") for i in ("fast", "slow1", "slow2", "never")]
    records = asyncio.run(runner.run(reqs, GenParams(), Concurrent(3)))
    assert [r.request_id for r in records] == ["fast", "slow1", "slow2"]  # then no more sent
    assert [r.error for r in records] == [None, CANCELLED, CANCELLED]
    assert sorted(map(id, records)) == sorted(map(id, emitted))  # each emitted once, all before


def test_a_cancelled_run_records_its_requests_before_it_raises():
    engine = Hanging(None, {})
    runner, emitted, _ = stop_runner(engine, 3600)

    async def main() -> None:
        task = asyncio.ensure_future(runner.run([Request("slow", "x")], GenParams(), Concurrent(1)))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert [r.error for r in emitted] == [CANCELLED]  # recorded before the run raised

    asyncio.run(main())


def test_a_static_batch_in_flight_at_the_grace_end_is_recorded_cancelled():
    engine = HangingBatches(None, {})
    runner, emitted, state = stop_runner(engine, 3600)

    async def main() -> list:
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, state.update, {"stop": True})
        loop.call_later(0.1, state.update, {"cancel": True})
        reqs = [Request("a", "x"), Request("b", "x"), Request("c", "x")]
        return await runner.run(reqs, GenParams(), Concurrent(2))  # batches of 2

    records = asyncio.run(main())
    assert [(r.request_id, r.error) for r in records] == [("a", CANCELLED), ("b", CANCELLED)]
    assert len(emitted) == 2


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_before_the_run_started_is_one_line(monkeypatch, capsys, sig, code):
    """While flags, files and models are read (no handler of the run's yet): one line, the same
    exit codes, and SIGTERM's handler given back after."""
    import harness.cli.run_command
    from harness.cli.main import main

    def loading(args) -> int:
        os.kill(os.getpid(), sig)
        time.sleep(5)  # the signal arrives here
        raise AssertionError("not interrupted")

    monkeypatch.setattr(harness.cli.run_command, "run_main", loading)
    before = signal.getsignal(signal.SIGTERM)
    assert main(["--engine", "hf"]) == code
    assert capsys.readouterr().err == f"error: interrupted by {sig.name}\n"
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_bad_grace_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HARNESS_STOP_GRACE_S", "soon")
    code, out = run_harness(tmp_path, "http://127.0.0.1:9/v1", 3)
    err = capsys.readouterr().err
    assert code == 2 and err == "error: $HARNESS_STOP_GRACE_S: not a number of seconds: 'soon'\n"
    assert not out.exists()

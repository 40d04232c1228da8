"""Server faults through the whole harness: the run completes, every failure is a record with
its reason, failures are counted apart, and every success is in results.json."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from pathlib import Path

import pytest

from harness.cli.main import main
from harness.core.records_file import load_with_records
from tests.fake_server import Behaviour, FakeServer

FAULTS = {
    1: (Behaviour(status=500), "http 500"),
    2: (Behaviour(status=429), "http 429"),
    3: (Behaviour(tokens=6, fault="reset", fault_after=2), "connection reset"),
    4: (Behaviour(tokens=6, fault="stall", fault_after=1), "timeout"),
    5: (Behaviour(tokens=6, fault="bad_json", fault_after=2), "bad sse"),
    6: (Behaviour(tokens=6, fault="no_done", fault_after=3), "incomplete stream"),
    7: (Behaviour(status=503), "http 503"),
}
OK = Behaviour(tokens=6, delay=0.001)


class ServerThread:
    """A FakeServer on its own event loop in a thread (the harness runs its own loop)."""

    def __init__(self, server: FakeServer):
        self.server = server
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.base_url = self.loop.run_until_complete(self.server.__aenter__())
        self.ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self.server.__aexit__(None, None, None))

    def __enter__(self) -> str:
        self.thread.start()
        self.ready.wait(10)
        return self.base_url

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def workload(tmp_path: Path, n: int) -> str:
    p = tmp_path / "w.jsonl"
    p.write_text(
        "".join(json.dumps({"id": f"r{i}", "prompt": f"prompt {i}"}) + "\n" for i in range(n))
    )
    return str(p)


def run_harness(tmp_path, base_url, n, *extra):
    out = tmp_path / "out"
    code = main(
        [
            "--engine",
            "openai",
            "--base-url",
            base_url,
            "--model",
            "fake-model",
            "--workload",
            workload(tmp_path, n),
            "--num-prompts",  # exactly the file (no cycling to 4x the concurrency)
            str(n),
            "--mode",
            "throughput",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--max-new-tokens",
            "6",
            "--output-dir",
            str(out),
            "--quiet",
            "--no-plots",
            *extra,
        ]
    )
    return code, out


def test_faults_are_counted_exactly_and_successes_kept(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-SECRET-4242")
    n = 32  # 4 rounds of OK + 7 faults

    def script(i: int) -> Behaviour:
        return FAULTS[i % 8][0] if i % 8 else OK

    behaviours = [script(i) for i in range(n)]
    server = FakeServer(script)
    with ServerThread(server) as url:
        code, out = run_harness(tmp_path, url, n, "--concurrency", "4", "--request-timeout", "1")
    assert code == 0, capsys.readouterr().err
    res = load_with_records(out / "results.json")
    (run,) = res["runs"]
    expected = Counter()
    for b in behaviours:
        kind = next((k for beh, k in FAULTS.values() if beh == b), None)
        if kind:
            expected[kind] += 1
    assert run["summary"]["errors"] == dict(expected)
    assert run["summary"]["failed"] == sum(expected.values())
    assert run["summary"]["completed"] == n - sum(expected.values())
    ok = [r for r in run["records"] if r["ok"]]
    assert len(ok) == run["summary"]["completed"] and all(r["output_tokens"] == 6 for r in ok)
    assert all(r["error"] and "\n" not in r["error"] for r in run["records"] if not r["ok"])
    # statistics over successes only: a failure never enters the latency distributions
    assert run["summary"]["ttft_s"]["n"] == len(ok)
    # the key went to the server and nowhere else
    assert all(
        r.headers.get("Authorization") == "Bearer sk-test-SECRET-4242" for r in server.requests
    )
    for f in out.iterdir():
        assert "SECRET-4242" not in f.read_text(errors="replace"), f.name
    assert "SECRET-4242" not in capsys.readouterr().out


def test_max_error_rate_stops_cleanly(tmp_path, capsys):
    server = FakeServer(lambda i: Behaviour(status=500) if i % 2 else OK)
    with ServerThread(server) as url:
        code, out = run_harness(tmp_path, url, 60, "--concurrency", "2", "--max-error-rate", "0.2")
    err = capsys.readouterr().err
    assert code == 1
    (line,) = [ln for ln in err.splitlines() if ln.startswith("error:")]  # says why
    assert "run stopped: error rate" in line and "--max-error-rate 20%" in line
    res = load_with_records(out / "results.json")
    assert res["status"].startswith("stopped: error rate")
    (run,) = res["runs"]
    assert len(run["records"]) < 60  # it stopped sending
    assert len(server.requests) == len(run["records"])
    assert "Traceback" not in err


def test_unreachable_base_url_is_a_one_line_error(tmp_path, capsys):
    code, out = run_harness(tmp_path, "http://127.0.0.1:9/v1", 3)
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "127.0.0.1:9" in err
    assert not out.exists()


def test_a_server_that_never_answers_is_a_one_line_error(tmp_path, capsys, monkeypatch):
    """A port that accepts connections and says nothing, neither at its root nor on /v1/models."""
    import socket

    import engines.openai.flags

    monkeypatch.setattr(engines.openai.flags, "PROBE_TIMEOUT_S", 0.2)
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen()
        url = f"http://127.0.0.1:{mute.getsockname()[1]}/v1"
        code, out = run_harness(tmp_path, url, 3, "--served-model", "fake-model")
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "does not answer (timed out)" in err, err
    assert not out.exists()


@pytest.mark.slow
def test_a_thousand_streams_in_flight(tmp_path, capsys):
    server = FakeServer(Behaviour(tokens=4, delay=0.05))
    with ServerThread(server) as url:
        code, out = run_harness(tmp_path, url, 1000, "--concurrency", "1000")
    assert code == 0, capsys.readouterr().err
    (run,) = load_with_records(out / "results.json")["runs"]
    assert run["summary"]["completed"] == 1000 and run["summary"]["failed"] == 0
    assert run["summary"]["peak_in_flight"] > 500


def test_no_request_succeeded_exits_nonzero_with_one_line(tmp_path, capsys):
    with ServerThread(FakeServer(Behaviour(status=500))) as url:
        code, out = run_harness(tmp_path, url, 4, "--concurrency", "2")
    err = capsys.readouterr().err
    assert code == 1, err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert "no request succeeded (4 failed, e.g. http 500" in line
    (run,) = load_with_records(out / "results.json")["runs"]  # results still written
    assert run["summary"]["failed"] == 4


def test_one_side_with_no_success_fails_the_run(tmp_path, capsys):
    """Two variants, one server answering 422 to all: the run exits 1 with one line naming the
    side at 0/N (results and table still written); some failures on a side still exit 0."""
    flaky = FakeServer(lambda i: Behaviour(status=500) if i % 2 else OK)
    broken = FakeServer(Behaviour(status=422))
    with (
        ServerThread(FakeServer(OK)) as good,
        ServerThread(broken) as bad,
        ServerThread(flaky) as half,
    ):
        for name, ngram in (("bad", bad), ("half", half)):
            (tmp_path / name).mkdir()
            urls = ("--base-url", f"baseline={good}", f"ngram={ngram}")
            code, out = run_harness(tmp_path / name, good, 4, "--spec", "ngram", *urls)
            err = capsys.readouterr().err
            if name == "half":
                assert code == 0, err
                continue
            assert code == 1, err
            (line,) = [ln for ln in err.splitlines() if ln.startswith("error:")]
            assert "openai [ngram]: no request succeeded (4 failed, e.g. http 422" in line
            assert "baseline" not in line
            runs = load_with_records(out / "results.json")["runs"]
            assert sorted(r["summary"]["completed"] for r in runs) == [0, 4]
            assert "ngram" in (out / "summary.md").read_text()


def test_engine_that_cannot_start_exits_nonzero(tmp_path, capsys):
    """A failing /v1/models stops the engine without --served-model (the line says to pass it),
    and is only a warning with it."""
    server = FakeServer(OK, models_status=500)
    with ServerThread(server) as url:
        code, out = run_harness(tmp_path, url, 4)
        err = capsys.readouterr().err
        assert code == 1 and "Traceback" not in err
        (line,) = [ln for ln in err.splitlines() if ln.startswith("error:")]
        assert "openai [baseline] engine did not start" in line and "--served-model" in line
        assert (out / "results.json").exists()
        code, out = run_harness(tmp_path, url, 4, "--served-model", "fake-model")
    assert code == 0, capsys.readouterr().err
    (run,) = load_with_records(out / "results.json")["runs"]
    assert run["summary"]["completed"] == 4
    assert "answered 500" in run["engine_info"]["warnings"][0]


def test_a_server_whose_model_listing_fails_still_runs_with_served_model(tmp_path, capsys):
    """/v1/models drops the connection: the server is alive (its root answers, 404), so the run
    goes on with --served-model (a warning in engine_info) and says to pass it without."""
    with ServerThread(FakeServer(OK, models_reset=True)) as url:
        code, out = run_harness(tmp_path, url, 4, "--served-model", "fake-model")
        assert code == 0, capsys.readouterr().err
        (run,) = load_with_records(out / "results.json")["runs"]
        assert run["summary"]["completed"] == 4
        assert "/models does not answer" in run["engine_info"]["warnings"][0]
        code, out = run_harness(tmp_path, url, 4)
    err = capsys.readouterr().err
    assert code == 1 and "does not answer" in err and "--served-model" in err


def test_ignore_eos_unsent_is_a_warning_and_extra_body_sends_it(tmp_path, capsys, caplog):
    """--ignore-eos to a server not taken for vLLM is not sent: engine_info and stderr say so.
    --extra-body merges its object into every request (and is recorded in the config)."""
    server = FakeServer(OK, vllm=False)
    extra = '{"ignore_eos": true, "top_k": 1}'
    with ServerThread(server) as url:
        for name, flags in (("plain", ()), ("extra", ("--extra-body", extra))):
            (tmp_path / name).mkdir()
            sent = len(server.requests)
            code, out = run_harness(tmp_path / name, url, 2, "--ignore-eos", *flags)
            err = capsys.readouterr().err
            assert code == 0, err
            said, _ = caplog.text, caplog.clear()  # the warning's line (stderr outside pytest)
            res = load_with_records(out / "results.json")
            (run,) = res["runs"]
            bodies = [r.body for r in server.requests[sent:]]
            warned = [w for w in run["engine_info"]["warnings"] if "--ignore-eos not sent" in w]
            if name == "plain":
                assert warned and said.count("--ignore-eos not sent") == 1
                assert all("ignore_eos" not in b for b in bodies)
            else:
                assert not warned and "--ignore-eos not sent" not in said
                assert all(b["ignore_eos"] is True and b["top_k"] == 1 for b in bodies)
                assert res["config"]["options"]["openai"]["extra_body"] == json.loads(extra)
                assert run["engine_info"]["extra_body"] == json.loads(extra)


def test_server_metrics_read_at_run_edges_unless_sampling_is_asked(tmp_path, capsys):
    """By default /metrics is read twice per run (counters at start and end), never during it;
    --sample-server-load S samples the gauges every S seconds and records S."""
    from tests.fake_server import render_metrics

    scrapes: list[int] = []

    def page() -> str:
        scrapes.append(1)
        return render_metrics(running=2)

    slow = Behaviour(tokens=6, delay=0.03)
    for extra, interval in (((), None), (("--sample-server-load", "0.05"), 0.05)):
        scrapes.clear()
        with ServerThread(FakeServer(slow, metrics=page)) as url:
            code, out = run_harness(tmp_path, url, 8, "--concurrency", "2", *extra)
        assert code == 0, capsys.readouterr().err
        (run,) = load_with_records(out / "results.json")["runs"]
        load = run["extra"]["server_load"]
        assert load["sample_interval_s"] == interval
        # + 1 at start: --token-ids auto with one variant asks whether the server speculates
        if interval is None:
            assert len(scrapes) == 3 and load["samples"] == 0
        else:  # a run of ~0.8 s sampled every 0.05 s
            assert load["samples"] >= 3  # a scrape cut by the run's end is not a sample:
            assert len(scrapes) - 3 - load["samples"] in (0, 1)
            assert load["server_num_requests_running_peak"] == 2


def test_token_ids_asked_only_when_the_run_compares_outputs(tmp_path, capsys):
    """One variant: no return_token_ids (a server like vLLM's then sends none), counts from the
    server's usage, the record and summary.md say so. Two variants: ids asked and compared;
    --token-ids off: the lossless check reads n/a, never a figure."""
    server = FakeServer(Behaviour(tokens=6, ids_if_asked=True))
    spec = ("--spec", "ngram", "--base-url")
    with ServerThread(server) as url:
        both = (*spec, f"baseline={url}", f"ngram={url}")
        runs = {}
        for name, extra in (("one", ()), ("two", both), ("off", (*both, "--token-ids", "off"))):
            (tmp_path / name).mkdir()
            sent = len(server.requests)
            code, out = run_harness(tmp_path / name, url, 4, "--ignore-eos", *extra)
            assert code == 0, capsys.readouterr().err
            runs[name] = (
                load_with_records(out / "results.json"),
                out,
                server.requests[sent:],
            )
    res, out, bodies = runs["one"]
    assert (
        res["config"]["token_ids"] == "auto"
        and res["config"]["options"]["openai"]["token_ids"] is None  # decided at start
    )
    assert all("return_token_ids" not in r.body and "min_tokens" not in r.body for r in bodies)
    assert all(r.body["ignore_eos"] is True for r in bodies)
    (run,) = res["runs"]
    assert run["engine_info"]["token_ids_asked"] is False
    assert not run["engine_info"]["warnings"]  # a vLLM server gets ignore_eos: no warning
    assert run["engine_info"]["token_ids_decided"] == (
        "--token-ids auto: no spec-decode counters on the server's /metrics"
    )
    ok = [r for r in run["records"] if r["ok"]]
    assert len(ok) == 4 and all(
        r["output_tokens"] == 6 and r["output_token_ids"] is None for r in ok
    )
    md = (out / "summary.md").read_text()
    assert "openai/baseline: no token ids (output tokens from server usage)" in md
    html = (out / "report.html").read_text()  # the full column set
    assert "<td>repetition n/a</td>" in html  # not "none": loops were not looked for
    res, out, bodies = runs["two"]
    assert all(r.body["return_token_ids"] is True for r in bodies)
    assert {r["engine_info"]["token_ids_asked"] for r in res["runs"]} == {True}
    why = {r["engine_info"]["token_ids_decided"] for r in res["runs"]}
    assert why == {"--token-ids auto: the run compares outputs"}  # not "flag"
    assert [c["identical"] for c in res["lossless"]] == [4]
    assert "no token ids" not in (out / "summary.md").read_text()
    res, out, bodies = runs["off"]
    assert not any("return_token_ids" in r.body for r in bodies)
    assert [c["status"] for c in res["lossless"]] == ["n/a (no token ids)"]
    assert "<td>n/a (no token ids)</td>" in (out / "report.html").read_text()


def test_one_variant_on_a_speculating_server_asks_for_token_ids(tmp_path, capsys):
    """--token-ids auto with one variant: a server whose /metrics has speculative counters
    streams several tokens per event, so the client asks for ids and counts each event's."""
    from tests.fake_server import render_metrics

    page = render_metrics(num_drafts=3, num_draft_tokens=9, num_accepted_tokens=6)
    server = FakeServer(Behaviour(tokens=6, ids_if_asked=True), metrics=page)
    with ServerThread(server) as url:
        code, out = run_harness(tmp_path, url, 2, "--ignore-eos")
    assert code == 0, capsys.readouterr().err
    (run,) = load_with_records(out / "results.json")["runs"]
    assert run["engine_info"]["token_ids_asked"] is True
    assert run["engine_info"]["token_ids_decided"] == (
        "--token-ids auto: the server's /metrics shows spec-decode counters"
    )
    assert all(r.body["return_token_ids"] is True for r in server.requests)
    assert all(r["output_token_ids"] is not None for r in run["records"] if r["ok"])

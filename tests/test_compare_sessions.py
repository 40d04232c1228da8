"""``compare`` gives a CI and a verdict only to runs of one interleaved session (DESIGN.md, rule
1): runs of two files written by two runs, one after the other, show the estimate only with
"n/a (sequential design)"; one session's runs, in one file or spread over several (the same
file twice, vLLM-shaped exports of one run), keep their CIs. A file without the session marker
(written before it, or by ``vllm bench serve``) is a session of its own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.analysis.comparisons.paired import UNPAIRED
from harness.cli.main import main
from harness.core.design import SEPARATE
from harness.report.vllm_json import from_run
from tests.test_vllm_json import _results, _run


def _file(path: Path, scale: float, session: str | None = None, spec: bool = True) -> Path:
    """A results.json with 3 repeats of a baseline (and an ngram variant at half the time)."""
    labels = ("baseline", "ngram") if spec else ("baseline",)
    runs = [
        _run(label, 8, scale * (0.5 if label == "ngram" else 1.0) * (1 + 0.01 * r * r), r)
        for r in range(3)
        for label in labels
    ]
    if session is not None:
        runs = [{**r, "session": session} for r in runs]
    path.mkdir(parents=True, exist_ok=True)
    (path / "results.json").write_text(json.dumps(_results(runs)))
    return path


def _compare(capsys, *files: Path | str) -> tuple[list[str], dict[str, Any]]:
    """The markdown's table lines, and the JSON compare writes (``--json``)."""
    out = Path(str(files[0])).parent / "compare.json"
    assert main(["compare", *map(str, files), "--json", str(out)]) == 0
    md = capsys.readouterr().out
    return md.splitlines(), json.loads(out.read_text())


def _row(lines: list[str], cand: str, base: str) -> str:
    """The TTFT line of the paired comparisons table for cand vs base, padding removed."""
    (line,) = [ln for ln in lines if ln.startswith(f"| {cand} vs {base} ") and "| ttft " in ln]
    return " ".join(line.split())


def _pair(data: dict[str, Any], cand: str, base: str) -> dict[str, Any]:
    (c,) = [
        c
        for c in data["comparisons"]
        if (c["candidate"], c["baseline"], c["metric"]) == (cand, base, "ttft")
        and c["load"] == {"concurrency": 4}
    ]
    return c


def test_two_sessions_get_the_estimate_only_one_session_its_ci(tmp_path: Path, capsys) -> None:
    a, b = _file(tmp_path / "a", 1.0), _file(tmp_path / "b", 0.8)
    lines, data = _compare(capsys, a, b)
    # b's baseline vs a's: two runs, one after the other
    across = _row(lines, "vllm@b/baseline", "vllm@a/baseline")
    assert "| 1.25x, CI n/a (sequential design) n=3 t | n/a (sequential design) |" in across
    assert "faster" not in across and "[" not in across, across
    assert any("separate sessions" in ln for ln in lines)  # the line that says why
    c = _pair(data, "vllm@b/baseline", "vllm@a/baseline")
    assert (c["lo"], c["hi"], c["verdict"], c["design"]) == (None, None, UNPAIRED, SEPARATE)
    assert round(c["estimate"], 2) == 1.25  # the estimate is still shown
    within = _pair(data, "vllm@a/ngram", "vllm@a/baseline")  # one file, one session
    assert within["lo"] is not None and within["verdict"] == "faster"
    assert "| 2.00x [2.00, 2.00] n=3 t | faster |" in _row(lines, "vllm@a/ngram", "vllm@a/baseline")

    # the same file with itself: one session, so its pairs keep their CIs
    lines, data = _compare(capsys, a, a / "results.json")
    assert _pair(data, "vllm@a#1/baseline", "vllm@a#0/baseline")["lo"] is not None
    assert "CI n/a" not in "\n".join(lines)

    # one session spread over files (its marker shared), against a file of another session
    s1, s2 = _file(tmp_path / "s1", 1.0, "S1"), _file(tmp_path / "s2", 0.8, "S1", spec=False)
    _, data = _compare(capsys, s1, s2)
    assert _pair(data, "vllm@s2/baseline", "vllm@s1/baseline")["verdict"] == "faster"
    s3 = _file(tmp_path / "s3", 0.8, "S3", spec=False)
    _, data = _compare(capsys, s1, s3)
    assert _pair(data, "vllm@s3/baseline", "vllm@s1/baseline")["verdict"] == UNPAIRED


def test_vllm_files_pair_within_a_session_only(tmp_path: Path, capsys) -> None:
    """Two ``vllm bench serve`` files ran one after the other: no CI; one file with itself, or
    the harness's own vLLM-shaped exports of one session (they carry its marker): CIs."""

    def vllm_file(name: str, scale: float, session: str | None = None) -> Path:
        res = _results([])
        runs = [{**_run("baseline", 8, scale * (1 + 0.01 * r * r), r)} for r in range(3)]
        if session is not None:
            runs = [{**r, "session": session} for r in runs]
        (tmp_path / name).mkdir()
        path = tmp_path / name / "bench.json"
        path.write_text("\n".join(json.dumps(from_run(res, r)) for r in runs))
        return path

    v1, v2 = vllm_file("v1", 1.0), vllm_file("v2", 0.8)
    lines, data = _compare(capsys, v1, v2)
    c = _pair(data, "vllm-bench@v2/baseline", "vllm-bench@v1/baseline")
    assert (c["lo"], c["verdict"]) == (None, UNPAIRED)
    assert "1.25x, CI n/a (sequential design)" in _row(
        lines, "vllm-bench@v2/baseline", "vllm-bench@v1/baseline"
    )
    _, data = _compare(capsys, v1, v1)
    assert _pair(data, "vllm-bench@v1#1/baseline", "vllm-bench@v1#0/baseline")["lo"] is not None
    e1, e2 = vllm_file("e1", 1.0, "S1"), vllm_file("e2", 0.8, "S1")
    _, data = _compare(capsys, e1, e2)
    assert _pair(data, "vllm-bench@e2/baseline", "vllm-bench@e1/baseline")["verdict"] == "faster"


def test_a_run_and_its_resume_are_one_session(tmp_path: Path, capsys) -> None:
    """Every run of results.json carries the session marker; ``--resume`` keeps the journal's,
    so compare pairs the resumed file with itself; another run is another session."""
    from tests.fake_server import Behaviour, FakeServer
    from tests.test_faults import ServerThread, run_harness

    other = tmp_path / "other"
    with ServerThread(FakeServer(Behaviour(tokens=6, delay=0.001))) as url:
        code, out = run_harness(tmp_path, url, 4, "--repeats", "2")
        assert code == 0, capsys.readouterr().err
        first = {r["session"] for r in json.loads((out / "results.json").read_text())["runs"]}
        code, _ = run_harness(tmp_path, url, 4, "--repeats", "3", "--resume", str(out))
        assert code == 0, capsys.readouterr().err
        code, _ = run_harness(tmp_path, url, 4, "--repeats", "3", "--output-dir", str(other))
        assert code == 0, capsys.readouterr().err
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert sorted(r["repeat"] for r in runs) == [0, 1, 2]
    assert len(first) == 1 and {r["session"] for r in runs} == first  # kept by --resume
    (again,) = {r["session"] for r in json.loads((other / "results.json").read_text())["runs"]}
    assert again not in first
    capsys.readouterr()
    _, data = _compare(capsys, out, other)
    across = [c for c in data["comparisons"] if c["candidate"] == "openai@other/baseline"]
    assert across and all(c["verdict"] == UNPAIRED and c["lo"] is None for c in across)

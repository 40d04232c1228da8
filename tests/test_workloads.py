"""Workload readers, detection, sampling, fingerprint and the one-line error messages."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from workloads import (
    DATA_DIR,
    Workload,
    WorkloadError,
    available_workloads,
    load_workload,
    shipped_path,
)

SHARED_SPECBENCH = Path("/work/shared/data/spec_bench/question.jsonl")


def write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# ---- shipped workloads -------------------------------------------------------------------------
def test_specbench_shipped_copy() -> None:
    w = load_workload("specbench")
    assert (w.name, w.fmt, len(w)) == ("specbench", "specbench", 480)
    cats = Counter(r.category for r in w.requests)
    assert cats["translation"] == cats["rag"] == 80 and cats["coding"] == 10 and len(cats) == 13
    first = json.loads(shipped_path("specbench").read_text(encoding="utf-8").splitlines()[0])
    r0 = w.requests[0]
    assert (r0.id, r0.prompt, r0.messages) == (str(first["question_id"]), first["turns"][0], None)
    assert r0.source.endswith("specbench_question.jsonl:1")
    if SHARED_SPECBENCH.exists():
        assert shipped_path("specbench").read_bytes() == SHARED_SPECBENCH.read_bytes()


def test_specbench_second_turn() -> None:
    with pytest.raises(
        WorkloadError, match=r"specbench_question\.jsonl:81: turns: no turn 1 \(has 1\)$"
    ):
        load_workload("specbench", turn=1)
    with pytest.warns(UserWarning, match="skipped 400 entries without turn 1"):
        w = load_workload("specbench", turn=1, skip_missing_turn=True)
    assert len(w) == 80 and w.skipped == 80 * 5
    first = json.loads(shipped_path("specbench").read_text(encoding="utf-8").splitlines()[0])
    assert w.requests[0].prompt == first["turns"][1]
    assert w.fingerprint != load_workload("specbench").fingerprint


def test_available_and_shipped_files_valid() -> None:
    names = available_workloads()
    assert set(names) == {"default", "grounded", "specbench", "tiny"}
    for name, desc in names.items():
        w = load_workload(name)
        assert desc and "\n" not in desc
        assert desc.split()[0] == str(len(w)) or f"{len(w)} prompts" in desc
    for lic in ("LICENSE-SPEC-BENCH", "LICENSE-PSF", "README.md"):
        assert (DATA_DIR / lic).stat().st_size > 500


def test_default_is_chat_across_categories_and_held_out() -> None:
    from harness.models.data import held_out

    w = load_workload("default")
    assert w.fmt == "native" and len(w) == 4
    assert all(r.messages and r.messages[0]["role"] == "user" and not r.prompt for r in w.requests)
    cats = Counter(r.category for r in w.requests)
    assert set(cats) == {"writing", "math_reasoning", "summarization", "code_edit"}
    assert {r.id for r in w.requests} <= held_out()  # the speculators never trained on them
    grounded = {r.id: r.prompt for r in load_workload("grounded").requests}
    for r in w.requests:
        if r.category == "code_edit":
            assert grounded[r.id] == r.messages[0]["content"]


def test_tiny_is_short_mixed() -> None:
    w = load_workload("tiny")
    assert w.fmt == "native" and len(w) == 16
    code = [r for r in w.requests if r.category == "code_edit"]
    complete = [r for r in w.requests if r.category == "code_complete"]
    others = {r.category for r in w.requests} - {"code_edit", "code_complete"}
    assert len(code) == 4 and len(complete) == 8 and len(others) == 4
    assert all(r.prompt and len(r.prompt) < 1000 for r in w.requests)
    assert all(r.prompt.split("\n\n", 1)[1].startswith("def ") for r in complete)
    grounded = {r.id: r.prompt for r in load_workload("grounded").requests}
    assert all(grounded[r.id] == r.prompt for r in code)


def test_grounded_code_prompts_quote_real_stdlib_functions() -> None:
    w = load_workload("grounded")
    cats = Counter(r.category for r in w.requests)
    assert cats == {"summarization": 80, "rag": 80, "code_edit": 20}
    for r in w.requests:
        if r.category == "code_edit":
            assert r.prompt is not None
            src = r.prompt.split("```python\n", 1)[1].rsplit("```", 1)[0]
            assert isinstance(ast.parse(src).body[0], ast.FunctionDef)


def test_make_grounded_reproduces_committed_files(tmp_path: Path) -> None:
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the committed files were made from CPython 3.11's stdlib")
    import workloads.make_grounded as mg

    code = mg.code_requests()
    for name, rows in (
        ("grounded", mg.grounded(code)),
        ("default", mg.default(code)),
        ("tiny", mg.tiny(code)),
    ):
        mg.write(tmp_path / f"{name}.jsonl", rows)
        assert (tmp_path / f"{name}.jsonl").read_bytes() == shipped_path(name).read_bytes()


# ---- readers on user files ---------------------------------------------------------------------
def test_native_prompt_and_messages(tmp_path: Path) -> None:
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]
    p = tmp_path / "mine.jsonl"
    p.write_text(
        json.dumps({"id": 7, "prompt": "def f(x):", "max_new_tokens": 16, "category": "code"})
        + "\n\n   \n"
        + json.dumps({"id": "b", "messages": msgs})
        + "\n",
        encoding="utf-8",
    )
    w = load_workload(str(p))
    assert (w.name, w.fmt, w.path, len(w)) == ("mine", "native", str(p), 2)
    a, b = w.requests
    assert (a.id, a.prompt, a.max_new_tokens, a.category, a.messages) == (
        "7",
        "def f(x):",
        16,
        "code",
        None,
    )
    assert b.prompt is None and b.messages == tuple(msgs) and b.source == f"{p}:4"


def test_sharegpt_json(tmp_path: Path) -> None:
    data = [
        {
            "id": "a",
            "conversations": [
                {"from": "human", "value": "Q1"},
                {"from": "gpt", "value": "A1"},
                {"from": "human", "value": "Q2"},
            ],
        },
        {
            "id": "b",
            "conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "Q"}],
        },
        {"id": "c", "conversations": [{"from": "gpt", "value": "hello"}]},
    ]
    p = tmp_path / "sg.json"
    p.write_text(json.dumps(data, indent=2), encoding="utf-8")
    with pytest.raises(WorkloadError) as e:
        load_workload(p)
    assert str(e.value) == f"{p}: entry 2: conversations: no human turn"
    with pytest.warns(UserWarning, match="skipped 1 entries"):
        w = load_workload(p, skip_missing_turn=True)
    assert w.fmt == "sharegpt" and [r.id for r in w.requests] == ["a", "b"]
    assert w.requests[0].prompt == "Q1" and w.requests[0].messages is None
    assert w.requests[1].messages == (
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q"},
    )
    with pytest.warns(UserWarning, match="skipped 2 entries without turn 1"):
        w1 = load_workload(p, turn=1, skip_missing_turn=True)
    assert [dict(m) for m in w1.requests[0].messages or ()] == [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "Q2"},
    ]


def test_vllm_custom(tmp_path: Path) -> None:
    p = write_jsonl(
        tmp_path / "custom.jsonl",
        [
            {"prompt": "What is the capital of India?", "output_tokens": 10},
            {"prompt": "What is the capital of Iran?"},
        ],
    )
    w = load_workload(p)
    assert w.fmt == "vllm-custom"
    assert [(r.id, r.prompt, r.max_new_tokens) for r in w.requests] == [
        ("0", "What is the capital of India?", 10),
        ("1", "What is the capital of Iran?", None),
    ]


@pytest.mark.parametrize(
    "row, fmt",
    [
        ({"question_id": 1, "category": "x", "turns": ["a"]}, "specbench"),
        ({"id": 1, "conversations": [{"from": "human", "value": "a"}]}, "sharegpt"),
        ({"prompt": "a", "output_tokens": 3}, "vllm-custom"),
        ({"prompt": "a"}, "vllm-custom"),
        ({"id": 1, "prompt": "a"}, "native"),
        ({"id": 1, "messages": [{"role": "user", "content": "a"}]}, "native"),
    ],
)
def test_detection_by_content(tmp_path: Path, row: dict, fmt: str) -> None:
    p = write_jsonl(tmp_path / "w.txt", [row])  # the suffix says nothing
    assert load_workload(p).fmt == fmt


def test_forced_format(tmp_path: Path) -> None:
    p = write_jsonl(tmp_path / "w.jsonl", [{"prompt": "a"}])
    with pytest.raises(WorkloadError, match=r"w\.jsonl:1: id: missing$"):
        load_workload(p, fmt="native")
    assert load_workload(p, fmt="vllm-custom").fmt == "vllm-custom"


# ---- sampling and fingerprint ------------------------------------------------------------------
def test_seeded_sampling() -> None:
    full = load_workload("specbench")
    a, b = load_workload("specbench", num_prompts=20), load_workload("specbench", num_prompts=20)
    c = load_workload("specbench", num_prompts=20, seed=1)
    assert a.requests == b.requests and a.fingerprint == b.fingerprint and len(a) == 20
    assert {r.id for r in a.requests} != {r.id for r in c.requests}
    order = {r.id: i for i, r in enumerate(full.requests)}
    idx = [order[r.id] for r in a.requests]
    assert idx == sorted(idx)  # file order kept
    assert load_workload("specbench", num_prompts=480).requests == full.requests
    more = load_workload("specbench", num_prompts=481)  # cycles: the file, then one fresh copy
    assert more.requests[:480] == full.requests and more.requests[480].id.endswith("~1")
    with pytest.raises(WorkloadError, match="^num_prompts: must be an integer >= 1, got 0$"):
        load_workload("specbench", num_prompts=0)


def test_fingerprint(tmp_path: Path) -> None:
    rows = [{"id": 1, "prompt": "a"}, {"id": 2, "prompt": "b"}]
    p1 = write_jsonl(tmp_path / "one.jsonl", rows)
    p2 = write_jsonl(
        tmp_path / "two.jsonl", [{**r, "category": "c", "max_new_tokens": 5} for r in rows]
    )
    p3 = write_jsonl(tmp_path / "three.jsonl", [rows[0], {"id": 2, "prompt": "B"}])
    p4 = write_jsonl(tmp_path / "four.jsonl", [rows[0], {"id": 3, "prompt": "b"}])
    p5 = write_jsonl(
        tmp_path / "five.jsonl",
        [rows[0], {"id": 2, "messages": [{"role": "user", "content": "b"}]}],
    )
    f = [load_workload(p).fingerprint for p in (p1, p2, p3, p4, p5)]
    assert f[0] == f[1]  # ids and prompts only
    assert len(set(f[1:])) == 4 and all(len(x) == 64 for x in f)
    w = load_workload(p1)
    with pytest.raises(AttributeError):
        w.fingerprint = "x"  # type: ignore[misc]
    assert Workload(w.name, w.path, w.fmt, w.requests[:1]).fingerprint != w.fingerprint


# ---- errors: one line, with path, place and field ----------------------------------------------
NATIVE_BAD = [
    (
        '{"id": 1, "prompt": "a"}\n{"id": 2, "prompt": "b",}\n',
        "2: invalid JSON: Expecting property name enclosed in double quotes (column 25)",
    ),
    ('{"id": 1, "prompt": "a"}\n[1, 2]\n', "2: expected a JSON object, got list"),
    ('{"id": 1, "prompt": "a"}\n\n{"prompt": "b", "category": "x"}\n', "3: id: missing"),
    ('{"id": 1.5, "prompt": "a"}\n', "1: id: must be a string or an integer, got float"),
    ('{"id": true, "prompt": "a"}\n', "1: id: must be a string or an integer, got bool"),
    ('{"id": 1}\n', "1: prompt: give exactly one of prompt or messages"),
    ('{"id": 1, "prompt": "  \\n "}\n', "1: prompt: empty prompt"),
    ('{"id": 1, "prompt": 5}\n', "1: prompt: must be a string, got int"),
    ('{"id": 1, "prompt": "a", "max_new_tokens": 0}\n', "1: max_new_tokens: must be > 0, got 0"),
    (
        '{"id": 1, "prompt": "a", "max_new_tokens": "9"}\n',
        "1: max_new_tokens: must be an integer > 0, got '9'",
    ),
    (
        '{"id": 1, "prompt": "a", "max_new_tokens": 2.0}\n',
        "1: max_new_tokens: must be an integer > 0, got 2.0",
    ),
    (
        '{"id": 1, "prompt": "a", "max_tokens": 9}\n',
        "1: max_tokens: unknown field (expected one of id, prompt, messages, max_new_tokens, "
        "category)",
    ),
    ('{"id": 1, "prompt": "a", "category": 3}\n', "1: category: must be a string, got int"),
    (
        '{"id": 1, "prompt": "a"}\n{"id": "1", "prompt": "b"}\n',
        "2: id: duplicate id '1' (first at line 1)",
    ),
    ('{"id": 1, "messages": []}\n', "1: messages: empty list"),
    ('{"id": 1, "messages": [{"role": "user"}]}\n', "1: messages[0].content: missing"),
    (
        '{"id": 1, "messages": [{"role": "user", "content": ["x"]}]}\n',
        "1: messages[0].content: must be a string, got list",
    ),
    (
        '{"id": 1, "messages": [{"role": "user", "content": ""}]}\n',
        "1: messages: empty prompt: every content is empty",
    ),
    ('{"question_id": 1, "category": "x", "turns": []}\n', "1: turns: empty list"),
    ('{"question_id": 1, "category": "x", "turns": [""]}\n', "1: turns[0]: empty prompt"),
    (
        '{"question_id": 1, "turns": ["a"]}\n{"question_id": 1, "turns": ["b"]}\n',
        "2: question_id: duplicate id '1' (first at line 1)",
    ),
    ('{"prompt": "a", "output_tokens": -3}\n', "1: output_tokens: must be > 0, got -3"),
    ('{"text": "a"}\n', "1: cannot tell the format from the keys (text); pass fmt"),
]


@pytest.mark.parametrize("content, expected", NATIVE_BAD)
def test_bad_jsonl(tmp_path: Path, content: str, expected: str) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text(content, encoding="utf-8")
    with pytest.raises(WorkloadError) as e:
        load_workload(str(p))
    assert str(e.value) == f"{p}:{expected}"
    assert "\n" not in str(e.value)


SHAREGPT_BAD = [
    (
        [{"id": "a", "conversations": [{"from": "gpt", "value": "x"}]}],
        "entry 0: conversations: no human turn",
    ),
    (
        [{"id": "a", "conversations": [{"from": "human", "value": "x"}]}, {"id": "b"}],
        "entry 1: conversations: missing",
    ),
    ([{"id": "a", "conversations": "hi"}], "entry 0: conversations: must be a list, got str"),
    (
        [{"id": "a", "conversations": [{"from": "robot", "value": "x"}]}],
        "entry 0: conversations[0].from: unknown speaker 'robot'",
    ),
    (
        [{"id": "a", "conversations": [{"from": "human"}]}],
        "entry 0: conversations[0].value: missing",
    ),
    (
        [{"id": "a", "conversations": [{"from": "human", "value": " "}]}],
        "entry 0: conversations[0].value: empty prompt",
    ),
    (
        [{"id": "a", "conversations": [{"from": "human", "value": "x"}]}, "oops"],
        "entry 1: expected a JSON object, got str",
    ),
    (
        [{"id": "a", "conversations": [{"from": "human", "value": "x"}]}] * 2,
        "entry 1: id: duplicate id 'a' (first at entry 0)",
    ),
    ([], "empty list: no entries"),
]


@pytest.mark.parametrize("data, expected", SHAREGPT_BAD)
def test_bad_sharegpt(tmp_path: Path, data: object, expected: str) -> None:
    p = tmp_path / "sg.json"
    p.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(WorkloadError) as e:
        load_workload(p, fmt="sharegpt")
    assert str(e.value) == f"{p}: {expected}"


def test_bad_json_document(tmp_path: Path) -> None:
    p = tmp_path / "sg.json"
    p.write_text('[\n  {"id": "a",\n   "conversations": [}\n]\n', encoding="utf-8")
    with pytest.raises(WorkloadError) as e:
        load_workload(p)
    assert str(e.value) == f"{p}:3: invalid JSON: Expecting value (column 22)"


def test_non_utf8(tmp_path: Path) -> None:
    p = tmp_path / "latin.jsonl"
    p.write_bytes(b'{"id": 1, "prompt": "a"}\n{"id": 2, "prompt": "caf\xe9"}\n')
    with pytest.raises(WorkloadError) as e:
        load_workload(p)
    assert str(e.value) == f"{p}:2: not UTF-8: byte 0xe9 at byte offset 49"


def test_bom_accepted(tmp_path: Path) -> None:
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b'\xef\xbb\xbf{"id": 1, "prompt": "a"}\n')
    assert load_workload(p).requests[0].prompt == "a"


@pytest.mark.parametrize("content", ["", "\n  \n\n"])
def test_empty_file(tmp_path: Path, content: str) -> None:
    p = tmp_path / "empty.jsonl"
    p.write_text(content, encoding="utf-8")
    with pytest.raises(WorkloadError) as e:
        load_workload(p)
    assert str(e.value) == f"{p}: empty file"


def test_spec_errors(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError) as e:
        load_workload("specbnech")
    assert str(e.value) == (
        "unknown workload 'specbnech' (valid: default, grounded, specbench, tiny, or a file path)"
    )
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(WorkloadError) as e:
        load_workload(missing)
    assert str(e.value) == f"{missing}: file not found"
    with pytest.raises(WorkloadError) as e:
        load_workload(tmp_path)
    assert str(e.value) == f"{tmp_path}: is a directory, not a workload file"
    with pytest.raises(WorkloadError) as e:
        load_workload("specbench", fmt="csv")
    assert (
        str(e.value)
        == "fmt: unknown format 'csv' (valid: native, specbench, sharegpt, vllm-custom)"
    )
    with pytest.raises(WorkloadError, match="^turn: must be an integer >= 0, got -1$"):
        load_workload("specbench", turn=-1)


def test_whole_file_validated_up_front(tmp_path: Path) -> None:
    rows: list[object] = [{"id": i, "prompt": f"p{i}"} for i in range(50)]
    rows.append({"id": 50, "prompt": ""})
    p = write_jsonl(tmp_path / "late.jsonl", rows)
    with pytest.raises(WorkloadError, match=r"late\.jsonl:51: prompt: empty prompt$"):
        load_workload(p, num_prompts=2)


def test_no_project_or_torch_imports() -> None:
    code = (
        "import sys, workloads, workloads.readers, workloads.make_grounded;"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'transformers', 'vllm', 'harness', 'engines', 'numpy')];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert r.returncode == 0, r.stdout + r.stderr

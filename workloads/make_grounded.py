"""Regenerate the shipped ``grounded.jsonl`` and ``default.jsonl`` (native JSONL).

Run from the project root: ``python -m workloads.make_grounded``.

- ``grounded``: Spec-Bench's summarization and rag prompts (real prompts whose answers copy from
  the input) plus 20 code-editing prompts built from functions of the running interpreter's
  standard library (Python Software Foundation License, see ``data/LICENSE-PSF``). The committed
  files were made with CPython 3.11; another version may give slightly different sources.
- ``default``: 4 chat prompts for the default run on SmolLM2-135M-Instruct: 2 of Spec-Bench's
  general categories (writing, math) and 2 input-grounded ones (a summary, a code edit),
  ``DEFAULT_IDS``: 4 x 32 tokens per latency repeat (harness/flags/plan.py), so the main job (4 variants, 2 modes,
  4 repeats) fits 10 minutes on 2 cores (docs/statistics.md: Power).
- ``tiny``: 16 short prompts sized for the tiny test pair (a code model): 8 code completions
  (the head of a stdlib function: signature, docstring, first lines; the model continues it),
  4 of the code edits (one of each kind) and the first Spec-Bench prompt under 1000 characters
  of 4 categories.

The output is deterministic for a given interpreter version.
"""

from __future__ import annotations

import ast
import importlib
import json
import sys
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"
SPECBENCH = DATA / "specbench_question.jsonl"

TEMPLATES = {
    "hints": "Add type hints to this Python function. Reply with the complete function.",
    "docstring": "Add a docstring to this Python function. Reply with the complete function.",
    "rename": "Rename the variable `{old}` to `{new}` in this Python function. "
    "Reply with the complete function.",
    "fstring": "Rewrite this Python function to use f-strings instead of str.format. "
    "Reply with the complete function.",
}

# (kind, module, function, rename-from, rename-to)
CODE_TASKS: list[tuple[str, str, str, str, str]] = [
    ("hints", "colorsys", "rgb_to_hsv", "", ""),
    ("docstring", "colorsys", "yiq_to_rgb", "", ""),
    ("rename", "posixpath", "split", "i", "index"),
    ("fstring", "difflib", "_format_range_unified", "", ""),
    ("hints", "colorsys", "hls_to_rgb", "", ""),
    ("docstring", "heapq", "_siftdown", "", ""),
    ("rename", "heapq", "heapify", "n", "size"),
    ("fstring", "difflib", "_format_range_context", "", ""),
    ("hints", "statistics", "median", "", ""),
    ("hints", "calendar", "monthrange", "", ""),
    ("hints", "html", "escape", "", ""),
    ("hints", "fnmatch", "filter", "", ""),
    ("hints", "shutil", "ignore_patterns", "", ""),
    ("docstring", "glob", "_rlistdir", "", ""),
    ("docstring", "locale", "_strip_padding", "", ""),
    ("docstring", "zipfile", "_strip_extra", "", ""),
    ("rename", "genericpath", "commonprefix", "s1", "smallest"),
    ("rename", "statistics", "multimode", "maxcount", "top_count"),
    ("rename", "calendar", "timegm", "days", "total_days"),
    ("rename", "shutil", "copyfileobj", "buf", "chunk"),
]

DEFAULT_CATEGORIES = (
    "coding",
    "translation",
    "qa",
    "math_reasoning",
    "summarization",
    "writing",
    "reasoning",
    "extraction",
)
MAX_DEFAULT_CHARS = 1000
HELD_OUT = 4  # the first 4 prompts of each category are never trained on (default draws here)
# free-form Spec-Bench categories, then input-grounded ones (a summary, a code edit) where the
# answer copies from the prompt; short prompts (prefill is paid in every latency repeat)
DEFAULT_IDS = (
    "81",  # writing (free-form: a model speculator's ground)
    "401",  # math_reasoning
    "243",  # summarization (copies from its input: n-gram's ground)
    "code-02",  # rename a variable (copies the function back)
)


def function_source(module: str, name: str) -> tuple[str, ast.FunctionDef]:
    """The source text of a top-level function of a stdlib module, read from its file."""
    mod = importlib.import_module(module)
    text = Path(mod.__file__ or "").read_text(encoding="utf-8")
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            seg = ast.get_source_segment(text, node)
            assert seg is not None
            return seg, node
    raise LookupError(f"{module}.{name} not found")


def code_requests() -> list[dict[str, Any]]:
    out = []
    for i, (kind, module, name, old, new) in enumerate(CODE_TASKS):
        src, node = function_source(module, name)
        if kind == "docstring":
            assert ast.get_docstring(node) is None, f"{module}.{name} has a docstring"
        if kind == "rename":
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            assert old in names, f"{module}.{name} has no variable {old}"
        if kind == "fstring":
            assert ".format(" in src, f"{module}.{name} has no str.format"
        head = TEMPLATES[kind].format(old=old, new=new)
        prompt = f"{head}\n\n```python\n{src}\n```\n"
        out.append({"id": f"code-{i:02d}", "prompt": prompt, "category": "code_edit"})
    return out


COMPLETE_LINES = 0.5  # a completion prompt is the first half of the function's lines
MAX_COMPLETE_CHARS = 600


def completion_requests() -> list[dict[str, Any]]:
    """The head of each stdlib function (at most MAX_COMPLETE_CHARS), to be continued."""
    out = []
    for i, (_, module, name, _, _) in enumerate(CODE_TASKS):
        lines = function_source(module, name)[0].splitlines(keepends=True)
        head = lines[: max(2, int(len(lines) * COMPLETE_LINES))]
        while len(head) > 2 and len("".join(head)) > MAX_COMPLETE_CHARS:
            head.pop()
        prompt = f"# {module}.py\n\n" + "".join(head)
        out.append({"id": f"complete-{i:02d}", "prompt": prompt, "category": "code_complete"})
    return out


def specbench() -> list[dict[str, Any]]:
    with SPECBENCH.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def native(q: dict[str, Any]) -> dict[str, Any]:
    return {"id": str(q["question_id"]), "prompt": q["turns"][0], "category": q["category"]}


def grounded(code: list[dict[str, Any]]) -> list[dict[str, Any]]:
    sb = [native(q) for q in specbench() if q["category"] in ("summarization", "rag")]
    return sb + code


def default(code: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The default run's chat prompts (one user turn, rendered by the model's chat template in
    every engine): DEFAULT_IDS, all among the prompts the shipped speculators never trained on
    (the first HELD_OUT of each category, see ``harness.models.data.held_out``)."""
    qs = {str(q["question_id"]): q for q in specbench()}
    edits = {r["id"]: r for r in code}
    out = []
    for rid in DEFAULT_IDS:
        if rid in edits:
            text, cat = edits[rid]["prompt"], "code_edit"
        else:
            text, cat = qs[rid]["turns"][0], qs[rid]["category"]
        out.append({"id": rid, "messages": [{"role": "user", "content": text}], "category": cat})
    return out


def tiny(code: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tiny test pair's prompts: code completions, edits and short Spec-Bench prompts."""
    qs = specbench()
    sb = []
    for cat in DEFAULT_CATEGORIES[:4]:
        q = next(q for q in qs if q["category"] == cat and len(q["turns"][0]) < MAX_DEFAULT_CHARS)
        sb.append(native(q))
    picked = [r for r in code if len(r["prompt"]) < MAX_DEFAULT_CHARS]
    edits: list[dict[str, Any]] = []
    for kind in TEMPLATES:  # one of each kind, in task order
        ids = [f"code-{i:02d}" for i, t in enumerate(CODE_TASKS) if t[0] == kind]
        edits += [r for r in picked if r["id"] in ids][:1]
    complete = completion_requests()[:8]
    assert len(edits) == 4 and len(sb) == 4 and len(complete) == 8
    others = [r for pair in zip(edits, sb) for r in pair]
    return [r for pair in zip(complete, others) for r in pair]


def write(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"wrote {path} ({len(rows)} prompts)", file=sys.stderr)


def main() -> None:
    code = code_requests()
    write(DATA / "grounded.jsonl", grounded(code))
    write(DATA / "default.jsonl", default(code))
    write(DATA / "tiny.jsonl", tiny(code))


if __name__ == "__main__":
    main()

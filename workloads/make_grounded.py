"""Regenerate the shipped ``grounded.jsonl`` and ``default.jsonl`` (native JSONL).

Run from the project root: ``python -m workloads.make_grounded``.

- ``grounded``: Spec-Bench's summarization and rag prompts (real prompts whose answers copy from
  the input) plus 20 code-editing prompts built from functions of the running interpreter's
  standard library (Python Software Foundation License, see ``data/LICENSE-PSF``). The committed
  files were made with CPython 3.11; another version may give slightly different sources.
- ``default``: 16 short prompts (< 1000 characters each): 8 of the code edits (two of each kind)
  and the first Spec-Bench prompt under 1000 characters of 8 categories, interleaved.

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


def specbench() -> list[dict[str, Any]]:
    with SPECBENCH.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def native(q: dict[str, Any]) -> dict[str, Any]:
    return {"id": str(q["question_id"]), "prompt": q["turns"][0], "category": q["category"]}


def grounded(code: list[dict[str, Any]]) -> list[dict[str, Any]]:
    sb = [native(q) for q in specbench() if q["category"] in ("summarization", "rag")]
    return sb + code


def default(code: list[dict[str, Any]]) -> list[dict[str, Any]]:
    qs = specbench()
    sb = []
    for cat in DEFAULT_CATEGORIES:
        q = next(q for q in qs if q["category"] == cat and len(q["turns"][0]) < MAX_DEFAULT_CHARS)
        sb.append(native(q))
    picked = [r for r in code if len(r["prompt"]) < MAX_DEFAULT_CHARS]
    short_code: list[dict[str, Any]] = []
    for kind in TEMPLATES:  # two of each kind, in task order
        ids = [f"code-{i:02d}" for i, t in enumerate(CODE_TASKS) if t[0] == kind]
        short_code += [r for r in picked if r["id"] in ids][:2]
    assert len(short_code) == 8 and len(sb) == 8
    return [r for pair in zip(short_code, sb) for r in pair]


def write(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"wrote {path} ({len(rows)} prompts)", file=sys.stderr)


def main() -> None:
    code = code_requests()
    write(DATA / "grounded.jsonl", grounded(code))
    write(DATA / "default.jsonl", default(code))


if __name__ == "__main__":
    main()

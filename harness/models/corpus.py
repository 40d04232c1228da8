"""The training prompts of SmolLM2's speculators: built here, never taken from the prompts the
harness evaluates on (Spec-Bench, the default workload, the grounded code edits).

Three sources, all deterministic for a seed and an interpreter version (CPython 3.11 made the
committed build):

- **Open tasks**: this project's own instruction templates (writing, explanation, advice,
  comparison, lists, roleplay) over this project's own topic list. Written for this file; no third-party text.
- **Grounded tasks** whose answer copies from the input, as the default workload's summary and
  code edit do: the source of functions of the running interpreter's standard library (edit,
  annotate, document, rename, explain) and the docstrings of its modules (summarize, answer a
  question from the passage). CPython's sources are under the PSF License
  (``workloads/data/LICENSE-PSF``); the functions the grounded workload uses
  (``workloads.make_grounded.CODE_TASKS``) are excluded.
- **Arithmetic word problems** from templates with seeded numbers.
- **Long passages** (``long_prompts``): sections of the Python reference manual that ships
  with the interpreter (``pydoc_data.topics``, PSF License), 1,500-3,600 characters each
  (400-1,000 tokens; the distill drops those over 1,024), to summarize, list or explain: the default workload's news summary reads a
  600-token article, longer than any prompt of the three kinds above (at most 384 tokens).

The answers are the target's own (``harness.models.distill``): self-distillation, so the labels
are what the target would say.
"""

from __future__ import annotations

import ast
import functools
import importlib
import random
import warnings
from pathlib import Path
from typing import Any

TOPICS = (
    "volcanoes", "the water cycle", "photosynthesis", "black holes", "the Roman Empire",
    "the printing press", "honey bees", "climate change", "the human heart", "earthquakes",
    "renewable energy", "the stock market", "inflation", "a healthy breakfast", "sleep",
    "learning a new language", "chess", "the Olympic Games", "jazz music",
    "impressionist painting", "the internet", "electric cars", "recycling", "the moon",
    "Mars exploration", "coral reefs", "rain forests", "deserts", "the Great Wall of China",
    "ancient Egypt", "the Renaissance", "the industrial revolution", "vaccines", "bacteria",
    "the immune system", "dinosaurs", "evolution", "DNA", "gravity", "magnets", "electricity",
    "light", "sound waves", "rainbows", "clouds", "hurricanes", "glaciers", "rivers", "mountains",
    "oceans", "penguins", "elephants", "dolphins", "wolves", "cats", "dogs", "gardening",
    "cooking pasta", "baking bread", "coffee", "tea", "chocolate", "a picnic", "a rainy day",
    "a city at night", "a small village", "friendship", "kindness", "patience", "courage",
    "time management", "public speaking", "job interviews", "saving money", "budgeting",
    "starting a business", "teamwork", "leadership", "remote work", "email etiquette",
    "writing a resume", "studying for exams", "reading books", "libraries", "museums",
    "travel by train", "airplanes", "bicycles", "hiking", "camping", "swimming", "running", "yoga",
    "meditation", "first aid", "fire safety", "online privacy", "passwords", "computer viruses",
    "databases", "sorting algorithms", "recursion", "version control", "unit testing",
    "web browsers", "spreadsheets", "robots", "artificial intelligence", "smartphones",
    "social media", "video games", "photography", "film making", "theatre", "poetry",
    "fairy tales", "the solar system", "stars", "telescopes", "microscopes",
    "chemistry experiments", "the periodic table", "acids and bases", "weather forecasts", "maps",
    "compasses", "the history of money", "markets", "farming", "bread wheat", "trees", "autumn",
    "winter", "spring", "summer holidays", "birthdays", "weddings", "a school trip", "a lost key",
    "a talking cat", "a lighthouse keeper", "a dragon", "a robot who learns to paint",
)  # fmt: skip

OPEN_TEMPLATES = (
    "Write a short essay about {t}.",
    "Explain {t} to a ten-year-old.",
    "Give me five interesting facts about {t}.",
    "What are the advantages and disadvantages of {t}?",
    "Write a short poem about {t}.",
    "Write a short story that involves {t}.",
    "Give three practical tips related to {t}.",
    "Describe {t} in detail.",
    "Why is {t} important? Answer in a few paragraphs.",
    "Write a blog post introduction about {t}.",
    "Compare {t} and {u}. How are they similar and how are they different?",
    "Imagine you are a tour guide. Introduce {t} to a group of visitors.",
    "Write a persuasive paragraph arguing that everyone should learn about {t}.",
    "List the main steps someone should follow to get started with {t}.",
    "Write an email to a friend telling them what you learned about {t}.",
    "Summarize what most people get wrong about {t}.",
)

CODE_TEMPLATES = {
    "hints": "Add type hints to this Python function. Reply with the complete function.",
    "docstring": "Add a docstring to this Python function. Reply with the complete function.",
    "rename": "Rename the variable `{old}` to `{new}` in this Python function. "
    "Reply with the complete function.",
    "explain": "Explain what this Python function does, step by step.",
    "tests": "Write unit tests with pytest for this Python function.",
    "comments": "Add comments to this Python function explaining each step. "
    "Reply with the complete function.",
}

TEXT_TEMPLATES = (
    "Summarize the following text in a few sentences.\n\n{text}",
    "Read the passage below and list its key points.\n\n{text}",
    "Based only on the passage below, explain what `{name}` is used for.\n\n{text}",
    "Rewrite the following documentation in plain language for a beginner.\n\n{text}",
)

MATH_TEMPLATES = (
    "A shop sells pencils for {a} cents each. Maria buys {b} pencils and pays with a {c} dollar "
    "bill. How much change does she get? Explain your reasoning.",
    "A train travels {a} kilometers in {b} hours. At the same speed, how far does it travel in "
    "{c} hours? Show your steps.",
    "Tom has {a} apples. He gives {b} to his sister and then buys {c} more. How many apples "
    "does he have now? Think step by step.",
    "A rectangle is {a} meters long and {b} meters wide. What are its area and its perimeter? "
    "If each side is increased by {c} meters, what is the new area?",
    "A class has {a} students. {b} percent of them walk to school and the rest take the bus. "
    "How many take the bus? Explain.",
    "Solve for x: {a}x + {b} = {c}. Show each step.",
    "A recipe needs {a} grams of flour for {b} cookies. How much flour is needed for {c} "
    "cookies? Explain your answer.",
    "What is {a} multiplied by {b}, minus {c}? Show your work.",
)

NEW_NAMES = ("value", "result", "item", "count", "total", "current", "text", "index", "node")
MODULES = (
    "argparse",
    "ast",
    "base64",
    "bisect",
    "calendar",
    "cmd",
    "codecs",
    "collections",
    "colorsys",
    "configparser",
    "copy",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "dis",
    "email.utils",
    "enum",
    "filecmp",
    "fileinput",
    "fnmatch",
    "fractions",
    "ftplib",
    "functools",
    "getopt",
    "gettext",
    "glob",
    "gzip",
    "hashlib",
    "heapq",
    "hmac",
    "html",
    "html.parser",
    "http.cookies",
    "imaplib",
    "inspect",
    "ipaddress",
    "json.decoder",
    "json.encoder",
    "keyword",
    "linecache",
    "locale",
    "logging",
    "mailbox",
    "mimetypes",
    "netrc",
    "ntpath",
    "numbers",
    "opcode",
    "operator",
    "optparse",
    "os",
    "pathlib",
    "pickle",
    "pickletools",
    "pkgutil",
    "platform",
    "plistlib",
    "poplib",
    "posixpath",
    "pprint",
    "profile",
    "pstats",
    "py_compile",
    "pydoc",
    "queue",
    "quopri",
    "random",
    "re",
    "reprlib",
    "sched",
    "secrets",
    "selectors",
    "shlex",
    "shutil",
    "smtplib",
    "socketserver",
    "statistics",
    "string",
    "stringprep",
    "subprocess",
    "symtable",
    "tabnanny",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "timeit",
    "token",
    "tokenize",
    "trace",
    "traceback",
    "tracemalloc",
    "types",
    "typing",
    "urllib.parse",
    "urllib.request",
    "uu",
    "uuid",
    "warnings",
    "wave",
    "weakref",
    "webbrowser",
    "xml.dom.minidom",
    "zipfile",
    "zipimport",
)
LONG_TEMPLATES = TEXT_TEMPLATES[:2] + (
    "Explain the following section of the Python reference to a beginner, with its main "
    "rules.\n\n{text}",
    "Write a short summary of the passage below, then quote its most important sentence.\n\n{text}",
)
LONG_MIN_CHARS, LONG_MAX_CHARS = 1500, 3600
MAX_SOURCE_CHARS = 1200
MIN_DOC_CHARS = 300
MAX_DOC_CHARS = 1500


def _excluded() -> set[tuple[str, str]]:
    from workloads.make_grounded import CODE_TASKS

    return {(m, f) for _, m, f, _, _ in CODE_TASKS}


@functools.cache
def _sources() -> tuple[tuple[tuple[str, str, ast.FunctionDef], ...], tuple[tuple[str, str], ...]]:
    """(module, source, node) of short top-level functions and (name, text) of long module
    and function docstrings, over MODULES (each module's own file, read as text). Parsed once
    per process (seconds): every seed draws from the same sources."""
    funcs: list[tuple[str, str, ast.FunctionDef]] = []
    docs: list[tuple[str, str]] = []
    skip = _excluded()
    for name in MODULES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                mod = importlib.import_module(name)
            except ImportError:
                continue
        path = Path(getattr(mod, "__file__", "") or "")
        if path.suffix != ".py":
            continue
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        doc = ast.get_docstring(tree)
        if doc and len(doc) >= MIN_DOC_CHARS:
            docs.append((name, doc[:MAX_DOC_CHARS]))
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or (name, node.name) in skip:
                continue
            seg = ast.get_source_segment(text, node)
            if seg and 120 <= len(seg) <= MAX_SOURCE_CHARS:
                funcs.append((name, seg, node))
            d = ast.get_docstring(node)
            if d and MIN_DOC_CHARS <= len(d) <= MAX_DOC_CHARS:
                docs.append((f"{name}.{node.name}", d))
    return tuple(funcs), tuple(docs)


def _code_prompt(rng: random.Random, src: str, node: ast.FunctionDef) -> str:
    kinds = ["hints", "explain", "tests", "comments"]
    if ast.get_docstring(node) is None:
        kinds.append("docstring")
    names = sorted(
        {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    )
    if names:
        kinds += ["rename", "rename"]
    kind = rng.choice(kinds)
    if kind == "rename":
        old = rng.choice(names)
        new = rng.choice([n for n in NEW_NAMES if n not in names and n != old] or ["renamed"])
        head = CODE_TEMPLATES[kind].format(old=old, new=new)
    else:
        head = CODE_TEMPLATES[kind]
    return f"{head}\n\n```python\n{src}\n```\n"


def prompts(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` training prompts (id, category, prompt): about 45% open tasks, 30% code, 15%
    passages, 10% arithmetic, interleaved; seeded."""
    rng = random.Random(seed)
    funcs, docs = _sources()
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    shares = (("open", 0.45), ("code", 0.30), ("passage", 0.15), ("math", 0.10))
    for cat, share in shares:
        i = tries = 0
        while i < round(n * share) and tries < 50 * n:  # distinct prompts only
            tries += 1
            if cat == "open":
                t, u = rng.sample(TOPICS, 2)
                text = rng.choice(OPEN_TEMPLATES).format(t=t, u=u)
            elif cat == "code":
                _, src, node = funcs[rng.randrange(len(funcs))]
                text = _code_prompt(rng, src, node)
            elif cat == "passage":
                name, doc = docs[rng.randrange(len(docs))]
                text = rng.choice(TEXT_TEMPLATES).format(text=doc, name=name.split(".")[-1])
            else:
                a, b, c = rng.randint(2, 60), rng.randint(2, 30), rng.randint(2, 90)
                text = rng.choice(MATH_TEMPLATES).format(a=a, b=b, c=c)
            if text in seen:
                continue
            seen.add(text)
            out.append({"id": f"{cat}-{i:05d}", "category": cat, "prompt": text})
            i += 1
    rng.shuffle(out)
    return out[:n]


@functools.cache
def _long_passages() -> tuple[tuple[str, str], ...]:
    """(topic, passage) of ``pydoc_data.topics``: each topic cut at paragraph breaks into
    passages of whole paragraphs, LONG_MIN_CHARS..LONG_MAX_CHARS characters, or one longer
    paragraph (a table); shorter tails dropped. The distill's token limit bounds them all."""
    from pydoc_data.topics import topics

    out = []
    for name in sorted(topics):
        cur = ""
        for para in topics[name].split("\n\n"):
            if cur and len(cur) + len(para) + 2 > LONG_MAX_CHARS:
                if len(cur) >= LONG_MIN_CHARS:
                    out.append((name, cur))
                cur = ""
            cur = f"{cur}\n\n{para}" if cur else para
        if LONG_MIN_CHARS <= len(cur) <= LONG_MAX_CHARS:
            out.append((name, cur))
    return tuple(out)


def long_prompts(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """The distinct ones of ``n`` long-passage prompts (id, category "long", prompt); seeded.
    Some topics share a passage (the operator table, ...): a repeat is dropped, ids stay put."""
    rng = random.Random(seed)
    pairs = [(p, t) for p in _long_passages() for t in LONG_TEMPLATES]
    rng.shuffle(pairs)
    out, seen = [], set()
    for i, ((name, passage), template) in enumerate(pairs[:n]):
        text = template.format(text=passage, name=name)
        if text not in seen:
            seen.add(text)
            out.append({"id": f"long-{i:05d}", "category": "long", "prompt": text})
    return out

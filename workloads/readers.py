"""Readers for the workload file formats, with one-line, located error messages.

Formats (``FORMATS``):

- ``native``: JSONL, one request a line: ``id`` (str or int), ``prompt`` (str) or ``messages``
  (list of ``{role, content}``), optional ``max_new_tokens`` (int > 0) and ``category`` (str).
  Unknown keys are errors (a typo such as ``max_tokens`` would otherwise pass silently).
- ``specbench``: Spec-Bench ``question.jsonl``: ``question_id``, ``category``, ``turns``.
  The prompt is ``turns[turn]``, alone (Spec-Bench has no reference answers for earlier turns).
- ``sharegpt``: a JSON list (or JSONL) of ``{id, conversations: [{from, value}]}``. Turn ``k``
  is the ``k``-th human turn: a plain prompt when nothing precedes it, else the messages up to
  and including it (``human`` -> user, ``gpt`` -> assistant, ``system`` -> system).
- ``vllm-custom``: vLLM bench's custom JSONL: ``prompt``, optional ``output_tokens``
  (-> ``max_new_tokens``). Ids are the 0-based entry indices.

Every error is a :class:`WorkloadError` whose ``str()`` is one line:
``path:LINE: field: what is wrong`` (JSONL, 1-based line) or
``path: entry N: field: what is wrong`` (JSON list, 0-based entry index).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workloads.base import Request

FORMATS = ("native", "specbench", "sharegpt", "vllm-custom")
NATIVE_KEYS = ("id", "prompt", "messages", "max_new_tokens", "category")
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "system": "system",
}
_BOM = b"\xef\xbb\xbf"


class WorkloadError(Exception):
    """A bad workload spec or file; ``str()`` is one line that names path, place and field."""

    def __init__(
        self,
        path: str | Path | None,
        msg: str,
        *,
        line: int | None = None,
        entry: int | None = None,
        field: str | None = None,
    ) -> None:
        self.path = None if path is None else str(path)
        self.line, self.entry, self.field = line, entry, field
        self.msg = " ".join(msg.split())  # one line, whatever the message held
        parts: list[str] = []
        if self.path is not None:
            parts.append(self.path if line is None else f"{self.path}:{line}")
        if entry is not None:
            parts.append(f"entry {entry}")
        if field is not None:
            parts.append(field)
        parts.append(self.msg)
        super().__init__(": ".join(parts))


@dataclass(frozen=True)
class Loc:
    """Where an entry sits: a JSONL line (1-based) or a JSON list index (0-based)."""

    path: str
    line: int | None = None
    entry: int | None = None

    def error(self, field: str | None, msg: str) -> WorkloadError:
        return WorkloadError(self.path, msg, line=self.line, entry=self.entry, field=field)

    @property
    def source(self) -> str:
        return f"{self.path}:{self.line}" if self.line is not None else f"{self.path}#{self.entry}"


class MissingTurn(Exception):
    """An entry lacks the asked-for turn (skippable when the caller says so)."""

    def __init__(self, err: WorkloadError) -> None:
        super().__init__(str(err))
        self.err = err


# ---- raw file access ---------------------------------------------------------------------------
def read_text(path: Path, shown: str) -> str:
    """The file's text; a one-line error for a missing file or bytes that are not UTF-8."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise WorkloadError(shown, "file not found") from None
    except IsADirectoryError:
        raise WorkloadError(shown, "is a directory, not a workload file") from None
    except OSError as e:
        raise WorkloadError(shown, f"cannot read: {e.strerror}") from None
    skip = len(_BOM) if data.startswith(_BOM) else 0
    try:
        text = data[skip:].decode("utf-8")
    except UnicodeDecodeError as e:
        offset = skip + e.start
        line = data.count(b"\n", 0, offset) + 1
        raise WorkloadError(
            shown, f"not UTF-8: byte 0x{data[offset]:02x} at byte offset {offset}", line=line
        ) from None
    if not text.strip():
        raise WorkloadError(shown, "empty file")
    return text


def _short(value: Any) -> str:
    r = repr(value)
    return r if len(r) <= 40 else r[:37] + "..."


def _json_error(e: json.JSONDecodeError) -> str:
    return f"invalid JSON: {e.msg} (column {e.colno})"


def jsonl_objects(text: str, path: str) -> Iterator[tuple[Loc, dict[str, Any]]]:
    """Each non-blank line as a JSON object, with its location."""
    for lineno, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        loc = Loc(path, line=lineno)
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            raise loc.error(None, _json_error(e)) from None
        if not isinstance(obj, dict):
            raise loc.error(None, f"expected a JSON object, got {type(obj).__name__}")
        yield loc, obj


def json_list_objects(text: str, path: str) -> Iterator[tuple[Loc, dict[str, Any]]]:
    """Each element of a top-level JSON list as an object, located by its index."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise WorkloadError(path, _json_error(e), line=e.lineno) from None
    if not isinstance(data, list):
        raise WorkloadError(path, f"expected a JSON list of entries, got {type(data).__name__}")
    if not data:
        raise WorkloadError(path, "empty list: no entries")
    for i, obj in enumerate(data):
        loc = Loc(path, entry=i)
        if not isinstance(obj, dict):
            raise loc.error(None, f"expected a JSON object, got {type(obj).__name__}")
        yield loc, obj


# ---- field checks ------------------------------------------------------------------------------
def _id(loc: Loc, obj: dict[str, Any], key: str) -> str:
    if key not in obj:
        raise loc.error(key, "missing")
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise loc.error(key, f"must be a string or an integer, got {type(v).__name__}")
    if isinstance(v, str) and not v.strip():
        raise loc.error(key, "empty")
    return str(v)


def _text(loc: Loc, value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise loc.error(field, f"must be a string, got {type(value).__name__}")
    if not value.strip():
        raise loc.error(field, "empty prompt")
    return value


def _positive_int(loc: Loc, value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise loc.error(field, f"must be an integer > 0, got {_short(value)}")
    if value <= 0:
        raise loc.error(field, f"must be > 0, got {value}")
    return value


def _opt_str(loc: Loc, obj: dict[str, Any], key: str) -> str | None:
    v = obj.get(key)
    if v is not None and not isinstance(v, str):
        raise loc.error(key, f"must be a string, got {type(v).__name__}")
    return v


def _messages(loc: Loc, value: Any) -> tuple[dict[str, str], ...]:
    if not isinstance(value, list):
        raise loc.error("messages", f"must be a list, got {type(value).__name__}")
    if not value:
        raise loc.error("messages", "empty list")
    out: list[dict[str, str]] = []
    for i, m in enumerate(value):
        f = f"messages[{i}]"
        if not isinstance(m, dict):
            raise loc.error(f, f"must be an object, got {type(m).__name__}")
        for k in ("role", "content"):
            if k not in m:
                raise loc.error(f"{f}.{k}", "missing")
            if not isinstance(m[k], str):
                raise loc.error(f"{f}.{k}", f"must be a string, got {type(m[k]).__name__}")
        if not m["role"].strip():
            raise loc.error(f"{f}.role", "empty")
        out.append({"role": m["role"], "content": m["content"]})
    if not any(m["content"].strip() for m in out):
        raise loc.error("messages", "empty prompt: every content is empty")
    return tuple(out)


# ---- one entry per format ----------------------------------------------------------------------
def parse_native(loc: Loc, obj: dict[str, Any], index: int, turn: int) -> Request:
    unknown = [k for k in obj if k not in NATIVE_KEYS]
    if unknown:
        raise loc.error(unknown[0], f"unknown field (expected one of {', '.join(NATIVE_KEYS)})")
    rid = _id(loc, obj, "id")
    has_p, has_m = "prompt" in obj, "messages" in obj
    if has_p == has_m:
        raise loc.error("prompt", "give exactly one of prompt or messages")
    prompt = _text(loc, obj["prompt"], "prompt") if has_p else None
    messages = _messages(loc, obj["messages"]) if has_m else None
    mnt = obj.get("max_new_tokens")
    if mnt is not None:
        mnt = _positive_int(loc, mnt, "max_new_tokens")
    cat = _opt_str(loc, obj, "category")
    return Request(rid, prompt, messages, mnt, cat, loc.source)


def parse_specbench(loc: Loc, obj: dict[str, Any], index: int, turn: int) -> Request:
    rid = _id(loc, obj, "question_id")
    cat = _opt_str(loc, obj, "category")
    turns = obj.get("turns")
    if turns is None:
        raise loc.error("turns", "missing")
    if not isinstance(turns, list):
        raise loc.error("turns", f"must be a list, got {type(turns).__name__}")
    if not turns:
        raise loc.error("turns", "empty list")
    if turn >= len(turns):
        raise MissingTurn(loc.error("turns", f"no turn {turn} (has {len(turns)})"))
    return Request(rid, _text(loc, turns[turn], f"turns[{turn}]"), None, None, cat, loc.source)


def parse_sharegpt(loc: Loc, obj: dict[str, Any], index: int, turn: int) -> Request:
    rid = _id(loc, obj, "id") if "id" in obj else str(index)
    conv = obj.get("conversations")
    if conv is None:
        raise loc.error("conversations", "missing")
    if not isinstance(conv, list):
        raise loc.error("conversations", f"must be a list, got {type(conv).__name__}")
    messages: list[dict[str, str]] = []
    humans = 0
    for i, t in enumerate(conv):
        f = f"conversations[{i}]"
        if not isinstance(t, dict):
            raise loc.error(f, f"must be an object, got {type(t).__name__}")
        who, value = t.get("from"), t.get("value")
        if not isinstance(who, str):
            raise loc.error(f"{f}.from", "missing" if who is None else "must be a string")
        role = SHAREGPT_ROLES.get(who.lower())
        if role is None:
            raise loc.error(f"{f}.from", f"unknown speaker {_short(who)}")
        if not isinstance(value, str):
            raise loc.error(f"{f}.value", "missing" if value is None else "must be a string")
        messages.append({"role": role, "content": value})
        if role == "user":
            if humans == turn:
                _text(loc, value, f"{f}.value")
                if len(messages) == 1:
                    return Request(rid, value, None, None, None, loc.source)
                return Request(rid, None, tuple(messages), None, None, loc.source)
            humans += 1
    what = "no human turn" if humans == 0 else f"no human turn {turn} (has {humans})"
    raise MissingTurn(loc.error("conversations", what))


def parse_vllm_custom(loc: Loc, obj: dict[str, Any], index: int, turn: int) -> Request:
    if "prompt" not in obj:
        raise loc.error("prompt", "missing")
    prompt = _text(loc, obj["prompt"], "prompt")
    out = obj.get("output_tokens")
    if out is not None:
        out = _positive_int(loc, out, "output_tokens")
    return Request(str(index), prompt, None, out, None, loc.source)


PARSERS: dict[str, Callable[[Loc, dict[str, Any], int, int], Request]] = {
    "native": parse_native,
    "specbench": parse_specbench,
    "sharegpt": parse_sharegpt,
    "vllm-custom": parse_vllm_custom,
}


# ---- detection and the whole-file read ---------------------------------------------------------
def detect_format(loc: Loc, obj: dict[str, Any]) -> str:
    """The format an entry's keys point to."""
    if "turns" in obj or "question_id" in obj:
        return "specbench"
    if "conversations" in obj:
        return "sharegpt"
    if "output_tokens" in obj:
        return "vllm-custom"
    if any(k in obj for k in ("id", "messages", "max_new_tokens")):
        return "native"
    if "prompt" in obj:
        return "vllm-custom"
    if "hash_ids" in obj:
        raise loc.error(None, "a Mooncake trace: use --dataset-name mooncake (or timed_trace)")
    keys = ", ".join(sorted(obj)) or "none"
    raise loc.error(None, f"cannot tell the format from the keys ({keys}); pass fmt")


def read_requests(
    path: Path,
    *,
    shown: str | None = None,
    fmt: str | None = None,
    turn: int = 0,
    skip_missing_turn: bool = False,
) -> tuple[str, tuple[Request, ...], int]:
    """Read and validate a whole file: (format, requests, entries skipped for a missing turn)."""
    shown = str(path) if shown is None else shown
    if fmt is not None and fmt not in PARSERS:
        raise WorkloadError(
            None, f"unknown format {fmt!r} (valid: {', '.join(FORMATS)})", field="fmt"
        )
    if isinstance(turn, bool) or not isinstance(turn, int) or turn < 0:
        raise WorkloadError(None, f"must be an integer >= 0, got {turn!r}", field="turn")
    text = read_text(path, shown)
    is_list = text.lstrip().startswith("[")
    entries = (json_list_objects if is_list else jsonl_objects)(text, shown)
    requests: list[Request] = []
    seen: dict[str, str] = {}
    skipped = 0
    parse = None
    for index, (loc, obj) in enumerate(entries):
        if parse is None:
            fmt = fmt or detect_format(loc, obj)
            parse = PARSERS[fmt]
        try:
            req = parse(loc, obj, index, turn)
        except MissingTurn as m:
            if not skip_missing_turn:
                raise m.err from None
            skipped += 1
            continue
        if req.id in seen:
            field = {"specbench": "question_id"}.get(fmt or "", "id")
            raise loc.error(field, f"duplicate id {req.id!r} (first at {seen[req.id]})")
        seen[req.id] = f"line {loc.line}" if loc.line is not None else f"entry {loc.entry}"
        requests.append(req)
    assert fmt is not None  # the file is not empty, so one entry set it
    if skipped:
        warnings.warn(f"{shown}: skipped {skipped} entries without turn {turn}", stacklevel=3)
    if not requests:
        raise WorkloadError(shown, f"no entries with turn {turn} (skipped {skipped})")
    return fmt, tuple(requests), skipped

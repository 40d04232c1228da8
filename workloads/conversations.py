"""Multi-turn conversations: the user turns of ShareGPT conversations or of Spec-Bench's MT-bench
questions (two turns each), for a run in which turn k is sent with the model's own answers to
turns 1..k-1 (:mod:`harness.run.conversations` drives them).

Why the model's own answers and not the file's: the recorded answers came from another model, so
a speculative method that copies from the context (n-gram, suffix) would be judged on text the
variant never wrote; each variant answers for itself, as a user of it would see.

One :class:`~workloads.base.Request` per conversation: ``messages`` is turn 1 (a leading system
message kept), ``next_turns`` the later user turns. The file's assistant turns are dropped.
Errors name the file, line (or entry) and field, as every reader's do.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from workloads.base import Request
from workloads.readers import (
    SHAREGPT_ROLES,
    Loc,
    WorkloadError,
    json_list_objects,
    jsonl_objects,
    read_text,
)

FORMATS = ("sharegpt", "specbench")
SEP = "@t"  # a turn's request id: conversation id, SEP, turn (1-based)


def turn_id(conversation: str, turn: int) -> str:
    """The request id of a conversation's turn (1-based): ``C@tK``."""
    return f"{conversation}{SEP}{turn}"


def split_turn(request_id: str) -> tuple[str, int] | None:
    """(conversation, turn) of a turn's request id, else None."""
    head, sep, tail = request_id.rpartition(SEP)
    return (head, int(tail)) if sep and head and tail.isdigit() else None


def _text(loc: Loc, value: Any, field: str) -> str:
    if not isinstance(value, str):
        what = "missing" if value is None else f"must be a string, got {type(value).__name__}"
        raise loc.error(field, what)
    if not value.strip():
        raise loc.error(field, "empty turn")
    return value


def _id(loc: Loc, obj: dict[str, Any], key: str, index: int) -> str:
    if key not in obj:
        return str(index)
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, (str, int)) or not str(v).strip():
        raise loc.error(key, f"must be a non-empty string or an integer, got {v!r}"[:120])
    return str(v)


def sharegpt_turns(loc: Loc, obj: dict[str, Any]) -> tuple[str | None, list[str]]:
    """(system prompt, user turns) of a ShareGPT entry; assistant turns are dropped."""
    conv = obj.get("conversations")
    if conv is None:
        raise loc.error("conversations", "missing")
    if not isinstance(conv, list):
        raise loc.error("conversations", f"must be a list, got {type(conv).__name__}")
    system, users = None, []
    for i, t in enumerate(conv):
        f = f"conversations[{i}]"
        if not isinstance(t, dict):
            raise loc.error(f, f"must be an object, got {type(t).__name__}")
        who = t.get("from")
        if not isinstance(who, str):
            raise loc.error(f"{f}.from", "missing" if who is None else "must be a string")
        role = SHAREGPT_ROLES.get(who.lower())
        if role is None:
            raise loc.error(f"{f}.from", f"unknown speaker {who!r}"[:120])
        if role == "user":
            users.append(_text(loc, t.get("value"), f"{f}.value"))
        elif role == "system" and not users:
            system = _text(loc, t.get("value"), f"{f}.value")
        elif not isinstance(t.get("value"), str):
            raise loc.error(f"{f}.value", "missing" if t.get("value") is None else "not a string")
    if not users:
        raise loc.error("conversations", "no human turn")
    return system, users


def specbench_turns(loc: Loc, obj: dict[str, Any]) -> tuple[str | None, list[str]]:
    turns = obj.get("turns")
    if turns is None:
        raise loc.error("turns", "missing")
    if not isinstance(turns, list) or not turns:
        raise loc.error("turns", "must be a non-empty list of strings")
    return None, [_text(loc, t, f"turns[{i}]") for i, t in enumerate(turns)]


def read_conversations(
    path: Path,
    shown: str,
    *,
    fmt: str | None = None,
    min_turns: int = 2,
    max_turns: int | None = None,
) -> tuple[str, tuple[Request, ...], int]:
    """(format, one request per conversation, conversations skipped for having fewer than
    ``min_turns`` user turns). ``max_turns`` keeps the first N user turns of each."""
    if fmt is not None and fmt not in FORMATS:
        raise WorkloadError(
            None, f"{fmt!r} holds no conversations (use {' or '.join(FORMATS)})", field="format"
        )
    text = read_text(path, shown)
    is_list = text.lstrip().startswith("[")
    out: list[Request] = []
    seen: dict[str, str] = {}
    skipped = 0
    for index, (loc, obj) in enumerate(
        (json_list_objects if is_list else jsonl_objects)(text, shown)
    ):
        if fmt is None:
            if "conversations" in obj:
                fmt = "sharegpt"
            elif "turns" in obj:
                fmt = "specbench"
            else:
                keys = ", ".join(sorted(obj)) or "none"
                raise loc.error(None, f"not a conversation (keys: {keys}): expected "
                                "conversations (ShareGPT) or turns (Spec-Bench)")  # fmt: skip
        key = "question_id" if fmt == "specbench" else "id"
        rid = _id(loc, obj, key, index)
        system, users = (sharegpt_turns if fmt == "sharegpt" else specbench_turns)(loc, obj)
        if max_turns is not None:
            users = users[:max_turns]
        if len(users) < min_turns:
            skipped += 1
            continue
        if rid in seen:
            raise loc.error(key, f"duplicate id {rid!r} (first at {seen[rid]})")
        seen[rid] = loc.source
        first = ({"role": "system", "content": system},) if system else ()
        cat = obj.get("category") if isinstance(obj.get("category"), str) else None
        out.append(
            Request(
                rid,
                messages=(*first, {"role": "user", "content": users[0]}),
                category=cat,
                source=loc.source,
                next_turns=tuple(users[1:]),
            )
        )
    assert fmt is not None
    if not out:
        raise WorkloadError(shown, f"no conversation with {min_turns} or more user turns")
    if skipped:
        warnings.warn(
            f"{shown}: skipped {skipped} conversations with fewer than {min_turns} user turns",
            stacklevel=3,
        )
    return fmt, tuple(out), skipped

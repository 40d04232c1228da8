"""Parsing helpers of the command line shared by every subcommand: the one-line usage error
(exit 2), an argparse parser that raises it, JSON/KEY=VALUE/URL/SLO values and numeric types."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any


class UsageError(Exception):
    """Bad flags or input: printed as one line, exit code 2."""


def json_arg(flag: str, text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}" if exc.lineno > 1 else f"column {exc.colno}"
        raise UsageError(f"{flag}: invalid JSON ({exc.msg} at {where})") from None
    if not isinstance(value, dict):
        raise UsageError(f"{flag}: expected a JSON object, got {type(value).__name__}")
    return value


def kv_args(items: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--engine-arg: expected KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def variant_urls(items: Sequence[str] | None) -> dict[str, list[str]] | None:
    """``--base-url baseline=URL ngram=URL`` -> {label: [URL, ...]}; plain URLs -> None."""
    if not items:
        return None
    labelled = [i.partition("=") for i in items]
    named = [(k, u) for k, sep, u in labelled if sep and "/" not in k and ":" not in k]
    if not named:
        return None
    if len(named) != len(items):
        raise UsageError("--base-url: label every URL (baseline=URL ngram=URL) or none")
    out: dict[str, list[str]] = {}
    for label, url in named:
        out.setdefault(label, []).append(url)  # a label given twice: replicas of one variant
    return out


def goodput(items: Sequence[str] | None, flag: str = "--goodput") -> dict[str, float] | None:
    if not items:
        return None
    out = {}
    for item in items:
        name, sep, ms = item.partition(":")
        name = "e2e" if name == "e2el" else name  # vllm bench serve's name
        if not sep or name not in ("ttft", "tpot", "e2e"):
            raise UsageError(f"{flag}: expected ttft:MS, tpot:MS or e2el:MS (e2e:MS), got {item!r}")
        try:
            out[name] = float(ms)
        except ValueError:
            raise UsageError(f"{flag}: {item!r}: {ms!r} is not a number of milliseconds") from None
    return out


def prices(items: Sequence[str] | None, engines: Sequence[str]) -> dict[str, float] | None:
    """``--price-per-hour 2.5`` (every engine's lane) or ``vllm=2.5 hf=1.2`` (one per engine,
    mixed hardware): USD per hour of the hardware a lane holds, per engine; None unpriced.
    ``engines`` "a@tag" (compare's) take the price given for "a"."""
    if not items:
        return None
    flag = "--price-per-hour"
    given: dict[str, float] = {}
    for item in items:
        name, sep, raw = item.rpartition("=")
        if sep and not name:
            raise UsageError(f"{flag}: expected USD or ENGINE=USD, got {item!r}")
        try:
            usd = float(raw)
        except ValueError:
            raise UsageError(f"{flag}: {item!r}: {raw!r} is not a number of dollars") from None
        if not usd > 0 or usd == float("inf"):
            raise UsageError(f"{flag}: {item!r}: expected a price > 0")
        given[name or "*"] = usd
    if "*" in given and len(given) > 1:
        raise UsageError(f"{flag}: give one price for every engine or ENGINE=USD each, not both")
    out = {}
    for engine in engines:
        usd = given.get("*", given.get(engine, given.get(engine.split("@")[0])))
        if usd is None:
            raise UsageError(f"{flag}: no price for engine {engine} (give ENGINE=USD for each)")
        out[engine] = usd
    unknown = set(given) - {"*", *engines, *(e.split("@")[0] for e in engines)}
    if unknown:
        raise UsageError(f"{flag}: {', '.join(sorted(unknown))}: not an engine of this run")
    return out


def _number(text: str, cast: type, low: float, strict: bool) -> Any:
    try:
        v = cast(text)
    except ValueError:
        kind = "an integer" if cast is int else "a number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {kind}") from None
    if v < low or (strict and v == low):
        raise argparse.ArgumentTypeError(f"{v:g} must be {'>' if strict else '>='} {low:g}")
    return v


def positive_int(text: str) -> int:
    return _number(text, int, 0, strict=True)


def non_negative_int(text: str) -> int:
    return _number(text, int, 0, strict=False)


def positive_float(text: str) -> float:
    return _number(text, float, 0, strict=True)


def split_top(text: str) -> list[str]:
    """Split at the commas outside brackets and quotes: ``1,4`` -> two items, a JSON object
    (``vllm={"a": 1, "b": 2}``) stays one."""
    out, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "{[(":
            depth += 1
        elif ch in "}])":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
    return [*out, text[start:]]


class ListStore(argparse.Action):
    """The store action of every flag of a :class:`Parser`: a flag that takes a list (nargs ``+``
    or ``*``) takes its items space-separated, comma-separated or both (``--concurrency 1 4 16``
    = ``--concurrency 1,4,16``; a comma inside brackets or quotes, as in JSON, does not split),
    so one list syntax holds for every list flag, including those added later. ``split=False``
    opts out, for a value that may hold a comma (``--metadata
    note=a,b``). ``distinct=True``, for a sweep (K, loads, lengths): each value once, in the
    order given; a repeated one ran two lanes or points under one label, pooled into one row."""

    def __init__(
        self,
        option_strings: Sequence[str],
        dest: str,
        split: bool = True,
        distinct: bool = False,
        **kw: Any,
    ):
        self.distinct = distinct
        self.listy = split and kw.get("nargs") in ("+", "*")
        self.item_type = kw.pop("type", None) if self.listy else None
        self.item_choices = kw.pop("choices", None) if self.listy else None
        super().__init__(option_strings, dest, **kw)

    def items(self, values: Any) -> list[Any]:
        parts = [p.strip() for v in values for p in split_top(str(v)) if p.strip()]
        if self.nargs == "+" and not parts:
            raise argparse.ArgumentError(self, "expected at least one value")
        out = []
        for part in parts:
            out.append(self.convert(part))
            if self.item_choices is not None and out[-1] not in self.item_choices:
                allowed = ", ".join(map(str, self.item_choices))
                raise argparse.ArgumentError(
                    self, f"invalid choice: {part!r} (choose from {allowed})"
                )
        return list(dict.fromkeys(out)) if self.distinct else out

    def convert(self, text: str) -> Any:
        if self.item_type is None:
            return text
        try:
            return self.item_type(text)
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentError(self, str(exc)) from None
        except (TypeError, ValueError):
            name = getattr(self.item_type, "__name__", repr(self.item_type))
            raise argparse.ArgumentError(self, f"invalid {name} value: {text!r}") from None

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, self.items(values) if self.listy else values)


class JoinedList(ListStore):
    """A list flag whose value is one comma-joined string (``--engine hf vllm`` = ``--engine
    hf,vllm``), converted whole by ``type``; given with no items it stores ``const``."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        item_type, self.item_type = self.item_type, None
        try:
            parts = self.items(values)
        finally:
            self.item_type = item_type
        if not parts:
            setattr(namespace, self.dest, self.const)
            return
        self.item_type = item_type
        setattr(namespace, self.dest, self.convert(",".join(parts)))


class Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", None, ListStore)  # the default action: one list syntax
        self.register("action", "store", ListStore)
        self.register("action", "joined", JoinedList)

    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage too)
        raise UsageError(message)


class Given(argparse.Action):
    """Stores the value and sets ``<dest>_named``: a flag given as its default value (``--model
    embedded``) differs from one left out (``--engine openai`` counts tokens only with a model
    the user named)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_named", True)

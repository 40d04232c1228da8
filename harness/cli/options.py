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
            raise UsageError(
                f"{flag}: expected ttft:MS, tpot:MS or e2el:MS (e2e:MS), got {item!r}"
            )
        try:
            out[name] = float(ms)
        except ValueError:
            raise UsageError(
                f"{flag}: {item!r}: {ms!r} is not a number of milliseconds"
            ) from None
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


class Parser(argparse.ArgumentParser):
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

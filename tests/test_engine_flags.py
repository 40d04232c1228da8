"""What the run's flags mean is each engine's (``Engine.run_flags`` / ``options_from`` /
``for_variants``): an engine that takes ``--base-url`` needs one registry line, no harness edit."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import pytest

from engines.base import REGISTRY, EngineConfig, engine_class
from harness.cli.preflight import engine_methods, variant_servers
from harness.flags.parser import build_parser
from harness.flags.plan import build_plan
from tests.clock import ScriptedEngine


class ToyHTTPEngine(ScriptedEngine):
    """A made-up engine that talks to servers by URL, one per variant when labelled."""

    name: ClassVar[str] = "toy-http"
    run_flags: ClassVar[frozenset[str]] = frozenset({"base_url", "request_timeout"})

    @classmethod
    def options_from(cls, flags: Mapping[str, Any], speculative: bool) -> dict[str, Any]:
        return {"urls": flags["base_url"], "timeout": flags["request_timeout"], "spec": speculative}

    @classmethod
    def for_variants(
        cls, configs: Sequence[tuple[str, EngineConfig]]
    ) -> list[tuple[str, EngineConfig]]:
        return [(lb, EngineConfig(c.engine, c.model, options={"label": lb})) for lb, c in configs]


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(REGISTRY, "toy-http", f"{__name__}:ToyHTTPEngine")


def _plan(*flags: str) -> Any:
    args = build_parser().parse_args(["--mode", "latency", *flags])
    return build_plan(args, "m", None)


def test_a_new_engine_takes_its_flags_through_the_registry(toy: None) -> None:
    plan = _plan("--engine", "toy-http", "--base-url", "http://h:8000", "--request-timeout", "7")
    assert plan.options == {
        "toy-http": {"urls": ["http://h:8000/v1"], "timeout": 7.0, "spec": False}
    }
    configs = variant_servers(plan.engine_configs(engine_methods(plan)))
    assert [(lb, c.options) for lb, c in configs] == [("baseline", {"label": "baseline"})]


def test_base_url_for_no_engine_of_the_run_names_the_engines_that_take_one(toy: None) -> None:
    from harness.flags.options import UsageError

    with pytest.raises(
        UsageError, match=r"--base-url is for --engine (openai or toy-http|toy-http or openai)"
    ):
        _plan("--engine", "hf", "--base-url", "http://h:8000/v1")
    assert "toy-http" not in _plan("--engine", "hf").options  # an engine with no flags: nothing


URL = ("--base-url", "http://h:8000/v1")
TWO_URLS = ("--base-url", "baseline=http://h:1/v1", "ngram=http://h:2/v1")


@pytest.mark.parametrize(
    ("flags", "asked"),
    [
        (("--engine", "openai", *URL), None),  # one variant: ids only if the server speculates
        (("--engine", "openai", *URL, "--token-ids", "on"), True),
        (("--engine", "openai", "--spec", "ngram", *TWO_URLS), True),  # several tokens per event
        (("--engine", "openai", "--spec", "ngram", *TWO_URLS, "--token-ids", "off"), False),
        (("--engine", "openai", "--aa", *URL), True),  # two variants' outputs compared
        (("--engine", "openai,vllm-server", *URL), True),  # engine vs engine
        (("--engine", "vllm-server"), None),
        (("--engine", "vllm-server", "--spec", "ngram"), True),
    ],
)
def test_token_ids_are_asked_for_when_the_run_needs_them(
    flags: tuple[str, ...], asked: bool | None
) -> None:
    """--token-ids auto: ids when the run compares outputs or has a speculative variant; on/off
    force it. The plan records the flag, each HTTP engine's options what it resolved to."""
    plan = _plan(*flags)
    http = [e for e in plan.engines if e in ("openai", "vllm-server")]
    assert [plan.options[e]["token_ids"] for e in http] == [asked] * len(http)
    given = flags[flags.index("--token-ids") + 1] if "--token-ids" in flags else "auto"
    assert plan.token_ids == given == plan.to_json()["token_ids"]
    assert "token_ids" not in plan.options.get("hf", {})
    if "vllm-server" in plan.options:  # a managed server hands it to its inner openai client
        cls = engine_class("vllm-server")
        (_, config), *_ = [
            (lb, c) for lb, c in plan.engine_configs({}) if c.engine == "vllm-server"
        ]
        cls.validate(config)
        assert cls._inner_config(config, "http://h:1/v1").options["token_ids"] is asked

"""The engine protocol, the shapes that cross it, and the lazy engine registry.

An engine turns one request into a stream of token-id chunks. It never computes a latency and
never renders a table. The runner owns the clock: it reads it at send and at the end, and hands
it to ``stream``; the engine stamps each chunk (``Chunk.t``) where its tokens first exist for the
client: on the host for in-process models (on the engine's own thread, which may then hand
chunks to the event loop in batches instead of waking it per token), at the socket read for HTTP
engines. A chunk left unstamped is stamped by the runner when it receives it.
"""

from __future__ import annotations

import importlib
from abc import abstractmethod
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

from workloads.base import Request

Clock = Callable[[], float]

__all__ = ["Request"]  # re-exported: engines see requests through this module


class EngineError(Exception):
    """A configuration or start-up problem the user can fix (printed as one line, exit 2)."""


class UnsupportedError(EngineError):
    """The engine cannot run this cell (e.g. assisted generation at batch size > 1)."""


@dataclass(frozen=True)
class GenParams:
    """Generation parameters shared by every request of a run; each adapter translates them.
    No length: each request carries its own (:func:`new_tokens`)."""

    temperature: float = 0.0
    top_p: float = 1.0
    ignore_eos: bool = False
    seed: int = 0


def new_tokens(request: Request) -> int:
    """The one length an engine generates to: ``request.max_new_tokens``, which the harness
    sets on every request before any engine sees it (``--max-new-tokens``, else the request's
    own, else the dataset's output length or the default: ``RunPlan.resolve_lengths`` in
    harness/run/plan.py). A request without one is a caller's bug, said in one line."""
    if request.max_new_tokens is None:
        raise EngineError(f"request {request.id!r}: no max_new_tokens (set it on the request)")
    return request.max_new_tokens


@dataclass(frozen=True)
class Chunk:
    """What an engine yields while streaming: newly produced output tokens.

    ``token_ids`` holds the ids when the engine knows them; ``num_tokens`` overrides the count
    when it does not (an HTTP server that returns text only). A chunk with zero tokens carries
    only metadata (``prompt_tokens``, ``usage_output_tokens``, ``finish_reason``, ``text``) and is
    not timed as a token arrival. ``t`` is the time the tokens existed, read from the clock the
    runner passed to ``stream``; None = the runner stamps the chunk when it receives it.

    A chunk may carry several arrivals (an in-process engine hands over several steps at once):
    then ``sizes[i]`` of its tokens existed at ``times[i]`` (``sum(sizes) == size``, ``t`` the
    last stamp); empty = all at ``t``.
    """

    token_ids: tuple[int, ...] = ()
    num_tokens: int | None = None
    prompt_tokens: int | None = None
    usage_output_tokens: int | None = None
    finish_reason: str | None = None
    text: str = ""
    info: Mapping[str, Any] | None = None  # e.g. {"replica": url, "chat_template": True}
    t: float | None = None
    times: tuple[float, ...] = ()
    sizes: tuple[int, ...] = ()

    @property
    def size(self) -> int:
        return self.num_tokens if self.num_tokens is not None else len(self.token_ids)


@dataclass(frozen=True)
class SpecCounters:
    """Cumulative speculative-decoding counters, in vLLM's schema.

    Engines return a snapshot; the runner takes the difference between the snapshots at the
    start and the end of a run, so nothing is cumulative across runs.
    """

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: tuple[int, ...] = ()
    target_passes: int | None = None  # target forward passes, where the engine can count them

    def __sub__(self, other: SpecCounters) -> SpecCounters:
        n = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        a = list(self.accepted_per_pos) + [0] * (n - len(self.accepted_per_pos))
        b = list(other.accepted_per_pos) + [0] * (n - len(other.accepted_per_pos))
        return SpecCounters(
            self.num_drafts - other.num_drafts,
            self.num_draft_tokens - other.num_draft_tokens,
            self.num_accepted_tokens - other.num_accepted_tokens,
            tuple(x - y for x, y in zip(a, b)),
            None
            if self.target_passes is None or other.target_passes is None
            else self.target_passes - other.target_passes,
        )

    def to_metrics(self) -> dict[str, Any]:
        """The JSON schema shared by every engine (derived rates included)."""
        d, t, a = self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens
        per_pos_rate = [x / d if d else None for x in self.accepted_per_pos]
        return {
            "num_drafts": d,
            "num_draft_tokens": t,
            "num_accepted_tokens": a,
            "accepted_per_pos": list(self.accepted_per_pos),
            "acceptance_rate": a / t if t else None,
            "mean_acceptance_length": 1 + a / d if d else None,
            "acceptance_per_pos": per_pos_rate,
            "alpha": per_pos_rate[0] if per_pos_rate else None,
            "target_passes": self.target_passes,
        }


@dataclass(frozen=True)
class EngineConfig:
    """One engine configuration. ``engine_args`` reaches the underlying library untouched."""

    engine: str
    model: str
    tokenizer: str | None = None
    draft_model: str | None = None
    spec_config: Mapping[str, Any] | None = (
        None  # vLLM ``speculative_config`` schema; None = baseline
    )
    dtype: str = "auto"
    device: str = "auto"
    seed: int = 0
    engine_args: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)  # adapter options (base_urls, ...)
    # engines of one run alive at once on this machine: an engine that reserves memory (vLLM's
    # GPU budget) takes its share of the default budget
    share: int = 1
    # the share of the device's memory the run's memory plan gave this engine (vLLM's
    # gpu_memory_utilization; harness.sizing.memory), None: the engine's own default
    memory_fraction: float | None = None
    prefix_cache: str = "reset"  # "reset" (before each measured run), "off", "keep"

    @property
    def variant(self) -> str:
        return "baseline" if self.spec_config is None else "spec"

    @property
    def spec_method(self) -> str | None:
        return None if self.spec_config is None else str(self.spec_config.get("method"))


@dataclass(frozen=True)
class Capabilities:
    """What an engine can do beyond streaming one request at a time. The session and the runner
    read these flags and call the protocol's methods directly: nothing is probed for."""

    # several configurations alive at once (one process, or a server each): lanes interleave
    coexist: bool = False
    # concurrent requests are served in fixed batches through ``stream_batch`` (HF generate)
    static_batching: bool = False
    # the harness starts the server itself (its log is saved with the results)
    managed: bool = False
    # ``sample_load`` reads the server's running/waiting gauges (sampled during runs on request)
    load_gauges: bool = False
    # requests go to a server over HTTP, so other processes can send them (``--client-workers``,
    # through ``client_config``)
    client_workers: bool = False
    # runs the speculative_config ``harness tune`` writes (vLLM's per-batch-size
    # ``num_speculative_tokens_per_batch_size``), so tune can measure and verify through it
    tunable: bool = False
    # starting a fresh instance is cheap (seconds): the session builds every lane's engine anew
    # for each block (repeat), so an instance's own speed offset varies between blocks and the
    # CI, which is computed over blocks, covers it (harness.core.design: instances)
    rebuild_per_block: bool = False
    # how it holds device memory, for the memory plan before anything loads: "" (elsewhere: a
    # remote server), "shared" (loads its weights into this process; lanes of one model share
    # one copy), "own" (a copy per lane: one server each), "budget" (reserves a share of the
    # device per lane: vLLM's gpu_memory_utilization, given through EngineConfig.memory_fraction)
    device_memory: str = ""


@runtime_checkable
class Engine(Protocol):
    """What every engine adapter implements; adapters subclass it explicitly.

    The abstract methods are the contract; the others have defaults that say "cannot" (no
    counters, no prefix cache, unbounded batch), so an adapter overrides only what it has.
    ``max_batch`` is the most requests the engine serves at once (None = unbounded, i.e.
    continuous batching).
    """

    name: ClassVar[str]
    spec_methods: ClassVar[tuple[str, ...]] = ()  # the speculative methods this engine can run
    capabilities: ClassVar[Capabilities] = Capabilities()
    config: EngineConfig

    @classmethod
    @abstractmethod
    def validate(cls, config: EngineConfig) -> None:
        """Cheap checks (paths exist, methods known) before anything loads; raise EngineError."""

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    def describe(self) -> Mapping[str, Any]:
        """The effective settings used (defaults the adapter chose included), for the record."""

    @abstractmethod
    def stream(
        self, request: Request, params: GenParams, clock: Clock | None = None
    ) -> AsyncIterator[Chunk]:
        """Yield the request's chunks; stamp them with ``clock`` where they are made off-loop."""

    @abstractmethod
    async def close(self) -> None: ...

    # ---- with defaults ------------------------------------------------------------------------
    def spec_counters(self) -> SpecCounters | None:
        """Cumulative speculative counters (None: not speculative, or not counted)."""
        return None

    def max_batch(self) -> int | None:
        return None

    async def refresh_metrics(self) -> SpecCounters | None:
        """Bring :meth:`spec_counters` up to date (HTTP engines scrape the server's /metrics);
        in-process counters are always current."""
        return None

    async def sample_load(self) -> Mapping[str, float | None]:
        """The server's load gauges now (``capabilities.load_gauges``)."""
        return {}

    async def reset_prefix_cache(self) -> str:
        """Empty the prefix cache before a measured run; say what was done."""
        return "no prefix cache"

    def prefix_cache_counters(self) -> dict[str, int] | None:
        """Cumulative prefix-cache queries and hits (prompt tokens), where counted."""
        return None

    def step_costs(self) -> dict[str, Any] | None:
        """One decode step's cost of target and draft (``c``), measured outside runs."""
        return None

    def client_config(self) -> EngineConfig:
        """This started engine as an ``openai`` config for a client in another process
        (``capabilities.client_workers``): the same servers, model name and request shape."""
        raise UnsupportedError(f"{self.name}: runs in this process; no client config")

    def stream_batch(
        self, requests: Sequence[Request], params: GenParams, clock: Clock | None = None
    ) -> AsyncIterator[tuple[int, Chunk]]:
        """Serve ``requests`` as one fixed batch (``capabilities.static_batching``): yield
        ``(index, chunk)``."""
        raise UnsupportedError(f"{self.name}: no static batching")

    # ---- what the run's flags mean to it (defaults: nothing) ----------------------------------
    # the run-level settings (engines.openai.flags.RunFlags) this engine takes into its options;
    # "max_model_len" (--max-model-len): into its engine_args under that name (RunPlan.args_for)
    run_flags: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def engine_arg_names(cls) -> frozenset[str] | None:
        """The ``engine_args`` keys this engine takes, so that a global ``--engine-args`` key
        goes only to the engines that take it and a scoped one it does not take is refused
        before loading; None: any (its library or server checks them)."""
        return None

    @classmethod
    def options_from(cls, flags: Mapping[str, Any], speculative: bool) -> dict[str, Any]:
        """This engine's options from the run-level settings (``speculative``: the run has
        speculative variants); raise EngineError (one line) for flags it cannot run with."""
        return {}

    @classmethod
    def for_variants(
        cls, configs: Sequence[tuple[str, EngineConfig]]
    ) -> list[tuple[str, EngineConfig]]:
        """This engine's (label, config) pairs of the run, as each variant should run them (the
        ``openai`` client: each variant its own server)."""
        return list(configs)

    @classmethod
    def probe(cls, config: EngineConfig) -> None:
        """Checks that need the outside world (a server that must answer), before the run."""


def speculative_config(
    method: str, k: int, draft: str | None, head: str | None
) -> dict[str, Any] | None:
    """What ``--spec METHOD`` with K draft tokens means, in vLLM's ``speculative_config`` schema
    (every engine's currency); None when the method lacks what it needs (a draft, a head)."""
    cfg: dict[str, Any] = {"method": method, "num_speculative_tokens": k}
    if method == "draft_model":
        if not draft:
            return None
        cfg["model"] = draft
    elif method == "eagle3":
        if not head:
            return None
        cfg["model"] = head
    elif method == "ngram":
        cfg.update(DEFAULT_NGRAM)
    return cfg


# name -> "module:Class"; modules are imported only when the engine is used, so an HTTP run
# never imports torch.
REGISTRY: dict[str, str] = {
    "hf": "engines.hf.engine:HFEngine",
    "vllm": "engines.vllm.engine:VLLMEngine",
    "openai": "engines.openai.engine:OpenAIEngine",
    "vllm-server": "engines.servers.vllm_serve:VLLMServerEngine",
    "transformers-server": "engines.servers.transformers_serve:TransformersServerEngine",
    "transformers-server-cb": "engines.servers.transformers_serve:TransformersServerCBEngine",
}

SPEC_METHODS = ("draft_model", "ngram", "eagle", "eagle3", "mtp", "suffix")
DEFAULT_NGRAM = {"prompt_lookup_max": 3, "prompt_lookup_min": 1}


def engine_class(name: str) -> type[Engine]:
    """Import and return the engine class registered under ``name``."""
    try:
        target = REGISTRY[name]
    except KeyError:
        raise EngineError(
            f"unknown engine {name!r}; choose from: {', '.join(sorted(REGISTRY))}"
        ) from None
    module, _, cls = target.partition(":")
    found: type[Engine] = getattr(importlib.import_module(module), cls)
    return found


def create_engine(config: EngineConfig) -> Engine:
    return engine_class(config.engine)(config)

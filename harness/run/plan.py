"""The run plan: a frozen product of engines x variants x modes x loads x lengths x repeats,
built from validated options before any model loads."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from engines.base import (
    SPEC_METHODS,
    EngineConfig,
    EngineError,
    Request,
    engine_class,
    speculative_config,
)
from engines.common.vllm_args import SCHEDULE
from harness.core.design import AA_LABEL
from harness.core.load import Concurrent, LoadStrategy, Poisson, Synchronous
from harness.core.replay import TraceReplay
from harness.core.results import Cell
from workloads import Cycled
from workloads.packed import Mapped

# A closed-loop point sends at least this many times its concurrency (cycling the prompts): one
# full batch. More waves measure more of the steady state but cost the main job minutes it does
# not have on 2 cores (two waves took it past 10 minutes: docs/measurements.md).
STEADY_WAVES = 1
ALL_METHODS = ("draft_model", "eagle3", "ngram")  # --spec alone: each that has what it needs
EAGLE = ("eagle3",)


class PlanError(ValueError):
    """A flag combination that cannot run (one line, exit 2)."""


@dataclass(frozen=True)
class Point:
    """One point of the plan for a given engine configuration."""

    mode: str
    strategy: LoadStrategy
    max_new_tokens: int


GRACE_S = 5.0  # after a stop, in-flight requests get this long before they are cancelled


@dataclass(frozen=True)
class LengthRule:
    """One request's generated length (:meth:`RunPlan.resolve_lengths`): its own when the
    workload decides lengths and it has one, else the point's. A class, not a closure: client
    worker processes receive it pickled."""

    own: bool
    n: int

    def __call__(self, r: Request) -> Request:
        return r if self.own and r.max_new_tokens else replace(r, max_new_tokens=self.n)


@dataclass(frozen=True)
class RunPlan:
    engines: tuple[str, ...]
    model: str
    draft_model: str | None
    tokenizer: str | None
    spec_methods: tuple[str, ...]  # empty: no speculative variants
    num_spec_tokens: tuple[int, ...]
    spec_config: Mapping[str, Any] | None  # verbatim --spec-config
    baseline: bool
    modes: tuple[str, ...]
    concurrency: tuple[int, ...]
    request_rates: tuple[float, ...]
    burstiness: float
    max_new_tokens: tuple[int, ...]
    repeats: int
    warmup: int
    target_ci: float | None  # keep repeating a point until its CI half-width is under this
    max_repeats: int
    seed: int
    workload: str
    lengths_from_workload: bool = False  # requests' own max_new_tokens win over the default
    dtype: str = "auto"
    device: str = "auto"
    engine_args: Mapping[str, Any] = field(default_factory=dict)
    # engine -> its arguments (the global ones it takes + --engine-args NAME=JSON); None: the
    # global ones for every engine (harness.flags.engine_args)
    engine_args_by_engine: Mapping[str, Mapping[str, Any]] | None = None
    resolved_dtype: str | None = None  # --dtype resolved once for every engine (model_size)
    max_model_len: int | None = None  # --max-model-len: each engine's that takes it (args_for)
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # engine -> options
    prefix_cache: str = "reset"  # harness.core.design.PREFIX_CACHE_POLICIES
    aa: bool = False  # A/A: the baseline twice (AA_LABEL), compared as usual
    duration: float | None = None  # throughput: seconds of arrivals per point
    fill_concurrency: bool = True  # throughput: cycle to STEADY_WAVES x concurrency requests
    metric_percentiles: tuple[float, ...] = (50.0, 90.0, 99.0)
    percentile_metrics: tuple[str, ...] = ()  # asked for: a percentile table per point
    metadata: Mapping[str, str] = field(default_factory=dict)  # --metadata KEY=VALUE
    eagle3_model: str | None = None  # the EAGLE-3 head that goes with --model (shipped family)
    # each --spec method's K and where it came from (harness.tune.committed.spec_k: a family's
    # committed tune result, --num-spec-tokens or the default); results.json config.spec_k
    spec_k: Mapping[str, Any] = field(default_factory=dict)
    client_workers: int = 1  # HTTP engines: client processes sending (harness.run.clients.workers)
    ray_address: str | None = None  # those workers as Ray actors on this cluster (run.ray_clients)
    # ---- requests and sampling
    temperature: float = 0.0
    ignore_eos: bool = False
    token_ids: str = "auto"  # --token-ids; each HTTP engine's options hold what it resolved to
    num_prompts: int | None = None  # None: the whole workload
    workload_fingerprint: str | None = None  # the prompt set itself (set once it is loaded)
    turn: int = 0  # which turn of multi-turn files
    # ---- how the session runs
    stopping: str = "fixed"  # "sequential" (analysis.comparisons) | "fixed" (n = repeats)
    budget_s: float | None = None  # sequential: session seconds for all blocks (None: no budget)
    interleave: bool = True  # rotated interleaving (harness.core.design); False: --sequential
    warmup_tokens: int | None = None  # cap on a warm-up request's new tokens (None: the point's)
    instances: str | None = (
        None  # harness.core.design.INSTANCES; None: per engine (rebuild_per_block)
    )
    sample_load_s: float | None = None  # sample server gauges this often during runs
    max_error_rate: float | None = None  # stop the run once this share of requests failed
    stop_grace_s: float = GRACE_S  # in-flight requests' grace after a stop ($HARNESS_STOP_GRACE_S)
    # ---- ramp-up, saturation, capacity under an SLO (harness.core.ramp, harness.run.capacity)
    ramp_up_strategy: str | None = None  # vLLM bench's: "linear" | "exponential"
    ramp_up_start_rps: float | None = None
    ramp_up_end_rps: float | None = None
    detect_saturation: bool = False  # stop an open-loop point that saturates (run.saturation)
    slo: Mapping[str, float] | None = None  # --slo: capacity search, ms per metric
    slo_quantile: float = 0.9
    slo_start_rate: float = 1.0  # the search's first probed rate (req/s)
    slo_max_probes: int = 10  # rates probed at most (each runs every variant, interleaved)
    # ---- analysis and output (never change a measurement)
    min_effect: float = 0.02
    goodput: Mapping[str, float] | None = None  # SLOs in ms: ttft, tpot, e2e
    price_per_hour: Mapping[str, float] | None = None  # engine -> USD per hour (--price-per-hour)
    plots: bool = True
    progress: bool = True
    save_vllm_json: bool = False
    result_filename: str | None = None
    resume: bool = False
    # ---- a trace replay or conversations (harness.flags.workload)
    trace_schedule: tuple[float, ...] = ()  # each request's send offset (s, scaled): a replay
    trace: Mapping[str, Any] | None = None  # how the trace was fitted (workloads.trace.TraceSpec)
    conversations: Mapping[str, Any] | None = None  # multi-turn: think_time_s, max_turns

    # ---- engine configurations ---------------------------------------------------------------
    def spec_configs(
        self, engine_methods: Sequence[str], engine: str | None = None
    ) -> list[tuple[str, dict[str, Any]]]:
        """(label, speculative_config) for every speculative variant of one engine. A method
        the engine lacks is kept when it has what it needs (an EAGLE head): its cells then say
        "unsupported" (HF has no EAGLE) instead of vanishing from the table. A method's K from
        a tune file (``spec_k``) runs as its per-load schedule on an engine that takes one
        (``tunable``), else as its K at the smallest load. A ``--spec-config`` of a method
        that ``--spec`` also runs (another EAGLE head beside the shipped one) is labelled
        ``METHOD(spec-config)``: under one label the two lanes' runs pooled into one row."""
        out: list[tuple[str, dict[str, Any]]] = []
        if self.spec_config is not None:
            cfg = dict(self.spec_config)
            out.append((_label(cfg, multi_k=False), cfg))
        multi_k = len(self.num_spec_tokens) > 1
        schedules = engine is None or engine_class(engine).capabilities.tunable
        for method in self.spec_methods:
            if method not in engine_methods and not (method in EAGLE and self.eagle3_model):
                continue
            tuned = self.tuned_k(method)
            for k in (tuned["k"],) if tuned else self.num_spec_tokens:
                cfg = speculative_config(method, k, self.draft_model, self.eagle3_model)
                if cfg is None:
                    continue
                if tuned and tuned.get("schedule") and schedules:
                    cfg["num_speculative_tokens"] = max(r[2] for r in tuned["schedule"])
                    cfg[SCHEDULE] = [list(r) for r in tuned["schedule"]]
                out.append((_label(cfg, multi_k), cfg))
        if self.spec_config is not None and out[0][0] in {label for label, _ in out[1:]}:
            out[0] = (f"{out[0][0]}(spec-config)", out[0][1])  # its lane apart from --spec's
        return out

    def tuned_k(self, method: str) -> Mapping[str, Any] | None:
        """The method's entry in ``spec_k`` where a tune file gave its K (``k``, ``schedule``)."""
        got = (self.spec_k.get("methods") or {}).get(method)
        file = self.spec_k.get("file")
        return got if got and file and got.get("from") == file else None

    def engine_configs(
        self, engine_methods: Mapping[str, Sequence[str]]
    ) -> list[tuple[str, EngineConfig]]:
        """(label, config) in run order: per engine, the baseline first, then each spec variant."""
        out = []
        for engine in self.engines:
            variants: list[tuple[str, Mapping[str, Any] | None]] = []
            if self.baseline:
                variants.append(("baseline", None))
            if self.aa:
                variants.append((AA_LABEL, None))
            variants.extend(self.spec_configs(engine_methods.get(engine, ()), engine))
            for label, spec in variants:
                out.append(
                    (
                        label,
                        EngineConfig(
                            engine=engine,
                            model=self.model,
                            tokenizer=self.tokenizer,
                            draft_model=self.draft_model,
                            spec_config=spec,
                            dtype=self.resolved_dtype or self.dtype,
                            device=self.device,
                            seed=self.seed,
                            engine_args=dict(self.args_for(engine)),
                            options=dict(self.options.get(engine, {})),
                            prefix_cache=self.prefix_cache,
                        ),
                    )
                )
        return out

    def args_for(self, engine: str) -> Mapping[str, Any]:
        """The engine's arguments: the global ones (or its own) and ``max_model_len`` where its
        ``run_flags`` take --max-model-len (the vLLM engines; HF's KV cache holds what each
        request needs)."""
        given = (
            self.engine_args
            if self.engine_args_by_engine is None
            else self.engine_args_by_engine.get(engine, {})
        )
        if self.max_model_len is None or "max_model_len" not in engine_class(engine).run_flags:
            return given
        return {**given, "max_model_len": self.max_model_len}

    # ---- points --------------------------------------------------------------------------------
    def strategies(self, mode: str) -> list[LoadStrategy]:
        if mode == "latency":
            return [Synchronous()]
        if self.trace_schedule:  # the trace says when; --concurrency, if given, caps in flight
            scale = float((self.trace or {}).get("time_scale", 1.0))
            caps = list(self.concurrency) or [None]
            return [TraceReplay(self.trace_schedule, scale, cap) for cap in caps]
        out: list[LoadStrategy] = []
        caps: list[int | None] = list(self.concurrency) or [None]
        if self.ramp_up_strategy is not None:
            from harness.core.ramp import Ramp

            start, end = float(self.ramp_up_start_rps or 0.0), float(self.ramp_up_end_rps or 0.0)
            return [
                Ramp(self.ramp_up_strategy, start, end, self.burstiness, self.seed, c) for c in caps
            ]
        if self.request_rates:
            for rate in self.request_rates:
                for cap in caps:
                    if rate == float("inf"):
                        out.append(Concurrent(cap) if cap else Concurrent(10**6))
                    else:
                        out.append(Poisson(rate, self.burstiness, self.seed, cap))
        else:
            out.extend(Concurrent(n) for n in self.concurrency)
        return out

    def points(self) -> Iterator[Point]:
        for mode in self.modes:
            for strategy in self.strategies(mode):
                for n in self.max_new_tokens:
                    yield Point(mode, strategy, n)

    def resolve_lengths(self, point: Point, requests: Sequence[Request]) -> Sequence[Request]:
        """Every request with the one length it is generated to (``Request.max_new_tokens``, the
        only length an engine reads: ``engines.base.new_tokens``), decided here and nowhere
        else. The point's length is ``--max-new-tokens`` when given, else the dataset's output
        length (``--random-output-len``, ``--prefix-repetition-output-len``), else the default
        (``harness.flags.plan.DEFAULT_MAX_NEW_TOKENS``). Without --max-new-tokens
        (``lengths_from_workload``) a request's own length (a request file's ``max_new_tokens``,
        a synthetic request's sampled output length) wins over the point's; with it, the flag
        wins over every request's own. A view, each request resolved as it is read (a million
        requests: no copy)."""
        return Mapped(requests, LengthRule(self.lengths_from_workload, point.max_new_tokens))

    def point_requests(self, point: Point, requests: Sequence[Request]) -> Sequence[Request]:
        """The requests one point sends, each with its length (:meth:`resolve_lengths`): the
        workload, cycled with fresh ids (seeded) to ``STEADY_WAVES`` x its concurrency in
        throughput mode, or without end under ``duration`` (the runner stops sending then)."""
        requests = self.resolve_lengths(point, requests)
        cap = point.strategy.max_concurrency
        if point.mode != "throughput" or not requests or self.trace_schedule:
            return requests  # a trace: its own lines, each once
        if self.duration is not None:
            rate = getattr(point.strategy, "rate", getattr(point.strategy, "end_rps", 0.0))
            return Cycled(requests, max(100_000, int(rate * self.duration * 3)), self.seed)
        if self.fill_concurrency and cap and len(requests) < STEADY_WAVES * cap:
            return Cycled(requests, STEADY_WAVES * cap, self.seed)
        return requests

    def cell(self, engine: str, label: str, point: Point, repeat: int) -> Cell:
        return Cell(
            engine=engine,
            label=label,
            mode=point.mode,
            load=point.strategy.to_json(),
            max_new_tokens=point.max_new_tokens,
            repeat=repeat,
            workload=self.workload,
            model=self.model,
            temperature=self.temperature,
        )

    def to_json(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in d.items()}


# Settings that never change what a run measures: analysis, output, how many repeats (a resumed
# run may ask for more), when to stop; every other key of RunPlan.to_json() does.
NOT_MEASURED = frozenset(
    {
        "repeats", "target_ci", "max_repeats", "stopping", "budget_s", "min_effect", "goodput", "max_error_rate", "price_per_hour",
        "metric_percentiles", "percentile_metrics", "metadata", "plots", "progress",
        "save_vllm_json", "result_filename", "resume", "token_ids", "stop_grace_s",
    }
)  # fmt: skip
# Engine options that only decide how long to wait for a server or where its key is, or say why,
# or repeat a setting compared above (ignore_eos: each HTTP client warns where it is not sent),
# or how tokens are counted when a server sends no usage (each record says how:
# info.output_tokens_from; journals before the option lack it).
NOT_MEASURED_OPTIONS = frozenset(
    {
        "start_timeout", "api_key_env", "api_key_file", "log_path", "token_ids_why", "ignore_eos",
        "count_with_model",
    }
)  # fmt: skip


def measured(config: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a recorded config (``RunPlan.to_json()`` plus the workload's fingerprint)
    that changes what is measured: two runs agreeing on it may share a journal."""
    out = {k: v for k, v in config.items() if k not in NOT_MEASURED}
    out["options"] = {
        engine: {k: v for k, v in opts.items() if k not in NOT_MEASURED_OPTIONS}
        for engine, opts in (config.get("options") or {}).items()
    }
    return out


def config_differences(recorded: Mapping[str, Any], asked: Mapping[str, Any]) -> list[str]:
    """The measured keys on which two configs differ, sorted (engine options as
    ``options.ENGINE.KEY``)."""
    a, b = measured(recorded), measured(asked)
    keys = [k for k in set(a) | set(b) if k != "options" and a.get(k) != b.get(k)]
    oa, ob = a["options"], b["options"]
    for engine in sorted(set(oa) | set(ob)):
        ea, eb = oa.get(engine, {}), ob.get(engine, {})
        keys += [f"options.{engine}.{k}" for k in set(ea) | set(eb) if ea.get(k) != eb.get(k)]
    return sorted(keys)


def lookup(config: Mapping[str, Any], key: str) -> Any:
    """``config[key]``, where ``options.ENGINE.KEY`` reads an engine option."""
    if key.startswith("options."):
        _, engine, opt = key.split(".", 2)
        return (config.get("options") or {}).get(engine, {}).get(opt)
    return config.get(key)


def _label(cfg: Mapping[str, Any], multi_k: bool) -> str:
    method = str(cfg.get("method", "spec"))
    k = cfg.get("num_speculative_tokens")
    return f"{method}(k={k})" if multi_k and k is not None else method


def parse_methods(value: str | None) -> tuple[str, ...]:
    """``--spec`` alone -> every method; ``--spec a,b`` -> those (validated)."""
    if value is None:
        return ()
    if value == "all":
        return ALL_METHODS
    methods = tuple(m.strip() for m in value.split(",") if m.strip())
    for m in methods:
        if m not in SPEC_METHODS:
            raise PlanError(f"--spec: unknown method {m!r}; choose from: {', '.join(SPEC_METHODS)}")
    return methods


def check_engines(names: Sequence[str]) -> None:
    from engines.base import REGISTRY

    for name in names:
        if name not in REGISTRY:
            raise EngineError(
                f"--engine: unknown engine {name!r}; choose from: {', '.join(sorted(REGISTRY))}"
            )

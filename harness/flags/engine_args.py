"""``--engine-args`` per engine: the global form (``'{...}'``, ``--engine-arg KEY=VALUE``) beside
the scoped one (``--engine-args vllm='{...}'``). A global key goes to the engines of the run that
take it (``Engine.engine_arg_names``); a key no engine of the run takes, or a scoped key its
engine does not take, is refused in one line naming the engine, before anything loads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engines.base import REGISTRY, engine_class
from harness.flags.options import UsageError, json_arg, kv_args

DTYPES = ["auto", "float32", "bfloat16", "float16"]
DTYPE_HELP = (
    "weights dtype, one for every engine (auto: float32 on CPU; on CUDA the model's config.json "
    "torch_dtype, bfloat16 if it says float32); a second dtype for one engine: "
    "--engine-args ENGINE='{\"dtype\": ...}'"
)
MAX_MODEL_LEN_HELP = (
    "the vLLM engines' max_model_len (vllm, vllm-server): the longest prompt + output a request "
    "may have (vLLM fails a longer one), and the KV cache the memory plan reserves per vLLM lane "
    "(default: the model's max_position_embeddings; on CPU 2048); hf, transformers-server and "
    "openai do not take it (HF's cache holds what each request needs)"
)
ARGS_HELP = (
    "JSON object passed to the engines that take its keys (vLLM EngineArgs, e.g. "
    "'{\"tensor_parallel_size\": 2}'); ENGINE=JSON for one engine only, e.g. "
    'vllm=\'{"enforce_eager": true}\' hf=\'{"attn_implementation": "sdpa"}\' (repeatable)'
)


def split_values(
    values: Sequence[str] | str | None,
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(global, {engine: scoped}) from the --engine-args values (each JSON or ENGINE=JSON)."""
    if values is None:
        return {}, {}
    glob: dict[str, Any] = {}
    scoped: dict[str, dict[str, Any]] = {}
    for value in [values] if isinstance(values, str) else values:
        name, sep, rest = value.partition("=")
        if sep and name.strip() in REGISTRY and not value.lstrip().startswith("{"):
            engine = name.strip()
            scoped.setdefault(engine, {}).update(json_arg(f"--engine-args {engine}", rest) or {})
        elif sep and not value.lstrip().startswith("{"):
            raise UsageError(
                f"--engine-args: {name.strip()!r} is no engine; expected JSON or ENGINE=JSON with "
                f"ENGINE one of: {', '.join(sorted(REGISTRY))}"
            )
        else:
            glob.update(json_arg("--engine-args", value) or {})
    return glob, scoped


def _takes(engine: str, key: str) -> bool:
    names = engine_class(engine).engine_arg_names()
    return names is None or key in names


def _refusal(engine: str, key: str, scoped: bool) -> str:
    names = engine_class(engine).engine_arg_names() or frozenset()
    how = f"--engine-args {engine}=" if scoped else "--engine-args"
    known = ", ".join(sorted(names)) if len(names) <= 16 else f"{len(names)} names"
    return f"{how}: {key!r} is not an argument engine {engine} takes (it takes: {known})"


def resolve(
    values: Sequence[str] | str | None, pairs: Sequence[str], engines: Sequence[str]
) -> tuple[dict[str, Any], dict[str, dict[str, Any]] | None]:
    """(the global arguments as given, each engine's arguments or None when nothing is
    scoped and one engine takes them all as before)."""
    glob, scoped = split_values(values)
    glob.update(kv_args(pairs))
    for engine in scoped:
        if engine not in engines:
            raise UsageError(
                f"--engine-args {engine}=...: {engine} is not in --engine {','.join(engines)}"
            )
    if not scoped and len(engines) == 1:  # as before: the engine's own validate() checks them
        return glob, None
    out: dict[str, dict[str, Any]] = {}
    for key in glob:
        takers = [e for e in engines if _takes(e, key)]
        if not takers:
            raise UsageError(
                _refusal(engines[0], key, scoped=False) + "; no engine of the run does"
            )
    for engine in engines:
        mine = {k: v for k, v in glob.items() if _takes(engine, k)}
        for key, value in scoped.get(engine, {}).items():
            if not _takes(engine, key):
                raise UsageError(_refusal(engine, key, scoped=True))
            mine[key] = value
        out[engine] = mine
    return glob, out


def check_max_model_len(
    n: int | None,
    engines: Sequence[str],
    glob: Mapping[str, Any],
    by_engine: Mapping[str, Mapping[str, Any]] | None,
) -> None:
    """--max-model-len goes to the engines whose ``run_flags`` take it (vLLM's: RunPlan.args_for);
    one line when no engine of the run does, or when --engine-args gives it too (said once)."""
    if n is None:
        return
    takers = [e for e in engines if "max_model_len" in engine_class(e).run_flags]
    if not takers:
        named = [e for e in REGISTRY if "max_model_len" in engine_class(e).run_flags]
        raise UsageError(
            f"--max-model-len is for --engine {' or '.join(named)} (vLLM's max_model_len); "
            f"--engine {','.join(engines)} does not take it"
        )
    for engine in takers:
        given = (glob if by_engine is None else by_engine.get(engine, {})).get("max_model_len")
        if given is not None:
            raise UsageError(
                f"--max-model-len {n} and --engine-args max_model_len={given} ({engine}): one "
                "setting given twice; keep --max-model-len"
            )


def describe(by_engine: Mapping[str, Mapping[str, Any]] | None, glob: Mapping[str, Any]) -> str:
    """One line: which engine gets which arguments."""
    if by_engine is None:
        return ", ".join(f"{k}={v!r}" for k, v in glob.items()) or "none"
    parts = [
        f"{e}: {', '.join(f'{k}={v!r}' for k, v in a.items()) or 'none'}"
        for e, a in by_engine.items()
    ]
    return "; ".join(parts)

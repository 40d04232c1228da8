"""One loaded copy of each model per process, shared by the HF lanes alive at once: baseline,
assisted generation and prompt lookup differ only in ``generate``'s arguments, so they run one
target object (and one draft), which is what the memory plan counts (harness.sizing.memory).

A shared model's candidate generator and forward hook are patched once; they count into the
engine generating at that moment (``Held.current``, set on the one generation thread before each
``generate``), so each lane's acceptance counters stay its own."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from engines.base import EngineError
from engines.hf.spec import patch_candidate_generator

# the engine_args the HF engine takes: from_pretrained's loading settings (and "dtype": this
# engine's own dtype when a run wants two); anything else is refused before loading
FROM_PRETRAINED = frozenset(
    {
        "attn_implementation", "revision", "trust_remote_code", "low_cpu_mem_usage",
        "max_memory", "quantization_config", "use_safetensors", "variant", "token",
        "cache_dir", "local_files_only", "subfolder", "dtype",
    }
)  # fmt: skip


@dataclass(eq=False)
class Held:
    """A loaded model, how many engines hold it, and which of them generates now."""

    key: Hashable
    model: Any
    refs: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)  # one generate at a time
    current: Any = None  # the engine whose counters a generate/forward counts into
    counting: bool = False  # candidate generator and forward hook patched

    def count(self) -> None:
        """Patch once: acceptance and target passes go to ``current``'s counters."""
        if self.counting:
            return
        self.counting = True
        patch_candidate_generator(self.model, _Current(self))
        self.model.register_forward_hook(self._pass)

    def _pass(self, *_: Any) -> None:
        engine = self.current
        if engine is not None:
            engine.count_pass()


class _Current:
    """An AcceptanceCounter's two calls, forwarded to the generating engine's own counter."""

    def __init__(self, held: Held) -> None:
        self.held = held

    def drafted(self, n: int) -> None:
        if self.held.current is not None:
            self.held.current.counter.drafted(n)

    def verified(self, num_matches: int) -> None:
        if self.held.current is not None:
            self.held.current.counter.verified(num_matches)


_HELD: dict[Hashable, Held] = {}
_GUARD = threading.Lock()
BUILT: list[str] = []  # every model this process built, by name (tests count them)


def check_args(engine_args: Mapping[str, Any], dtypes: tuple[str, ...]) -> None:
    """Refuse an engine argument from_pretrained is not given here, before loading."""
    for key in engine_args:
        if key not in FROM_PRETRAINED:
            raise EngineError(
                f"hf engine: engine argument {key!r} is not taken (from_pretrained settings: "
                f"{', '.join(sorted(FROM_PRETRAINED))})"
            )
    own = engine_args.get("dtype")
    if own is not None and own not in dtypes:
        raise EngineError(f"hf engine: engine_args dtype {own!r}; choose from {dtypes}")


def dtype_name(asked: str, on_cuda: bool) -> str:
    """The dtype loaded: as asked (the run resolves auto once: harness.sizing.model_size), else
    float16 on CUDA and float32 on CPU."""
    if asked != "auto":
        return asked
    return "float16" if on_cuda else "float32"


def load(auto: Any, path: str, dtype: Any, device: str, kwargs: dict[str, Any]) -> Held:
    """``auto.from_pretrained(path)`` on ``device``, once per (model, dtype, device, settings)
    in this process; held once more by the caller (``release`` when done)."""

    def build() -> Any:
        try:
            m = auto.from_pretrained(path, dtype=dtype, **kwargs)
        except Exception as e:  # hub id offline, bad directory, ...
            raise EngineError(f"hf engine: cannot load {path}: {str(e).splitlines()[0]}") from e
        return m.to(device).eval()

    key = (path, str(dtype), device, json.dumps(kwargs, sort_keys=True, default=str))
    return acquire(key, path, build)


def acquire(key: Hashable, name: str, build: Callable[[], Any]) -> Held:
    """The model for ``key``, built on first use (``build``), held once more."""
    with _GUARD:
        held = _HELD.get(key)
        if held is None:
            held = Held(key, build())
            BUILT.append(name)
            _HELD[key] = held
        held.refs += 1
        return held


def release(held: Held | None) -> bool:
    """Hold it once less; True when that was the last holder (the model is dropped)."""
    if held is None:
        return False
    with _GUARD:
        held.refs -= 1
        if held.refs > 0:
            return False
        _HELD.pop(held.key, None)
        held.model = None
        return True


def alive() -> int:
    """Models loaded in this process now."""
    with _GUARD:
        return len(_HELD)

"""What ``harness tune`` tunes: the methods ``--spec`` names that the engine runs and has what they
need, and a ``--spec-config`` variant (e.g. a hub EAGLE-3 head) as one more method, its K tuned
like theirs (the config as given, ``num_speculative_tokens`` replaced per arm)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from harness.run.plan import RunPlan


def spec_config_for(plan: RunPlan, method: str, k: int) -> dict[str, Any] | None:
    """The speculative_config a run builds for (method, K): --spec-config's own when it is of
    that method, else the one ``--spec METHOD`` makes (draft paths, n-gram sizes)."""
    given = plan.spec_config
    if given is not None and given.get("method") == method:
        return {**dict(given), "num_speculative_tokens": k}
    one = replace(plan, spec_config=None, spec_methods=(method,), num_spec_tokens=(k,), spec_k={})
    got = one.spec_configs((method,))
    return dict(got[0][1]) if got else None


def tuned_methods(plan: RunPlan, engine_methods: Sequence[str]) -> list[str]:
    """The methods to tune, in --spec order, then --spec-config's (once)."""
    methods = [m for m in plan.spec_methods if m in engine_methods]
    given = None if plan.spec_config is None else plan.spec_config.get("method")
    if given is not None and given in engine_methods and given not in methods:
        methods.append(str(given))
    return methods

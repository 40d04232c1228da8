"""Energy per token on a fake NVML (no GPU here): a module object whose total-energy counter
advances at a known power on the session's clock, patched in where harness.run.energy imports
pynvml. Real engines cannot make a device draw a known power; everything else is the real
session, runner, analysis and views."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from engines import base as engines_base
from engines.base import Capabilities, Chunk, EngineConfig, GenParams, Request
from harness.analysis.derived import analyze
from harness.report.answer_text import answer_sections
from harness.run import energy
from harness.run.plan import RunPlan
from harness.run.session import Session
from tests.clock import FakeClock, ScriptedEngine

WATTS = 300.0  # the fake device's constant draw
PROMPTS = [Request(f"p{i}", f"prompt {i}") for i in range(4)]
SECONDS_PER_TOKEN = {"baseline": 0.02, "fast": 0.01}


class TimedEngine(ScriptedEngine):
    """A scripted engine whose token takes a set virtual time per variant, slower as (virtual)
    time passes (``drift`` per second), so that blocks differ."""

    capabilities: ClassVar[Capabilities] = Capabilities(coexist=True, device_memory="shared")

    def __init__(self, clock: FakeClock, label: str, drift: float):
        super().__init__(clock, {})
        self.label, self.drift = label, drift

    async def stream(
        self, request: Request, params: GenParams, clock: Any = None
    ) -> AsyncIterator[Chunk]:
        for i in range(4):
            slower = 1 + self.drift * (self.clock.now - 100.0) * (1 if self.label == "fast" else 0)
            self.clock.now += SECONDS_PER_TOKEN[self.label] * slower
            await asyncio.sleep(0)
            yield Chunk(token_ids=(i,))


def fake_nvml(clock: FakeClock, energy_counter: bool = True) -> SimpleNamespace:
    """pynvml's calls that harness.run.energy makes: one device drawing WATTS on ``clock``; the
    total-energy counter in mJ (or NotSupported: an older card, power in mW only)."""

    def total(handle: str) -> float:
        if not energy_counter:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return WATTS * clock.now * 1e3

    return SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetName=lambda h: b"Fake GPU",
        nvmlDeviceGetTotalEnergyConsumption=total,
        nvmlDeviceGetPowerUsage=lambda h: WATTS * 1e3,
    )


def _plan(**kw: Any) -> RunPlan:
    args: dict[str, Any] = dict(
        engines=("timed",), model="m", draft_model=None, tokenizer=None, spec_methods=(),
        num_spec_tokens=(4,), spec_config=None, baseline=True, modes=("latency", "throughput"),
        concurrency=(2,), request_rates=(), burstiness=1.0, max_new_tokens=(4,), repeats=4,
        warmup=1, target_ci=None, max_repeats=4, seed=0, workload="w",
    )  # fmt: skip
    return RunPlan(**(args | kw))


def _run(monkeypatch: pytest.MonkeyPatch, drift: float, counter: bool = True) -> list[Any]:
    clock = FakeClock()
    monkeypatch.setattr(energy, "load_nvml", lambda: fake_nvml(clock, counter))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def factory(config: EngineConfig) -> TimedEngine:  # the lane's label rides in its model
        return TimedEngine(clock, config.model, drift)

    session = Session(_plan(), PROMPTS, progress=False, clock=clock, engine_factory=factory)
    configs = [(lb, EngineConfig(engine="timed", model=lb)) for lb in ("baseline", "fast")]
    asyncio.run(session.execute(configs))
    return session.runs


@pytest.fixture(autouse=True)
def _registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(engines_base.REGISTRY, "timed", "tests.test_energy:TimedEngine")


def test_each_run_records_the_counters_difference(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _run(monkeypatch, drift=0.0)
    assert len(runs) == 2 * 2 * 4
    for run in runs:
        e = run.extra["energy"]
        assert e["source"] == energy.NVML_COUNTER and e["devices"] == ["Fake GPU"]
        # the counter read at the run's start and end: the power times the run's own time
        assert e["joules"] == pytest.approx(WATTS * e["seconds"], rel=1e-9)
        span = max(r.t_end for r in run.counted) - min(r.t_send for r in run.counted)
        assert e["seconds"] == pytest.approx(span, rel=1e-9)  # warm-ups are outside it


def test_joules_per_token_and_the_paired_ratio(monkeypatch: pytest.MonkeyPatch) -> None:
    """Constant speeds: J/token is the power times the seconds per token (latency mode, one at a
    time); the ratio is exact. A drifting candidate: at constant power the energy ratio per block
    is the inverse of that block's tokens/s speedup, so the interval is the speedup's inverted."""
    res = analyze(_run(monkeypatch, drift=0.0), min_effect=0.02)
    for row in res["rows"]:
        if row["mode"] == "latency":
            expected = WATTS * SECONDS_PER_TOKEN[row["label"]]
            assert row["energy"]["joules_per_token"] == pytest.approx(expected, rel=1e-9)
            assert row["energy"]["mean_watts"] == pytest.approx(WATTS, rel=1e-9)
    tok_s = [c for c in res["comparisons"] if c["metric"] == "output_tok_s"]
    assert len(tok_s) == 2
    for c in tok_s:
        assert c["energy"]["estimate"] == pytest.approx(0.5, rel=1e-9)
        assert c["energy"]["verdict"] == "less energy" and c["energy"]["n"] == 4

    res = analyze(_run(monkeypatch, drift=0.5), min_effect=0.02)
    for c in (c for c in res["comparisons"] if c["metric"] == "output_tok_s"):
        e = c["energy"]
        assert c["lo"] < c["hi"]  # the drift spreads the blocks
        assert e["estimate"] == pytest.approx(1 / c["estimate"], rel=1e-9)
        assert e["lo"] == pytest.approx(1 / c["hi"], rel=1e-9)
        assert e["hi"] == pytest.approx(1 / c["lo"], rel=1e-9)
    lines = dict(answer_sections(res))
    head = next(h for h in lines if h.startswith("What it draws"))
    assert "nvml energy counter" in head
    first = res["answer"]["energy"][0]
    assert f"uses {(1 - first['estimate']) * 100:.0f}% less energy per token [" in lines[head][0]


class RemoteEngine(TimedEngine):
    """A server elsewhere (``device_memory`` ""): this machine's devices do not serve it."""

    capabilities: ClassVar[Capabilities] = Capabilities(coexist=True)


def test_a_remote_server_gets_no_reading_of_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(energy, "load_nvml", lambda: fake_nvml(clock))
    session = Session(
        dataclasses.replace(_plan(), modes=("latency",)),
        PROMPTS,
        progress=False,
        clock=clock,
        engine_factory=lambda config: RemoteEngine(clock, "baseline", 0.0),
    )
    asyncio.run(session.execute([("baseline", EngineConfig(engine="timed", model="m"))]))
    assert session.runs and all("energy" not in r.extra for r in session.runs)


def test_sampled_power_where_the_card_has_no_counter(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _run(monkeypatch, drift=0.0, counter=False)
    for run in runs:
        e = run.extra["energy"]
        assert e["source"] == energy.NVML_POWER
        assert e["joules"] == pytest.approx(WATTS * e["seconds"], rel=1e-9)


def test_no_nvml_means_no_energy_and_the_views_say_n_a(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(energy, "load_nvml", lambda: None)
    monkeypatch.setattr(energy, "POWERCAP", Path("/nonexistent"))
    clock = FakeClock()
    session = Session(
        dataclasses.replace(_plan(), modes=("latency",), repeats=3),
        PROMPTS,
        progress=False,
        clock=clock,
        engine_factory=lambda config: TimedEngine(clock, "baseline", 0.0),
    )
    assert session.energy is None or session.energy.source == energy.RAPL
    if session.energy is None:
        asyncio.run(session.execute([("baseline", EngineConfig(engine="timed", model="m"))]))
        assert all("energy" not in r.extra for r in session.runs)
        res = analyze(session.runs, min_effect=0.02)
        assert all(row["energy"] is None for row in res["rows"])
        from harness.report.columns import MAIN, Line

        col = next(c for c in MAIN if c.name == "j_per_tok")
        assert col.fmt(col.get(Line(res["rows"][0]))) == "n/a"


def test_rapl_packages_with_a_wrapping_counter(tmp_path: Path) -> None:
    zone = tmp_path / "intel-rapl:0"
    zone.mkdir()
    (zone / "name").write_text("package-0\n")
    (zone / "max_energy_range_uj").write_text("1000000\n")
    (zone / "energy_uj").write_text("900000\n")
    sub = tmp_path / "intel-rapl:0:0"  # a sub-zone (core): not counted again
    sub.mkdir()
    (sub / "name").write_text("core\n")
    meter = energy.rapl_meter(tmp_path)
    assert meter is not None and meter.source == energy.RAPL and meter.devices == ["intel-rapl:0"]
    start = meter.read()
    (zone / "energy_uj").write_text("100000\n")  # wrapped: 0.2 J later
    assert meter.read() - start == pytest.approx(0.2)
    assert energy.rapl_meter(tmp_path / "none") is None


def test_visible_devices_map_to_nvml_indices() -> None:
    assert energy.visible_indices(4, None) == [0, 1, 2, 3]
    assert energy.visible_indices(4, "2,3") == [2, 3]
    assert energy.visible_indices(2, "GPU-abc") == [0, 1]  # UUIDs: every device


def test_gpu_check_says_what_the_counter_measured() -> None:
    """bench/gpu_check's energy line (its GPU run is unproven here: no GPU is lent)."""
    from bench.gpu_harness import energy_line

    assert "Energy: n/a" in energy_line({"energy_source": None})
    h = {
        "energy_source": "nvml energy counter (NVIDIA H200)",
        "energy_rows": {"hf/baseline": {"joules_per_token": 0.5, "mean_watts": 310.0}},
        "energy_ratios": [{"candidate": "hf/ngram", "estimate": 0.8, "lo": 0.7, "hi": 0.9}],
        "energy_whole_run_j": 1234.0,
    }
    line = energy_line(h)
    assert "hf/baseline 0.5 J/tok at 310 W" in line and "hf/ngram 0.80x [0.70, 0.90]" in line
    assert "1234 J" in line

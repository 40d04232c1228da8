"""The energy a measured run drew, read beside it (harness.run.lanes.measured): the device's
own counter at the run's start and end, stored as the run's ``extra["energy"]``.

Sources, in the order tried (each said in the record, never mixed within a session):

* ``nvml energy counter``: NVML's total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``,
  mJ since the driver loaded; Volta and later), summed over the CUDA devices this process sees;
* ``nvml sampled power``: older cards without that counter: ``nvmlDeviceGetPowerUsage`` (mW)
  sampled every ``SAMPLE_S`` on the runner's clock, integrated by the trapezoid rule;
* ``rapl package``: a CPU's package energy from readable RAPL counters under
  /sys/class/powercap (the whole package, not only this process: said as such).

No source (no NVML, no driver, no readable RAPL): no ``energy`` key, and the views say n/a.
``nvidia-ml-py`` (module ``pynvml``, the gpu extra) is imported only here and only when a
session starts (:func:`energy_meter`), so tests patch :func:`load_nvml`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

NVML_COUNTER, NVML_POWER, RAPL = "nvml energy counter", "nvml sampled power", "rapl package"
SAMPLE_S = 0.1  # power samples on cards without the energy counter
POWERCAP = Path("/sys/class/powercap")


def load_nvml() -> Any | None:
    """The initialised ``pynvml`` module, or None (not installed, no driver, no device)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml if pynvml.nvmlDeviceGetCount() > 0 else None
    except Exception:  # noqa: BLE001 - no NVML is a machine without the reading, not an error
        return None


def visible_indices(count: int, env: str | None) -> list[int]:
    """The NVML indices of the devices CUDA shows this process (all when CUDA_VISIBLE_DEVICES is
    unset or names devices by UUID, which NVML's order cannot map here)."""
    if not env:
        return list(range(count))
    parts = [p.strip() for p in env.split(",") if p.strip()]
    if not all(p.isdigit() for p in parts):
        return list(range(count))
    return [int(p) for p in parts if int(p) < count]


class EnergyMeter:
    """Reads one source's cumulative energy (J); ``sampled``: the source is power, integrated
    by :class:`Reading` while the run lasts."""

    def __init__(
        self, source: str, devices: Sequence[str], read: Callable[[], float], sampled: bool
    ):
        self.source, self.devices, self.read, self.sampled = source, list(devices), read, sampled

    def reading(self, clock: Callable[[], float]) -> Reading:
        return Reading(self, clock)


class Reading:
    """``async with`` around one measured run: the counter read at its start and end (or the
    power sampled between them), on the runner's clock; :meth:`summary` is the run's record."""

    def __init__(self, meter: EnergyMeter, clock: Callable[[], float]):
        self.meter, self.clock = meter, clock
        self.joules = 0.0
        self.t0 = self.t1 = 0.0
        self._start = 0.0
        self._last = (0.0, 0.0)  # sampled power: the last (time, watts)
        self._task: asyncio.Task[None] | None = None
        self.error: str | None = None

    async def __aenter__(self) -> Reading:
        self.t0 = self.clock()
        try:
            self._start = self.meter.read()
        except Exception as exc:  # noqa: BLE001 - a failed read loses the energy, not the run
            self.error = str(exc)
        if self.meter.sampled and self.error is None:
            self._last = (self.t0, self._start)
            self._task = asyncio.create_task(self._sample())
        return self

    def _add(self, now: float, watts: float) -> None:
        t, p = self._last
        self.joules += (now - t) * (watts + p) / 2  # the trapezoid since the last sample
        self._last = (now, watts)

    async def _sample(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_S)
            self._add(self.clock(), self.meter.read())

    async def __aexit__(self, *exc: object) -> None:
        self.t1 = self.clock()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self.error is not None:
            return
        try:
            if self.meter.sampled:  # the last stretch, up to the run's end
                self._add(self.t1, self.meter.read())
            else:
                self.joules = self.meter.read() - self._start
        except Exception as exc:  # noqa: BLE001
            self.error = str(exc)

    def summary(self) -> dict[str, Any]:
        """The run's ``extra["energy"]``: joules over ``seconds`` (the runner's clock), the
        source and the devices read."""
        out: dict[str, Any] = {
            "source": self.meter.source,
            "devices": self.meter.devices,
            "seconds": self.t1 - self.t0,
        }
        if self.error is not None:
            return out | {"joules": None, "error": self.error}
        return out | {"joules": self.joules}


def nvml_meter(nvml: Any) -> EnergyMeter:
    """NVML's meter over the visible devices: the energy counter where every device has one,
    else sampled power."""
    count = nvml.nvmlDeviceGetCount()
    handles = [
        nvml.nvmlDeviceGetHandleByIndex(i)
        for i in visible_indices(count, os.environ.get("CUDA_VISIBLE_DEVICES"))
    ]
    names = [_name(nvml.nvmlDeviceGetName(h)) for h in handles]
    try:
        for h in handles:
            nvml.nvmlDeviceGetTotalEnergyConsumption(h)
    except Exception:  # noqa: BLE001 - NotSupported on cards before Volta
        return EnergyMeter(
            NVML_POWER,
            names,
            lambda: sum(nvml.nvmlDeviceGetPowerUsage(h) for h in handles) / 1e3,
            sampled=True,
        )
    return EnergyMeter(
        NVML_COUNTER,
        names,
        lambda: sum(nvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in handles) / 1e3,
        sampled=False,
    )


def _name(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def rapl_meter(root: Path = POWERCAP) -> EnergyMeter | None:
    """The CPU packages' RAPL counters (``intel-rapl:N``, whose name is ``package-N``) when every
    one is readable; the counter's wrap (``max_energy_range_uj``) is undone between reads."""
    zones = sorted(
        z
        for z in root.glob("intel-rapl:*")
        if ":" not in z.name.removeprefix("intel-rapl:")
        and (z / "name").is_file()
        and (z / "name").read_text().startswith("package")
    )
    try:
        ranges = [int((z / "max_energy_range_uj").read_text()) for z in zones]
        [int((z / "energy_uj").read_text()) for z in zones]
    except (OSError, ValueError):
        return None
    if not zones:
        return None
    last = [0] * len(zones)
    total = [0.0]

    def read() -> float:  # cumulative J since the first read, wraps undone
        for i, z in enumerate(zones):
            now = int((z / "energy_uj").read_text())
            if last[i]:
                total[0] += ((now - last[i]) % ranges[i]) / 1e6
            last[i] = now
        return total[0]

    read()
    return EnergyMeter(RAPL, [z.name for z in zones], read, sampled=False)


def energy_meter() -> EnergyMeter | None:
    """The session's meter: NVML where it answers, else RAPL packages, else None."""
    nvml = load_nvml()
    if nvml is not None:
        try:
            return nvml_meter(nvml)
        except Exception:  # noqa: BLE001 - a device NVML cannot name gives no reading
            return None
    return rapl_meter()

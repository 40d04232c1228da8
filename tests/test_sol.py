"""Speed of light: parameter count from safetensors headers, and the bound's arithmetic."""

import pytest

from harness.analysis.theory.sol import bound_for, count_params, speed_of_light, weights_device


def test_count_params_reads_the_header(tiny_pair):
    target, draft = tiny_pair
    assert count_params(target) == 1_066_112  # BUILD.json's figure, tied embeddings counted once
    assert 0 < count_params(draft) < count_params(target)


def test_bound(tiny_pair, tmp_path):
    assert speed_of_light(1e6, 4, 8e9) == pytest.approx(2000.0)
    b = bound_for(tiny_pair[0], "float32", 4.264448e9)
    assert b["bytes_per_param"] == 4 and b["tok_s"] == pytest.approx(1000.0)
    assert bound_for(str(tmp_path), "float32", 1e9) is None  # no weights: size unknown
    with pytest.raises(ValueError):
        speed_of_light(0, 4, 1e9)


def test_a_failed_device_measurement_gives_no_bound_not_a_lost_file(monkeypatch, tiny_pair):
    """finalize measures the bound before results.json is written: a full or broken GPU (or a
    journaled CUDA run resumed on a machine without one) must cost the bound, not the file."""
    from types import SimpleNamespace

    import harness.analysis.theory.sol
    from harness.cli.finalize import _speed_of_light
    from harness.core.results import Cell, Run

    def broken(mib: int = 0, reps: int = 0, device: str = "cpu") -> dict[str, float]:
        if device.startswith("cuda"):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return {"best": 1e10, "median": 1e10, "bytes": 1.0}

    monkeypatch.setattr(harness.analysis.theory.sol, "measure_bandwidth", broken)
    cell = Cell("hf", "baseline", "latency", {"concurrency": 1}, 8, 0, "w")
    plan = SimpleNamespace(model=tiny_pair[0])

    def bound(info: dict) -> dict | None:
        return _speed_of_light(plan, [Run(cell, None, (), engine_info=info)])  # type: ignore[arg-type]

    assert bound({"device": "cuda:0", "dtype": "float16"}) is None
    assert bound({"device": "cpu", "dtype": "float32"})["memory"] == "host"
    assert bound({"dtype": "float32"})["memory"].startswith("host (assumed")


def test_the_bound_reads_bandwidth_where_the_weights_are() -> None:
    """An HF model on CUDA was held to host bandwidth (23 GB/s on an H200 machine: "290% of the
    bound"): the device comes from the engines' own descriptions."""
    assert weights_device([{"device": "cuda:0", "dtype": "float16"}]) == "cuda:0"
    assert weights_device([{}, {"platform": "cuda"}]) == "cuda"
    assert weights_device([{"device": "cpu"}]) == "cpu"
    assert weights_device([{"platform": "cpu"}]) == "cpu"
    assert weights_device([{"base_url": "http://x/v1"}]) is None  # a server: not ours to see

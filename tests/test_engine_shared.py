"""Rules the engines share, written once: what a model name that is a path looks like, how a
request becomes prompt ids, and vLLM's CPU defaults for the in-process engine and the server."""

from __future__ import annotations

from typing import Any

import pytest

from engines.base import EngineConfig, EngineError
from engines.common.local_model import looks_like_path, missing_path, prompt_ids
from engines.common.vllm_args import CPU_DTYPE, CPU_KV_CACHE_BYTES, CPU_MAX_MODEL_LEN, cpu_defaults
from engines.servers.vllm_serve import VLLMServerEngine
from workloads.base import Request


@pytest.mark.parametrize(
    ("name", "path"),
    [
        ("gpt2", False),
        ("HuggingFaceTB/SmolLM2-135M", False),
        ("a/b/c", True),  # hub ids have at most one slash
        ("./m", True),
        ("../m", True),
        (".m", True),
        ("/m", True),
        ("~/m", True),
        ("C:\\models\\m", True),
    ],
)
def test_a_path_or_a_hub_id(name: str, path: bool) -> None:
    assert looks_like_path(name) is path
    assert missing_path(name) is path  # none of these exists here


def test_every_side_refuses_the_same_missing_path(tmp_path: Any) -> None:
    """The CLI, the HF engine and in-process vLLM agree: ``a/b/c`` is a missing path."""
    from engines.hf.engine import HFEngine
    from engines.vllm.engine import VLLMEngine
    from harness.flags.inputs import resolve_models
    from harness.flags.options import UsageError
    from harness.flags.parser import build_parser
    from harness.flags.plan import build_plan

    for cls in (HFEngine, VLLMEngine):
        with pytest.raises(EngineError, match="a/b/c"):
            cls.validate(EngineConfig(cls.name, "a/b/c"))
    with pytest.raises(UsageError, match="--model: a/b/c: no such file"):
        resolve_models(build_plan(build_parser().parse_args(["--model", "a/b/c"]), "a/b/c", None))
    assert not missing_path(str(tmp_path)) and not missing_path(None)


class _Tokenizer:
    """Encodes each character as its code point; marks the template's output."""

    def __init__(self, template: bool) -> None:
        self.chat_template = "t" if template else None
        self.calls: list[tuple[str, bool]] = []

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.calls.append((text, add_special_tokens))
        return ([1] if add_special_tokens else []) + [ord(c) for c in text]

    def apply_chat_template(self, messages: list[dict[str, Any]], **kw: Any) -> str:
        assert kw == {"add_generation_prompt": True, "tokenize": False}
        return "<" + "|".join(m["content"] for m in messages) + ">"


def test_prompt_ids_follow_one_rule() -> None:
    chat = Request(
        id="c", messages=({"role": "user", "content": "hi"}, {"role": "user", "content": "yo"})
    )
    assert prompt_ids(_Tokenizer(True), chat) == ([ord(c) for c in "<hi|yo>"], True)  # no 2nd BOS
    assert prompt_ids(_Tokenizer(False), chat) == ([1, *map(ord, "hi\nyo")], False)
    assert prompt_ids(_Tokenizer(True), Request(id="p", prompt="ab")) == ([1, 97, 98], False)
    exact = Request(id="s", prompt="ignored", prompt_token_ids=(5, 6))
    assert prompt_ids(_Tokenizer(True), exact) == ([5, 6], False)


def test_server_and_in_process_vllm_share_the_cpu_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    table = cpu_defaults("/no/model", {})
    assert table == {
        "enforce_eager": True,
        "max_model_len": CPU_MAX_MODEL_LEN,
        "kv_cache_memory_bytes": CPU_KV_CACHE_BYTES,
    }
    assert CPU_KV_CACHE_BYTES == 512 * 2**20  # the value chosen for both (README, issue 14)
    server = VLLMServerEngine(EngineConfig("vllm-server", "/no/model", device="cpu"))
    argv = server.argv
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == str(CPU_KV_CACHE_BYTES)
    assert argv[argv.index("--max-model-len") + 1] == str(CPU_MAX_MODEL_LEN)
    # dtype "auto" on CPU: float32 for both (vllm_args.CPU_DTYPE), recorded as chosen
    assert server.describe()["defaults_chosen"] == table | {"dtype": CPU_DTYPE}
    assert argv[argv.index("--dtype") + 1] == CPU_DTYPE
    user = {"gpu_memory_utilization": 0.5, "max_model_len": 64}  # the user's keys win, alone
    assert cpu_defaults("/no/model", user) == {"enforce_eager": True}
    gpu = VLLMServerEngine(EngineConfig("vllm-server", "/no/model", device="cuda"))
    assert "--kv-cache-memory-bytes" not in gpu.argv and gpu.describe()["defaults_chosen"] == {}

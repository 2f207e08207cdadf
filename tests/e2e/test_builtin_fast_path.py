"""The CPU fast path through the gateway: a Switchyard server (subprocess) whose builtin backend
says only `dtype = "bfloat16"` compiles its steps (the default with bfloat16 on the CPU)
before /ready says yes, caches inductor's code under the cache root, and serves the official
`openai` client the same greedy tokens as an eager bfloat16 backend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from builtin_engine.model.store import cache_root
from builtin_engine.runner.device import resolve_placement
from tests.support.server import running_server

if not resolve_placement("cpu", "bfloat16").compile:
    pytest.skip("no C++ compiler: torch.compile cannot build the fast path's decode step", allow_module_level=True)

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


def config(model_dir: Path, **extra: str) -> str:
    lines = "".join(f"{key} = {value}\n" for key, value in extra.items())
    return f"""
[server]
log_level = "info"
health_interval_s = 0

[[backends]]
name = "builtin"
type = "builtin"
[backends.options]
model = "{model_dir}"
served_model_name = "tiny"
num_threads = 1
max_num_seqs = 4
max_model_len = 256
kv_cache_tokens = 1024
dtype = "bfloat16"
{lines}"""


@pytest.fixture(scope="module")
def servers(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    compiled_dir, eager_dir = tmp_path_factory.mktemp("fast-compiled"), tmp_path_factory.mktemp("fast-eager")
    with running_server(config(tiny_model_dir), compiled_dir, ready_timeout=600) as compiled, \
            running_server(config(tiny_model_dir, compile="false"), eager_dir) as eager:
        yield compiled, eager, compiled_dir


def chat(base: str, **extra: object) -> openai.types.chat.ChatCompletion:
    with openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120) as client:
        return client.chat.completions.create(model="tiny", messages=FRANCE, max_tokens=16, temperature=0,
                                              logprobs=True, **extra)


def test_compiled_before_ready_and_cached(servers: tuple[str, str, Path]) -> None:
    compiled, _, log_dir = servers
    assert httpx.get(compiled + "/ready", timeout=10).status_code == 200  # the first answer is already yes
    log = next(log_dir.glob("server-*.log")).read_text()
    assert "every step prepared in" in log  # the whole-step graph (builtin_engine.runner.step_graph)
    assert "bfloat16, decode step compiled (inductor)" in log
    assert any((cache_root() / "compile").glob("torch-*/*"))


def test_compiled_serves_the_eager_tokens(servers: tuple[str, str, Path]) -> None:
    compiled, eager, _ = servers
    fast, slow = chat(compiled), chat(eager)
    assert fast.usage.completion_tokens == 16
    tokens = [[t.token for t in r.choices[0].logprobs.content] for r in (fast, slow)]
    assert tokens[0] == tokens[1]
    with openai.OpenAI(base_url=compiled + "/v1", api_key="unused", max_retries=0, timeout=120) as client:
        stream = client.chat.completions.create(model="tiny", messages=FRANCE, max_tokens=16, temperature=0,
                                                stream=True)
        assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices) == \
            fast.choices[0].message.content

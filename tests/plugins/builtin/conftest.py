"""Fixtures for the built-in backend's tests, the structured-output and tool-call tests among them.

- `backend`: the built-in backend in process over the tiny random-weight model (`tiny_model_dir`),
  for bulk generations (one request with n=50 is one batched run).
- `gateway`: a real Switchyard server in a subprocess with two built-in backends over the same
  tiny model, read with the official `openai` client: `tiny` (tool parser `hermes`) and
  `tiny-llama3` (tool parser `llama3_json`); tests/e2e/test_structured_builtin.py imports it.

The random model writes nonsense, so every structured-output test constrains it: whatever it
writes must still parse and validate.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import openai
import pytest

from plugins.builtin.backend import BuiltinBackend, BuiltinOptions
from plugins.contract.protocol import Event, RequestSpec, Sampling
from tests.support.server import running_server

MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread() -> None:
    import torch

    torch.set_num_threads(1)  # two cores shared with the gateway subprocess: more threads thrash


@pytest.fixture(scope="module")
def backend(tiny_model_dir: Path) -> Iterator[BuiltinBackend]:
    options = msgspec.convert({"model": str(tiny_model_dir), "served_model_name": "tiny", "num_threads": 1,
                               "kv_cache_tokens": 16384, "max_num_batched_tokens": 512}, BuiltinOptions)
    backend = BuiltinBackend("local", options)
    run(backend.start())
    yield backend
    run(backend.close())


def chat_spec(**fields: Any) -> RequestSpec:
    sampling = fields.pop("sampling", Sampling(temperature=1.0, seed=7, max_tokens=120))
    base: dict[str, Any] = {"request_id": "req", "kind": "chat", "model": "tiny", "upstream_model": "tiny",
                            "messages": MESSAGES}
    base.update(fields)
    return RequestSpec(sampling=sampling, **base)


async def collect(backend: BuiltinBackend, spec: RequestSpec) -> list[Event]:
    return [event async for event in backend.generate(spec)]


@pytest.fixture(scope="session")
def gateway(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config = "\n".join([
        "[[backends]]", 'name = "tiny"', 'type = "builtin"', "[backends.options]",
        f'model = "{tiny_model_dir}"', 'served_model_name = "tiny"', "num_threads = 1", "kv_cache_tokens = 8192",
        'tool_parser = "hermes"', "",
        "[[backends]]", 'name = "tiny-llama3"', 'type = "builtin"', "[backends.options]",
        f'model = "{tiny_model_dir}"', 'served_model_name = "tiny-llama3"', "num_threads = 1",
        "kv_cache_tokens = 4096", 'tool_parser = "llama3_json"', "",
    ])
    with running_server(config, tmp_path_factory.mktemp("structured-gateway"), ready_timeout=180) as base:
        yield base


@pytest.fixture(scope="session")
def client(gateway: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway + "/v1", api_key="unused", max_retries=0, timeout=120)

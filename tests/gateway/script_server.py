"""Fixtures for the new front-ends' contract tests (Anthropic Messages, embeddings), imported by
the conftests of tests/gateway/messages_api and tests/gateway/embeddings_api: one real
server (a subprocess on a free loopback port) serving the scripted test backend
(`tests.support.script_backend`) under three names:
- `script` (model `claude-echo`): every extension, no delay, embeddings with `dimensions`;
- `slow` (model `claude-slow`): 50 ms per token, a `cancel_log`, one request at a time and no
  queue (the second concurrent request gets a 429);
- `plain` (model `claude-plain`): no extension declared and no embeddings;
- `agent` (model `claude-agent`): a context as long as a coding agent's requests need (Claude
  Code's default tools and system prompt, its `max_tokens` of 32000).
Client keys are on (`KEY`), so the official clients authenticate as they do against Anthropic
(`x-api-key`) and OpenAI (`Authorization: Bearer`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.support.probes import metric, wait_until
from tests.support.server import _toml, running_server

KEY = "sk-frontends-test-key"
MAX_BODY_BYTES = 64 * 1024
TOKEN_DELAY_S = 0.05


@dataclass(frozen=True)
class Server:
    base: str
    cancel_log: Path


def backend(name: str, limits: dict[str, int] | None = None, **options: object) -> str:
    lines = ["[[backends]]", f'name = "{name}"', 'type = "script"']
    lines += [f"{k} = {v}" for k, v in (limits or {}).items()]
    lines.append("[backends.options]")
    lines += [f"{k} = {_toml(v)}" for k, v in options.items()]
    return "\n".join(lines) + "\n\n"


def config(cancel_log: Path) -> str:
    return (
        f'[server]\napi_keys = ["{KEY}"]\nmax_body_bytes = {MAX_BODY_BYTES}\n\n'
        '[plugins]\ndisable = ["builtin"]\nmodules = ["tests.support.script_backend"]\n\n'
        + backend("script", models=["claude-echo"])
        + backend("slow", models=["claude-slow"], token_delay_s=TOKEN_DELAY_S, cancel_log=str(cancel_log),
                  limits={"max_concurrent": 1, "max_queue": 0})
        + backend("plain", models=["claude-plain"], extensions=[], embeddings=False)
        + backend("agent", models=["claude-agent"], max_model_len=200_000)
        + '[[routes]]\nname = "claude-sticky"\nstrategy = "sticky"\noptions = { key = ["user"] }\n'
        + '[[routes.targets]]\nbackend = "script"\nmodel = "claude-echo"\n'
        + '[[routes.targets]]\nbackend = "plain"\nmodel = "claude-plain"\n'
    )


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("frontends")
    cancel_log = tmp / "cancel.log"
    with running_server(config(cancel_log), tmp) as base:
        yield Server(base=base, cancel_log=cancel_log)


@pytest.fixture(scope="session")
def claude(server: Server) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=server.base, api_key=KEY, max_retries=0, timeout=30) as client:
        yield client


@pytest.fixture(scope="session")
def oai(server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.base + "/v1", api_key=KEY, max_retries=0, timeout=30) as client:
        yield client


def wait_idle(server: Server, backend: str = "slow") -> None:
    """Until no request runs on `backend` (one a test before left, cancelled, may still hold it)."""
    def idle() -> bool:
        return metric(httpx.get(server.base + "/metrics").text, "switchyard_requests_in_flight", backend=backend) == 0

    assert wait_until(idle, timeout=10)

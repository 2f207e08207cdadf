"""Fixtures for the gateway contract tests: real servers (subprocesses on free loopback ports)
serving the deterministic echo backend, and official `openai` clients pointed at them.

One session-wide server carries most tests; it has three echo backends:
- `echo`  (model `echo-1`): every extension declared, no delay;
- `plain` (models `plain-1`, `org/plain-2`): no extension declared, to prove undeclared extensions
  are refused; the second name has a slash, as Hugging Face model ids do;
- `slow`  (model `slow-1`): 50 ms per token and a `cancel_log`, for disconnect/cancel tests.
Its `[server]` table lowers `max_n` and `max_body_bytes`, so those limits are tested as configured.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.server import _toml, echo_config, running_server

MAX_N = 4
MAX_BODY_BYTES = 64 * 1024
TOKEN_DELAY_S = 0.05


@dataclass(frozen=True)
class Server:
    base: str  # http://127.0.0.1:PORT
    cancel_log: Path | None = None

    @property
    def v1(self) -> str:
        return self.base + "/v1"


def backend_table(name: str, **options: object) -> str:
    """One more `[[backends]]` table of type echo (echo_config writes the first one)."""
    body = echo_config(**options).split("[[backends]]", 1)[1]
    return "[[backends]]" + body.replace('name = "echo"', f'name = "{name}"', 1)


def server_table(**keys: object) -> str:
    return "[server]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in keys.items()) + "\n"


def multi_backend_config(cancel_log: Path) -> str:
    return (
        server_table(max_n=MAX_N, max_body_bytes=MAX_BODY_BYTES)
        + echo_config()
        + "\n"
        + backend_table("plain", models=["plain-1", "org/plain-2"], extensions=[])
        + "\n"
        + backend_table("slow", models=["slow-1"], token_delay_s=TOKEN_DELAY_S, cancel_log=str(cancel_log))
    )


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("gateway-main")
    cancel_log = tmp / "cancel.log"
    with running_server(multi_backend_config(cancel_log), tmp) as base:
        yield Server(base=base, cancel_log=cancel_log)


@pytest.fixture(scope="session")
def client(server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.v1, api_key="x", max_retries=0, timeout=30) as c:
        yield c


@pytest.fixture
async def aclient(server: Server):
    # function-scoped: an AsyncOpenAI's connection pool belongs to the event loop that made it
    async with openai.AsyncOpenAI(base_url=server.v1, api_key="x", max_retries=0, timeout=30) as c:
        yield c


@pytest.fixture(scope="session")
def http(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base, timeout=30) as c:
        yield c


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"

"""Routed gateways for the tests of routing, fallback, breakers and the request log:
plugins.toml texts with several echo backends and routes, in-process gateways (routing
decisions, breakers, logs) and requests to run through them; the seed of the weighted splits
the tests check (`SEED`, and the `seeded_random` fixture for the modules that import it)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from gateway.config import parse_config
from gateway.service.gateway import Gateway
from plugins.contract.protocol import RequestSpec, Sampling
from tests.support.server import _toml, echo_config


def backend(name: str, **options: object) -> str:
    """A `[[backends]]` table of type echo."""
    lines = ["[[backends]]", f'name = "{name}"', 'type = "echo"', "[backends.options]"]
    lines += [f"{k} = {_toml(v)}" for k, v in options.items()]
    return "\n".join(lines) + "\n\n"


def route(name: str, targets: list[tuple[str, float]], *, model: str = "echo-1", **keys: Any) -> str:
    """A `[[routes]]` table; `keys` are written as inline TOML (dicts become inline tables)."""
    lines = ["[[routes]]", f'name = "{name}"']
    lines += [f"{k} = {_inline(v)}" for k, v in keys.items()]
    for backend_name, weight in targets:
        lines += ["[[routes.targets]]", f'backend = "{backend_name}"', f'model = "{model}"', f"weight = {weight}"]
    return "\n".join(lines) + "\n\n"


def _inline(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_inline(v)}" for k, v in value.items()) + " }"
    return _toml(value)


def config_text(*tables: str, server: dict[str, Any] | None = None) -> str:
    """Echo plugins, the given backend and route tables, and a `[server]` table."""
    head = "[server]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in (server or {}).items()) + "\n"
    plugins = echo_config().split("[[backends]]", 1)[0]  # the [plugins] table only
    return head + plugins + "\n" + "".join(tables)


def spec(model: str, text: str = "hello big world", **fields: Any) -> RequestSpec:
    return RequestSpec(
        request_id=fields.pop("request_id", "r"),
        kind="chat",
        model=model,
        upstream_model="",
        sampling=Sampling(),
        messages=[{"role": "user", "content": text}],
        **fields,
    )


@asynccontextmanager
async def running_gateway(text: str) -> AsyncIterator[Gateway]:
    gateway = Gateway.from_config(parse_config(text, "test.toml"))
    await gateway.start()
    try:
        yield gateway
    finally:
        await gateway.close()


# The seed of `random` for weighted splits the tests check: in process (`seeded_random`) and in
# a server's process (the echo backend's `seed_random` option).
SEED = 20240607


@pytest.fixture
def seeded_random() -> Iterator[None]:
    import random

    state = random.getstate()
    random.seed(SEED)
    try:
        yield
    finally:
        random.setstate(state)

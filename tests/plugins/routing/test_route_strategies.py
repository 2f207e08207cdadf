"""`least_load` and `prefix_cache` as route strategies, between a route's targets (backends of
one server each), through an in-process gateway's routing hook."""

from __future__ import annotations

import asyncio

import pytest

from gateway.config import parse_config
from gateway.service.gateway import Gateway
from plugins.contract.errors import ConfigError
from tests.plugins.fleet.conftest import tenant_prompt
from tests.support.routed_gateway import backend, config_text, route, running_gateway, spec

BACKENDS = ("a", "b", "c")


def text(strategy: str, **keys: object) -> str:
    return config_text(*(backend(n) for n in BACKENDS), route("chat", [(n, 1.0) for n in BACKENDS], strategy=strategy, **keys),
                       server={"health_interval_s": 0})


def tenant_spec(tenant: int, question: str):  # noqa: ANN201
    s = spec("chat", question)
    s.messages = [{"role": "system", "content": tenant_prompt(tenant, 1200)}, *s.messages]
    return s


def test_prefix_cache_between_targets_spreads_tenants_and_follows_them() -> None:
    async def go() -> None:
        async with running_gateway(text("prefix_cache", options={"load_margin": 2})) as gateway:
            plan = gateway.plan("chat")
            first = {t: gateway.pick(tenant_spec(t, "hi"), plan).target.backend for t in range(3)}
            assert sorted(first.values()) == list(BACKENDS)
            for t in range(3):
                assert gateway.pick(tenant_spec(t, "and then?"), plan).target.backend == first[t]

    asyncio.run(go())


def test_prefix_cache_between_targets_spreads_agent_sessions_and_keeps_each_on_its_target() -> None:
    """Six sessions of one agent (one shared system prompt): two per target, each turn where its
    session's last turn went, until that target is overloaded."""
    async def go() -> None:
        async with running_gateway(text("prefix_cache", options={"load_margin": 2})) as gateway:
            plan = gateway.plan("chat")
            sessions = [f"0190-{i}" for i in range(6)]
            home = {s: gateway.pick(session_spec(s, 0), plan).target.backend for s in sessions}
            assert sorted(home.values()) == sorted(BACKENDS * 2)
            for turn in range(1, 4):
                for s in sessions:
                    assert gateway.pick(session_spec(s, turn), plan).target.backend == home[s]
            gateway.in_flight[home["0190-0"]] = 3  # over the margin: that session moves, and stays moved
            moved = gateway.pick(session_spec("0190-0", 4), plan).target.backend
            assert moved != home["0190-0"]
            gateway.in_flight[home["0190-0"]] = 0
            assert gateway.pick(session_spec("0190-0", 5), plan).target.backend == moved

    asyncio.run(go())


def session_spec(session: str, turn: int):  # noqa: ANN201
    s = tenant_spec(0, f"{session} turn {turn}")
    s.session = session
    return s


def test_least_load_between_targets_avoids_the_loaded_backend() -> None:
    async def go() -> None:
        async with running_gateway(text("least_load")) as gateway:
            plan = gateway.plan("chat")
            gateway.in_flight["a"] = 5  # echo backends report no engine load: their in-flight count stands in
            gateway.in_flight["b"] = 5
            picks = [gateway.pick(spec("chat"), plan).target.backend for _ in range(60)]
            assert picks.count("c") >= 30  # c whenever it is one of the two drawn (2 in 3)
            gateway.in_flight["c"] = 9
            assert "c" not in {gateway.pick(spec("chat"), plan).target.backend for _ in range(30)}

    asyncio.run(go())


def test_prefix_cache_route_options_are_checked_at_start_up() -> None:
    with pytest.raises(ConfigError) as info:
        Gateway.from_config(parse_config(text("prefix_cache", options={"block_chars": 2}), "plugins.toml"))
    assert "routes[0].options.block_chars" in info.value.message

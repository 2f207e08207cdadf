"""Coding-agent sessions through a fleet of three real llama.cpp replicas: four sessions of six
turns at once (two shaped like Claude Code's recorded requests, on /v1/messages; two like
Codex's, on /v1/responses; each turn resending the growing conversation), every turn of a
session on one replica, all three replicas used, and from the second turn on the replica's
cache holding the whole earlier conversation. Claude Code's billing line, new every request,
never reaches the prompt — unless a route turns `strip_billing_header` off."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from engines.launch import ServerProcess
from tests.plugins.fleet.conftest import MODEL, replicas, three_replicas  # noqa: F401 - fixtures
from tests.support.agent_sessions import AgentSession, Fit, Turn, send_turn, sessions
from tests.support.probes import request_log
from tests.support.server import running_server

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PUBLIC = "smol"
FIT = Fit(system_chars=1200, tools=1, tool_chars=160, max_tokens=12)  # ~500 prompt tokens at turn 1
SESSIONS = 4
TURNS = 6


def fleet_config(endpoints: list[str], log: Path, *, extra: str = "") -> str:
    return (f'[server]\nrequest_log = "{log}"\n\n[plugins]\ndisable = ["builtin"]\n\n'
            f'[[backends]]\nname = "fleet"\ntype = "llamacpp"\n[backends.options]\ntools = true\n'
            f'endpoints = {json.dumps(endpoints)}\nmodels = {{ "{PUBLIC}" = "{MODEL}" }}\n'
            f'[backends.options.timeouts]\nfirst_byte_s = 300\n\n{extra}')


async def run_sessions(base: str, agents: list[AgentSession], turns: int) -> list[Turn]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0), trust_env=False) as client:
        async def one(agent: AgentSession) -> list[Turn]:
            return [await send_turn(client, base, agent, turn) for turn in range(turns)]

        return [turn for done in await asyncio.gather(*(one(a) for a in agents)) for turn in done]


def test_four_agent_sessions_each_stay_on_one_replica_and_hit_its_cache(three_replicas: list[ServerProcess],  # noqa: F811
                                                                        tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    endpoints = [s.base_url for s in three_replicas]
    agents = sessions(SESSIONS, PUBLIC, FIT)
    assert {a.cli for a in agents} == {"claude", "codex"}
    with running_server(fleet_config(endpoints, log), tmp_path) as base:
        turns = asyncio.run(run_sessions(base, agents, TURNS))
        metrics = httpx.get(base + "/metrics").text
    assert [t.error for t in turns if t.error] == []
    logged = request_log(log, SESSIONS * TURNS)
    by_session: dict[str, list[Turn]] = {}
    for turn in turns:
        by_session.setdefault(turn.session, []).append(turn)
    homes = {}
    for session, done in by_session.items():
        lines = [logged[t.request_id] for t in done]
        assert {line["session"] for line in lines} == {session}  # the header's (or body's) session id
        assert len({line["replica"] for line in lines}) == 1, [line["replica"] for line in lines]
        homes[session] = lines[0]["replica"]
        for before, after in zip(done, done[1:]):
            # the whole earlier conversation was cached where the turn went (llama.cpp
            # re-reads the last prompt token, and the template's re-rendered answer may differ)
            assert after.cached_tokens >= 0.8 * before.prompt_tokens, (session, before, after)
            assert after.prompt_tokens > before.prompt_tokens
        assert [logged[t.request_id]["cached_tokens"] for t in done] == [t.cached_tokens for t in done]
    assert set(homes.values()) == set(endpoints), homes
    assert f'reason="session_new"' in metrics and 'reason="session_hit"' in metrics


def two_billing_lines(agent: AgentSession, cch: str) -> Any:
    def edit(body: dict[str, Any]) -> None:
        line = body["system"][0]["text"]
        body["system"][0]["text"] = line[: line.index(" cch=")] + f" cch={cch};"
    return edit


def test_two_requests_differing_only_in_the_billing_line_read_one_cached_prompt(three_replicas: list[ServerProcess],  # noqa: F811
                                                                                tmp_path: Path) -> None:
    """Through one replica: with the default, the second request's prompt is the first's,
    all cached; on a route with `strip_billing_header = false` the line makes it another prompt
    from its first line on."""
    log = tmp_path / "requests.jsonl"
    raw_route = (f'[[routes]]\nname = "{PUBLIC}-raw"\nstrip_billing_header = false\n'
                 f'[[routes.targets]]\nbackend = "fleet"\nmodel = "{PUBLIC}"\n')
    agent = AgentSession("claude", 90, PUBLIC, FIT)

    async def go(base: str) -> list[Turn]:
        async with httpx.AsyncClient(timeout=httpx.Timeout(300.0), trust_env=False) as client:
            out = []
            for i, (model, cch) in enumerate([(PUBLIC, "3a7f1"), (PUBLIC, "9b2e4"), (f"{PUBLIC}-raw", "3a7f1"),
                                              (f"{PUBLIC}-raw", "9b2e4")]):
                out.append(await send_turn(client, base, agent, 0, model=model, request_id=f"b{i}",
                                           edit=two_billing_lines(agent, cch)))
            return out

    with running_server(fleet_config([three_replicas[0].base_url], log, extra=raw_route), tmp_path) as base:
        first, second, raw_first, raw_second = asyncio.run(go(base))
    assert [t.error for t in (first, second, raw_first, raw_second) if t.error] == []
    assert second.prompt_tokens == first.prompt_tokens
    assert second.cached_tokens >= first.prompt_tokens - 2, (first, second)
    assert raw_first.prompt_tokens > first.prompt_tokens  # the line is in that prompt
    assert raw_second.cached_tokens < 0.2 * raw_second.prompt_tokens, raw_second

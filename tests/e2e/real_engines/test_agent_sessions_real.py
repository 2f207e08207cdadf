"""Coding-agent sessions on each real engine behind the gateway (llama.cpp, vLLM): two sessions
shaped like the recorded Claude Code and Codex requests, four turns each, every turn resending
the growing conversation (tools left out: this session's engines run without a tool parser);
from the second turn on the engine's prefix cache holds the earlier conversation — Claude
Code's billing line, new every request, is stripped before the prompt is rendered."""

from __future__ import annotations

import asyncio

import httpx

from tests.e2e.real_engines.conftest import public_name
from tests.support.agent_sessions import Fit, Turn, send_turn, sessions

TURNS = 4
FIT = Fit(system_chars=1200, tools=0, max_tokens=12)


def test_a_session_s_second_turn_on_reads_its_prefix_from_the_engine_s_cache(engine: str, gateway_url: str) -> None:
    agents = sessions(2, public_name(engine), FIT, seed=hash(engine) % 1000)

    async def go() -> list[list[Turn]]:
        async with httpx.AsyncClient(timeout=httpx.Timeout(300.0), trust_env=False) as client:
            return [[await send_turn(client, gateway_url, agent, t) for t in range(TURNS)] for agent in agents]

    for done in asyncio.run(go()):
        assert [t.error for t in done if t.error] == []
        for before, after in zip(done, done[1:]):
            # whole cache blocks of the earlier prompt (vLLM counts full blocks; llama.cpp re-reads
            # the last token and the re-rendered answer may tokenize apart)
            assert after.cached_tokens >= min(0.8 * before.prompt_tokens, before.prompt_tokens - 128) > 0, (before, after)

"""Per-key limits through real gateway processes: in-process state, and Redis state shared by
two gateways (a real redis-server on a free loopback port)."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.gateway.keys.conftest import redis, redis_session  # noqa: F401 - fixtures
from tests.gateway.keys.gateways import BUDGET, BURST, PARALLEL, PLAIN, RESPONSES, STREAM, TOKENS, chat, limits_config, usage_of
from tests.support.probes import wait_until
from tests.support.redis_server import RedisServer
from tests.support.server import ROOT, running_server

RATE_HEADERS = ("limit-requests", "remaining-requests", "reset-requests", "limit-tokens", "remaining-tokens", "reset-tokens")


@pytest.fixture(scope="module")
def memory_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_server(limits_config(), tmp_path_factory.mktemp("keys-memory")) as base:
        yield base


@pytest.fixture(scope="module")
def redis_gateways(tmp_path_factory: pytest.TempPathFactory, redis_session: RedisServer) -> Iterator[tuple[str, str]]:
    """Two gateway processes sharing one Redis: what two workers or two replicas are."""
    config = limits_config(state=redis_session.url)
    with running_server(config, tmp_path_factory.mktemp("keys-redis-a")) as a, running_server(config, tmp_path_factory.mktemp("keys-redis-b")) as b:
        yield a, b


@pytest.fixture(params=["memory", "redis"])
def gateway(request: pytest.FixtureRequest) -> str:
    if request.param == "memory":
        return request.getfixturevalue("memory_gateway")
    request.getfixturevalue("redis")  # empty
    return request.getfixturevalue("redis_gateways")[0]


async def _burst(bases: list[str], count: int) -> tuple[list[httpx.Response], float]:
    async with httpx.AsyncClient(timeout=30) as client:
        started = time.monotonic()
        responses = await asyncio.gather(
            *(client.post(bases[i % len(bases)] + "/v1/chat/completions", json=chat(), headers=BURST.auth) for i in range(count))
        )
        return responses, time.monotonic() - started


def test_two_gateways_sharing_redis_admit_exactly_the_rpm_in_a_burst(redis: RedisServer, redis_gateways: tuple[str, str]) -> None:
    rpm = int(BURST.limits["rpm"])  # type: ignore[call-overload]
    responses, elapsed = asyncio.run(_burst(list(redis_gateways), 3 * rpm))
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 429}, statuses
    admitted = statuses.count(200)
    refilled = math.floor(elapsed * rpm / 60)  # one request per 6 s comes back while the burst runs
    assert rpm <= admitted <= rpm + refilled, (admitted, elapsed)
    assert {r.headers["x-switchyard-backend"] for r in responses if r.status_code == 200} == {"echo"}
    for refused in (r for r in responses if r.status_code == 429):
        body = refused.json()["error"]
        assert (body["type"], body["code"]) == ("rate_limit_error", "rate_limit_exceeded")
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.headers["x-ratelimit-limit-requests"] == str(rpm)
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"
        assert refused.headers["x-ratelimit-reset-requests"].endswith("s")


def test_tpm_and_budget_settle_on_the_real_usage(gateway: str) -> None:
    with openai.OpenAI(base_url=gateway + "/v1", api_key=TOKENS.secret, max_retries=0) as client:
        started = time.monotonic()
        raw = client.chat.completions.with_raw_response.create(model="echo-1", messages=[{"role": "user", "content": "a b c d"}], max_tokens=30)
        completion = raw.parse()
    used = completion.usage.total_tokens
    assert used < 30  # the echo answers 4 words: far less than reserved
    headers = raw.headers
    assert headers["x-ratelimit-limit-tokens"] == "60"
    assert int(headers["x-ratelimit-remaining-tokens"]) <= 60 - 30  # max_tokens was reserved up front
    assert "x-ratelimit-limit-requests" not in headers  # the key has no rpm
    # the budget never refills: it shows the settlement exactly
    assert wait_until(lambda: usage_of(gateway, "tokens")["budget"]["used"] == used)
    entry = usage_of(gateway, "tokens")
    refill = math.ceil(time.monotonic() - started)  # tpm 60: one token a second
    assert 60 - used <= entry["tpm"]["remaining"] <= min(60, 60 - used + refill)


def test_a_stream_left_early_returns_its_reservation(gateway: str) -> None:
    """A 100-token stream the client walks away from after 3 chunks: the settlement charges the
    prompt's estimate and the tokens that reached the gateway, not the 100 reserved, and its
    parallel slot is free again."""
    words = " ".join(f"w{i}" for i in range(100))
    body = chat("slow-1", words, max_tokens=100, stream=True)
    with httpx.Client(timeout=30) as client, client.stream("POST", gateway + "/v1/chat/completions", json=body, headers=STREAM.auth) as response:
        assert response.status_code == 200
        assert wait_until(lambda: usage_of(gateway, "stream")["max_parallel"]["in_flight"] == 1)
        chunks = 0
        for line in response.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                chunks += 1
                if chunks == 3:
                    break
    assert wait_until(lambda: usage_of(gateway, "stream")["max_parallel"]["in_flight"] == 0, timeout=10)
    prompt_estimate = len(words) // 4 + 4 + 1
    used = usage_of(gateway, "stream")["budget"]["used"]
    assert prompt_estimate + 3 <= used < prompt_estimate + 50, used


def test_max_parallel_refuses_the_request_over_it(memory_gateway: str) -> None:
    body = chat("slow-1", " ".join(f"w{i}" for i in range(200)), max_tokens=200, stream=True)
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", memory_gateway + "/v1/chat/completions", json=body, headers=PARALLEL.auth) as first, \
                client.stream("POST", memory_gateway + "/v1/chat/completions", json=body, headers=PARALLEL.auth) as second:
            assert (first.status_code, second.status_code) == (200, 200)
            third = client.post(memory_gateway + "/v1/chat/completions", json=chat(), headers=PARALLEL.auth)
            assert third.status_code == 429
            assert "max_parallel" in third.json()["error"]["message"]
            assert third.headers["retry-after"] == "1"
        # both streams closed: their slots come back
        assert wait_until(lambda: client.post(memory_gateway + "/v1/chat/completions", json=chat(), headers=PARALLEL.auth).status_code == 200)


def test_budget_exhausted_is_a_429_insufficient_quota(memory_gateway: str) -> None:
    with openai.OpenAI(base_url=memory_gateway + "/v1", api_key=BUDGET.secret, max_retries=0) as client:
        client.chat.completions.create(model="echo-1", messages=[{"role": "user", "content": "x " * 40}], max_tokens=10)
        with pytest.raises(openai.RateLimitError) as refused:
            client.chat.completions.create(model="echo-1", messages=[{"role": "user", "content": "x " * 40}], max_tokens=10)
    error = refused.value.body
    assert refused.value.status_code == 429
    assert error["type"] == "insufficient_quota" and error["code"] == "insufficient_quota"
    assert int(refused.value.response.headers["retry-after"]) >= 1


def test_the_responses_api_counts_against_the_key(gateway: str) -> None:
    """`/v1/responses` goes through the same limits: rpm 1 admits one call, streamed or not, and
    the budget settles on the usage the client saw (30 tokens were reserved)."""
    with openai.OpenAI(base_url=gateway + "/v1", api_key=RESPONSES.secret, max_retries=0) as client:
        raw = client.responses.with_raw_response.create(model="echo-1", input="one two three", max_output_tokens=30)
        response = raw.parse()
        assert response.output_text == "one two three"
        assert (raw.headers["x-ratelimit-limit-requests"], raw.headers["x-ratelimit-remaining-requests"]) == ("1", "0")
        assert wait_until(lambda: usage_of(gateway, "responses")["budget"]["used"] == response.usage.total_tokens)
        with pytest.raises(openai.RateLimitError) as refused:
            client.responses.create(model="echo-1", input="again", stream=True)
    assert refused.value.body["code"] == "rate_limit_exceeded"
    headers = refused.value.response.headers
    assert (headers["x-ratelimit-limit-requests"], headers["x-ratelimit-remaining-requests"]) == ("1", "0")
    assert int(headers["retry-after"]) >= 1
    assert usage_of(gateway, "responses")["rpm"]["remaining"] == 0


def test_a_key_without_limits_gets_no_rate_limit_headers(memory_gateway: str) -> None:
    response = httpx.post(memory_gateway + "/v1/chat/completions", json=chat(), headers=PLAIN.auth, timeout=30)
    assert response.status_code == 200
    assert not [h for h in response.headers if h.startswith("x-ratelimit-")]


def test_a_request_larger_than_the_tpm_is_refused_at_once(memory_gateway: str) -> None:
    response = httpx.post(memory_gateway + "/v1/chat/completions", json=chat(max_tokens=100), headers=TOKENS.auth, timeout=30)
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "request_too_large"
    assert "retry-after" not in response.headers


def test_keys_usage_reads_redis_or_the_running_gateway(tmp_path: Path, redis: RedisServer, redis_gateways: tuple[str, str],
                                                       memory_gateway: str) -> None:
    httpx.post(redis_gateways[1] + "/v1/chat/completions", json=chat(), headers=BURST.auth, timeout=30)
    config = tmp_path / "redis.toml"
    config.write_text(limits_config(state=redis.url))
    out = _switchyard("keys", "usage", str(config))
    assert out.splitlines()[0] == f"usage from Redis at {redis.url}"
    assert any(line.startswith("burst: rpm 9/10 left") for line in out.splitlines()), out

    memory = tmp_path / "memory.toml"
    memory.write_text(limits_config())
    out = _switchyard("keys", "usage", str(memory), "--url", memory_gateway)
    assert out.splitlines()[0] == f"usage from the gateway at {memory_gateway}, in-process (this gateway process only)"
    assert "budget: budget" in out


def _switchyard(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "gateway.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout

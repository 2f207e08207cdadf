"""Limits the gateway enforces itself, as configured: body size (413), `messages` count, `n`,
`max_tokens` per route (400 beyond, the cap when a request asks none), a bounded queue per
backend (429 + `Retry-After` when full or too slow; the next target on a fallback route), and
a request deadline (504 before the first byte, an error event after it)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway.conftest import backend_table
from tests.gateway.helpers import assert_error_shape, chat_body
from tests.support.gateway_thread import GatewayThread
from tests.support.probes import wait_until
from tests.support.server import echo_config

DELAY = 0.05  # seconds per token of the slow echo backends


def limits_config(cancel_log: Path) -> str:
    return (
        "[server]\nmax_messages = 8\nmax_tokens = 50\nmax_n = 2\nmax_body_bytes = 32768\nhealth_interval_s = 0\n\n"
        + echo_config(models=["fast-1"])
        + "\n" + backend_table("slow", models=["slow-1"], token_delay_s=DELAY).replace(
            "[backends.options]", "max_concurrent = 2\nmax_queue = 2\nqueue_timeout_s = 5.0\n[backends.options]")
        + "\n" + backend_table("one", models=["one-1"], token_delay_s=DELAY, cancel_log=str(cancel_log)).replace(
            "[backends.options]", "max_concurrent = 1\nmax_queue = 1\nqueue_timeout_s = 0.3\n[backends.options]")
        + "\n" + backend_table("dl", models=["dl-1"], token_delay_s=0.1, cancel_log=str(cancel_log))
        + """
[[routes]]
name = "capped"
max_tokens = 5
[[routes.targets]]
backend = "echo"
model = "fast-1"

[[routes]]
name = "deadline"
request_timeout_s = 0.4
[[routes.targets]]
backend = "dl"
model = "dl-1"

[[routes]]
name = "queued-deadline"
request_timeout_s = 0.15
[[routes.targets]]
backend = "one"
model = "one-1"

[[routes]]
name = "spill"
strategy = "fallback"
[[routes.targets]]
backend = "one"
model = "one-1"
[[routes.targets]]
backend = "echo"
model = "fast-1"
"""
    )


@pytest.fixture(scope="module")
def cancel_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("limits") / "cancel.log"


@pytest.fixture(scope="module")
def gw(cancel_log: Path) -> Iterator[GatewayThread]:
    with GatewayThread(limits_config(cancel_log)) as g:
        yield g


@pytest.fixture
def http(gw: GatewayThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gw.base, timeout=15) as c:
        yield c


@pytest.fixture(autouse=True)
def nothing_left_running(gw: GatewayThread) -> Iterator[None]:
    yield
    assert wait_until(lambda: not any(gw.gateway.in_flight.values()), timeout=5), gw.gateway.in_flight
    assert all(limiter.running == 0 and limiter.queued == 0 for limiter in gw.gateway.limiters.values())


def words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


def error_of(resp: httpx.Response, status: int, param: str | None = None) -> dict:
    assert resp.status_code == status, resp.text
    error = assert_error_shape(resp.json())
    if param is not None:
        assert error["param"] == param, error
    return error


# -- per request -------------------------------------------------------------------------------


def test_body_too_large_is_413(http: httpx.Client) -> None:
    resp = http.post("/v1/chat/completions", json=chat_body("x" * 40_000, model="fast-1"))
    error_of(resp, 413)


def test_too_many_messages_is_400(http: httpx.Client) -> None:
    messages = [{"role": "user", "content": "hi"}] * 9
    error = error_of(http.post("/v1/chat/completions", json={"model": "fast-1", "messages": messages}), 400, "messages")
    assert "9" in error["message"] and "8" in error["message"]
    assert http.post("/v1/chat/completions", json={"model": "fast-1", "messages": messages[:8]}).status_code == 200
    render = {"model": "fast-1", "messages": messages}
    error_of(http.post("/switchyard/render", json=render), 400, "messages")


def test_n_above_max_n_is_400(http: httpx.Client) -> None:
    error_of(http.post("/v1/chat/completions", json=chat_body("hi", model="fast-1", n=3)), 400, "n")


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_above_the_server_cap_is_400(http: httpx.Client, field: str) -> None:
    error_of(http.post("/v1/chat/completions", json=chat_body("hi", model="fast-1", **{field: 51})), 400, field)
    assert http.post("/v1/chat/completions", json=chat_body("hi", model="fast-1", **{field: 50})).status_code == 200


def test_route_max_tokens_caps_and_defaults(http: httpx.Client) -> None:
    error_of(http.post("/v1/chat/completions", json=chat_body("hi", model="capped", max_tokens=6)), 400, "max_tokens")
    legacy = {"model": "capped", "prompt": "a b", "max_tokens": 6}
    error_of(http.post("/v1/completions", json=legacy), 400, "max_tokens")
    resp = http.post("/v1/chat/completions", json=chat_body(words(10), model="capped"))
    assert resp.status_code == 200
    body = resp.json()
    assert body["usage"]["completion_tokens"] == 5 and body["choices"][0]["finish_reason"] == "length"
    # legacy completions' own default (16) is capped too, not refused
    resp = http.post("/v1/completions", json={"model": "capped", "prompt": words(10)})
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 5


# -- the queue in front of a backend ---------------------------------------------------------------


async def _stream(client: httpx.AsyncClient, model: str, n_words: int, request_id: str = "") -> tuple[int, dict[str, str], bytes, float]:
    start = time.monotonic()
    body = {**chat_body(words(n_words), model=model), "stream": True}
    headers = {"x-request-id": request_id} if request_id else {}
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        raw = await r.aread()
    return r.status_code, dict(r.headers), raw, time.monotonic() - start


def _run(coro):  # noqa: ANN001, ANN202
    return asyncio.run(coro)


def test_full_queue_is_429_with_retry_after(gw: GatewayThread) -> None:
    async def main() -> list:
        async with httpx.AsyncClient(base_url=gw.base, timeout=15) as client:
            return await asyncio.gather(*(_stream(client, "slow-1", 10) for _ in range(6)))

    results = _run(main())
    ok = [r for r in results if r[0] == 200]
    refused = [r for r in results if r[0] == 429]
    assert len(ok) == 4 and len(refused) == 2, [r[0] for r in results]  # 2 running + 2 queued; 2 turned away
    for status, headers, raw, elapsed in refused:
        assert int(headers["retry-after"]) >= 1
        error = assert_error_shape(json.loads(raw))
        assert error["type"] == "rate_limit_error" and error["code"] == "queue_full"
        assert elapsed < 1.0, "refused at once, not after waiting for a slot"
    for _, _, raw, _ in ok:
        assert raw.endswith(b"data: [DONE]\n\n") and b'"error"' not in raw
    # the queued two started only when a running one finished
    assert max(r[3] for r in ok) >= 2 * 10 * DELAY * 0.9


def test_waiting_longer_than_queue_timeout_is_429(gw: GatewayThread) -> None:
    async def main() -> list:
        async with httpx.AsyncClient(base_url=gw.base, timeout=15) as client:
            first = asyncio.create_task(_stream(client, "one-1", 20))  # holds the only slot for ~1 s
            await asyncio.sleep(0.1)
            second = await _stream(client, "one-1", 2)
            return [await first, second]

    (first, second) = _run(main())
    assert first[0] == 200
    assert second[0] == 429 and 0.25 <= second[3] < 1.0, second[:1] + second[3:]
    assert "no free slot" in assert_error_shape(json.loads(second[2]))["message"]


def test_a_full_backend_spills_to_the_next_target_on_a_fallback_route(gw: GatewayThread) -> None:
    async def main() -> list:
        async with httpx.AsyncClient(base_url=gw.base, timeout=15) as client:
            busy = asyncio.create_task(_stream(client, "one-1", 20))
            await asyncio.sleep(0.1)
            queued = asyncio.create_task(_stream(client, "one-1", 2))  # waits (queue_timeout 0.3 s)
            await asyncio.sleep(0.05)
            spilled = await client.post("/v1/chat/completions", json=chat_body("over flow", model="spill"))
            return [await busy, await queued, spilled]

    busy, queued, spilled = _run(main())
    assert spilled.status_code == 200 and spilled.headers["x-switchyard-backend"] == "echo"
    assert spilled.json()["choices"][0]["message"]["content"] == "over flow"


# -- the request deadline ----------------------------------------------------------------------


def test_deadline_mid_stream_is_an_error_event(gw: GatewayThread, cancel_log: Path) -> None:
    async def main() -> tuple:
        async with httpx.AsyncClient(base_url=gw.base, timeout=15) as client:
            return await _stream(client, "deadline", 20, "deadline-mid-stream")  # 2 s of tokens, a 0.4 s deadline

    status, _, raw, elapsed = _run(main())
    assert status == 200 and 0.35 <= elapsed < 1.0, elapsed
    events = raw[:-2].split(b"\n\n")
    assert events[-1] == b"data: [DONE]"
    error = assert_error_shape(json.loads(events[-2][6:]))
    assert error["type"] == "timeout_error" and error["code"] == "request_timeout"
    assert any(b'"content":"w0"' in e for e in events), "tokens before the deadline were sent"
    assert wait_until(lambda: cancel_log.exists() and "deadline-mid-stream" in cancel_log.read_text()), "the backend was not cancelled"


def test_deadline_before_the_first_byte_is_504(http: httpx.Client) -> None:
    start = time.monotonic()
    error = error_of(http.post("/v1/chat/completions", json=chat_body(words(20), model="deadline")), 504)
    assert error["code"] == "request_timeout" and time.monotonic() - start < 1.0


def test_deadline_counts_the_time_in_the_queue(gw: GatewayThread) -> None:
    async def main() -> list:
        async with httpx.AsyncClient(base_url=gw.base, timeout=15) as client:
            busy = asyncio.create_task(_stream(client, "one-1", 10))
            await asyncio.sleep(0.1)
            start = time.monotonic()
            waited = await client.post("/v1/chat/completions", json=chat_body("hi", model="queued-deadline"))
            return [await busy, waited, time.monotonic() - start]

    busy, waited, elapsed = _run(main())
    assert busy[0] == 200
    # the deadline (0.15 s), not the queue timeout (0.3 s, a 429), ended the wait
    assert waited.status_code == 504 and assert_error_shape(waited.json())["code"] == "request_timeout"
    assert 0.1 <= elapsed < 1.0, elapsed


# -- the limiter alone -------------------------------------------------------------------------


def test_limiter_hands_slots_in_order_and_never_leaks_one() -> None:
    from gateway.errors import DeadlineExceeded, ShuttingDown
    from gateway.service.admission import BackendLimiter, Deadline
    from plugins.contract.errors import Overloaded

    async def main() -> None:
        lim = BackendLimiter("b", max_concurrent=1, max_queue=4, queue_timeout_s=5)
        await lim.acquire()
        order: list[int] = []

        async def wait(i: int) -> None:
            await lim.acquire()
            order.append(i)

        waiters = [asyncio.create_task(wait(i)) for i in range(4)]
        await asyncio.sleep(0)
        assert lim.queued == 4
        with pytest.raises(Overloaded):  # the queue is full: refused at once
            await lim.acquire()
        lim.release()  # the slot goes to waiter 0 ...
        waiters[0].cancel()  # ... which is cancelled before it runs: the slot must pass on
        waiters[2].cancel()
        await asyncio.sleep(0.01)
        assert order == [1] and lim.running == 1
        lim.release()
        await asyncio.sleep(0.01)
        assert order == [1, 3]
        lim.release()
        assert lim.running == 0 and lim.queued == 0
        # a deadline earlier than the queue timeout ends the wait with DeadlineExceeded
        await lim.acquire()
        with pytest.raises(DeadlineExceeded):
            await lim.acquire(Deadline.after(0.05))
        # draining fails the waiters
        pending = asyncio.create_task(lim.acquire())
        await asyncio.sleep(0)
        lim.fail_waiters(ShuttingDown())
        with pytest.raises(ShuttingDown):
            await pending
        lim.release()
        assert lim.running == 0 and lim.queued == 0

    asyncio.run(main())

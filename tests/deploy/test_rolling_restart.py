"""A rolling restart that loses nothing: two gateway containers of the image share one port (the
kernel spreads connections over both, as a Service spreads them over pods), 64 clients stream
chat completions through it without pause, and each container in turn gets SIGTERM, drains,
exits 0 by itself and is started again.

A client does what the OpenAI SDKs do: a request that failed before its response began (the
connection refused or reset, or a 503 `server_shutting_down` from a draining gateway) is sent
again. What must hold: 0 failed requests and every stream complete (200, its text, one finish
reason, usage, `[DONE]`, no error event), with streams in flight at every SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import httpx
import pytest

from tests.deploy.conftest import record, write_config
from tests.deploy.containers import run_container
from tests.deploy.streams import StreamResult, chat_body, read_events
from tests.support.server import free_port

pytestmark = pytest.mark.slow

CLIENTS = 64
MAX_TOKENS = 24
MAX_ATTEMPTS = 30
WORKERS = 2  # per gateway: the worker mode binds with SO_REUSEPORT, so two gateways can share a port
STARTUP_MARKER = "Application startup complete."
CONFIG = """
[server]
workers = 2
drain_timeout_s = 30.0
[[backends]]
name = "llamacpp"
type = "llamacpp"
[backends.options]
base_url = "{url}"
"""


class NotStarted(Exception):
    """The gateway refused the request before answering it (draining): safe to send again."""


@dataclass
class Tally:
    completed: int = 0
    reconnects: int = 0
    reconnect_reasons: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    in_flight: int = 0  # streams whose response began
    pending: int = 0  # requests sent and not yet finished (queued upstream, or streaming)


async def one_request(client: httpx.AsyncClient, url: str, tally: Tally) -> None:
    tally.pending += 1
    try:
        await _one_request(client, url, tally)
    finally:
        tally.pending -= 1


async def _one_request(client: httpx.AsyncClient, url: str, tally: Tally) -> None:
    for attempt in range(1, MAX_ATTEMPTS + 1):
        result = StreamResult()
        started = False
        try:
            async with client.stream("POST", url, json=chat_body("smollm2-135m-instruct", MAX_TOKENS)) as resp:
                result.status = resp.status_code
                if resp.status_code != 200:
                    text = (await resp.aread()).decode(errors="replace")
                    if resp.status_code == 503 and "server_shutting_down" in text:
                        raise NotStarted(text)
                    tally.failures.append(f"HTTP {resp.status_code}: {text[:300]}")
                    return
                started = True
                tally.in_flight += 1
                try:
                    async for line in resp.aiter_lines():
                        if line.startswith("data: "):
                            read_events(result, line[6:])
                finally:
                    tally.in_flight -= 1
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError, NotStarted) as exc:
            if started:
                tally.failures.append(f"stream broken after it began: {type(exc).__name__}: {exc}")
                return
            reason = type(exc).__name__
            tally.reconnects += 1
            tally.reconnect_reasons[reason] = tally.reconnect_reasons.get(reason, 0) + 1
            await asyncio.sleep(min(0.05 * attempt, 0.5))
            continue
        if result.complete and result.usage["completion_tokens"] == MAX_TOKENS or \
                result.complete and result.finish_reasons == ["stop"]:
            tally.completed += 1
        else:
            tally.failures.append(f"incomplete stream: {result}")
        return
    tally.failures.append(f"not served after {MAX_ATTEMPTS} attempts")


async def client_loop(url: str, stop: asyncio.Event, tally: Tally) -> None:
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with httpx.AsyncClient(timeout=httpx.Timeout(90, connect=5), limits=limits) as client:
        while not stop.is_set():
            try:
                await one_request(client, url, tally)
            except Exception as exc:  # noqa: BLE001 - any other failure is a failed request, counted
                tally.failures.append(f"{type(exc).__name__}: {exc}")


def test_rolling_restart_under_64_streaming_clients_loses_nothing(proxy_image, llama_server, tmp_path):
    config = write_config(tmp_path, CONFIG.format(url=llama_server.base_url))
    port = free_port()
    gateways = [run_container(proxy_image, port, config=config)]
    try:
        gateways[0].wait_ready(120, log_marker=STARTUP_MARKER, markers=WORKERS)
        gateways.append(run_container(proxy_image, port, config=config))
        gateways[1].wait_ready(120, log_marker=STARTUP_MARKER, markers=WORKERS)
        tally = Tally()
        restarts = asyncio.run(_rollout(gateways, f"http://127.0.0.1:{port}/v1/chat/completions", tally))
    finally:
        for gateway in gateways:
            gateway.remove()
    summary = {"clients": CLIENTS, "requests_completed": tally.completed, "failed": len(tally.failures),
               "reconnects": tally.reconnects, "reconnect_reasons": tally.reconnect_reasons, "restarts": restarts}
    record("rolling_restart", summary)
    print(json.dumps(summary, indent=2))
    assert tally.failures == [], tally.failures[:10]
    assert tally.completed >= 4 * CLIENTS
    for restart in restarts:
        assert restart["exit_code"] == 0
        assert restart["streams_in_flight_at_sigterm"] > 0
        assert restart["sigterm_to_exit_s"] < 30 + 5  # drain_timeout_s + the backstop: exited by itself


async def _rollout(gateways, url: str, tally: Tally) -> list[dict]:
    stop = asyncio.Event()
    clients = [asyncio.create_task(client_loop(url, stop, tally)) for _ in range(CLIENTS)]
    restarts = []
    try:
        await _until(lambda: tally.completed >= CLIENTS, 120, tally)  # traffic through both gateways
        for run, gateway in enumerate(gateways):
            # streams under way (llama-server streams 16 at a time; the rest queue there)
            await _until(lambda: tally.in_flight >= 4 and tally.pending >= CLIENTS // 2, 60, tally)
            in_flight, pending = tally.in_flight, tally.pending
            completed_before = tally.completed
            signalled = time.monotonic()
            await asyncio.to_thread(gateway.signal, "TERM")
            code = await asyncio.to_thread(gateway.wait_exit, 45)
            exit_s = time.monotonic() - signalled
            await asyncio.to_thread(gateway.start_again)
            ready_s = await asyncio.to_thread(gateway.wait_ready, 120, log_marker=STARTUP_MARKER, markers=2 * WORKERS)
            restarts.append({"gateway": run, "streams_in_flight_at_sigterm": in_flight,
                             "requests_pending_at_sigterm": pending, "exit_code": code,
                             "sigterm_to_exit_s": round(exit_s, 1), "restart_to_ready_s": round(ready_s, 1),
                             "completed_meanwhile": tally.completed - completed_before})
            await _until(lambda: tally.completed >= completed_before + CLIENTS, 120, tally)
        await asyncio.sleep(1)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*clients), 120)
    return restarts


async def _until(condition, timeout: float, tally: Tally | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for the clients: {tally}")
        await asyncio.sleep(0.05)

"""`[server] workers = 2`: one port served by two real worker processes (the echo backend).

Requests land on both (the `x-switchyard-worker` header), `/metrics` of either counts every
request of both, the request log is one valid JSONL stream, a killed worker is replaced (and
its counters kept), and SIGTERM with 20 streams in flight drains both and exits 0.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import httpx
import pytest

from gateway.config import parse_config
from gateway.worker_pool import worker_count
from plugins.contract.errors import ConfigError
from tests.gateway.helpers import assert_error_shape, chat_body, data_events
from tests.support.probes import metric, wait_until
from tests.support.process_tree import Server, serving
from tests.support.server import echo_config

WORKER_HEADER = "x-switchyard-worker"


def two_workers(tmp_path: Path, *, drain_s: float = 30.0, **echo: object) -> str:
    server = f'[server]\nworkers = 2\ndrain_timeout_s = {drain_s}\nhealth_interval_s = 0\nrequest_log = "{tmp_path / "requests.jsonl"}"\n\n'
    return server + echo_config(**echo)


def send(server: Server, n: int, *, stream: bool, tag: str) -> list[str]:
    """`n` requests, each on a new connection (the kernel picks a worker per connection); the
    workers that served them."""
    served = []
    with httpx.Client(base_url=server.base, timeout=30, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        for i in range(n):
            r = client.post("/v1/chat/completions", json=chat_body(f"{tag} {i}", stream=stream), headers={"x-request-id": f"{tag}-{i}"})
            assert r.status_code == 200, r.text
            if stream:
                assert data_events(r.content)[-1] == "[DONE]"
            served.append(r.headers[WORKER_HEADER])
    return served


def total(server: Server, name: str, **labels: str) -> float:
    return metric(server.metrics(), name, **labels)


def test_workers_setting_is_validated() -> None:
    assert parse_config('[server]\nworkers = "auto"\n', "t.toml").server.workers == "auto"
    assert worker_count("auto") >= 1 and worker_count(3) == 3
    for bad in ("0", '"many"', "2.5"):
        with pytest.raises(ConfigError, match=r"server\.workers"):
            parse_config(f"[server]\nworkers = {bad}\n", "t.toml")


def test_requests_land_on_both_workers_and_metrics_count_them_all(tmp_path: Path) -> None:
    with serving(two_workers(tmp_path), tmp_path) as server:
        served = send(server, 20, stream=False, tag="json") + send(server, 20, stream=True, tag="sse")
        assert set(served) == {"0", "1"}, served
        assert len(server.children("gateway.worker")) == 2
        # any worker's /metrics is the whole server's
        assert wait_until(lambda: total(server, "switchyard_requests_total", outcome="ok") == 40, timeout=10), server.metrics()
        for _ in range(4):  # whichever worker answers the scrape
            text = server.metrics()
            assert metric(text, "switchyard_requests_total") == 40
            assert metric(text, "switchyard_request_duration_seconds_count") == 40
            assert metric(text, "switchyard_requests_in_flight") == 0
            assert metric(text, "switchyard_tokens_total", kind="completion") == 40 * 2  # "json i" / "sse i"
        log = tmp_path / "requests.jsonl"
        assert wait_until(lambda: log.exists() and len(log.read_bytes().splitlines()) == 40, timeout=10)
        lines = [json.loads(line) for line in log.read_bytes().splitlines()]  # every line whole and valid
        assert sorted(r["request_id"] for r in lines) == sorted([f"json-{i}" for i in range(20)] + [f"sse-{i}" for i in range(20)])


def test_a_killed_worker_is_replaced_and_its_counters_kept(tmp_path: Path) -> None:
    with serving(two_workers(tmp_path), tmp_path) as server:
        send(server, 10, stream=False, tag="before")
        assert wait_until(lambda: total(server, "switchyard_requests_total") == 10, timeout=10)
        victim = server.children("gateway.worker")[0]
        victim.kill()
        victim.wait(10)

        def replaced() -> bool:
            pids = {p.pid for p in server.children("gateway.worker")}
            return len(pids) == 2 and victim.pid not in pids

        assert wait_until(replaced, timeout=60), server.log_text()[-3000:]
        assert wait_until(lambda: total(server, "switchyard_worker_restarts_total") == 1, timeout=10)
        assert wait_until(lambda: set(send(server, 10, stream=False, tag="probe")) == {"0", "1"}, timeout=60, interval=0.2)
        # the dead worker's requests still count
        assert wait_until(lambda: total(server, "switchyard_requests_total") >= 20, timeout=10)
        assert "exited with code -9; restarting it" in server.log_text()


SHORT_WORDS = 10  # ~0.5 s: finishes within the drain period
LONG_WORDS = 200  # ~10 s: cut at its end


async def _stream(client: httpx.AsyncClient, i: int, words: int, begun: list[int], all_begun: asyncio.Event) -> tuple[list, str]:
    text = " ".join(f"s{i}w{j}" for j in range(words))
    async with client.stream("POST", "/v1/chat/completions", json=chat_body(text, stream=True)) as r:
        assert r.status_code == 200
        worker = r.headers[WORKER_HEADER]
        raw = b""
        async for piece in r.aiter_raw():
            if not raw:
                begun[0] += 1
                if begun[0] == 20:
                    all_begun.set()
            raw += piece
    return data_events(raw), worker


def test_sigterm_drains_every_worker_and_exits_0(tmp_path: Path) -> None:
    # room for the long answers (the echo model's default 256 tokens would end them after ~2.7 s)
    with serving(two_workers(tmp_path, drain_s=1.5, token_delay_s=0.05, max_model_len=1024), tmp_path) as server:
        workers = server.children("gateway.worker")

        async def main() -> list[tuple[list, str]]:
            begun, all_begun = [0], asyncio.Event()
            limits = httpx.Limits(max_connections=40, max_keepalive_connections=0)
            async with httpx.AsyncClient(base_url=server.base, timeout=60, limits=limits) as client:
                tasks = [asyncio.create_task(_stream(client, i, SHORT_WORDS if i % 2 else LONG_WORDS, begun, all_begun))
                         for i in range(20)]
                await asyncio.wait_for(all_begun.wait(), 30)
                server.proc.send_signal(signal.SIGTERM)
                return await asyncio.gather(*tasks)

        results = asyncio.run(main())
        rc = server.proc.wait(timeout=30)
        assert rc == 0, server.log_text()[-3000:]
        assert not any(w.is_running() and w.status() != "zombie" for w in workers)
    assert {worker for _, worker in results} == {"0", "1"}, "the streams did not land on both workers"
    for i, (events, _) in enumerate(results):
        assert events[-1] == "[DONE]", (i, events[-2:])
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if isinstance(e, dict) and e.get("choices"))
        if i % 2:  # short: finished within the drain period
            assert text == " ".join(f"s{i}w{j}" for j in range(SHORT_WORDS)), (i, text)
        else:  # long: cut at the end of the period
            error = assert_error_shape(events[-2])
            assert error["code"] == "server_shutting_down", error
            assert text, "the long stream got nothing before it was cut"
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.base + "/health", timeout=2)


def test_a_port_in_use_stops_start_up(tmp_path: Path) -> None:
    import socket
    import subprocess
    import sys

    from tests.support.server import ROOT

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        (tmp_path / "plugins.toml").write_text(two_workers(tmp_path))
        done = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--config", str(tmp_path / "plugins.toml"),
                               "--port", str(port)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "cannot listen on" in done.stderr, done.stderr[-2000:]

"""Graceful drain: SIGTERM to a real `switchyard serve` process while 20 streams are in flight.

It stops accepting connections at once; streams that finish within the drain period finish
normally; the others end, at the end of the period, with an error event and `[DONE]` (and
their backend generation is cancelled); the process then exits 0.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.gateway.helpers import assert_error_shape
from tests.support.server import ROOT, _wait_ready, echo_config, free_port

DRAIN_S = 1.5
DELAY = 0.05
SHORT_WORDS = 12  # ~0.6 s: finishes within the drain period
LONG_WORDS = 200  # ~10 s: cut at its end


async def _stream(client: httpx.AsyncClient, i: int, n_words: int, started: asyncio.Event, counter: list[int]) -> tuple[bytes, float]:
    text = " ".join(f"s{i}w{j}" for j in range(n_words))
    body = {"model": "echo-1", "messages": [{"role": "user", "content": text}], "stream": True}
    raw = b""
    async with client.stream("POST", "/v1/chat/completions", json=body, headers={"x-request-id": f"drain-{i}"}) as r:
        assert r.status_code == 200
        async for piece in r.aiter_raw():
            if not raw:
                counter[0] += 1
                if counter[0] == 20:
                    started.set()
            raw += piece
    return raw, time.monotonic()


def _content(raw: bytes) -> tuple[str, list]:
    events = [json.loads(e[6:]) if e != b"data: [DONE]" else "[DONE]" for e in raw[:-2].split(b"\n\n")]
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if isinstance(e, dict) and e.get("choices"))
    return text, events


def test_sigterm_drains_then_cuts_and_exits_0(tmp_path: Path) -> None:
    cancel_log = tmp_path / "cancel.log"
    config = tmp_path / "plugins.toml"
    config.write_text(f"[server]\ndrain_timeout_s = {DRAIN_S}\nhealth_interval_s = 0\n\n" + echo_config(token_delay_s=DELAY, cancel_log=str(cancel_log)))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = (tmp_path / "server.log").open("wb")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--config", str(config), "--port", str(port)],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_ready(proc, base, 60, log.name)

        async def main() -> tuple[list, float, bool]:
            started, counter = asyncio.Event(), [0]
            limits = httpx.Limits(max_connections=40)
            async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as client:
                tasks = [asyncio.create_task(_stream(client, i, SHORT_WORDS if i % 2 else LONG_WORDS, started, counter)) for i in range(20)]
                await asyncio.wait_for(started.wait(), 20)  # all 20 streams have begun
                proc.send_signal(signal.SIGTERM)
                sigterm_at = time.monotonic()
                await asyncio.sleep(0.5)
                try:  # a new connection is refused
                    async with httpx.AsyncClient(base_url=base, timeout=2) as fresh:
                        await fresh.get("/health")
                    refused = False
                except httpx.ConnectError:
                    refused = True
                return await asyncio.gather(*tasks), sigterm_at, refused

        results, sigterm_at, refused = asyncio.run(main())
        assert refused, "the server still accepted connections after SIGTERM"
        rc = proc.wait(timeout=DRAIN_S + 10)
        exited_at = time.monotonic()
        assert rc == 0, f"exit code {rc}\n{(tmp_path / 'server.log').read_text()[-3000:]}"
        assert exited_at - sigterm_at < DRAIN_S + 4
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()

    for i, (raw, ended_at) in enumerate(results):
        text, events = _content(raw)
        assert events[-1] == "[DONE]", (i, events[-2:])
        if i % 2:  # short: finished normally within the drain period
            assert text == " ".join(f"s{i}w{j}" for j in range(SHORT_WORDS)), i
            assert not any(isinstance(e, dict) and "error" in e for e in events), i
        else:  # long: cut at the end of the drain period, with an error event
            error = assert_error_shape(events[-2])
            assert error["type"] == "service_unavailable_error" and error["code"] == "server_shutting_down", error
            assert text and text != " ".join(f"s{i}w{j}" for j in range(LONG_WORDS)), "some, not all, of the text came"
            assert DRAIN_S - 0.3 <= ended_at - sigterm_at < DRAIN_S + 1.5, ended_at - sigterm_at
    cancelled = cancel_log.read_text()
    assert all(f"drain-{i}" in cancelled for i in range(0, 20, 2)), "long streams' generation was not cancelled"
    assert not any(f"drain-{i} " in cancelled for i in range(1, 20, 2))

"""Keys stay where they belong. A real gateway process (log level debug) in front of a real
upstream process that echoes the `Authorization` header it receives back in its errors — as
some hosted APIs do ("Incorrect API key provided: sk-...").

- Each backend's upstream key is sent to its own upstream, and only there; the client's key is
  never forwarded.
- No key — client or upstream, from the file or the environment — appears in any response
  (bodies, error events, headers), in the server's log, in the request log or in /metrics.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import faulty_upstream
from tests.support.faulty_upstream import FaultyUpstream
from tests.support.probes import wait_until
from tests.support.server import running_server

UPSTREAM_ENV_KEY = "sk-UPSTREAM-ENV-SENTINEL-7f3a9c"  # vllm backend, via api_key_env
UPSTREAM_FILE_KEY = "sk-UPSTREAM-FILE-SENTINEL-c41d77"  # llamacpp backend, written in plugins.toml
CLIENT_KEY = "sk-CLIENT-SENTINEL-2b8e1d"  # via $SWITCHYARD_API_KEYS
SENTINEL = "SENTINEL"
BACKENDS = {"vllm": UPSTREAM_ENV_KEY, "llamacpp": UPSTREAM_FILE_KEY, "nokey": None}


def config(upstream: str, request_log: Path) -> str:
    return f"""
[server]
log_level = "debug"
health_interval_s = 0
request_log = "{request_log}"

[plugins]
disable = ["builtin"]

[[backends]]
name = "vllm"
type = "vllm"
[backends.options]
base_url = "{upstream}"
api_key_env = "SY_TEST_UPSTREAM_KEY"
models = {{ "m-vllm" = "up" }}

[[backends]]
name = "llamacpp"
type = "llamacpp"
[backends.options]
base_url = "{upstream}"
api_key = "{UPSTREAM_FILE_KEY}"
models = {{ "m-llamacpp" = "up" }}

[[backends]]
name = "nokey"
type = "openai_compatible"
[backends.options]
base_url = "{upstream}"
models = {{ "m-nokey" = "up" }}
"""


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultyUpstream]:
    up = faulty_upstream.start(str(tmp_path_factory.mktemp("secrets-upstream") / "upstream.log"))
    try:
        yield up
    finally:
        faulty_upstream.stop(up)


@pytest.fixture(scope="module")
def served(upstream: FaultyUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    tmp = tmp_path_factory.mktemp("secrets-gateway")
    env = {"SY_TEST_UPSTREAM_KEY": UPSTREAM_ENV_KEY, "SWITCHYARD_API_KEYS": CLIENT_KEY}
    with running_server(config(upstream.url, tmp / "requests.jsonl"), tmp, env=env) as base:
        yield base, tmp


def _exchange(http: httpx.Client, model: str, text: str, stream: bool, request_id: str) -> str:
    """Everything the client saw: status line, headers and body, as text."""
    body = {"model": model, "messages": [{"role": "user", "content": text}], "stream": stream}
    with http.stream("POST", "/v1/chat/completions", json=body, headers={"x-request-id": request_id}) as r:
        raw = r.read()
    return f"{r.status_code}\n{json.dumps(dict(r.headers))}\n{raw.decode()}"


def test_keys_go_to_their_own_upstream_only_and_leak_nowhere(served: tuple[str, Path], upstream: FaultyUpstream) -> None:
    base, tmp = served
    seen: list[str] = []
    with httpx.Client(base_url=base, timeout=15, headers={"authorization": f"Bearer {CLIENT_KEY}"}) as http:
        for backend in BACKENDS:
            for stream in (False, True):
                kind = "sse" if stream else "json"
                ok = _exchange(http, f"m-{backend}", "all fine", stream, f"ok-{backend}-{kind}")
                assert ok.startswith("200"), ok
                seen.append(ok)
                for fault in ("echo_auth", "echo_auth_event"):
                    seen.append(_exchange(http, f"m-{backend}", f"one two fault:{fault}", stream, f"{fault}-{backend}-{kind}"))
        seen.append(http.get("/v1/models").text)
        seen.append(http.get("/metrics").text)

    # what each upstream request carried
    requests = upstream.stats()["requests"]
    for backend, key in BACKENDS.items():
        for rid in (f"ok-{backend}-json", f"ok-{backend}-sse", f"echo_auth-{backend}-json"):
            assert requests[rid]["authorization"] == (f"Bearer {key}" if key else ""), (rid, requests[rid])
    assert all(CLIENT_KEY not in r["authorization"] for r in requests.values()), "the client's key went upstream"

    # the echoing upstream's errors did reach the client — without the key
    echoed = [s for s in seen if "Incorrect API key provided" in s]
    assert len(echoed) >= 8, "the upstream's message (minus the key) should still be shown"
    assert any("[redacted]" in s for s in echoed)
    for text in seen:
        assert SENTINEL not in text, text[:500]

    logs = "".join(p.read_text(errors="replace") for p in tmp.glob("server-*.log"))
    assert "DEBUG" in logs, "the server ran at log level debug"
    assert SENTINEL not in logs, [line for line in logs.splitlines() if SENTINEL in line][:5]
    log_file = tmp / "requests.jsonl"
    # the log is written in batches every 0.2 s: wait for this test's requests to reach it
    assert wait_until(lambda: log_file.exists() and log_file.read_text().count("\n") >= 2 * len(BACKENDS) * 3)
    assert SENTINEL not in log_file.read_text()

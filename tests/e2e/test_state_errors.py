"""Redis stopped under a running gateway: `on_state_error` decides, never a 500; when Redis
comes back, the limits count again."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.gateway.keys.gateways import BURST, STREAM, chat, limits_config
from tests.support.probes import wait_until
from tests.support.redis_server import INSTALL_HINT, RedisServer, redis_installed
from tests.support.server import running_server


def _requests(client: httpx.Client, base: str) -> list[httpx.Response]:
    """One plain request, one stream, for two keys."""
    out = [client.post(base + "/v1/chat/completions", json=chat(), headers=BURST.auth)]
    with client.stream("POST", base + "/v1/chat/completions", json=chat(stream=True), headers=STREAM.auth) as stream:
        stream.read()
        out.append(stream)
    return out


@pytest.mark.parametrize("policy", ["allow", "deny"])
def test_redis_stopped_mid_run_follows_on_state_error(tmp_path: Path, policy: str) -> None:
    if not redis_installed():
        pytest.skip(f"redis-server is not installed; run `{INSTALL_HINT}`")
    redis = RedisServer(tmp_path)  # a server of its own: this test stops it
    redis.start()
    try:
        config = limits_config(keys=(BURST, STREAM), state=redis.url, on_state_error=policy, state_timeout_s=0.5)
        with running_server(config, tmp_path) as base, httpx.Client(timeout=30) as client:
            before = _requests(client, base)
            assert [r.status_code for r in before] == [200, 200]
            assert before[0].headers["x-ratelimit-remaining-requests"] == "9"

            redis.stop()
            during = _requests(client, base) + _requests(client, base)
            if policy == "allow":
                assert [r.status_code for r in during] == [200] * 4
                assert not [h for r in during for h in r.headers if h.startswith("x-ratelimit-")]  # not counted
                assert b"data: [DONE]" in during[1].content
            else:
                assert [r.status_code for r in during] == [503] * 4
                for response in during:
                    error = response.json()["error"]
                    assert (error["type"], error["code"]) == ("service_unavailable_error", "state_unavailable")
                    assert "retry shortly" in error["message"]
            usage = client.get(base + "/switchyard/keys/usage", headers=BURST.auth)
            assert usage.status_code == 503

            redis.start()  # empty again, on the same port
            assert wait_until(lambda: "x-ratelimit-remaining-requests" in _requests(client, base)[0].headers, timeout=15)
            metrics = client.get(base + "/metrics").text
            assert 'switchyard_key_state_errors_total{step="admit"}' in metrics
            assert "switchyard_errors_total{type=\"server_error\"}" not in metrics  # no 500, ever
    finally:
        redis.stop()

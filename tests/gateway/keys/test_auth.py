"""Client API keys: `Authorization: Bearer`, keys from plugins.toml or the environment, keys
limited to some routes; 401 and 403 in OpenAI's error shape; constant-time comparison."""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from gateway.cli.main import main
from gateway.config import parse_config
from gateway.keys import keyring as auth
from gateway.keys.keyring import KeyRing
from tests.gateway.helpers import assert_error_shape, chat_body
from tests.support.gateway_thread import GatewayThread
from tests.support.server import echo_config

PLAIN = "sk-plain-key-000"  # [server] api_keys: every route
TEAM_A = "sk-team-a-from-env"  # [[server.keys]] key_env: echo-1 only
TEAM_B = "sk-team-b-in-file"  # [[server.keys]] key: plain-1 only

CONFIG = f"""[server]
api_keys = ["{PLAIN}"]
health_interval_s = 0

[[server.keys]]
name = "team-a"
key_env = "SY_TEST_TEAM_A_KEY"
routes = ["echo-1"]

[[server.keys]]
name = "team-b"
key = "{TEAM_B}"
routes = ["plain-1"]

""" + echo_config(models=["echo-1", "plain-1"])


@pytest.fixture(scope="module")
def gw() -> Iterator[GatewayThread]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SY_TEST_TEAM_A_KEY", TEAM_A)
        with GatewayThread(CONFIG) as g:
            yield g


def client(gw: GatewayThread, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base + "/v1", api_key=key, max_retries=0, timeout=10)


def test_no_key_wrong_key_or_wrong_scheme_is_401(gw: GatewayThread) -> None:
    with httpx.Client(base_url=gw.base, timeout=10) as http:
        for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": f"Basic {PLAIN}"}, {"authorization": PLAIN},
                        {"authorization": "Bearer"}, {"authorization": f"Bearer {PLAIN}x"}, {"authorization": f"Bearer {PLAIN[:-1]}"}):
            resp = http.post("/v1/chat/completions", json=chat_body(model="echo-1"), headers=headers)
            assert resp.status_code == 401, headers
            error = assert_error_shape(resp.json())
            assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"
            assert resp.headers["www-authenticate"] == "Bearer"
    with client(gw, "wrong") as c, pytest.raises(openai.AuthenticationError):
        c.models.list()


def test_every_key_source_is_accepted(gw: GatewayThread) -> None:
    for key, model in ((PLAIN, "echo-1"), (PLAIN, "plain-1"), (TEAM_A, "echo-1"), (TEAM_B, "plain-1")):
        with client(gw, key) as c:
            answer = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
            assert answer.choices[0].message.content == "hi"


def test_a_key_outside_its_routes_is_403(gw: GatewayThread) -> None:
    with client(gw, TEAM_A) as c:
        with pytest.raises(openai.PermissionDeniedError) as info:
            c.chat.completions.create(model="plain-1", messages=[{"role": "user", "content": "hi"}])
        error = assert_error_shape(info.value.response.json())
        assert error["type"] == "permission_error" and error["code"] == "model_not_allowed" and error["param"] == "model"
        with pytest.raises(openai.PermissionDeniedError):
            c.completions.create(model="plain-1", prompt="hi")
        with pytest.raises(openai.PermissionDeniedError):
            c.models.retrieve("plain-1")
        with pytest.raises(openai.PermissionDeniedError):  # streams too, before any byte
            c.chat.completions.create(model="plain-1", messages=[{"role": "user", "content": "hi"}], stream=True)


def test_models_and_token_endpoints_respect_the_routes(gw: GatewayThread) -> None:
    with client(gw, TEAM_A) as c:
        assert [m.id for m in c.models.list()] == ["echo-1"]
    with client(gw, PLAIN) as c:
        assert sorted(m.id for m in c.models.list()) == ["echo-1", "plain-1"]
    with httpx.Client(base_url=gw.base, timeout=10, headers={"authorization": f"Bearer {TEAM_B}"}) as http:
        assert http.post("/tokenize", json={"prompt": "a b"}).headers["x-switchyard-backend"] == "echo"  # its first allowed route
        assert http.post("/tokenize", json={"model": "echo-1", "prompt": "a b"}).status_code == 403
        assert http.post("/detokenize", json={"model": "echo-1", "tokens": [1]}).status_code == 403
        render = {"model": "echo-1", "messages": [{"role": "user", "content": "hi"}]}
        assert http.post("/switchyard/render", json=render).status_code == 403
        assert http.post("/switchyard/render", json={**render, "model": "plain-1"}).status_code == 200


def test_health_ready_metrics_and_schema_stay_open(gw: GatewayThread) -> None:
    with httpx.Client(base_url=gw.base, timeout=10) as http:
        for path in ("/health", "/ready", "/metrics", "/schema/openapi.json"):
            assert http.get(path).status_code == 200, path


def test_comparison_is_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every key is compared, as SHA-256 digests of one length, whichever key matches (or none)."""
    server = parse_config(CONFIG, "<test>").server
    with monkeypatch.context() as mp:
        mp.setenv("SY_TEST_TEAM_A_KEY", TEAM_A)
        ring = KeyRing.from_config(server)
    calls: list[tuple[int, int]] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    for presented in (PLAIN, TEAM_A, TEAM_B, "nope", "x" * 1000, ""):
        calls.clear()
        ring.authenticate(f"Bearer {presented}")
        assert len(calls) == 3, presented
        assert set(calls) == {(32, 32)}, "digests of equal length: no length leak"
    assert ring.authenticate(f"Bearer {TEAM_A}").name == "team-a"
    assert ring.authenticate("Bearer nope") is None


def test_keys_are_never_in_a_repr() -> None:
    config = parse_config(CONFIG, "<test>")
    text = repr(config) + repr(config.server) + "".join(repr(k) for k in config.server.keys)
    assert PLAIN not in text and TEAM_B not in text


@pytest.mark.parametrize(
    "table,message",
    [
        ('[[server.keys]]\nkey = "a-long-key"\nkey_env = "X"\n', "exactly one of `key` and `key_env` at `server.keys[0]`"),
        ("[[server.keys]]\nroutes = []\n", "exactly one of `key` and `key_env`"),
        ('[[server.keys]]\nkey_env = "SY_TEST_UNSET_VARIABLE"\n', "'SY_TEST_UNSET_VARIABLE' named at `server.keys[0].key_env` is not set"),
        ('[[server.keys]]\nkey = ""\n', "`server.keys[0].key`"),
        ('[[server.keys]]\nkey = "k"\nroute = ["a"]\n', "unknown key at `server.keys[0].route`"),
    ],
)
def test_bad_key_tables_stop_start_up(tmp_path: Path, capsys: pytest.CaptureFixture[str], table: str, message: str) -> None:
    path = tmp_path / "plugins.toml"
    path.write_text(table + "\n" + echo_config())
    rc = main(["check-config", str(path)])
    err = capsys.readouterr().err
    assert rc != 0 and message in err, err

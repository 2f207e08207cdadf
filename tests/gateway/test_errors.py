"""Each error class: the HTTP status, the matching `openai` exception, and the exact OpenAI error
body `{"error": {"message", "type", "param", "code"}}` with `code` a string or null."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.gateway.conftest import MAX_BODY_BYTES, Server
from tests.gateway.helpers import assert_error_shape, chat_body, user
from tests.support.server import echo_config, running_server


def _body(exc: openai.APIStatusError) -> dict:
    return assert_error_shape(exc.response.json())


# -- 400 ------------------------------------------------------------------------------------------


def test_bad_json_is_400(http: httpx.Client, client: openai.OpenAI) -> None:
    for raw in (b"{not json", b'{"model": "echo-1", "messages": [', b"\xff\xfe", b"[1, 2]", b'"just a string"'):
        resp = http.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json", "x-request-id": "bad-json"})
        assert resp.status_code == 400, raw
        error = assert_error_shape(resp.json())
        assert error["type"] == "invalid_request_error"
        assert resp.headers["x-request-id"] == "bad-json", "error responses carry the request id too"


def test_empty_body_is_400_without_framework_internals(http: httpx.Client) -> None:
    resp = http.post("/v1/chat/completions", content=b"", headers={"content-type": "application/json"})
    assert resp.status_code == 400
    error = assert_error_shape(resp.json())
    assert "`data`" not in error["message"], f"leaks the handler's parameter name: {error['message']}"


def test_wrong_type_is_400_with_param(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="echo-1", messages=user("hi"), extra_body={"temperature": "hot"})
    assert info.value.status_code == 400
    assert info.value.param == "temperature"
    assert info.value.type == "invalid_request_error"
    assert _body(info.value)["code"] is None


def test_unknown_field_is_400_naming_it(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="echo-1", messages=user("hi"), extra_body={"temprature": 0.5})
    assert info.value.param == "temprature"
    assert "temprature" in info.value.message


def test_backend_invalid_request_is_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="echo-1", messages=user("FAIL:invalid"))
    assert info.value.param == "messages"
    assert _body(info.value)["message"] == "The backend refused this request."


def test_context_length_exceeded_is_400_with_code(client: openai.OpenAI) -> None:
    # echo's max_model_len is 256: a 300-word prompt does not fit
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="echo-1", messages=user(" ".join(["w"] * 300)))
    assert info.value.code == "context_length_exceeded"
    assert info.value.type == "invalid_request_error"


def test_method_not_allowed_has_error_shape(http: httpx.Client) -> None:
    resp = http.get("/v1/chat/completions")
    assert resp.status_code == 405
    assert_error_shape(resp.json())
    assert resp.headers.get("x-request-id")


# -- 404 ------------------------------------------------------------------------------------------


def test_unknown_model_is_404_model_not_found(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="no-such-model", messages=user("hi"))
    assert info.value.status_code == 404
    assert info.value.code == "model_not_found"
    assert info.value.param == "model"
    assert "no-such-model" in info.value.message
    _body(info.value)


@pytest.mark.anyio
async def test_unknown_model_async(aclient: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        await aclient.completions.create(model="no-such-model", prompt="hi")
    assert info.value.code == "model_not_found"


def test_unknown_route_is_404_in_error_shape(http: httpx.Client) -> None:
    resp = http.get("/v1/nothing-here", headers={"x-request-id": "nope-route"})
    assert resp.status_code == 404
    assert_error_shape(resp.json())
    assert resp.headers["x-request-id"] == "nope-route"


# -- 413 ------------------------------------------------------------------------------------------


def test_body_over_limit_is_413(http: httpx.Client, client: openai.OpenAI) -> None:
    big = chat_body("x " * MAX_BODY_BYTES)
    resp = http.post("/v1/chat/completions", json=big)
    assert resp.status_code == 413
    error = assert_error_shape(resp.json())
    assert error["type"] == "invalid_request_error"
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="echo-1", messages=user("x " * MAX_BODY_BYTES))
    assert info.value.status_code == 413
    # a body just under the limit is served
    fits = chat_body("y " * ((MAX_BODY_BYTES - 200) // 2 // 2))
    assert http.post("/v1/chat/completions", json=fits).status_code != 413


# -- 429 and upstream failures --------------------------------------------------------------------


def test_overloaded_is_429_with_retry_after(client: openai.OpenAI) -> None:
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(model="echo-1", messages=user("FAIL:overloaded"))
    assert info.value.status_code == 429
    assert info.value.response.headers["retry-after"] == "1"
    error = _body(info.value)
    assert error["type"] == "rate_limit_error"
    assert error["code"] == "queue_full"


@pytest.mark.parametrize("kind,status", [("bad_gateway", 502), ("unavailable", 503), ("timeout", 504)])
def test_upstream_failures_are_5xx(client: openai.OpenAI, kind: str, status: int) -> None:
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="echo-1", messages=user(f"FAIL:{kind}"))
    assert info.value.status_code == status
    error = _body(info.value)
    assert error["type"] != "server_error", "upstream failures are not the gateway's own bugs"


@pytest.mark.anyio
@pytest.mark.parametrize("kind,status", [("bad_gateway", 502), ("unavailable", 503), ("timeout", 504)])
async def test_upstream_failures_async(aclient: openai.AsyncOpenAI, kind: str, status: int) -> None:
    with pytest.raises(openai.InternalServerError) as info:
        await aclient.chat.completions.create(model="echo-1", messages=user(f"FAIL:{kind}"))
    assert info.value.status_code == status


@pytest.mark.parametrize("stream", [False, True])
def test_real_bug_is_500_with_request_id_and_no_traceback(http: httpx.Client, client: openai.OpenAI, stream: bool) -> None:
    resp = http.post("/v1/chat/completions", json=chat_body("FAIL:bug", stream=stream))
    assert resp.status_code == 500
    request_id = resp.headers["x-request-id"]
    error = assert_error_shape(resp.json())
    assert error["type"] == "server_error"
    assert request_id and request_id in error["message"]
    for leak in ("Traceback", "RuntimeError", "a real bug", 'File "', "echo_backend"):
        assert leak not in resp.text
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="echo-1", messages=user("FAIL:bug"), extra_headers={"x-request-id": "bug-42"})
    assert info.value.status_code == 500
    assert "bug-42" in info.value.message


# -- 401 ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("gateway-auth")
    config = '[server]\napi_keys = ["k1"]\n\n' + echo_config()
    # keys come from plugins.toml and from $SWITCHYARD_API_KEYS (comma-separated), both honoured
    with running_server(config, tmp, env={"SWITCHYARD_API_KEYS": "env1, env2"}) as base:
        yield Server(base=base)


@pytest.mark.parametrize("key", ["wrong", "k1x", "k", "K1"])
def test_wrong_key_is_401(auth_server: Server, key: str) -> None:
    with openai.OpenAI(base_url=auth_server.v1, api_key=key, max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError) as info:
            client.chat.completions.create(model="echo-1", messages=user("hi"))
    assert info.value.status_code == 401
    error = _body(info.value)
    assert error["type"] == "authentication_error"
    assert info.value.response.headers.get("www-authenticate", "").lower().startswith("bearer")


def test_missing_or_malformed_authorization_is_401(auth_server: Server) -> None:
    with httpx.Client(base_url=auth_server.base) as http:
        for headers in ({}, {"authorization": "k1"}, {"authorization": "Basic k1"}, {"authorization": "Bearer"}):
            resp = http.post("/v1/chat/completions", json=chat_body(), headers=headers)
            assert resp.status_code == 401, headers
            assert_error_shape(resp.json())
        for path in ("/v1/models", "/v1/models/echo-1"):
            assert http.get(path).status_code == 401
        assert http.post("/tokenize", json={"prompt": "a"}).status_code == 401


def test_right_key_is_served_and_health_is_open(auth_server: Server) -> None:
    with openai.OpenAI(base_url=auth_server.v1, api_key="k1", max_retries=0) as client:
        assert client.chat.completions.create(model="echo-1", messages=user("hi there")).choices[0].message.content == "hi there"
        assert [m.id for m in client.models.list()] == ["echo-1"]
    with httpx.Client(base_url=auth_server.base) as http:
        assert http.get("/health").status_code == 200
        assert http.get("/ready").status_code == 200
        assert http.get("/metrics").status_code == 200
        assert http.post("/v1/chat/completions", json=chat_body(), headers={"authorization": "bearer k1"}).status_code == 200


@pytest.mark.anyio
async def test_wrong_key_async(auth_server: Server) -> None:
    async with openai.AsyncOpenAI(base_url=auth_server.v1, api_key="nope", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError):
            await client.models.list()


def test_api_keys_from_environment(auth_server: Server) -> None:
    with httpx.Client(base_url=auth_server.base) as http:
        assert http.get("/v1/models").status_code == 401
        for key in ("env1", "env2", "k1"):
            assert http.get("/v1/models", headers={"authorization": f"Bearer {key}"}).status_code == 200, key
        assert http.get("/v1/models", headers={"authorization": "Bearer env1, env2"}).status_code == 401

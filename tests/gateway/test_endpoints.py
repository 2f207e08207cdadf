"""Legacy completions, models, tokenize/detokenize, health/ready/metrics, headers and OpenAPI."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.gateway.conftest import Server
from tests.gateway.helpers import assert_error_shape, chat_body, user
from tests.support.server import echo_config, running_server

# -- /v1/completions ------------------------------------------------------------------------------


def test_completion_sync(client: openai.OpenAI) -> None:
    resp = client.completions.create(model="echo-1", prompt="a b c")
    assert resp.object == "text_completion"
    assert resp.id.startswith("cmpl-")
    assert resp.model == "echo-1"
    assert resp.system_fingerprint == "fp_switchyard"
    assert [(c.index, c.text, c.finish_reason) for c in resp.choices] == [(0, "a b c", "stop")]
    assert resp.choices[0].logprobs is None
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens, resp.usage.total_tokens) == (3, 3, 6)
    assert resp.usage.prompt_tokens_details.cached_tokens == 1


@pytest.mark.anyio
async def test_completion_async(aclient: openai.AsyncOpenAI) -> None:
    resp = await aclient.completions.create(model="echo-1", prompt="a b c", max_tokens=2)
    assert resp.choices[0].text == "a b"
    assert resp.choices[0].finish_reason == "length"


@pytest.mark.parametrize(
    "prompt,text",
    [("x y", "x y"), (["x y"], "x y"), ([5, 6, 7], "5 6 7"), ([[5, 6]], "5 6")],
    ids=["string", "one-string-list", "token-ids", "one-token-id-list"],
)
def test_completion_prompt_shapes(client: openai.OpenAI, prompt: object, text: str) -> None:
    assert client.completions.create(model="echo-1", prompt=prompt).choices[0].text == text


def test_completion_default_max_tokens_is_16(client: openai.OpenAI) -> None:
    prompt = " ".join(f"t{i}" for i in range(20))
    resp = client.completions.create(model="echo-1", prompt=prompt)
    assert resp.usage.completion_tokens == 16
    assert resp.choices[0].finish_reason == "length"


def test_completion_stream_sync(client: openai.OpenAI) -> None:
    with client.completions.create(model="echo-1", prompt="a b c", stream=True) as stream:
        chunks = list(stream)
    assert all(c.object == "text_completion" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert [c.choices[0].text for c in chunks] == ["a", " b", " c"]  # no role chunk, no empty text
    assert [c.choices[0].finish_reason for c in chunks] == [None, None, "stop"]
    assert all(c.usage is None for c in chunks)


@pytest.mark.anyio
async def test_completion_stream_async_with_usage(aclient: openai.AsyncOpenAI) -> None:
    stream = await aclient.completions.create(
        model="echo-1", prompt="a b c", stream=True, n=2, stream_options={"include_usage": True}
    )
    chunks = [c async for c in stream]
    *body, last = chunks
    assert last.choices == [] and last.usage.completion_tokens == 6 and last.usage.total_tokens == 9
    for index in (0, 1):
        texts = [ch.text for c in body for ch in c.choices if ch.index == index]
        assert "".join(texts) == "a b c"


def test_completion_logprobs_stream_matches_non_stream(client: openai.OpenAI) -> None:
    full = client.completions.create(model="echo-1", prompt="aa bbb c", logprobs=2)
    lp = full.choices[0].logprobs
    assert lp.tokens == ["aa", " bbb", " c"]
    assert lp.text_offset == [0, 2, 6]
    assert all(len(t) == 2 for t in lp.top_logprobs)
    with client.completions.create(model="echo-1", prompt="aa bbb c", logprobs=2, stream=True) as stream:
        chunks = list(stream)
    tokens = [t for c in chunks for t in c.choices[0].logprobs.tokens]
    offsets = [o for c in chunks for o in c.choices[0].logprobs.text_offset]
    assert tokens == lp.tokens
    assert offsets == lp.text_offset, "streamed text_offset must count from the start of the choice's text"


# -- /v1/models -----------------------------------------------------------------------------------


def test_models_list(client: openai.OpenAI) -> None:
    models = client.models.list()
    ids = sorted(m.id for m in models)
    assert ids == ["echo-1", "org/plain-2", "plain-1", "slow-1"]
    for m in models:
        assert m.object == "model"
        assert isinstance(m.created, int)
        assert isinstance(m.owned_by, str) and m.owned_by


def test_models_retrieve(client: openai.OpenAI, http: httpx.Client) -> None:
    model = client.models.retrieve("plain-1")
    assert (model.id, model.object, model.owned_by) == ("plain-1", "model", "plain")
    raw = http.get("/v1/models/echo-1").json()
    assert raw["max_model_len"] == 256


def test_model_id_with_a_slash(client: openai.OpenAI) -> None:
    assert client.models.retrieve("org/plain-2").id == "org/plain-2"
    resp = client.chat.completions.create(model="org/plain-2", messages=user("slash ok"))
    assert (resp.model, resp.choices[0].message.content) == ("org/plain-2", "slash ok")


def test_models_unknown_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("no-such-model")
    assert info.value.code == "model_not_found"
    assert info.value.param == "model"
    assert_error_shape(info.value.response.json())


@pytest.mark.anyio
async def test_models_async(aclient: openai.AsyncOpenAI) -> None:
    page = await aclient.models.list()
    assert "echo-1" in [m.id for m in page.data]
    with pytest.raises(openai.NotFoundError):
        await aclient.models.retrieve("nope")


# -- /tokenize, /detokenize -----------------------------------------------------------------------


def test_tokenize_prompt(http: httpx.Client) -> None:
    resp = http.post("/tokenize", json={"model": "echo-1", "prompt": "a bb ccc"})
    assert resp.status_code == 200
    body = resp.json()
    # the echo backend's "token id" of a word is its length
    assert body["tokens"] == [1, 2, 3]
    assert body["count"] == 3
    assert body["max_model_len"] == 256
    assert resp.headers["x-switchyard-backend"] == "echo"


def test_tokenize_messages_counts_like_chat_usage(http: httpx.Client, client: openai.OpenAI) -> None:
    messages = [{"role": "system", "content": "be nice"}, {"role": "user", "content": "hello big world"}]
    body = http.post("/tokenize", json={"model": "echo-1", "messages": messages}).json()
    usage = client.chat.completions.create(model="echo-1", messages=messages).usage
    assert body["count"] == len(body["tokens"]) == usage.prompt_tokens


def test_tokenize_needs_exactly_one_of_prompt_and_messages(http: httpx.Client) -> None:
    for body in ({"model": "echo-1"}, {"model": "echo-1", "prompt": "a", "messages": user("b")}):
        resp = http.post("/tokenize", json=body)
        assert resp.status_code == 400
        assert_error_shape(resp.json())


def test_tokenize_unknown_model_is_404(http: httpx.Client) -> None:
    resp = http.post("/tokenize", json={"model": "nope", "prompt": "a"})
    assert resp.status_code == 404
    assert assert_error_shape(resp.json())["code"] == "model_not_found"


def test_detokenize(http: httpx.Client) -> None:
    resp = http.post("/detokenize", json={"model": "plain-1", "tokens": [1, 2, 3]})
    assert resp.status_code == 200
    assert resp.json() == {"prompt": "x xx xxx"}
    assert resp.headers["x-switchyard-backend"] == "plain"
    bad = http.post("/detokenize", json={"model": "echo-1", "tokens": [-1]})
    assert bad.status_code == 400
    assert assert_error_shape(bad.json())["param"].startswith("tokens")


# -- health, ready, metrics -----------------------------------------------------------------------


def test_health_and_ready(http: httpx.Client) -> None:
    assert http.get("/health").status_code == 200
    assert http.get("/health").json() == {"status": "ok"}
    assert http.get("/ready").status_code == 200


@pytest.fixture(scope="module")
def sick_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(echo_config(healthy=False), tmp_path_factory.mktemp("gateway-sick")) as base:
        yield Server(base=base)


def test_ready_is_503_when_no_backend_is_healthy(sick_server: Server) -> None:
    with httpx.Client(base_url=sick_server.base) as http:
        assert http.get("/health").status_code == 200, "liveness does not depend on the backends"
        assert http.get("/ready").status_code == 503


def _metric(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_metrics_count_requests_and_tokens(http: httpx.Client, client: openai.OpenAI) -> None:
    before = http.get("/metrics")
    assert before.status_code == 200
    ctype = before.headers["content-type"]
    assert ctype.startswith("text/plain") and "version=0.0.4" in ctype
    assert ctype.count("charset") == 1, ctype
    labels = {"route": "plain-1", "backend": "plain"}
    ok0 = _metric(before.text, "switchyard_requests_total", outcome="ok", **labels)
    prompt0 = _metric(before.text, "switchyard_tokens_total", kind="prompt", **labels)
    completion0 = _metric(before.text, "switchyard_tokens_total", kind="completion", **labels)
    client.chat.completions.create(model="plain-1", messages=user("one two three"))
    with client.chat.completions.create(model="plain-1", messages=user("four five"), stream=True) as stream:
        list(stream)
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="plain-1", messages=user("FAIL:timeout"))
    after = http.get("/metrics").text
    assert "# TYPE switchyard_requests_total counter" in after
    assert _metric(after, "switchyard_requests_total", outcome="ok", **labels) == ok0 + 2
    assert _metric(after, "switchyard_requests_total", outcome="error:UpstreamError", **labels) >= 1
    assert _metric(after, "switchyard_tokens_total", kind="prompt", **labels) == prompt0 + 4 + 3  # the failed request reported no usage
    assert _metric(after, "switchyard_tokens_total", kind="completion", **labels) == completion0 + 3 + 2
    assert _metric(after, "switchyard_requests_in_flight", **labels) == 0
    assert _metric(after, "switchyard_request_duration_seconds_count", **labels) >= 3


# -- headers --------------------------------------------------------------------------------------


def test_request_id_is_echoed(http: httpx.Client) -> None:
    rid = "client-" + uuid.uuid4().hex
    for method, path, body in (
        ("POST", "/v1/chat/completions", chat_body()),
        ("POST", "/v1/chat/completions", chat_body(stream=True)),
        ("POST", "/v1/completions", {"model": "echo-1", "prompt": "x"}),
        ("GET", "/v1/models", None),
        ("POST", "/v1/chat/completions", chat_body(model="nope")),
    ):
        resp = http.request(method, path, json=body, headers={"x-request-id": rid})
        assert resp.headers.get("x-request-id") == rid, (method, path)


def test_request_id_is_generated(http: httpx.Client) -> None:
    a = http.post("/v1/chat/completions", json=chat_body()).headers.get("x-request-id")
    b = http.post("/v1/chat/completions", json=chat_body()).headers.get("x-request-id")
    assert a and b and a != b
    assert len(a) >= 16


def test_backend_header_names_the_backend(http: httpx.Client, client: openai.OpenAI) -> None:
    for model, backend in (("echo-1", "echo"), ("plain-1", "plain")):
        raw = client.chat.completions.with_raw_response.create(model=model, messages=user("hi"))
        assert raw.headers["x-switchyard-backend"] == backend
        with http.stream("POST", "/v1/chat/completions", json=chat_body(model=model, stream=True)) as resp:
            assert resp.headers["x-switchyard-backend"] == backend
            resp.read()


# -- OpenAPI --------------------------------------------------------------------------------------

CHAT_EXTENSIONS = [
    "top_k",
    "min_p",
    "repetition_penalty",
    "priority",
    "structured_outputs",
    "chat_template",
    "chat_template_kwargs",
    "add_generation_prompt",
    "continue_final_message",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "min_tokens",
    "ignore_eos",
    "stop_token_ids",
]


def test_openapi_describes_the_request_structs(http: httpx.Client) -> None:
    resp = http.get("/schema/openapi.json")
    assert resp.status_code == 200
    spec = resp.json()
    paths = spec["paths"]
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/models", "/tokenize", "/detokenize"):
        assert path in paths, path
    body_ref = paths["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert body_ref.endswith("/ChatCompletionRequest")
    schemas = spec["components"]["schemas"]
    chat = schemas["ChatCompletionRequest"]
    props = chat["properties"]
    for name in ["messages", "model", "stream_options", "logprobs", "top_logprobs", "tools", "tool_choice", *CHAT_EXTENSIONS]:
        assert name in props, name
    assert set(chat["required"]) >= {"model", "messages"}
    assert props["messages"]["type"] == "array"
    assert props["temperature"].get("maximum") == 2.0
    so = schemas["StructuredOutputs"]["properties"]
    assert {"json", "regex", "choice", "grammar"} <= set(so)
    completion = schemas["CompletionRequest"]["properties"]
    assert "prompt" in completion and "top_k" in completion


def test_metrics_count_errors_by_type(http: httpx.Client, client: openai.OpenAI) -> None:
    before = http.get("/metrics").text
    invalid0 = _metric(before, "switchyard_errors_total", type="invalid_request_error")
    upstream0 = _metric(before, "switchyard_errors_total", type="upstream_error")
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="echo-1", messages=user("hi"), temperature=5)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=user("hi"))
    with pytest.raises(openai.APIError):  # the error arrives as an event after two tokens
        with client.chat.completions.create(model="echo-1", messages=user("a b FAILMID:2"), stream=True) as stream:
            list(stream)
    after = http.get("/metrics").text
    assert _metric(after, "switchyard_errors_total", type="invalid_request_error") == invalid0 + 2
    assert _metric(after, "switchyard_errors_total", type="upstream_error") == upstream0 + 1

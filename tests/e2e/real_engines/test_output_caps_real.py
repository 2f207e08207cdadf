"""Context overflow and output limits on every backend — the built-in engine, real llama.cpp, real
vLLM — through the gateway and the official clients: a prompt over the context is a 400 with code
`context_length_exceeded` in OpenAI's wording of the numbers each engine tells; on a route with
`over_max_tokens = "clamp"` an output limit over the cap is lowered to it (and said in
`x-switchyard-max-tokens-clamped`), and one over the context left after the prompt ends with
`finish_reason: "length"` exactly at the context's end: fitted by the gateway for the built-in
engine (which says so), lowered by vLLM and llama.cpp themselves."""

from __future__ import annotations

import re
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from engines.launch import ServerProcess
from gateway.http.common import CLAMPED_HEADER
from tests.e2e.real_engines.conftest import CONTEXT, ENGINES, gateway_config, public_name
from tests.support.server import running_server

BACKENDS = ("builtin", *ENGINES)
CAP = 48
OVERFLOW = re.compile(r"^This model's maximum context length is (\d+) tokens\. However, your messages resulted in (\d+) "
                      r"tokens\. Please reduce the length of the messages\.$")


def routes(engines: list[str]) -> str:
    text = ""
    for engine in engines:
        for name, cap in ((f"capped-{engine}", f"max_tokens = {CAP}\n"), (f"fitted-{engine}", "")):
            text += (f'[[routes]]\nname = "{name}"\nover_max_tokens = "clamp"\n{cap}'
                     f'[[routes.targets]]\nbackend = "{engine}"\nmodel = "{public_name(engine)}"\n\n')
    return text


@pytest.fixture(scope="module")
def base(engine_servers: dict[str, ServerProcess], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config = gateway_config(engine_servers, builtin=True) + "\n" + routes(["builtin", *engine_servers])
    with running_server(config, tmp_path_factory.mktemp("caps"), ready_timeout=300) as url:
        yield url


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, engine_servers: dict[str, ServerProcess]) -> str:
    if request.param != "builtin" and request.param not in engine_servers:
        pytest.skip(f"{request.param} is not installed")
    return request.param


@pytest.fixture(scope="module")
def oa(base: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=300) as client:
        yield client


def prompt_of(base: str, backend: str, tokens: int) -> list[dict[str, str]]:
    """A user message whose chat prompt is `tokens` long on `backend` (counted by its /tokenize)."""
    def count(words: int) -> int:
        messages = [{"role": "user", "content": "switch " * words}]
        body = httpx.post(base + "/tokenize", json={"model": public_name(backend), "messages": messages}, timeout=60).json()
        return body["count"]

    words = 100 + tokens - count(100)
    assert count(words) == tokens
    return [{"role": "user", "content": "switch " * words}]


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_over_the_context_is_openais_context_error(oa: openai.OpenAI, base: str, backend: str, stream: bool) -> None:
    messages = [{"role": "user", "content": "switch " * (CONTEXT + 200)}]
    with pytest.raises(openai.BadRequestError) as info:
        oa.chat.completions.create(model=public_name(backend), messages=messages, max_tokens=4, stream=stream)
    assert info.value.code == "context_length_exceeded" and info.value.body["type"] == "invalid_request_error"
    told = OVERFLOW.match(info.value.body["message"])
    assert told is not None, info.value.body["message"]
    assert int(told[1]) == CONTEXT and int(told[2]) > CONTEXT  # vLLM counts to CONTEXT + 1 ("at least")


def test_messages_get_a_400_too(base: str, backend: str) -> None:
    with anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0, timeout=300) as claude, \
            pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.create(model=public_name(backend), max_tokens=4,
                               messages=[{"role": "user", "content": "switch " * (CONTEXT + 200)}])
    assert info.value.body["error"]["type"] == "invalid_request_error"


def test_over_the_cap_is_lowered_to_it(oa: openai.OpenAI, backend: str) -> None:
    raw = oa.chat.completions.with_raw_response.create(
        model=f"capped-{backend}", messages=[{"role": "user", "content": "Count from one to one hundred."}],
        max_tokens=32000, temperature=0, extra_body={"ignore_eos": True})
    assert raw.headers[CLAMPED_HEADER] == f"32000->{CAP}"
    body = raw.parse()
    assert body.usage.completion_tokens == CAP and body.choices[0].finish_reason == "length"


def test_an_output_over_the_context_left_ends_with_length_at_the_context(oa: openai.OpenAI, base: str, backend: str) -> None:
    room = 24
    messages = prompt_of(base, backend, CONTEXT - room)
    raw = oa.chat.completions.with_raw_response.create(model=f"fitted-{backend}", messages=messages, max_tokens=1000,
                                                       temperature=0, extra_body={"ignore_eos": True})
    body = raw.parse()
    assert body.usage.prompt_tokens == CONTEXT - room
    assert body.choices[0].finish_reason == "length"
    # llama.cpp counts the last token it could not place; the others stop at the context's end
    assert body.usage.completion_tokens in (room, room + 1) if backend == "llamacpp" else body.usage.completion_tokens == room
    if backend == "builtin":  # the gateway fitted it, and says so
        assert raw.headers[CLAMPED_HEADER] == f"1000->{room}"
    else:  # the engine lowered it itself: the gateway cannot tell
        assert CLAMPED_HEADER not in raw.headers

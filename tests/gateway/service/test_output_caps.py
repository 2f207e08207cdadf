"""Output limits agents survive (`over_max_tokens = "clamp"`): an output limit over the route's cap
is lowered to it instead of a 400, one that does not fit the context left after the prompt is
fitted into it once the backend told the prompt's length, the response says so in
`x-switchyard-max-tokens-clamped`, and the answer ends with the API's own length reason — in every
wire API, through the official clients. A route that rejects keeps today's 400s, in OpenAI's
wording of a context overflow."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import parse_config
from gateway.http.common import CLAMPED_HEADER
from gateway.service.admission import RouteLimits
from plugins.contract.errors import ConfigError, ContextLengthExceeded, InvalidRequest
from tests.gateway.conftest import backend_table
from tests.support.gateway_thread import GatewayThread
from tests.support.server import echo_config

CONTEXT = 16  # the `ctx` echo backend's context, in words (the echo backend's tokens)

CONFIG = (
    "[server]\nhealth_interval_s = 0\n\n"
    + echo_config(models=["wide-1"])
    + "\n" + backend_table("ctx", models=["ctx-1"], max_model_len=CONTEXT)
    + """
[[routes]]
name = "clamped"
max_tokens = 5
over_max_tokens = "clamp"
[[routes.targets]]
backend = "echo"
model = "wide-1"

[[routes]]
name = "capped"
max_tokens = 5
[[routes.targets]]
backend = "echo"
model = "wide-1"

[[routes]]
name = "fitted"
over_max_tokens = "clamp"
[[routes.targets]]
backend = "ctx"
model = "ctx-1"

[[routes]]
name = "strict"
[[routes.targets]]
backend = "ctx"
model = "ctx-1"
"""
)


def words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


@pytest.fixture(scope="module")
def gw() -> Iterator[GatewayThread]:
    with GatewayThread(CONFIG) as g:
        yield g


@pytest.fixture(scope="module")
def oa(gw: GatewayThread) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gw.base + "/v1", api_key="x", max_retries=0, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def claude(gw: GatewayThread) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=gw.base, api_key="x", max_retries=0, timeout=30) as client:
        yield client


def chat(oa: openai.OpenAI, model: str, n_words: int, **fields: Any) -> Any:
    return oa.chat.completions.with_raw_response.create(model=model, messages=[{"role": "user", "content": words(n_words)}],
                                                        **fields)


# -- the route's cap ------------------------------------------------------------------------------


def test_over_the_cap_is_lowered_to_it_and_said(oa: openai.OpenAI) -> None:
    raw = chat(oa, "clamped", 10, max_tokens=50)
    body = raw.parse()
    assert raw.headers[CLAMPED_HEADER] == "50->5"
    assert body.usage.completion_tokens == 5 and body.choices[0].finish_reason == "length"
    raw = chat(oa, "clamped", 10, max_completion_tokens=7)
    assert raw.headers[CLAMPED_HEADER] == "7->5"


def test_every_api_says_what_it_asked(claude: anthropic.Anthropic, oa: openai.OpenAI) -> None:
    raw = claude.messages.with_raw_response.create(model="clamped", max_tokens=32000,
                                                   messages=[{"role": "user", "content": words(10)}])
    assert raw.headers[CLAMPED_HEADER] == "32000->5" and raw.parse().stop_reason == "max_tokens"
    raw = oa.responses.with_raw_response.create(model="clamped", input=words(10), max_output_tokens=50, store=False)
    assert raw.headers[CLAMPED_HEADER] == "50->5" and raw.parse().status == "incomplete"
    raw = oa.completions.with_raw_response.create(model="clamped", prompt=words(10), max_tokens=50)
    assert raw.headers[CLAMPED_HEADER] == "50->5" and raw.parse().choices[0].finish_reason == "length"


def test_within_the_cap_nothing_changes(oa: openai.OpenAI) -> None:
    raw = chat(oa, "clamped", 10, max_tokens=3)
    assert CLAMPED_HEADER not in raw.headers and raw.parse().usage.completion_tokens == 3
    raw = chat(oa, "clamped", 2)  # asks nothing: the cap is its default, not a clamp
    assert CLAMPED_HEADER not in raw.headers and raw.parse().choices[0].finish_reason == "stop"


def test_a_route_that_rejects_still_answers_400(oa: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        chat(oa, "capped", 10, max_tokens=50)
    assert info.value.body["param"] == "max_tokens"


# -- the context left after the prompt ------------------------------------------------------------


def test_an_output_that_does_not_fit_the_context_is_fitted(oa: openai.OpenAI, gw: GatewayThread) -> None:
    before = fitted_attempts(gw)
    raw = chat(oa, "fitted", 10, max_tokens=20)  # 11 prompt words (the role counts) + 20 > 16
    body = raw.parse()
    assert raw.headers[CLAMPED_HEADER] == f"20->{CONTEXT - 11}"
    assert body.usage.prompt_tokens == 11 and body.usage.completion_tokens == CONTEXT - 11
    assert body.choices[0].finish_reason == "length"
    assert fitted_attempts(gw) == before + 1


def test_streamed_the_header_and_the_length_reason_come_too(oa: openai.OpenAI) -> None:
    raw = oa.chat.completions.with_raw_response.create(
        model="fitted", messages=[{"role": "user", "content": words(10)}], max_tokens=20, stream=True,
        stream_options={"include_usage": True})
    assert raw.headers[CLAMPED_HEADER] == f"20->{CONTEXT - 11}"
    chunks = list(raw.parse())
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].usage.completion_tokens == CONTEXT - 11


def test_legacy_completions_are_fitted(oa: openai.OpenAI) -> None:
    raw = oa.completions.with_raw_response.create(model="fitted", prompt=words(10), max_tokens=20)
    body = raw.parse()
    assert raw.headers[CLAMPED_HEADER] == f"20->{CONTEXT - 10}"
    assert body.usage.completion_tokens == CONTEXT - 10 and body.choices[0].finish_reason == "length"


def test_messages_end_with_max_tokens(claude: anthropic.Anthropic) -> None:
    raw = claude.messages.with_raw_response.create(model="fitted", max_tokens=20,
                                                   messages=[{"role": "user", "content": words(10)}])
    message = raw.parse()
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == CONTEXT - 11
    assert raw.headers[CLAMPED_HEADER].endswith(f"->{CONTEXT - 11}")


def test_responses_end_incomplete(oa: openai.OpenAI) -> None:
    raw = oa.responses.with_raw_response.create(model="fitted", input=words(10), max_output_tokens=20, store=False)
    response = raw.parse()
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert raw.headers[CLAMPED_HEADER].endswith(f"->{CONTEXT - 11}")


def test_a_prompt_that_fills_the_context_is_still_the_context_error(oa: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        chat(oa, "fitted", 20, max_tokens=4)
    assert info.value.code == "context_length_exceeded" and info.value.body["type"] == "invalid_request_error"
    assert info.value.body["message"] == (f"This model's maximum context length is {CONTEXT} tokens. However, your "
                                          "messages resulted in 21 tokens. Please reduce the length of the messages.")


def test_a_route_that_rejects_answers_openais_context_error(oa: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        chat(oa, "strict", 10, max_tokens=10)
    assert info.value.code == "context_length_exceeded"
    assert info.value.body["message"] == (
        f"This model's maximum context length is {CONTEXT} tokens. However, you requested 21 tokens (11 in the "
        "messages, 10 in the completion). Please reduce the length of the messages or completion.")
    with pytest.raises(openai.BadRequestError) as info:
        oa.completions.create(model="strict", prompt=words(20), max_tokens=2)
    assert info.value.body["message"] == (
        f"This model's maximum context length is {CONTEXT} tokens, however you requested 20 tokens (20 in your "
        "prompt; 0 for the completion). Please reduce your prompt; or completion length.")


def fitted_attempts(gw: GatewayThread) -> float:
    text = httpx.get(gw.base + "/metrics", timeout=10).text
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "switchyard_route_attempts_total" and s.labels["outcome"] == "max_tokens_fitted")


# -- the rules, and the key ------------------------------------------------------------------------


def test_max_tokens_for_rejects_or_lowers() -> None:
    reject = RouteLimits(max_tokens=100)
    with pytest.raises(InvalidRequest, match="more than model `m` allows"):
        reject.max_tokens_for("m", "max_tokens", 101)
    assert reject.max_tokens_for("m", "max_tokens", 1000 - 900) == 100
    clamp = RouteLimits(max_tokens=100, over_max_tokens="clamp", max_model_len=64)
    assert clamp.max_tokens_for("m", "max_tokens", 32000) == 64  # the context bounds it too
    assert clamp.max_tokens_for("m", "max_tokens", 50) == 50
    assert clamp.max_tokens_for("m", "max_tokens", None) == 64
    assert RouteLimits(over_max_tokens="clamp").max_tokens_for("m", "max_tokens", None) is None


@pytest.mark.parametrize(("prompt", "context", "asked", "fitted"), [
    (10, 16, 20, 6),  # the room left
    (16, 16, 20, None),  # no room: the prompt is the problem
    (None, 512, 600, 512),  # vLLM's max_tokens over max_model_len: the whole context
    (None, 512, 100, None),  # a prompt too long, its length untold
    (10, None, 20, None),  # told too little
    (5, 16, 8, None),  # it fits: the overflow was not the output's
])
def test_fit(prompt: int | None, context: int | None, asked: int, fitted: int | None) -> None:
    error = ContextLengthExceeded("too long", prompt_tokens=prompt, max_model_len=context)
    assert RouteLimits(over_max_tokens="clamp").fit(error, asked) == fitted
    assert RouteLimits().fit(error, asked) is None


@pytest.mark.parametrize("where", ["[server]\nover_max_tokens = \"sometimes\"\n",
                                   '[[routes]]\nname = "r"\nover_max_tokens = "sometimes"\n[[routes.targets]]\nbackend = "echo"\n'])
def test_a_bad_value_stops_start_up_naming_the_key(where: str) -> None:
    with pytest.raises(ConfigError, match="over_max_tokens"):
        parse_config(echo_config() + "\n" + where if where.startswith("[[") else where + echo_config(), "<test>")

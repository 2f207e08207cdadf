"""The published OpenAPI document says what the gateway enforces: the bounds Litestar's own
generator drops, unknown fields refused, vLLM's extensions, the real responses and errors."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from litestar.testing import TestClient

from gateway.app import create_app
from gateway.config import parse_config
from gateway.openapi import ERRORS
from tests.support.server import echo_config


@pytest.fixture(scope="module")
def doc() -> Iterator[dict]:
    with TestClient(create_app(parse_config(echo_config(), "<doc>"))) as client:
        resp = client.get("/schema/openapi.json")
        assert resp.status_code == 200
        yield resp.json()


def branch(prop: dict) -> dict:
    """The non-null branch of an optional property."""
    (value,) = [b for b in prop.get("anyOf", [prop]) if b != {"type": "null"}]
    return value


def test_bounds_and_unknown_fields(doc: dict) -> None:
    schemas = doc["components"]["schemas"]
    chat = schemas["ChatCompletionRequest"]
    props = chat["properties"]
    assert chat["additionalProperties"] is False
    assert branch(props["max_tokens"])["minimum"] == 0  # Litestar drops a falsy bound
    assert branch(props["temperature"]) == {"description": "Sampling temperature, 0–2.", "type": "number", "minimum": 0.0, "maximum": 2.0}
    assert props["stop"]["anyOf"][1] == {"type": "array", "items": {"type": "string"}, "maxItems": 4, "minItems": 1}
    assert branch(props["top_logprobs"])["maximum"] == 20
    for extension in ("top_k", "min_p", "repetition_penalty", "structured_outputs", "chat_template_kwargs", "min_tokens", "stop_token_ids"):
        assert extension in props, extension
    assert branch(props["stop_token_ids"])["items"]["maximum"] == 2**31 - 1
    # a system message's text parts decode without their `type` tag; a user message's need it
    system_parts = schemas["SystemMessage"]["properties"]["content"]["anyOf"][1]["items"]
    assert system_parts == {"$ref": "#/components/schemas/TextPartUntagged"}
    assert "type" not in schemas["TextPartUntagged"]["required"] and "type" in schemas["TextPart"]["required"]


def test_operations_list_their_real_answers(doc: dict) -> None:
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ChatCompletionRequest"}
    ok = chat["responses"]["200"]["content"]
    assert ok["application/json"]["schema"] == {"$ref": "#/components/schemas/ChatCompletion"}
    event = ok["text/event-stream"]["schema"]["properties"]["data"]
    assert event["then"]["contentSchema"]["anyOf"][0] == {"$ref": "#/components/schemas/ChatCompletionChunk"}
    assert set(chat["responses"]) == {"200", *ERRORS}
    error = doc["components"]["responses"]["Error429"]["content"]["application/json"]["schema"]
    assert error == {"$ref": "#/components/schemas/ErrorResponse"}
    assert doc["components"]["schemas"]["ErrorBody"]["required"] == ["message", "type", "param", "code"]
    assert set(doc["paths"]["/health"]["get"]["responses"]) == {"200"}

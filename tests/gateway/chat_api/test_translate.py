"""One row per validation rule, driven through the real server: each is a 400 with
`type == "invalid_request_error"`, the offending `param`, and a message a person understands.

Rows are (endpoint, fields merged into a valid body — `DROP` removes a key, param, message part).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.gateway.conftest import MAX_N
from tests.gateway.helpers import assert_error_shape

DROP = object()
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"

USER = {"role": "user", "content": "hi"}
ASSISTANT = {"role": "assistant", "content": "partial"}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}

ROWS: list[tuple[str, str, dict[str, Any], str | None, str]] = [
    # (id, endpoint, fields, param, message substring)
    ("temperature-high", CHAT, {"temperature": 2.5}, "temperature", "<= 2"),
    ("temperature-negative", CHAT, {"temperature": -0.1}, "temperature", ">= 0"),
    ("top_p-high", CHAT, {"top_p": 1.5}, "top_p", "<= 1"),
    ("top_p-negative", CHAT, {"top_p": -0.5}, "top_p", ">= 0"),
    ("n-zero", CHAT, {"n": 0}, "n", ">= 1"),
    ("n-over-server-max", CHAT, {"n": MAX_N + 1}, "n", f"allows ({MAX_N})"),
    ("n-over-128", CHAT, {"n": 129}, "n", "<= 128"),
    ("top_logprobs-without-logprobs", CHAT, {"top_logprobs": 2}, "top_logprobs", "needs `logprobs`"),
    ("top_logprobs-with-logprobs-false", CHAT, {"top_logprobs": 2, "logprobs": False}, "top_logprobs", "needs `logprobs`"),
    ("top_logprobs-over-20", CHAT, {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "<= 20"),
    ("stream_options-without-stream", CHAT, {"stream_options": {"include_usage": True}}, "stream_options", "stream"),
    ("stream_options-stream-false", CHAT, {"stream": False, "stream_options": {"include_usage": True}}, "stream_options", "stream"),
    (
        "continue_final-with-generation-prompt",
        CHAT,
        {"messages": [USER, ASSISTANT], "continue_final_message": True, "add_generation_prompt": True},
        "continue_final_message",
        "add_generation_prompt",
    ),
    ("continue_final-last-not-assistant", CHAT, {"continue_final_message": True}, "messages", "assistant"),
    ("tools-empty", CHAT, {"tools": []}, "tools", "empty"),
    (
        "tool_choice-named-not-in-tools",
        CHAT,
        {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "other"}}},
        "tool_choice",
        "'other'",
    ),
    ("tool_choice-required-without-tools", CHAT, {"tool_choice": "required"}, "tool_choice", "needs `tools`"),
    ("tool_choice-auto-without-tools", CHAT, {"tool_choice": "auto"}, "tool_choice", "needs `tools`"),
    ("tool_choice-unknown-string", CHAT, {"tools": [TOOL], "tool_choice": "always"}, "tool_choice", "always"),
    (
        "structured_outputs-with-named-tool_choice",
        CHAT,
        {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "structured_outputs": {"regex": "a+"}},
        "structured_outputs",
        "named `tool_choice`",
    ),
    (
        "tool-message-missing-tool_call_id",
        CHAT,
        {"messages": [USER, {"role": "tool", "content": "sunny"}]},
        "messages[1].tool_call_id",
        "tool_call_id",
    ),
    (
        "tool-message-unknown-tool_call_id",
        CHAT,
        {"messages": [USER, {"role": "assistant", "tool_calls": [CALL]}, {"role": "tool", "tool_call_id": "call_9", "content": "x"}]},
        "messages[2].tool_call_id",
        "call_9",
    ),
    (
        "assistant-without-content-or-tool_calls",
        CHAT,
        {"messages": [USER, {"role": "assistant"}, USER]},
        "messages[1].content",
        "`content` or `tool_calls`",
    ),
    ("unknown-role", CHAT, {"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role", "robot"),
    ("messages-empty", CHAT, {"messages": []}, "messages", "length >= 1"),
    ("messages-not-a-list", CHAT, {"messages": "hi"}, "messages", "array"),
    ("stop-five-strings", CHAT, {"stop": ["a", "b", "c", "d", "e"]}, "stop", "length <= 4"),
    ("stop-empty-string", CHAT, {"stop": ""}, "stop", "empty"),
    ("stop-empty-string-in-list", CHAT, {"stop": ["a", ""]}, "stop", "empty"),
    ("logit_bias-non-integer-key", CHAT, {"logit_bias": {"hello": 5}}, "logit_bias", "token ids"),
    ("logit_bias-negative-key", CHAT, {"logit_bias": {"-3": 5}}, "logit_bias", "token ids"),
    ("logit_bias-value-over-100", CHAT, {"logit_bias": {"42": 101}}, "logit_bias", "<= 100"),
    ("logit_bias-value-under-minus-100", CHAT, {"logit_bias": {"42": -100.5}}, "logit_bias", ">= -100"),
    ("presence_penalty-out-of-range", CHAT, {"presence_penalty": 2.5}, "presence_penalty", "<= 2"),
    ("frequency_penalty-out-of-range", CHAT, {"frequency_penalty": -3}, "frequency_penalty", ">= -2"),
    ("min_tokens-over-max_tokens", CHAT, {"min_tokens": 5, "max_tokens": 2}, "min_tokens", "larger than"),
    (
        "min_tokens-over-max_completion_tokens",
        CHAT,
        {"min_tokens": 5, "max_completion_tokens": 2},
        "min_tokens",
        "larger than",
    ),
    ("max_tokens-zero", CHAT, {"max_tokens": 0}, "max_tokens", "at least 1"),
    ("max_tokens-negative", CHAT, {"max_tokens": -1}, "max_tokens", ">= 0"),
    ("max_completion_tokens-zero", CHAT, {"max_completion_tokens": 0}, "max_completion_tokens", "at least 1"),
    ("response_format-json_schema-without-schema", CHAT, {"response_format": {"type": "json_schema"}}, "response_format.json_schema", "json_schema"),
    ("response_format-unknown-type", CHAT, {"response_format": {"type": "yaml"}}, "response_format.type", "yaml"),
    (
        "structured_outputs-two-kinds",
        CHAT,
        {"structured_outputs": {"regex": "a+", "choice": ["x", "y"]}},
        "structured_outputs",
        "exactly one",
    ),
    ("structured_outputs-no-kind", CHAT, {"structured_outputs": {}}, "structured_outputs", "exactly one"),
    (
        "structured_outputs-with-json-response_format",
        CHAT,
        {"structured_outputs": {"regex": "a+"}, "response_format": {"type": "json_object"}},
        "response_format",
        "not both",
    ),
    (
        "image-content-part",
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}]},
        "messages[0].content[0]",
        "only text",
    ),
    ("unknown-top-level-field", CHAT, {"temprature": 0.5}, "temprature", "Unrecognized request argument supplied: temprature"),
    (
        "unknown-nested-field",
        CHAT,
        {"messages": [{"role": "user", "content": "hi", "colour": "red"}]},
        "messages[0].colour",
        "colour",
    ),
    (
        "unknown-field-in-stream_options",
        CHAT,
        {"stream": True, "stream_options": {"include_usage": True, "usage": True}},
        "stream_options.usage",
        "usage",
    ),
    ("wrong-type", CHAT, {"temperature": "hot"}, "temperature", "got `str`"),
    ("wrong-type-stream", CHAT, {"stream": "yes"}, "stream", "got `str`"),
    ("wrong-type-n-float", CHAT, {"n": 1.5}, "n", "got `float`"),
    ("missing-model", CHAT, {"model": DROP}, "model", "model"),
    ("missing-messages", CHAT, {"messages": DROP}, "messages", "messages"),
    ("deprecated-functions", CHAT, {"functions": [{"name": "f"}]}, "functions", "tools"),
    ("deprecated-function_call", CHAT, {"function_call": "auto"}, "function_call", "tool_choice"),
    ("audio-output", CHAT, {"modalities": ["text", "audio"]}, "modalities", "Audio"),
    ("seed-out-of-int64", CHAT, {"seed": 2**63}, "seed", "seed"),
    ("reasoning_effort-unknown", CHAT, {"reasoning_effort": "extreme"}, "reasoning_effort", "extreme"),
    ("tool-name-invalid", CHAT, {"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name", "matching regex"),
    # what the chosen backend did not declare (echo-1's backend lacks structured_outputs)
    (
        "response_format-json-on-backend-without-structured-outputs",
        CHAT,
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
        "response_format",
        "not supported by backend `echo`",
    ),
    ("structured_outputs-undeclared", CHAT, {"structured_outputs": {"regex": "a+"}}, "structured_outputs", "backend `echo`"),
    ("extension-undeclared", CHAT, {"model": "plain-1", "top_k": 3}, "top_k", "backend `plain`"),
    ("continuous_usage_stats-undeclared", CHAT, {"stream": True, "stream_options": {"continuous_usage_stats": True}}, "continuous_usage_stats", "backend `echo`"),
    # legacy /v1/completions
    ("completions-missing-prompt", COMPLETIONS, {"prompt": DROP}, "prompt", "prompt"),
    ("completions-logprobs-over-5", COMPLETIONS, {"logprobs": 6}, "logprobs", "<= 5"),
    ("completions-suffix", COMPLETIONS, {"suffix": "end"}, "suffix", "not supported"),
    ("completions-best_of", COMPLETIONS, {"best_of": 3}, "best_of", "not supported"),
    ("completions-several-prompts", COMPLETIONS, {"prompt": ["a", "b"]}, "prompt", "one prompt"),
    ("completions-mixed-prompt", COMPLETIONS, {"prompt": [1, "a"]}, "prompt", "mixture"),
    ("completions-empty-prompt-list", COMPLETIONS, {"prompt": []}, "prompt", "length >= 1"),
    ("completions-negative-token", COMPLETIONS, {"prompt": [1, -2]}, "prompt[1]", ">= 0"),
    ("completions-stream_options-without-stream", COMPLETIONS, {"stream_options": {"include_usage": True}}, "stream_options", "stream"),
    ("completions-unknown-field", COMPLETIONS, {"messages": [USER]}, "messages", "Unrecognized"),
    ("completions-temperature", COMPLETIONS, {"temperature": 3}, "temperature", "<= 2"),
]


def _body(endpoint: str, fields: dict[str, Any]) -> dict[str, Any]:
    base: dict[str, Any] = {"model": "echo-1"}
    base.update({"messages": [USER]} if endpoint == CHAT else {"prompt": "hi"})
    for key, value in fields.items():
        if value is DROP:
            base.pop(key)
        else:
            base[key] = value
    return base


@pytest.mark.parametrize("endpoint,fields,param,message", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_rule(http: httpx.Client, endpoint: str, fields: dict[str, Any], param: str, message: str) -> None:
    resp = http.post(endpoint, json=_body(endpoint, fields))
    assert resp.status_code == 400, resp.text
    error = assert_error_shape(resp.json())
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param, error
    assert message in error["message"], error
    assert resp.headers.get("x-request-id")


def test_row_ids_are_unique() -> None:
    ids = [r[0] for r in ROWS]
    assert len(ids) == len(set(ids))


# The counterpart of the table: the valid neighbours of each rule pass, so a rule that rejected
# everything would fail here.
VALID: list[tuple[str, str, dict[str, Any]]] = [
    ("temperature-bounds", CHAT, {"temperature": 0}),
    ("temperature-2", CHAT, {"temperature": 2}),
    ("top_p-bounds", CHAT, {"top_p": 0, "n": MAX_N}),
    ("top_logprobs-zero-alone", CHAT, {"top_logprobs": 0}),
    ("top_logprobs-20", CHAT, {"logprobs": True, "top_logprobs": 20}),
    ("stream_options-with-stream", CHAT, {"stream": True, "stream_options": {"include_usage": True}}),
    ("continue_final", CHAT, {"messages": [USER, ASSISTANT], "continue_final_message": True}),
    (
        "continue_final-generation-prompt-false",
        CHAT,
        {"messages": [USER, ASSISTANT], "continue_final_message": True, "add_generation_prompt": False},
    ),
    ("tool_choice-none-without-tools", CHAT, {"tool_choice": "none"}),
    ("tool-round-trip", CHAT, {"messages": [USER, {"role": "assistant", "tool_calls": [CALL]}, {"role": "tool", "tool_call_id": "call_1", "content": "x"}]}),
    ("assistant-null-content-with-tool_calls", CHAT, {"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]}, USER]}),
    ("developer-message", CHAT, {"messages": [{"role": "developer", "content": "x"}, USER]}),
    ("text-parts", CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}),
    ("stop-four", CHAT, {"stop": ["a", "b", "c", "d"]}),
    ("logit_bias-bounds", CHAT, {"logit_bias": {"0": -100, "7": 100}}),
    ("penalties-bounds", CHAT, {"presence_penalty": -2, "frequency_penalty": 2}),
    ("min_tokens-equal-max", CHAT, {"min_tokens": 2, "max_tokens": 2}),
    ("response_format-text", CHAT, {"response_format": {"type": "text"}}),
    ("null-optional-fields", CHAT, {"temperature": None, "stop": None, "n": None, "tools": None}),
    ("openai-accepted-fields", CHAT, {"user": "u1", "seed": -1, "store": False, "metadata": {"k": "v"}, "parallel_tool_calls": True}),
    ("completions-echo-max-tokens-zero", COMPLETIONS, {"echo": True, "max_tokens": 0}),
    ("completions-best_of-equals-n", COMPLETIONS, {"best_of": 1}),
]


@pytest.mark.parametrize("endpoint,fields", [r[1:] for r in VALID], ids=[r[0] for r in VALID])
def test_valid_neighbour(http: httpx.Client, endpoint: str, fields: dict[str, Any]) -> None:
    resp = http.post(endpoint, json=_body(endpoint, fields))
    assert resp.status_code == 200, resp.text

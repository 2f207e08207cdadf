"""The Anthropic Messages API through a real server and the official `anthropic` client, over the
scripted backend (see `tests.support.script_backend` for what each prompt makes it do)."""

from __future__ import annotations

import re
import threading

import anthropic
import httpx
import pytest

from tests.gateway.script_server import KEY, MAX_BODY_BYTES, Server, wait_idle
from tests.support.probes import wait_until

WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_create_text(claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(model="claude-echo", max_tokens=50, messages=user("hello there world"),
                                     system="Be brief.")
    assert message.type == "message" and message.role == "assistant" and message.model == "claude-echo"
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == "hello there world"
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert message.usage.output_tokens == 3
    # the prompt (4 words with the role marker, 3 of the system) is split into cache reads and the rest
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens == 7
    assert message.id.startswith("msg_")


def test_stream_equals_create(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(model="claude-echo", max_tokens=50, messages=user("one two three four")) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "one two three four" == final.content[0].text
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == 4
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == 5


def test_max_tokens_stop_reason(claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(model="claude-echo", max_tokens=2, messages=user("a b c d"))
    assert message.content[0].text == "a b" and message.stop_reason == "max_tokens"


def test_stop_sequences(claude: anthropic.Anthropic) -> None:
    kwargs = dict(model="claude-echo", max_tokens=50, messages=user("alpha beta END gamma"), stop_sequences=["END", "zz"])
    message = claude.messages.create(**kwargs)
    assert message.content[0].text == "alpha beta"
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "END")
    with claude.messages.stream(**kwargs) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "END")
    assert final.content[0].text == "alpha beta"


def test_thinking_blocks_streamed_and_not(claude: anthropic.Anthropic) -> None:
    kwargs = dict(model="claude-echo", max_tokens=50, messages=user("THINK let me see ANSWER it is four"))
    message = claude.messages.create(**kwargs)
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == "let me see" and message.content[1].text == "it is four"
    thinking: list[str] = []
    with claude.messages.stream(**kwargs) as stream:
        for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "thinking_delta":
                thinking.append(event.delta.thinking)
        final = stream.get_final_message()
    assert "".join(thinking) == message.content[0].thinking == final.content[0].thinking
    assert final.content[1].text == "it is four" and "let" not in final.content[1].text


def test_tool_use_round_trip(claude: anthropic.Anthropic) -> None:
    first = claude.messages.create(model="claude-echo", max_tokens=50, tools=[WEATHER],
                                   messages=user("CALL get_weather Paris"))
    assert first.stop_reason == "tool_use"
    (call,) = first.content
    assert call.type == "tool_use" and call.name == "get_weather" and call.input == {"city": "Paris"}
    second = claude.messages.create(
        model="claude-echo", max_tokens=50, tools=[WEATHER],
        messages=[*user("CALL get_weather Paris"), {"role": "assistant", "content": first.content},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny 21C"}]}],
    )
    assert second.content[0].text == "result: sunny 21C" and second.stop_reason == "end_turn"


def test_tool_use_streamed_with_named_choice(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(model="claude-echo", max_tokens=50, tools=[WEATHER],
                                tool_choice={"type": "tool", "name": "get_weather"},
                                messages=user("CALL get_weather Oslo")) as stream:
        partial = [e.delta.partial_json for e in stream if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
        final = stream.get_final_message()
    assert "".join(partial) == '{"city": "Oslo"}'
    assert final.content[0].input == {"city": "Oslo"} and final.stop_reason == "tool_use"


def test_count_tokens_matches_create(claude: anthropic.Anthropic) -> None:
    kwargs = dict(model="claude-echo", messages=user("how many tokens is this"), system="sys words")
    counted = claude.messages.count_tokens(**kwargs)
    message = claude.messages.create(max_tokens=20, **kwargs)
    assert counted.input_tokens == message.usage.input_tokens + message.usage.cache_read_input_tokens


def _normalized(body: bytes) -> str:
    text = re.sub(r'"id":"msg_[0-9a-f]+"', '"id":"msg_X"', body.decode())
    return re.sub(r'"signature":"[0-9a-f]+"', '"signature":"S"', text)


def test_stream_bytes_exact(server: Server) -> None:
    """Every event, its `event:` line and its JSON, byte for byte (ids and signatures aside)."""
    body = {"model": "claude-echo", "max_tokens": 50, "stream": True, "stop_sequences": ["STOP"],
            "messages": user("THINK hm ANSWER hi you STOP")}
    with httpx.stream("POST", server.base + "/v1/messages", json=body, headers={"x-api-key": KEY}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = response.read()
    expected = (
        'event: message_start\ndata: {"type":"message_start","message":{"type":"message","id":"msg_X","role":"assistant",'
        '"model":"claude-echo","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0}}}\n\n'
        'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}\n\n'
        'event: ping\ndata: {"type":"ping"}\n\n'
        'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hm"}}\n\n'
        'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"S"}}\n\n'
        'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
        'event: content_block_start\ndata: {"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}\n\n'
        'event: content_block_delta\ndata: {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"hi"}}\n\n'
        'event: content_block_delta\ndata: {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":" you"}}\n\n'
        'event: content_block_stop\ndata: {"type":"content_block_stop","index":1}\n\n'
        'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"stop_sequence","stop_sequence":"STOP"},'
        '"usage":{"input_tokens":4,"output_tokens":3,"cache_read_input_tokens":3}}\n\n'
        'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    )
    assert _normalized(raw) == expected


def test_stream_of_tool_call_bytes_exact(server: Server) -> None:
    body = {"model": "claude-echo", "max_tokens": 50, "stream": True, "tools": [WEATHER],
            "messages": user("CALL get_weather Rome")}
    raw = httpx.post(server.base + "/v1/messages", json=body, headers={"x-api-key": KEY}).content
    assert _normalized(raw) == (
        'event: message_start\ndata: {"type":"message_start","message":{"type":"message","id":"msg_X","role":"assistant",'
        '"model":"claude-echo","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0}}}\n\n'
        'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"call_rome","name":"get_weather","input":{}}}\n\n'
        'event: ping\ndata: {"type":"ping"}\n\n'
        'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\\"city\\": "}}\n\n'
        'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"\\"Rome\\"}"}}\n\n'
        'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
        'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},'
        '"usage":{"input_tokens":2,"output_tokens":2,"cache_read_input_tokens":2}}\n\n'
        'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    )


def test_error_mid_stream_is_an_error_event(server: Server, claude: anthropic.Anthropic) -> None:
    body = {"model": "claude-echo", "max_tokens": 50, "stream": True, "messages": user("a b c FAILMID:2")}
    raw = httpx.post(server.base + "/v1/messages", json=body, headers={"x-api-key": KEY}).content.decode()
    assert raw.endswith('event: error\ndata: {"type":"error","error":{"type":"api_error",'
                        '"message":"The upstream connection broke mid-stream."}}\n\n')
    assert "message_stop" not in raw
    with pytest.raises(anthropic.APIStatusError, match="broke mid-stream"):
        with claude.messages.stream(model="claude-echo", max_tokens=50, messages=user("a b c FAILMID:2")) as stream:
            stream.until_done()


# -- errors in Anthropic's shape, and the client's exception classes ------------------------------


def _error_body(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"type", "error"} and body["type"] == "error"
    assert set(body["error"]) == {"type", "message"}
    return body["error"]


def test_400_bad_request(claude: anthropic.Anthropic, server: Server) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.create(model="claude-echo", max_tokens=10, messages=user("x"), extra_body={"temperature": 1.5})
    assert info.value.body["error"]["type"] == "invalid_request_error"
    assert "temperature" in info.value.body["error"]["message"]
    missing = httpx.post(server.base + "/v1/messages", json={"model": "claude-echo", "messages": user("x")},
                         headers={"x-api-key": KEY})
    assert missing.status_code == 400 and "max_tokens" in _error_body(missing)["message"]
    unknown = httpx.post(server.base + "/v1/messages", headers={"x-api-key": KEY},
                         json={"model": "claude-echo", "max_tokens": 5, "messages": user("x"), "temprature": 1})
    assert unknown.status_code == 400 and "temprature" in _error_body(unknown)["message"]


def test_400_for_what_the_backend_cannot_do(claude: anthropic.Anthropic) -> None:
    """Thinking switched on or off by name needs a backend that can switch it; `adaptive`
    (Claude Code's) asks for it where it can and is served everywhere."""
    for thinking in ({"type": "enabled", "budget_tokens": 1024}, {"type": "disabled"}):
        with pytest.raises(anthropic.BadRequestError, match="chat_template_kwargs"):
            claude.messages.create(model="claude-plain", max_tokens=2000, messages=user("x"), thinking=thinking)
    adaptive = claude.messages.create(model="claude-plain", max_tokens=10, messages=user("ok"),
                                      thinking={"type": "adaptive"})
    assert adaptive.content[0].text == "ok"
    with pytest.raises(anthropic.BadRequestError, match="budget_tokens"):
        claude.messages.create(model="claude-echo", max_tokens=1024, messages=user("x"),
                               thinking={"type": "enabled", "budget_tokens": 1024})
    with pytest.raises(anthropic.BadRequestError, match="image"):
        claude.messages.create(model="claude-echo", max_tokens=10, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
    with pytest.raises(anthropic.BadRequestError, match="not in `tools`"):
        claude.messages.create(model="claude-echo", max_tokens=10, messages=user("x"), tools=[WEATHER],
                               tool_choice={"type": "tool", "name": "nope"})


def test_401_without_a_good_key(server: Server) -> None:
    with anthropic.Anthropic(base_url=server.base, api_key="wrong", max_retries=0) as bad:
        with pytest.raises(anthropic.AuthenticationError) as info:
            bad.messages.create(model="claude-echo", max_tokens=5, messages=user("x"))
    assert info.value.body["error"]["type"] == "authentication_error"
    assert _error_body(httpx.post(server.base + "/v1/messages/count_tokens", json={}))["type"] == "authentication_error"


def test_bearer_token_accepted_too(server: Server) -> None:
    with anthropic.Anthropic(base_url=server.base, auth_token=KEY, max_retries=0) as bearer:
        assert bearer.messages.create(model="claude-echo", max_tokens=5, messages=user("ok")).content[0].text == "ok"


def test_404_unknown_model(claude: anthropic.Anthropic, server: Server) -> None:
    with pytest.raises(anthropic.NotFoundError) as info:
        claude.messages.create(model="claude-nope", max_tokens=5, messages=user("x"))
    assert info.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.count_tokens(model="claude-nope", messages=user("x"))


def test_413_body_too_large(server: Server) -> None:
    response = httpx.post(server.base + "/v1/messages", headers={"x-api-key": KEY},
                          json={"model": "claude-echo", "max_tokens": 5, "messages": user("x" * MAX_BODY_BYTES)})
    assert response.status_code == 413 and _error_body(response)["type"] == "request_too_large"


def test_429_when_the_backend_is_full(claude: anthropic.Anthropic, server: Server) -> None:
    """`slow` runs one request at a time with no queue: a second one at once is refused."""
    wait_idle(server)
    with claude.messages.stream(model="claude-slow", max_tokens=50, messages=user("w " * 40)) as first:
        next(iter(first))  # the first request is running
        with pytest.raises(anthropic.RateLimitError) as info:
            claude.messages.create(model="claude-slow", max_tokens=5, messages=user("x"))
    assert info.value.body["error"]["type"] == "rate_limit_error"
    assert info.value.response.headers["retry-after"] == "1"


def test_disconnect_cancels_the_backend(server: Server) -> None:
    request_id = "messages-disconnect-1"
    body = {"model": "claude-slow", "max_tokens": 100, "stream": True, "messages": user("w " * 100)}
    wait_idle(server)
    with httpx.stream("POST", server.base + "/v1/messages", json=body,
                      headers={"x-api-key": KEY, "x-request-id": request_id}) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("event: content_block_delta"):
                break
    assert wait_until(lambda: server.cancel_log.exists() and request_id in server.cancel_log.read_text(), timeout=10)


def test_metadata_user_id_is_a_sticky_key(claude: anthropic.Anthropic) -> None:
    """Route `claude-sticky` keys on `user`: each user lands on one backend, every time."""
    for user_id in ("alice", "bob", "carol", "dave"):
        backends = set()
        for _ in range(4):
            response = claude.messages.with_raw_response.create(model="claude-sticky", max_tokens=5, messages=user("x"),
                                                                metadata={"user_id": user_id})
            backends.add(response.headers["x-switchyard-backend"])
        assert len(backends) == 1, user_id


def test_anthropic_version_header_accepted(server: Server) -> None:
    for headers in ({"x-api-key": KEY}, {"x-api-key": KEY, "anthropic-version": "2023-06-01"}):
        response = httpx.post(server.base + "/v1/messages", headers=headers,
                              json={"model": "claude-echo", "max_tokens": 5, "messages": user("ok")})
        assert response.status_code == 200, response.text


def test_concurrent_streams_stay_apart(claude: anthropic.Anthropic) -> None:
    results: dict[int, str] = {}

    def run(i: int) -> None:
        with claude.messages.stream(model="claude-echo", max_tokens=50, messages=user(f"n{i} m{i} o{i}")) as stream:
            results[i] = "".join(stream.text_stream)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: f"n{i} m{i} o{i}" for i in range(8)}

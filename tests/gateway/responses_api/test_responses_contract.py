"""The Responses API through a real gateway process (the deterministic echo backend behind it),
driven by the official `openai` client and by raw HTTP where the bytes matter."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.probes import wait_until
from tests.support.server import echo_config, running_server

EXPECTED_TEXT_EVENTS = [
    "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
    "response.output_text.delta", "response.output_text.delta", "response.output_text.delta",
    "response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed",
]


def _config(store_dir: Path, **options: object) -> str:
    return f'[responses]\nsqlite_path = "{store_dir}/responses.sqlite3"\n\n' + echo_config(**options)


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("store")


@pytest.fixture(scope="module")
def base(store_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_server("[server]\nmax_tokens = 64\n\n" + _config(store_dir), tmp_path_factory.mktemp("plain")) as url:
        yield url


@pytest.fixture(scope="module")
def client(base: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def sse(base: str, body: dict) -> list[tuple[str, dict]]:
    """(event name, data) of each event of a streamed response, checked against its framing."""
    with httpx.stream("POST", base + "/v1/responses", json={**body, "stream": True}, timeout=60) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = response.read().decode()
    events = []
    for block in raw.split("\n\n")[:-1]:
        name_line, data_line = block.split("\n")
        assert name_line.startswith("event: ") and data_line.startswith("data: ")
        data = json.loads(data_line[len("data: "):])
        assert data["type"] == name_line[len("event: "):]
        events.append((data["type"], data))
    assert raw.endswith("\n\n") and "[DONE]" not in raw
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    return events


def test_create_text(client: openai.OpenAI) -> None:
    response = client.responses.create(model="echo-1", input="hello big world", instructions="Be brief.")
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status == "completed" and response.error is None and response.incomplete_details is None
    assert response.output_text == "hello big world"
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant" and message.status == "completed"
    assert message.id.startswith("msg_") and message.content[0].type == "output_text"
    usage = response.usage
    assert usage.output_tokens == 3 and usage.input_tokens == 7  # <system> Be brief. <user> hello big world
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens == 3 and usage.output_tokens_details.reasoning_tokens == 0
    assert response.instructions == "Be brief." and response.model == "echo-1" and response.store is True


def test_stream_events_in_openai_order(base: str) -> None:
    events = sse(base, {"model": "echo-1", "input": "one two three"})
    assert [name for name, _ in events] == EXPECTED_TEXT_EVENTS
    created, in_progress = events[0][1]["response"], events[1][1]["response"]
    assert created["status"] == in_progress["status"] == "in_progress" and created["output"] == []
    added = events[2][1]
    assert added["output_index"] == 0 and added["item"]["status"] == "in_progress" and added["item"]["content"] == []
    item_id = added["item"]["id"]
    assert all(d["item_id"] == item_id for _, d in events[3:9])
    assert "".join(d["delta"] for name, d in events if name.endswith(".delta")) == "one two three"
    assert events[7][1]["text"] == events[8][1]["part"]["text"] == "one two three"
    done = events[9][1]["item"]
    assert done["status"] == "completed" and done["content"][0]["text"] == "one two three"
    final = events[-1][1]["response"]
    assert final["id"] == created["id"] and final["status"] == "completed" and final["output"] == [done]
    assert final["usage"]["output_tokens"] == 3


def test_sdk_stream_equals_the_plain_answer(client: openai.OpenAI) -> None:
    with client.responses.stream(model="echo-1", input="a streamed answer") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == "a streamed answer"
    plain = client.responses.create(model="echo-1", input="a streamed answer")
    assert plain.output_text == final.output_text and plain.usage.output_tokens == final.usage.output_tokens


def test_previous_response_id_continues_the_conversation(client: openai.OpenAI) -> None:
    first = client.responses.create(model="echo-1", input="first turn", instructions="Be brief.")
    second = client.responses.create(model="echo-1", input="second turn", previous_response_id=first.id)
    assert second.previous_response_id == first.id and second.output_text == "second turn"
    # <user> first turn <assistant> first turn <user> second turn: instructions do not carry over
    assert second.usage.input_tokens == 9
    stored = client.responses.retrieve(first.id)
    assert stored.output_text == "first turn" and stored.status == "completed"


def test_restart_keeps_stored_responses(store_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    with running_server(_config(store_dir), tmp_path / "a") as url:
        with openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as c:
            first_id = c.responses.create(model="echo-1", input="remember this").id
    (tmp_path / "b").mkdir()
    with running_server(_config(store_dir), tmp_path / "b") as url:
        with openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as c:
            follow = c.responses.create(model="echo-1", input="and this", previous_response_id=first_id)
            assert follow.usage.input_tokens == 9  # <user> remember this <assistant> remember this <user> and this
            assert c.responses.retrieve(first_id).output_text == "remember this"


def test_store_false_and_delete(client: openai.OpenAI) -> None:
    unstored = client.responses.create(model="echo-1", input="forget me", store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model="echo-1", input="x", previous_response_id=unstored.id)
    assert info.value.body["param"] == "previous_response_id"
    kept = client.responses.create(model="echo-1", input="delete me")
    client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(kept.id)


def test_max_output_tokens_makes_it_incomplete(client: openai.OpenAI, base: str) -> None:
    response = client.responses.create(model="echo-1", input="one two three four", max_output_tokens=2)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == "one two" and response.output[0].status == "incomplete"
    events = sse(base, {"model": "echo-1", "input": "one two three four", "max_output_tokens": 2})
    assert events[-1][0] == "response.incomplete" and events[-2][1]["item"]["status"] == "incomplete"
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="echo-1", input="x", max_output_tokens=65)  # over [server] max_tokens
    assert info.value.body["param"] == "max_output_tokens"


def test_failure_mid_stream_ends_with_response_failed(base: str) -> None:
    events = sse(base, {"model": "echo-1", "input": "a b c FAILMID:2"})
    names = [name for name, _ in events]
    assert names[-1] == "response.failed" and names.count("response.output_text.delta") == 2
    failed = events[-1][1]["response"]
    assert failed["status"] == "failed" and failed["error"]["message"]
    assert events[-2][1]["item"]["status"] == "incomplete"  # the open message was closed first


def test_errors_in_openai_shape(client: openai.OpenAI, base: str) -> None:
    with pytest.raises(openai.RateLimitError):
        client.responses.create(model="echo-1", input="FAIL:overloaded")
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="no-such-model", input="x")
    cases = [
        ({"model": "echo-1", "input": "x", "temprature": 1}, "temprature"),
        ({"model": "echo-1", "input": [{"type": "image_generation_call"}]}, "input[0].type"),
        ({"model": "echo-1", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
         "input[0].content[0]"),
        ({"model": "echo-1", "input": [{"type": "function_call_output", "call_id": "call_1", "output": "4"}]}, "input[0].call_id"),
        ({"model": "echo-1", "input": "x", "tools": [{"type": "telepathy"}]}, "tools[0].type"),
        ({"model": "echo-1", "input": "x", "tools": [{"type": "function", "name": "f"}]}, "tools"),
        ({"model": "echo-1", "input": "x", "text": {"format": {"type": "json_object"}}}, "response_format"),
        ({"model": "echo-1", "input": "x", "background": True}, "background"),
        ({"model": "echo-1", "input": "x", "temperature": 3}, "temperature"),
    ]
    for body, param in cases:
        response = httpx.post(base + "/v1/responses", json=body, timeout=30)
        assert response.status_code == 400, (body, response.text)
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == param, (body, error)


def test_reasoning_on_chat_and_responses(store_dir: Path, tmp_path: Path) -> None:
    words = "<think> the user wants two words </think> red green"
    with running_server(_config(store_dir, reasoning_parser="deepseek_r1"), tmp_path) as url:
        with openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as c:
            chat = c.chat.completions.create(model="echo-1", messages=[{"role": "user", "content": words}])
            message = chat.choices[0].message
            assert message.content == " red green" and "<think>" not in message.content
            reasoning = message.model_extra["reasoning_content"]
            assert reasoning == message.model_extra["reasoning"] == " the user wants two words "
            assert chat.usage.completion_tokens_details.reasoning_tokens == 7  # <think> ... </think>
            chunks = list(c.chat.completions.create(model="echo-1", messages=[{"role": "user", "content": words}], stream=True,
                                                    stream_options={"include_usage": True}))
            deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
            assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == reasoning
            assert "".join(d.content or "" for d in deltas) == message.content
            assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == 7

            response = c.responses.create(model="echo-1", input=words)
            kinds = [item.type for item in response.output]
            assert kinds == ["reasoning", "message"] and response.output_text == " red green"
            assert response.output[0].content[0].text == reasoning
            assert response.usage.output_tokens_details.reasoning_tokens == 7
            events = sse(url, {"model": "echo-1", "input": words})
            names = [n for n, _ in events]
            assert names[2:6] == ["response.output_item.added", "response.content_part.added",
                                  "response.reasoning_text.delta", "response.reasoning_text.delta"]
            assert names.index("response.reasoning_text.done") < names.index("response.output_text.delta")
            assert "".join(d["delta"] for n, d in events if n == "response.reasoning_text.delta") == reasoning
            final = events[-1][1]["response"]["output"]
            assert [i["type"] for i in final] == kinds and final[0]["content"][0]["text"] == reasoning
            off = c.chat.completions.create(model="echo-1", messages=[{"role": "user", "content": words}],
                                            extra_body={"chat_template_kwargs": {"enable_thinking": False}})
            assert off.choices[0].message.content == words and "reasoning_content" not in (off.choices[0].message.model_extra or {})


def test_client_disconnect_cancels_the_backend(store_dir: Path, tmp_path: Path) -> None:
    cancel_log = tmp_path / "cancelled.txt"
    cancel_log.touch()
    with running_server(_config(store_dir, token_delay_s=0.2, cancel_log=str(cancel_log)), tmp_path) as url:
        request_id = f"resp-disconnect-{uuid.uuid4().hex[:8]}"
        with httpx.stream("POST", url + "/v1/responses", headers={"x-request-id": request_id}, timeout=30,
                          json={"model": "echo-1", "input": " ".join(["word"] * 200), "stream": True}) as response:
            for line in response.iter_lines():
                if "response.output_text.delta" in line:
                    break
        assert wait_until(lambda: request_id in cancel_log.read_text(), timeout=20)

        # the cancel endpoint ends a response in flight; its stream ends with status "cancelled"
        events: list[dict] = []
        started = threading.Event()

        def consume() -> None:
            with httpx.stream("POST", url + "/v1/responses", timeout=60,
                              json={"model": "echo-1", "input": " ".join(["word"] * 200), "stream": True}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(json.loads(line[6:]))
                        if events[-1]["type"] == "response.output_text.delta":
                            started.set()

        reader = threading.Thread(target=consume)
        reader.start()
        assert started.wait(30)
        response_id = events[0]["response"]["id"]
        cancelled = httpx.post(f"{url}/v1/responses/{response_id}/cancel", timeout=30)
        reader.join(30)
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        assert events[-1]["type"] == "response.failed" and events[-1]["response"]["status"] == "cancelled"
        stored = httpx.get(f"{url}/v1/responses/{response_id}", timeout=30).json()
        assert stored["status"] == "cancelled" and 0 < len(stored["output"][0]["content"][0]["text"])
        again = httpx.post(f"{url}/v1/responses/{response_id}/cancel", timeout=30)
        assert again.status_code == 400 and again.json()["error"]["type"] == "invalid_request_error"

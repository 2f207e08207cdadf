"""The Anthropic Messages API with the official `anthropic` client on the built-in engine and,
through the proxies (which speak chat completions upstream), on real vLLM and llama.cpp: the
default model, greedy, so each engine's answers can be compared with themselves."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import jsonschema
import pytest

from engines.launch import ServerProcess
from tests.e2e.real_engines.conftest import CONTEXT, MODEL
from tests.support.server import running_server

GREEDY = {"temperature": 0}
ASK = [{"role": "user", "content": "Name three colours of the rainbow and say one thing about each."}]
WEATHER = {"name": "get_weather", "description": "Get the current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                            "required": ["city"]}}
ASK_TOOL = [{"role": "user", "content": "What is the weather in Paris? Use the get_weather tool."}]
# tools on the built-in engine, and on a llama-server of this module's own started with --jinja
# (the session's runs without; its vLLM has no --tool-call-parser, which vLLM 0.32 needs even for
# a named tool choice)
TOOL_ENGINES = ("builtin", "llamacpp-jinja")
# the default model's ChatML with a generation prompt that opens the thinking: what it writes is
# reasoning until it closes the tag (the built-in engine's `auto` reasoning parser)
THINK_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)


def _config(servers: dict[str, ServerProcess]) -> str:
    lines = ["[plugins]", 'modules = ["plugins.proxy.vllm", "plugins.proxy.llamacpp"]', "",
             "[[backends]]", 'name = "builtin"', 'type = "builtin"', "[backends.options]", f'model = "{MODEL}"',
             'served_model_name = "claude-builtin"', f"max_model_len = {CONTEXT}", "num_threads = 1", "",
             "[[backends]]", 'name = "thinker"', 'type = "builtin"', "[backends.options]", f'model = "{MODEL}"',
             'served_model_name = "claude-thinker"', f"max_model_len = {CONTEXT}", "num_threads = 1",
             f"chat_template = {json.dumps(THINK_TEMPLATE)}", ""]
    for name, server in servers.items():
        lines += ["[[backends]]", f'name = "{name}"', f'type = "{name.split("-")[0]}"', "[backends.options]",
                  f'base_url = "{server.base_url}"', f'models = {{ "claude-{name}" = "{MODEL}" }}',
                  f"tools = {'true' if name in TOOL_ENGINES else 'false'}", ""]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def claude(engine_servers: dict[str, ServerProcess], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from engines.launch import start_llamacpp

    servers = dict(engine_servers)
    logs = tmp_path_factory.mktemp("messages-gateway")
    jinja = None
    if "llamacpp" in engine_servers:
        jinja = servers["llamacpp-jinja"] = start_llamacpp(alias=MODEL, ctx_size=CONTEXT, parallel=1, threads=1,
                                                           log_dir=logs, extra=["--jinja"])
    try:
        with running_server(_config(servers), logs, ready_timeout=300) as base:
            with anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0, timeout=180) as client:
                client.served = ["builtin", *servers]  # type: ignore[attr-defined]
                yield client
    finally:
        if jinja is not None:
            jinja.stop()


@pytest.fixture(params=["builtin", "llamacpp", "vllm"])
def model(request: pytest.FixtureRequest, claude: Any) -> str:
    if request.param not in claude.served:
        pytest.skip(f"{request.param} is not installed; run `python -m engines.install {request.param}`")
    return f"claude-{request.param}"


def create(claude: anthropic.Anthropic, model: str, **kwargs: Any) -> anthropic.types.Message:
    return claude.messages.create(model=model, extra_body=GREEDY, **{"max_tokens": 60, "messages": ASK, **kwargs})


def test_text_streamed_and_not(claude: anthropic.Anthropic, model: str) -> None:
    message = create(claude, model, system="You are brief.")
    assert [b.type for b in message.content] == ["text"] and message.content[0].text.strip()
    assert message.stop_reason in ("end_turn", "max_tokens")
    with claude.messages.stream(model=model, max_tokens=60, messages=ASK, system="You are brief.", extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == message.content[0].text == final.content[0].text
    assert final.stop_reason == message.stop_reason
    assert final.usage.output_tokens == message.usage.output_tokens > 0


def test_count_tokens_is_the_prompt(claude: anthropic.Anthropic, model: str) -> None:
    counted = claude.messages.count_tokens(model=model, messages=ASK, system="You are brief.")
    message = create(claude, model, system="You are brief.", max_tokens=5)
    assert counted.input_tokens == message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)


def test_stop_sequences(claude: anthropic.Anthropic, model: str) -> None:
    """A word of the greedy answer as a stop sequence: the answer ends right before it."""
    full = create(claude, model).content[0].text
    word = next(w.strip(".,:;!*") for w in full.split()[3:] if len(w.strip(".,:;!*")) >= 4)
    for stream in (False, True):
        if stream:
            with claude.messages.stream(model=model, max_tokens=60, messages=ASK, stop_sequences=[word, "zzzz"],
                                        extra_body=GREEDY) as s:
                message = s.get_final_message()
        else:
            message = create(claude, model, stop_sequences=[word, "zzzz"])
        assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", word), (message, full)
        assert message.content[0].text == full[: full.index(word)]


@pytest.mark.parametrize("engine", TOOL_ENGINES)
def test_tool_use_round_trip(claude: Any, engine: str) -> None:
    if engine not in claude.served:
        pytest.skip(f"{engine} is not installed")
    model = f"claude-{engine}"
    first = create(claude, model, messages=ASK_TOOL, tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"})
    assert first.stop_reason == "tool_use"
    (call,) = [b for b in first.content if b.type == "tool_use"]
    assert call.name == "get_weather"
    jsonschema.validate(call.input, WEATHER["input_schema"])
    with claude.messages.stream(model=model, max_tokens=60, messages=ASK_TOOL, tools=[WEATHER], extra_body=GREEDY,
                                tool_choice={"type": "tool", "name": "get_weather"}) as stream:
        streamed = stream.get_final_message()
    assert [(b.name, b.input) for b in streamed.content if b.type == "tool_use"] == [(call.name, call.input)]
    second = create(claude, model, tools=[WEATHER], messages=[
        *ASK_TOOL, {"role": "assistant", "content": first.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 21 degrees."}]},
    ])
    assert second.content[0].type == "text" and second.content[0].text.strip()
    assert second.stop_reason in ("end_turn", "max_tokens")


def test_errors(claude: anthropic.Anthropic, model: str) -> None:
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model=model + "-nope", max_tokens=5, messages=ASK)
    with pytest.raises(anthropic.BadRequestError, match="temperature"):
        claude.messages.create(model=model, max_tokens=5, messages=ASK, extra_body={"temperature": 1.5})
    if model != "claude-llamacpp":  # llama-server caps max_tokens to its context instead of refusing
        with pytest.raises(anthropic.BadRequestError, match="context|max_model_len"):
            claude.messages.create(model=model, max_tokens=10**6, messages=ASK)


def test_thinking_blocks_from_a_thinking_template(claude: anthropic.Anthropic) -> None:
    """The template opens `<think>`: the model's thinking comes as a thinking block, streamed as
    `thinking_delta`s that join to the non-streamed block; no tag reaches any block."""
    kwargs = dict(model="claude-thinker", max_tokens=40, messages=[{"role": "user", "content": "Name a color."}],
                  extra_body=GREEDY)
    message = claude.messages.create(**kwargs)
    assert message.content[0].type == "thinking" and message.content[0].thinking.strip()
    with claude.messages.stream(**kwargs) as stream:
        deltas = [e.delta.thinking for e in stream if e.type == "content_block_delta" and e.delta.type == "thinking_delta"]
        final = stream.get_final_message()
    assert "".join(deltas) == message.content[0].thinking == final.content[0].thinking
    for block in [*message.content, *final.content]:
        assert "think>" not in (getattr(block, "thinking", None) or getattr(block, "text", ""))
    assert [b.type for b in final.content] == [b.type for b in message.content]

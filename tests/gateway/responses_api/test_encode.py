"""Backend events → Responses items and stream events (gateway/responses_api/encode.py and the
stream writer of respond.py): calls named back by the request's tools, custom tool calls,
sealed reasoning, and a failure after the stream began."""

from __future__ import annotations

import asyncio

import msgspec

from gateway.errors import error_payload
from gateway.responses_api import response_schemas as O
from gateway.responses_api import schemas as R
from gateway.responses_api.encode import OutputBuilder
from gateway.responses_api.reasoning_seal import ReasoningSeal
from gateway.responses_api.respond import ResponsesState, Turn, _StreamWriter
from gateway.responses_api.tools import chat_tools
from plugins.contract.errors import ContextLengthExceeded
from plugins.contract.protocol import Finish, ReasoningDelta, TextDelta, ToolCallDelta

TOOLS = chat_tools([("tools", msgspec.convert([
    {"type": "function", "name": "get_weather"},
    {"type": "namespace", "name": "functions", "description": "", "tools": [
        {"type": "custom", "name": "exec"}, {"type": "function", "name": "wait"}]},
], list[R.Tool]))], "drop")
SEAL = ReasoningSeal(b"s" * 32)


def build(*events: object, seal: ReasoningSeal | None = None) -> OutputBuilder:
    builder = OutputBuilder(stream=True, tools=TOOLS, seal=seal)
    for event in events:
        builder.feed(event)
    return builder


def test_calls_are_named_back() -> None:
    builder = build(
        ToolCallDelta(tool_index=0, id="c1", name="functions__exec", arguments='{"input": "text('),
        ToolCallDelta(tool_index=0, arguments='1)"}'),
        ToolCallDelta(tool_index=1, id="c2", name="functions__wait", arguments='{"cell_id": 1}'),
        ToolCallDelta(tool_index=2, id="c3", name="get_weather", arguments="{}"),
        Finish(reason="tool_calls"),
    )
    custom, waited, plain = builder.items
    assert isinstance(custom, O.OutputCustomToolCall)
    assert (custom.name, custom.namespace, custom.input, custom.call_id, custom.status) == (
        "exec", "functions", "text(1)", "c1", "completed")
    assert isinstance(waited, O.OutputFunctionCall) and (waited.name, waited.namespace) == ("wait", "functions")
    assert (plain.name, plain.namespace) == ("get_weather", None)
    names = [e.__struct_config__.tag for e in builder.take_events()]
    assert names[:4] == ["response.output_item.added", "response.custom_tool_call_input.delta",
                         "response.custom_tool_call_input.done", "response.output_item.done"]
    assert names.count("response.function_call_arguments.delta") == 2
    wire = msgspec.to_builtins(custom)
    assert wire == {"type": "custom_tool_call", "id": custom.id, "call_id": "c1", "name": "exec", "input": "text(1)",
                    "status": "completed", "namespace": "functions"}
    # a stored conversation keeps the chat names, so a follow-up's outputs find their calls
    (message,) = builder.chat_messages()
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["functions__exec", "functions__wait", "get_weather"]
    assert message["tool_calls"][0]["function"]["arguments"] == '{"input": "text(1)"}'


def test_reasoning_is_sealed_when_asked() -> None:
    thought = [ReasoningDelta(text="think "), ReasoningDelta(text="hard"), TextDelta(text="Blue."), Finish(reason="stop")]
    sealed, plain = build(*thought, seal=SEAL).items[0], build(*thought).items[0]
    assert isinstance(sealed, O.OutputReasoning) and sealed.content[0].text == "think hard"
    assert SEAL.unseal(sealed.encrypted_content) == "think hard"
    assert plain.encrypted_content is None and msgspec.to_builtins(plain)["encrypted_content"] is None


def test_a_context_overflow_after_the_stream_began_is_response_failed_with_its_code(tmp_path: object) -> None:
    frame = O.Response(id="resp_1", created_at=0, status="in_progress", model="m")
    writer = _StreamWriter(ResponsesState(store=None), Turn(frame=frame, conversation=[], store=False, tools=TOOLS))

    async def run() -> bytes:
        writer.start([])
        writer.feed([TextDelta(text="partial")])
        error = ContextLengthExceeded("This model's maximum context length is 8192 tokens.", param="input")
        return await writer.error(error, error_payload(error)[1])

    tail = asyncio.run(run()).decode().strip().split("\n\n")[-1]
    event, data = tail.split("\n")
    assert event == "event: response.failed"
    failed = msgspec.json.decode(data.removeprefix("data: "))
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"]["code"] == "context_length_exceeded"
    assert failed["response"]["output"][0]["status"] == "incomplete"

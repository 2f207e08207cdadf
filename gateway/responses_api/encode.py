"""Backend events → Responses output items, and the typed stream events that build them.

One state machine for both answers: `OutputBuilder` turns `ReasoningDelta` / `TextDelta` /
`ToolCallDelta` / `Finish` into `reasoning`, `message`, `function_call` and `custom_tool_call`
items in the order they came, and (when streaming) the events OpenAI sends for each, in
OpenAI's order:

    output_item.added, content_part.added, (output_text|reasoning_text).delta ...,
    (output_text|reasoning_text).done, content_part.done, output_item.done
    output_item.added (function_call), function_call_arguments.delta ..., .done, output_item.done
    output_item.added (custom_tool_call), custom_tool_call_input.delta, .done, output_item.done

A call's chat name is mapped back by the request's `tools.ChatTools` (a namespace's tool, a
custom tool); a custom tool's input comes out of the JSON arguments whole, so it is one delta.
Reasoning items carry their text sealed in `encrypted_content` when the request `include`s it.

A non-streaming request runs the same builder and keeps only the items, so both answers agree.
"""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.ids import token_hex
from gateway.responses_api import response_schemas as R
from gateway.responses_api.reasoning_seal import ReasoningSeal
from gateway.responses_api.tools import ChatTools, custom_arguments, custom_input, flat_name
from plugins.contract.errors import UpstreamError
from plugins.contract.protocol import Event, Finish, ReasoningDelta, TextDelta, ToolCallDelta, Usage


def new_id(prefix: str) -> str:
    return f"{prefix}_{token_hex(16)}"


class OutputBuilder:
    """Items and (with `stream`) stream events for one response. Events carry
    `sequence_number` 0 here; the writer numbers them as it sends them."""

    def __init__(self, *, stream: bool, tools: ChatTools | None = None, seal: ReasoningSeal | None = None) -> None:
        self.stream = stream
        self.tools = tools if tools is not None else ChatTools()
        self.seal = seal  # None: no `encrypted_content`
        self.items: list[R.OutputItem] = []
        self.events: list[R._Event] = []
        self.finish_reason: str | None = None
        self._open: R.OutputItem | None = None
        self._text: list[str] = []  # of the open message or reasoning item
        self._tool_index: int | None = None  # of the open function_call item

    # -- events in --------------------------------------------------------------------------

    def feed(self, event: Event) -> None:
        if isinstance(event, Usage):
            return
        if event.index != 0:
            raise UpstreamError(f"The backend sent choice {event.index}; a response has one.", kind="bad_gateway")
        if isinstance(event, ReasoningDelta):
            if event.text:
                self._append(R.OutputReasoning, event.text)
        elif isinstance(event, TextDelta):
            if event.text:
                self._append(R.OutputMessage, event.text)
        elif isinstance(event, ToolCallDelta):
            self._call(event)
        elif isinstance(event, Finish):
            if self.finish_reason is not None:
                raise UpstreamError("The backend finished the response twice.", kind="bad_gateway")
            self.finish_reason = event.reason
            self._close("incomplete" if event.reason == "length" else "completed")

    def check_complete(self, backend: str) -> None:
        if self.finish_reason is None:
            raise UpstreamError(f"`{backend}` ended without finishing the response.", kind="bad_gateway")

    @property
    def incomplete(self) -> bool:
        return self.finish_reason == "length"

    def close(self) -> None:
        """End an item left open (the response failed or was cancelled part-way)."""
        self._close("incomplete")

    # -- items ----------------------------------------------------------------------------------

    def _append(self, kind: type[R.OutputMessage] | type[R.OutputReasoning], text: str) -> None:
        item = self._open
        if not isinstance(item, kind):
            self._close("completed")
            item = self._start(kind)
        self._text.append(text)
        index = len(self.items) - 1
        if isinstance(item, R.OutputMessage):
            self._emit(R.OutputTextDelta(sequence_number=0, item_id=item.id, output_index=index, content_index=0, delta=text))
        else:
            self._emit(R.ReasoningTextDelta(sequence_number=0, item_id=item.id, output_index=index, content_index=0, delta=text))

    def _start(self, kind: type[R.OutputMessage] | type[R.OutputReasoning]) -> R.OutputItem:
        item = kind(id=new_id("msg" if kind is R.OutputMessage else "rs"), status="in_progress")
        self._open_item(item)
        empty = R.OutputText(text="") if kind is R.OutputMessage else R.ReasoningText(text="")
        self._emit(R.ContentPartAdded(sequence_number=0, item_id=item.id, output_index=len(self.items) - 1,
                                      content_index=0, part=empty))
        return item

    def _call(self, delta: ToolCallDelta) -> None:
        item = self._open
        if not isinstance(item, (R.OutputFunctionCall, R.OutputCustomToolCall)) or delta.tool_index != self._tool_index:
            self._close("completed")
            item = self._new_call(delta.id or new_id("call"), delta.name or "")
            self._tool_index = delta.tool_index
            self._open_item(item)
        elif delta.name and not item.name:
            ref = self.tools.ref(delta.name)
            if ref.custom != isinstance(item, R.OutputCustomToolCall):  # rare: the name came after the call began
                item = self.items[-1] = self._open = self._new_call(item.call_id, delta.name, item.id)
            item.name, item.namespace = ref.name, ref.namespace
        if delta.arguments:
            self._text.append(delta.arguments)
            if isinstance(item, R.OutputFunctionCall):
                self._emit(R.FunctionCallArgumentsDelta(sequence_number=0, item_id=item.id, output_index=len(self.items) - 1,
                                                        delta=delta.arguments))

    def _new_call(self, call_id: str, flat: str, item_id: str | None = None) -> R.OutputFunctionCall | R.OutputCustomToolCall:
        ref = self.tools.ref(flat) if flat else None
        name, namespace = (ref.name, ref.namespace) if ref is not None else ("", None)
        if ref is not None and ref.custom:
            return R.OutputCustomToolCall(id=item_id or new_id("ctc"), call_id=call_id, name=name, input="",
                                          status="in_progress", namespace=namespace)
        return R.OutputFunctionCall(id=item_id or new_id("fc"), call_id=call_id, name=name, arguments="",
                                    status="in_progress", namespace=namespace)

    def _open_item(self, item: R.OutputItem) -> None:
        self.items.append(item)
        self._open = item
        self._text = []
        self._emit(R.OutputItemAdded(sequence_number=0, output_index=len(self.items) - 1, item=_snapshot(item)))

    def _close(self, status: R.ItemStatus) -> None:
        item = self._open
        if item is None:
            return
        self._open = None
        index = len(self.items) - 1
        text = "".join(self._text)
        if isinstance(item, R.OutputMessage):
            part: R.OutputText | R.ReasoningText = R.OutputText(text=text)
            item.content = [part]  # type: ignore[list-item]
            self._emit(R.OutputTextDone(sequence_number=0, item_id=item.id, output_index=index, content_index=0, text=text))
        elif isinstance(item, R.OutputReasoning):
            part = R.ReasoningText(text=text)
            item.content = [part]
            if self.seal is not None:
                item.encrypted_content = self.seal.seal(text)
            self._emit(R.ReasoningTextDone(sequence_number=0, item_id=item.id, output_index=index, content_index=0, text=text))
        elif isinstance(item, R.OutputCustomToolCall):
            item.input = custom_input(text)
            self._emit(R.CustomToolCallInputDelta(sequence_number=0, item_id=item.id, output_index=index, delta=item.input))
            self._emit(R.CustomToolCallInputDone(sequence_number=0, item_id=item.id, output_index=index, input=item.input))
        else:
            item.arguments = text
            self._emit(R.FunctionCallArgumentsDone(sequence_number=0, item_id=item.id, output_index=index, name=item.name,
                                                   arguments=text))
        if isinstance(item, (R.OutputMessage, R.OutputReasoning)):
            self._emit(R.ContentPartDone(sequence_number=0, item_id=item.id, output_index=index, content_index=0, part=part))
        item.status = status
        self._emit(R.OutputItemDone(sequence_number=0, output_index=index, item=_snapshot(item)))

    def _emit(self, event: R._Event) -> None:
        if self.stream:
            self.events.append(event)

    def take_events(self) -> list[R._Event]:
        events, self.events = self.events, []
        return events

    def chat_messages(self) -> list[dict[str, Any]]:
        """The output as chat messages (reasoning left out), named as the model named its calls:
        what a stored conversation keeps for `previous_response_id`."""
        text = "".join(item.content[0].text for item in self.items if isinstance(item, R.OutputMessage) and item.content)
        calls = [
            {"id": item.call_id, "type": "function", "function": {
                "name": flat_name(item.name, item.namespace),
                "arguments": item.arguments if isinstance(item, R.OutputFunctionCall) else custom_arguments(item.input)}}
            for item in self.items
            if isinstance(item, (R.OutputFunctionCall, R.OutputCustomToolCall))
        ]
        if not text and not calls:
            return []
        message: dict[str, Any] = {"role": "assistant", "content": text}  # "" with calls: see translate.to_messages
        if calls:
            message["tool_calls"] = calls
        return [message]


def _snapshot(item: R.OutputItem) -> R.OutputItem:
    """The item as it is now (later deltas mutate the builder's own)."""
    return msgspec.structs.replace(item)


def usage_body(usage: Usage) -> R.ResponseUsage:
    return R.ResponseUsage(
        input_tokens=usage.prompt_tokens,
        input_tokens_details=R.InputTokensDetails(cached_tokens=usage.cached_tokens or 0),
        output_tokens=usage.completion_tokens,
        output_tokens_details=R.OutputTokensDetails(reasoning_tokens=usage.reasoning_tokens or 0),
        total_tokens=usage.prompt_tokens + usage.completion_tokens,
    )

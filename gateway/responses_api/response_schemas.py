"""What POST /v1/responses sends back, as msgspec structs: the response object (`object:
"response"`, also what the stores keep and GET returns), its output items and the typed stream
events that build them. Encoded, never decoded by the gateway (but the stores decode what they
stored). Field names and values as OpenAI sends them; the request is `schemas`.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import Struct


class _Response(Struct, kw_only=True, forbid_unknown_fields=True):
    """Encoded, never decoded by the gateway (but the stores decode what they stored)."""


Status = Literal["in_progress", "completed", "incomplete", "failed", "cancelled"]
ItemStatus = Literal["in_progress", "completed", "incomplete"]


class OutputText(_Response, tag="output_text", tag_field="type", kw_only=True):
    text: str
    annotations: list[Any] = []
    logprobs: list[Any] = []


class ReasoningText(_Response, tag="reasoning_text", tag_field="type", kw_only=True):
    text: str


class OutputMessage(_Response, tag="message", tag_field="type", kw_only=True):
    id: str
    status: ItemStatus
    role: Literal["assistant"] = "assistant"
    content: list[OutputText] = []


class OutputReasoning(_Response, tag="reasoning", tag_field="type", kw_only=True):
    """`encrypted_content`: the text sealed by this gateway (`reasoning_seal`), when `include`
    asks for `reasoning.encrypted_content`; a client that resends the item gives it back."""

    id: str
    status: ItemStatus
    summary: list[Any] = []
    content: list[ReasoningText] = []
    encrypted_content: str | None = None


class OutputFunctionCall(_Response, tag="function_call", tag_field="type", kw_only=True):
    id: str
    call_id: str
    name: str
    arguments: str
    status: ItemStatus
    namespace: str | None = None  # the `namespace` tool `name` belongs to


class OutputCustomToolCall(_Response, tag="custom_tool_call", tag_field="type", kw_only=True):
    """A call of a `custom` tool: its free-text `input`."""

    id: str
    call_id: str
    name: str
    input: str
    status: ItemStatus
    namespace: str | None = None


OutputItem = OutputMessage | OutputReasoning | OutputFunctionCall | OutputCustomToolCall


class InputTokensDetails(_Response, kw_only=True):
    cached_tokens: int


class OutputTokensDetails(_Response, kw_only=True):
    reasoning_tokens: int


class ResponseUsage(_Response, kw_only=True):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class ResponseError(_Response, kw_only=True):
    code: str
    message: str


class IncompleteDetails(_Response, kw_only=True):
    reason: Literal["max_output_tokens"]


class ReasoningEcho(_Response, kw_only=True):
    effort: str | None = None
    summary: str | None = None
    context: str | None = None


class TextFormatEcho(_Response, kw_only=True):
    format: dict[str, Any]
    verbosity: str | None = None


class Response(_Response, kw_only=True):
    """The response object (`object: "response"`), as returned, streamed and stored."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Status
    completed_at: int | None = None
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str
    output: list[OutputItem] = []
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    reasoning: ReasoningEcho = msgspec.field(default_factory=ReasoningEcho)
    store: bool = True
    temperature: float | None = None
    text: TextFormatEcho = msgspec.field(default_factory=lambda: TextFormatEcho(format={"type": "text"}))
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = []
    top_p: float | None = None
    truncation: str = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None
    metadata: dict[str, str] = {}
    background: bool = False
    prompt_cache_key: str | None = None


class DeletedResponse(_Response, kw_only=True):
    id: str
    object: Literal["response"] = "response"
    deleted: bool = True


# -- stream events (`event: <type>` + `data: <json>`; every one has `sequence_number`) -----------


class _Event(_Response, kw_only=True):
    sequence_number: int


class ResponseCreated(_Event, tag="response.created", tag_field="type", kw_only=True):
    response: Response


class ResponseInProgress(_Event, tag="response.in_progress", tag_field="type", kw_only=True):
    response: Response


class ResponseCompleted(_Event, tag="response.completed", tag_field="type", kw_only=True):
    response: Response


class ResponseIncomplete(_Event, tag="response.incomplete", tag_field="type", kw_only=True):
    response: Response


class ResponseFailed(_Event, tag="response.failed", tag_field="type", kw_only=True):
    response: Response


class OutputItemAdded(_Event, tag="response.output_item.added", tag_field="type", kw_only=True):
    output_index: int
    item: OutputItem


class OutputItemDone(_Event, tag="response.output_item.done", tag_field="type", kw_only=True):
    output_index: int
    item: OutputItem


class ContentPartAdded(_Event, tag="response.content_part.added", tag_field="type", kw_only=True):
    item_id: str
    output_index: int
    content_index: int
    part: OutputText | ReasoningText


class ContentPartDone(_Event, tag="response.content_part.done", tag_field="type", kw_only=True):
    item_id: str
    output_index: int
    content_index: int
    part: OutputText | ReasoningText


class OutputTextDelta(_Event, tag="response.output_text.delta", tag_field="type", kw_only=True):
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[Any] = []


class OutputTextDone(_Event, tag="response.output_text.done", tag_field="type", kw_only=True):
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[Any] = []


class ReasoningTextDelta(_Event, tag="response.reasoning_text.delta", tag_field="type", kw_only=True):
    item_id: str
    output_index: int
    content_index: int
    delta: str


class ReasoningTextDone(_Event, tag="response.reasoning_text.done", tag_field="type", kw_only=True):
    item_id: str
    output_index: int
    content_index: int
    text: str


class FunctionCallArgumentsDelta(_Event, tag="response.function_call_arguments.delta", tag_field="type", kw_only=True):
    item_id: str
    output_index: int
    delta: str


class FunctionCallArgumentsDone(_Event, tag="response.function_call_arguments.done", tag_field="type", kw_only=True):
    item_id: str
    output_index: int
    name: str
    arguments: str


class CustomToolCallInputDelta(_Event, tag="response.custom_tool_call_input.delta", tag_field="type", kw_only=True):
    item_id: str
    output_index: int
    delta: str


class CustomToolCallInputDone(_Event, tag="response.custom_tool_call_input.done", tag_field="type", kw_only=True):
    item_id: str
    output_index: int
    input: str


StreamEvent = (
    ResponseCreated | ResponseInProgress | ResponseCompleted | ResponseIncomplete | ResponseFailed | OutputItemAdded
    | OutputItemDone | ContentPartAdded | ContentPartDone | OutputTextDelta | OutputTextDone | ReasoningTextDelta
    | ReasoningTextDone | FunctionCallArgumentsDelta | FunctionCallArgumentsDone | CustomToolCallInputDelta
    | CustomToolCallInputDone
)

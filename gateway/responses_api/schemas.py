"""The OpenAI Responses API wire contract as msgspec structs: the request, the response object,
its output items and the typed stream events. Field names and values as OpenAI sends them.

`input` items are decoded in two steps (`translate.input_items`): a message item may leave out
its `type`, which a msgspec tagged union cannot say, so the request struct takes objects and
each is converted strictly by its `type`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from gateway.chat_api.schemas import Temperature, TopP


class _Request(Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    pass


# -- request ----------------------------------------------------------------------------------


class InputText(_Request, tag="input_text", tag_field="type", kw_only=True):
    text: str


class OutputTextIn(_Request, tag="output_text", tag_field="type", kw_only=True):
    """An earlier answer's text, sent back as part of the conversation."""

    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class RefusalIn(_Request, tag="refusal", tag_field="type", kw_only=True):
    refusal: str


class InputImage(_Request, tag="input_image", tag_field="type", kw_only=True):
    image_url: str | None = None
    file_id: str | None = None
    detail: Literal["low", "high", "auto"] | None = None


class InputFile(_Request, tag="input_file", tag_field="type", kw_only=True):
    file_id: str | None = None
    file_data: str | None = None
    file_url: str | None = None
    filename: str | None = None


ContentPart = InputText | OutputTextIn | RefusalIn | InputImage | InputFile


class MessageItem(_Request, kw_only=True):
    """`{"role", "content"}`, with or without `"type": "message"`."""

    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]
    type: Literal["message"] = "message"
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None
    phase: str | None = None


class FunctionCallItem(_Request, kw_only=True):
    type: Literal["function_call"]
    call_id: Annotated[str, Meta(min_length=1)]
    name: str
    arguments: str
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCallOutputItem(_Request, kw_only=True):
    type: Literal["function_call_output"]
    call_id: Annotated[str, Meta(min_length=1)]
    output: str | list[InputText]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class SummaryText(_Request, tag="summary_text", tag_field="type", kw_only=True):
    text: str


class ReasoningTextIn(_Request, tag="reasoning_text", tag_field="type", kw_only=True):
    text: str


class ReasoningItemIn(_Request, kw_only=True):
    """An earlier answer's reasoning, sent back: accepted, and not shown to the model again
    (chat templates drop earlier turns' thinking)."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[SummaryText] = []
    content: list[ReasoningTextIn] | None = None
    encrypted_content: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItemIn


class FunctionTool(_Request, kw_only=True):
    type: Literal["function"]
    name: Annotated[str, Meta(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionChoice(_Request, kw_only=True):
    type: Literal["function"]
    name: str


class FormatText(_Request, tag="text", tag_field="type", kw_only=True):
    pass


class FormatJSONObject(_Request, tag="json_object", tag_field="type", kw_only=True):
    pass


class FormatJSONSchema(_Request, tag="json_schema", tag_field="type", kw_only=True):
    name: Annotated[str, Meta(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    schema_: dict[str, Any] = msgspec.field(name="schema")
    description: str | None = None
    strict: bool | None = None


TextFormat = FormatText | FormatJSONObject | FormatJSONSchema


class TextConfig(_Request, kw_only=True):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningConfig(_Request, kw_only=True):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class StreamOptions(_Request, kw_only=True):
    include_obfuscation: bool | None = None


MetadataKey = Annotated[str, Meta(max_length=64)]
MetadataValue = Annotated[str, Meta(max_length=512)]


class ResponsesRequest(_Request, kw_only=True):
    """POST /v1/responses."""

    model: str
    input: str | Annotated[list[dict[str, Any]], Meta(min_length=1)]  # items: `InputItem`
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None  # `FunctionTool`s; other tool types are refused
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None  # or a `FunctionChoice`
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: Annotated[int, Meta(ge=1)] | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    metadata: Annotated[dict[MetadataKey, MetadataValue], Meta(max_length=16)] | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    reasoning: ReasoningConfig | None = None
    truncation: Literal["auto", "disabled"] | None = None
    include: list[str] | None = None
    background: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    max_tool_calls: Annotated[int, Meta(ge=1)] | None = None


# -- response -------------------------------------------------------------------------------------


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
    id: str
    status: ItemStatus
    summary: list[Any] = []
    content: list[ReasoningText] = []


class OutputFunctionCall(_Response, tag="function_call", tag_field="type", kw_only=True):
    id: str
    call_id: str
    name: str
    arguments: str
    status: ItemStatus


OutputItem = OutputMessage | OutputReasoning | OutputFunctionCall


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


class TextFormatEcho(_Response, kw_only=True):
    format: dict[str, Any]


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


StreamEvent = (
    ResponseCreated | ResponseInProgress | ResponseCompleted | ResponseIncomplete | ResponseFailed | OutputItemAdded
    | OutputItemDone | ContentPartAdded | ContentPartDone | OutputTextDelta | OutputTextDone | ReasoningTextDelta
    | ReasoningTextDone | FunctionCallArgumentsDelta | FunctionCallArgumentsDone
)

"""Anthropic's Messages API as msgspec structs: `POST /v1/messages`, `POST /v1/messages/count_tokens`,
their responses, stream events and error object, snake_case as on the wire.

Requests are decoded strictly, as Anthropic's API does (an unknown field is a 400); fields the
gateway accepts without acting on them (`cache_control`, `citations`, `service_tier`, a
thinking block's `signature`) are listed so that the official clients' requests decode. Content
the backends cannot take (images, documents) decodes too and is refused by `translate` with a
400 naming the block.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

# Anthropic's own ranges (temperature is 0–1 there, not OpenAI's 0–2)
Temperature = Annotated[float, Meta(ge=0.0, le=1.0, description="Sampling temperature, 0–1.")]
TopP = Annotated[float, Meta(ge=0.0, le=1.0)]
ToolName = Annotated[str, Meta(pattern=r"^[a-zA-Z0-9_-]{1,128}$")]


class _Request(Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    pass


class CacheControl(_Request, kw_only=True):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(_Request, tag="text", tag_field="type", kw_only=True):
    text: str
    cache_control: CacheControl | None = None
    citations: list[dict[str, Any]] | None = None


class ImageBlock(_Request, tag="image", tag_field="type", kw_only=True):
    source: dict[str, Any]
    cache_control: CacheControl | None = None


class DocumentBlock(_Request, tag="document", tag_field="type", kw_only=True):
    source: dict[str, Any]
    title: str | None = None
    context: str | None = None
    citations: dict[str, Any] | None = None
    cache_control: CacheControl | None = None


class ToolUseBlock(_Request, tag="tool_use", tag_field="type", kw_only=True):
    id: str
    name: str
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolResultBlock(_Request, tag="tool_result", tag_field="type", kw_only=True):
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock | DocumentBlock] | None = None
    is_error: bool | None = None
    cache_control: CacheControl | None = None


class ThinkingBlock(_Request, tag="thinking", tag_field="type", kw_only=True):
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Request, tag="redacted_thinking", tag_field="type", kw_only=True):
    data: str


UserBlock = TextBlock | ImageBlock | DocumentBlock | ToolResultBlock
AssistantBlock = TextBlock | ToolUseBlock | ThinkingBlock | RedactedThinkingBlock


class UserMessage(_Request, tag="user", tag_field="role", kw_only=True):
    content: str | list[UserBlock]


class AssistantMessage(_Request, tag="assistant", tag_field="role", kw_only=True):
    content: str | list[AssistantBlock]


Message = UserMessage | AssistantMessage


class Tool(_Request, kw_only=True):
    name: ToolName
    input_schema: dict[str, Any]
    description: str | None = None
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None
    strict: bool | None = None


class ToolChoiceAuto(_Request, tag="auto", tag_field="type", kw_only=True):
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAny(_Request, tag="any", tag_field="type", kw_only=True):
    disable_parallel_tool_use: bool | None = None


class ToolChoiceTool(_Request, tag="tool", tag_field="type", kw_only=True):
    name: str
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNone(_Request, tag="none", tag_field="type", kw_only=True):
    pass


ToolChoice = ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone


class ThinkingEnabled(_Request, tag="enabled", tag_field="type", kw_only=True):
    budget_tokens: Annotated[int, Meta(ge=1024)]
    display: Literal["summarized", "omitted"] | None = None


class ThinkingDisabled(_Request, tag="disabled", tag_field="type", kw_only=True):
    pass


class ThinkingAdaptive(_Request, tag="adaptive", tag_field="type", kw_only=True):
    display: Literal["summarized", "omitted"] | None = None


Thinking = ThinkingEnabled | ThinkingDisabled | ThinkingAdaptive


class Metadata(_Request, kw_only=True):
    user_id: Annotated[str, Meta(max_length=256)] | None = None


class _Conversation(_Request, kw_only=True):
    """What a prompt is built from: shared by create and count_tokens."""

    model: str
    messages: Annotated[list[Message], Meta(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


class MessagesRequest(_Conversation, kw_only=True):
    """POST /v1/messages."""

    max_tokens: Annotated[int, Meta(ge=1)]
    stop_sequences: list[Annotated[str, Meta(min_length=1)]] | None = None
    stream: bool | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: Annotated[int, Meta(ge=0)] | None = None
    metadata: Metadata | None = None
    # accepted, no effect here
    service_tier: Literal["auto", "standard_only"] | None = None


class CountTokensRequest(_Conversation, kw_only=True):
    """POST /v1/messages/count_tokens."""


# -- responses ------------------------------------------------------------------------------------


class _Response(Struct, kw_only=True, forbid_unknown_fields=True):
    """Encoded, never decoded: `forbid_unknown_fields` only makes the schema say so."""


class Usage(_Response, kw_only=True, omit_defaults=True):
    """`input_tokens` excludes the prompt tokens read from the prefix cache
    (`cache_read_input_tokens`), as Anthropic counts; their sum is the prompt's length."""

    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int | None = None


class TextContent(_Response, tag="text", tag_field="type", kw_only=True):
    text: str


class ThinkingContent(_Response, tag="thinking", tag_field="type", kw_only=True):
    thinking: str
    signature: str


class ToolUseContent(_Response, tag="tool_use", tag_field="type", kw_only=True):
    id: str
    name: str
    input: dict[str, Any]


Content = TextContent | ThinkingContent | ToolUseContent
StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class MessageResponse(_Response, tag="message", tag_field="type", kw_only=True):
    id: str
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[Content]
    stop_reason: StopReason | None
    stop_sequence: str | None
    usage: Usage


class TokenCount(_Response, kw_only=True):
    input_tokens: int


class ErrorObject(_Response, kw_only=True):
    type: str
    message: str


class ErrorResponse(_Response, tag="error", tag_field="type", kw_only=True):
    error: ErrorObject


# -- stream events (each one SSE `event: <type>` + `data: <the event as JSON>`) --------------------


class MessageStart(_Response, tag="message_start", tag_field="type", kw_only=True):
    message: MessageResponse


class ContentBlockStart(_Response, tag="content_block_start", tag_field="type", kw_only=True):
    index: int
    content_block: Content


class TextDelta(_Response, tag="text_delta", tag_field="type", kw_only=True):
    text: str


class InputJSONDelta(_Response, tag="input_json_delta", tag_field="type", kw_only=True):
    partial_json: str


class ThinkingDelta(_Response, tag="thinking_delta", tag_field="type", kw_only=True):
    thinking: str


class SignatureDelta(_Response, tag="signature_delta", tag_field="type", kw_only=True):
    signature: str


class ContentBlockDelta(_Response, tag="content_block_delta", tag_field="type", kw_only=True):
    index: int
    delta: TextDelta | InputJSONDelta | ThinkingDelta | SignatureDelta


class ContentBlockStop(_Response, tag="content_block_stop", tag_field="type", kw_only=True):
    index: int


class StopDelta(_Response, kw_only=True):
    stop_reason: StopReason
    stop_sequence: str | None


class MessageDelta(_Response, tag="message_delta", tag_field="type", kw_only=True):
    delta: StopDelta
    usage: Usage


class MessageStop(_Response, tag="message_stop", tag_field="type", kw_only=True):
    pass


class Ping(_Response, tag="ping", tag_field="type", kw_only=True):
    pass


StreamEvent = MessageStart | ContentBlockStart | ContentBlockDelta | ContentBlockStop | MessageDelta | MessageStop | Ping | ErrorResponse

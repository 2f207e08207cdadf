"""Anthropic's Messages API as msgspec structs: `POST /v1/messages`, `POST /v1/messages/count_tokens`
(with or without `?beta=true`), their responses, stream events and error object, snake_case as
on the wire.

Requests are decoded strictly, as Anthropic's API does (an unknown field is a 400), and take what
the real API takes, its beta fields included (those Claude Code sends: `role: "system"` turns
inside `messages`, `output_config`, `context_management`, `thinking.display`, `defer_loading`).
What each top-level field becomes is `fields.py`'s table; fields the gateway has nothing to do
with (a billing policy, an MCP server list) are typed loosely, as the objects they are. Content
the backends cannot take (images, documents) decodes too and is refused by `translate` with a
400 naming the block.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

# Anthropic's own ranges (temperature is 0–1 there, not OpenAI's 0–2)
Temperature = Annotated[float, Meta(ge=0.0, le=1.0, description="Sampling temperature, 0–1.")]
TopP = Annotated[float, Meta(ge=0.0, le=1.0)]
ToolName = Annotated[str, Meta(pattern=r"^[a-zA-Z0-9_-]{1,128}$")]
Effort = Literal["low", "medium", "high", "xhigh", "max"]
Object = dict[str, Any]  # a JSON object the gateway takes as it is


class _Request(Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    pass


class CacheControl(_Request, kw_only=True):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(_Request, tag="text", tag_field="type", kw_only=True):
    text: str
    cache_control: CacheControl | None = None
    citations: list[Object] | None = None


class ImageBlock(_Request, tag="image", tag_field="type", kw_only=True):
    source: Object
    cache_control: CacheControl | None = None


class DocumentBlock(_Request, tag="document", tag_field="type", kw_only=True):
    source: Object
    title: str | None = None
    context: str | None = None
    citations: Object | None = None
    cache_control: CacheControl | None = None


class ToolReferenceBlock(_Request, tag="tool_reference", tag_field="type", kw_only=True):
    """In a `tool_result`: the tool search found `tool_name`, a `defer_loading` tool, which is
    offered to the model from then on."""

    tool_name: str
    cache_control: CacheControl | None = None


class ToolUseBlock(_Request, tag="tool_use", tag_field="type", kw_only=True):
    id: str
    name: str
    input: Object
    cache_control: CacheControl | None = None
    caller: Object | None = None
    toolset_name: str | None = None


class ToolResultBlock(_Request, tag="tool_result", tag_field="type", kw_only=True):
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock | DocumentBlock | ToolReferenceBlock] | None = None
    is_error: bool | None = None
    cache_control: CacheControl | None = None
    toolset_name: str | None = None


class ThinkingBlock(_Request, tag="thinking", tag_field="type", kw_only=True):
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Request, tag="redacted_thinking", tag_field="type", kw_only=True):
    data: str


# -- mid-conversation tool changes (beta), in a user or system turn ---------------------------------


class ToolRef(_Request, tag="tool_reference", tag_field="type", kw_only=True):
    name: str


class MCPToolRef(_Request, tag="mcp_tool_reference", tag_field="type", kw_only=True):
    name: str
    server_name: str


class MCPToolsetRef(_Request, tag="mcp_toolset_reference", tag_field="type", kw_only=True):
    server_name: str


class Tool(_Request, kw_only=True):
    name: ToolName
    input_schema: Object
    description: str | None = None
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None
    strict: bool | None = None
    defer_loading: bool | None = None  # left out of the prompt until a tool search finds it
    allowed_callers: list[str] | None = None
    eager_input_streaming: bool | None = None
    input_examples: list[Object] | None = None


class ToolDefinitionRef(_Request, tag="tool_definition", tag_field="type", kw_only=True):
    definition: Tool


class ToolAdditionBlock(_Request, tag="tool_addition", tag_field="type", kw_only=True):
    tool: ToolRef | MCPToolRef | MCPToolsetRef | ToolDefinitionRef
    cache_control: CacheControl | None = None


class ToolRemovalBlock(_Request, tag="tool_removal", tag_field="type", kw_only=True):
    tool: ToolRef | MCPToolRef | MCPToolsetRef
    cache_control: CacheControl | None = None


ToolChange = ToolAdditionBlock | ToolRemovalBlock
UserBlock = TextBlock | ImageBlock | DocumentBlock | ToolResultBlock | ToolAdditionBlock | ToolRemovalBlock
AssistantBlock = TextBlock | ToolUseBlock | ThinkingBlock | RedactedThinkingBlock
SystemBlock = TextBlock | ToolAdditionBlock | ToolRemovalBlock


class UserMessage(_Request, tag="user", tag_field="role", kw_only=True):
    content: str | list[UserBlock]


class AssistantMessage(_Request, tag="assistant", tag_field="role", kw_only=True):
    content: str | list[AssistantBlock]


class TurnOutputConfig(_Request, kw_only=True):
    effort: Effort | None = None


class SystemMessage(_Request, tag="system", tag_field="role", kw_only=True):
    """A system turn inside `messages` (beta). `clear_at: "next_user_message"`: shown only until
    a later user turn; `output_config.effort` steers the turn's thinking (`translate`)."""

    content: str | list[SystemBlock] | None = None
    clear_at: Literal["next_user_message", "never"] | None = None
    output_config: TurnOutputConfig | None = None


Message = UserMessage | AssistantMessage | SystemMessage


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
ThinkingDisplay = Literal["summarized", "omitted", "updates"]


class ThinkingEnabled(_Request, tag="enabled", tag_field="type", kw_only=True):
    budget_tokens: Annotated[int, Meta(ge=1024)]
    display: ThinkingDisplay | None = None
    block_binding: Object | None = None


class ThinkingDisabled(_Request, tag="disabled", tag_field="type", kw_only=True):
    pass


class ThinkingAdaptive(_Request, tag="adaptive", tag_field="type", kw_only=True):
    display: ThinkingDisplay | None = None
    block_binding: Object | None = None


class ThinkingBetweenTools(_Request, tag="between_tools", tag_field="type", kw_only=True):
    pass


Thinking = ThinkingEnabled | ThinkingDisabled | ThinkingAdaptive | ThinkingBetweenTools


class JSONOutputFormat(_Request, tag="json_schema", tag_field="type", kw_only=True):
    schema_: Object = msgspec.field(name="schema")


class TaskBudget(_Request, kw_only=True):
    type: Literal["tokens"]
    total: int
    remaining: int | None = None


class OutputConfig(_Request, kw_only=True):
    """`effort` steers thinking (`translate`), `format` is the answer's JSON schema; a
    `task_budget` (tokens across an agent's contexts) is accepted and not counted here."""

    effort: Effort | None = None
    format: JSONOutputFormat | None = None
    task_budget: TaskBudget | None = None


class Metadata(_Request, kw_only=True):
    user_id: Annotated[str, Meta(max_length=256)] | None = None


class ContextManagement(_Request, kw_only=True):
    edits: list[Object] | None = None


class _Conversation(_Request, kw_only=True):
    """What a prompt is built from: shared by create and count_tokens."""

    model: str
    messages: Annotated[list[Message], Meta(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    # accepted; what each becomes is `fields.py`'s
    cache_control: CacheControl | None = None
    context_management: ContextManagement | None = None
    mcp_servers: list[Object] | None = None
    speed: Literal["standard", "fast"] | None = None
    billing_policy: Object | None = None
    compaction: Object | None = None


class MessagesRequest(_Conversation, kw_only=True):
    """POST /v1/messages."""

    max_tokens: Annotated[int, Meta(ge=1)]
    stop_sequences: list[Annotated[str, Meta(min_length=1)]] | None = None
    stream: bool | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: Annotated[int, Meta(ge=0)] | None = None
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    container: str | Object | None = None
    diagnostics: Object | None = None
    fallback_credit_token: str | Object | None = None
    fallbacks: list[Object] | Literal["default"] | None = None
    inference_geo: str | None = None
    thread: Object | None = None


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

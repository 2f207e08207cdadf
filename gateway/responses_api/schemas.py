"""The OpenAI Responses API request as msgspec structs (`POST /v1/responses`): every field the
official SDK sends, and Codex's own `client_metadata`. Field names and values as OpenAI sends
them; what each field becomes is `fields.RESPONSES_FIELDS`. The response object, its output items
and the stream events are `response_schemas`.

`input` items are decoded in two steps (`translate.input_items`): a message item may leave out
its `type`, which a msgspec tagged union cannot say, so the request struct takes objects and
each is converted strictly by its `type` (`INPUT_ITEMS`). The published schema (`gateway.openapi`)
says what each item really is.

Tools are a tagged union: `function`, `custom` (free-text input, optionally under a grammar),
`namespace` (a group of those) and the hosted tools OpenAI runs on its side, which no engine here
can run (`HOSTED_TOOL_TYPES`: taken with any fields, then dropped or refused by the route's
`hosted_tools`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

import msgspec
from msgspec import Meta, Struct

from gateway.chat_api.schemas import Temperature, TopP


class _Request(Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    pass


Status = Literal["in_progress", "completed", "incomplete"]
Caller = dict[str, Any]  # `{"type": "direct"}` or a program's; where a call came from, not used here

# -- input items --------------------------------------------------------------------------------


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
    detail: Literal["low", "high", "auto", "original"] | None = None


class InputFile(_Request, tag="input_file", tag_field="type", kw_only=True):
    file_id: str | None = None
    file_data: str | None = None
    file_url: str | None = None
    filename: str | None = None


ContentPart = InputText | OutputTextIn | RefusalIn | InputImage | InputFile
ToolOutputPart = InputText | InputImage | InputFile
# decoded so that they are refused with a clear 400 (`translate`: only text is supported); the
# published schema (`gateway.openapi`) leaves them out
REFUSED_PARTS: tuple[type[Struct], ...] = (InputImage, InputFile)


class MessageItem(_Request, kw_only=True):
    """`{"role", "content"}`, with or without `"type": "message"`."""

    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]
    type: Literal["message"] = "message"
    id: str | None = None
    status: Status | None = None
    phase: str | None = None


class FunctionCallItem(_Request, kw_only=True):
    type: Literal["function_call"]
    call_id: Annotated[str, Meta(min_length=1)]
    name: str
    arguments: str
    namespace: str | None = None  # the `namespace` tool it belongs to
    id: str | None = None
    status: Status | None = None
    caller: Caller | None = None


class FunctionCallOutputItem(_Request, kw_only=True):
    type: Literal["function_call_output"]
    call_id: Annotated[str, Meta(min_length=1)]
    output: str | list[ToolOutputPart]
    name: str | None = None
    namespace: str | None = None
    id: str | None = None
    status: Status | None = None
    caller: Caller | None = None


class CustomToolCallItem(_Request, kw_only=True):
    """An earlier call of a `custom` tool: its free-text `input`."""

    type: Literal["custom_tool_call"]
    call_id: Annotated[str, Meta(min_length=1)]
    name: str
    input: str
    namespace: str | None = None
    id: str | None = None
    status: Status | None = None
    caller: Caller | None = None


class CustomToolCallOutputItem(_Request, kw_only=True):
    type: Literal["custom_tool_call_output"]
    call_id: Annotated[str, Meta(min_length=1)]
    output: str | list[ToolOutputPart]
    id: str | None = None
    caller: Caller | None = None


class SummaryText(_Request, tag="summary_text", tag_field="type", kw_only=True):
    text: str


class ReasoningTextIn(_Request, tag="reasoning_text", tag_field="type", kw_only=True):
    text: str


class ReasoningItemIn(_Request, kw_only=True):
    """An earlier answer's reasoning, sent back: its text is `content` or, from this gateway,
    sealed in `encrypted_content` (`reasoning_seal`); `translate` gives it back to the model as
    `reasoning.context` asks (the chat template decides whether it is shown)."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[SummaryText] = []
    content: list[ReasoningTextIn] | None = None
    encrypted_content: str | None = None
    status: Status | None = None


# -- tools --------------------------------------------------------------------------------------

ToolName = Annotated[str, Meta(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]


class FunctionTool(_Request, tag="function", tag_field="type", kw_only=True):
    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    defer_loading: bool | None = None
    allowed_callers: list[Literal["direct", "programmatic"]] | None = None
    output_schema: dict[str, Any] | None = None
    async_: bool | None = msgspec.field(name="async", default=None)


class FormatText(_Request, tag="text", tag_field="type", kw_only=True):
    pass


class FormatGrammar(_Request, tag="grammar", tag_field="type", kw_only=True):
    definition: str
    syntax: Literal["lark", "regex"]


class CustomTool(_Request, tag="custom", tag_field="type", kw_only=True):
    """A tool that takes free text, not JSON (Codex's `exec` takes JavaScript under a Lark grammar)."""

    name: ToolName
    description: str | None = None
    format: FormatText | FormatGrammar | None = None
    defer_loading: bool | None = None
    allowed_callers: list[Literal["direct", "programmatic"]] | None = None
    async_: bool | None = msgspec.field(name="async", default=None)


class NamespaceTool(_Request, tag="namespace", tag_field="type", kw_only=True):
    """Function and custom tools grouped under one name (`multi_agent_v1`); calls name both."""

    name: ToolName
    description: str
    tools: list[FunctionTool | CustomTool]


class _HostedTool(Struct, kw_only=True):
    """A tool OpenAI runs on its side; its fields are taken as they come (it is dropped or refused)."""


# every tool type of the SDK's `ToolParam` but function, custom and namespace
HOSTED_TOOL_TYPES = (
    "web_search", "web_search_2025_08_26", "web_search_preview", "web_search_preview_2025_03_11", "file_search",
    "code_interpreter", "computer", "computer_use", "computer_use_preview", "image_generation", "mcp", "local_shell",
    "shell", "apply_patch", "tool_search", "programmatic_tool_calling",
)
HOSTED_TOOLS: tuple[type[_HostedTool], ...] = tuple(
    msgspec.defstruct(f"HostedTool_{tag}", [], bases=(_HostedTool,), tag=tag, tag_field="type", kw_only=True)
    for tag in HOSTED_TOOL_TYPES
)
Tool = Union[(FunctionTool, CustomTool, NamespaceTool, *HOSTED_TOOLS)]  # type: ignore[valid-type]


class AdditionalToolsItem(_Request, kw_only=True):
    """Tools made available from this point of `input` on (Codex's own models get theirs this
    way); a chat template has one tool list, so they join `tools`."""

    type: Literal["additional_tools"]
    role: Literal["developer"]
    tools: list[Tool]  # type: ignore[valid-type]
    id: str | None = None


InputItem = (MessageItem | FunctionCallItem | FunctionCallOutputItem | CustomToolCallItem | CustomToolCallOutputItem
             | ReasoningItemIn | AdditionalToolsItem)
INPUT_ITEMS: dict[str, type[Struct]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
    "custom_tool_call": CustomToolCallItem,
    "custom_tool_call_output": CustomToolCallOutputItem,
    "reasoning": ReasoningItemIn,
    "additional_tools": AdditionalToolsItem,
}

# -- tool_choice --------------------------------------------------------------------------------


class ToolChoiceFunction(_Request, tag="function", tag_field="type", kw_only=True):
    name: str


class ToolChoiceCustom(_Request, tag="custom", tag_field="type", kw_only=True):
    name: str


class ToolChoiceAllowed(_Request, tag="allowed_tools", tag_field="type", kw_only=True):
    """Only these of `tools` may be called (`[{"type": "function", "name": ...}, ...]`)."""

    mode: Literal["auto", "required"]
    tools: list[dict[str, Any]]


# the SDK's forced choices of a hosted tool
HOSTED_CHOICE_TYPES = (
    "file_search", "web_search_preview", "web_search_preview_2025_03_11", "computer", "computer_use",
    "computer_use_preview", "image_generation", "code_interpreter", "mcp", "apply_patch", "shell",
    "programmatic_tool_calling",
)
HOSTED_CHOICES: tuple[type[_HostedTool], ...] = tuple(
    msgspec.defstruct(f"ToolChoiceHosted_{tag}", [], bases=(_HostedTool,), tag=tag, tag_field="type", kw_only=True)
    for tag in HOSTED_CHOICE_TYPES
)
ToolChoice = Union[(Literal["none", "auto", "required"], ToolChoiceFunction, ToolChoiceCustom,  # type: ignore[valid-type]
                    ToolChoiceAllowed, *HOSTED_CHOICES)]

# -- the other settings -------------------------------------------------------------------------


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
    verbosity: Literal["low", "medium", "high"] | None = None  # accepted; no engine here takes it


class ReasoningConfig(_Request, kw_only=True):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None
    # which earlier reasoning items go back to the model: None / "auto" as "current_turn"
    context: Literal["auto", "current_turn", "all_turns"] | None = None
    mode: str | None = None  # "standard" | "pro": accepted, one mode here


class StreamOptions(_Request, kw_only=True):
    include_obfuscation: bool | None = None


# what `include` may ask for; only `reasoning.encrypted_content` adds anything here (the others
# are items no engine here makes, and logprobs, which are refused like `top_logprobs`)
Includable = Literal[
    "reasoning.encrypted_content", "message.output_text.logprobs", "file_search_call.results",
    "web_search_call.results", "web_search_call.action.sources", "message.input_image.image_url",
    "computer_call_output.output.image_url", "code_interpreter_call.outputs",
]


def _only(schema: dict[str, Any]) -> Meta:
    """What the published schema adds to a field some of whose values `translate.check_request`
    refuses with a clear 400 (decoding takes them, to say why): msgspec's own keywords win over
    these, so they narrow with others (`not`, `const`)."""
    return Meta(extra_json_schema=schema)


class BackgroundOptions(_Request, kw_only=True):
    completion_window: Literal["soonest", "2h", "8h"] | None = None
    continuation_id: str | None = None


class PromptCacheOptions(_Request, kw_only=True):
    comparison_response_id: str | None = None
    mode: Literal["implicit", "explicit"] | None = None
    prewarm: bool | None = None
    ttl: Literal["30m", "12h"] | None = None


class ContextManagement(_Request, kw_only=True):
    type: str
    compact_threshold: int | None = None


MetadataKey = Annotated[str, Meta(max_length=64)]
MetadataValue = Annotated[str, Meta(max_length=512)]


class ResponsesRequest(_Request, kw_only=True):
    """POST /v1/responses."""

    model: str
    input: str | Annotated[list[dict[str, Any]], Meta(min_length=1)]  # items: `InputItem`
    instructions: str | None = None
    tools: list[Tool] | None = None  # type: ignore[valid-type]
    tool_choice: ToolChoice | None = None  # type: ignore[valid-type]
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
    truncation: Annotated[Literal["auto", "disabled"], _only({"not": {"const": "auto"}})] | None = None
    include: Annotated[list[Includable], _only({"not": {"contains": {"const": "message.output_text.logprobs"}}})] | None = None
    background: Annotated[bool, _only({"const": False})] | None = None
    background_options: BackgroundOptions | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    safety_identifier: str | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20), _only({"const": 0})] | None = None
    max_tool_calls: Annotated[int, Meta(ge=1)] | None = None
    context_management: list[ContextManagement] | None = None
    access_programs: dict[str, Any] | None = None
    image: dict[str, Any] | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    moderation: dict[str, Any] | None = None
    client_metadata: dict[str, str] | None = None  # Codex's own (session, turn, installation ids)

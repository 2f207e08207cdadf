"""The OpenAI wire contract as msgspec structs: requests (with vLLM's extensions), responses,
stream chunks. Field names are snake_case, exactly as on the wire.

Request structs forbid unknown fields (OpenAI rejects them; vLLM silently ignores typos) and
carry the per-field ranges of the OpenAI spec; cross-field rules live in `gateway/chat_api/translate.py`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

# -- request pieces ---------------------------------------------------------------------------

Temperature = Annotated[float, Meta(ge=0.0, le=2.0, description="Sampling temperature, 0–2.")]
TopP = Annotated[float, Meta(ge=0.0, le=1.0, description="Nucleus sampling mass, 0–1.")]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
NumChoices = Annotated[int, Meta(ge=1, le=128, description="Number of choices, 1–128.")]
NonNegativeInt = Annotated[int, Meta(ge=0)]
# a token id: engines hold ids in int32 tensors; a larger one could only crash them
TokenId = Annotated[int, Meta(ge=0, le=2**31 - 1)]
Seed = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
TopLogprobs = Annotated[int, Meta(ge=0, le=20)]
Stop = str | Annotated[list[str], Meta(min_length=1, max_length=4)]


class _Request(Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    pass


class TextPart(_Request, tag="text", tag_field="type", kw_only=True):
    text: str


class ImageURL(_Request, kw_only=True):
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImageURLPart(_Request, tag="image_url", tag_field="type", kw_only=True):
    image_url: ImageURL


class InputAudio(_Request, kw_only=True):
    data: str
    format: Literal["wav", "mp3"]


class InputAudioPart(_Request, tag="input_audio", tag_field="type", kw_only=True):
    input_audio: InputAudio


class FileRef(_Request, kw_only=True):
    file_data: str | None = None
    file_id: str | None = None
    filename: str | None = None


class FilePart(_Request, tag="file", tag_field="type", kw_only=True):
    file: FileRef


class RefusalPart(_Request, tag="refusal", tag_field="type", kw_only=True):
    refusal: str


UserContentPart = TextPart | ImageURLPart | InputAudioPart | FilePart
AssistantContentPart = TextPart | RefusalPart


class FunctionCall(_Request, kw_only=True):
    name: str
    arguments: str


class ToolCall(_Request, kw_only=True):
    id: str
    function: FunctionCall
    type: Literal["function"] = "function"


class SystemMessage(_Request, tag="system", tag_field="role", kw_only=True):
    content: str | list[TextPart]
    name: str | None = None


class DeveloperMessage(_Request, tag="developer", tag_field="role", kw_only=True):
    content: str | list[TextPart]
    name: str | None = None


class UserMessage(_Request, tag="user", tag_field="role", kw_only=True):
    content: str | list[UserContentPart]
    name: str | None = None


class AssistantMessage(_Request, tag="assistant", tag_field="role", kw_only=True):
    content: str | list[AssistantContentPart] | None = None
    name: str | None = None
    refusal: str | None = None
    tool_calls: list[ToolCall] | None = None
    function_call: FunctionCall | None = None
    reasoning_content: str | None = None


class ToolMessage(_Request, tag="tool", tag_field="role", kw_only=True):
    content: str | list[TextPart]
    tool_call_id: str


class FunctionMessage(_Request, tag="function", tag_field="role", kw_only=True):
    content: str | None
    name: str


Message = SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage | FunctionMessage


class FunctionDefinition(_Request, kw_only=True):
    name: Annotated[str, Meta(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Request, kw_only=True):
    function: FunctionDefinition
    type: Literal["function"] = "function"


class NamedFunction(_Request, kw_only=True):
    name: str


class NamedToolChoice(_Request, kw_only=True):
    function: NamedFunction
    type: Literal["function"] = "function"


class JSONSchemaFormat(_Request, kw_only=True):
    name: Annotated[str, Meta(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    description: str | None = None
    # `schema` shadows nothing in msgspec, but keep the wire name explicit.
    schema_: dict[str, Any] | None = msgspec.field(default=None, name="schema")
    strict: bool | None = None


class ResponseFormatText(_Request, tag="text", tag_field="type", kw_only=True):
    pass


class ResponseFormatJSONObject(_Request, tag="json_object", tag_field="type", kw_only=True):
    pass


class ResponseFormatJSONSchema(_Request, tag="json_schema", tag_field="type", kw_only=True):
    json_schema: JSONSchemaFormat | None = None  # required; checked with a clear message


ResponseFormat = ResponseFormatText | ResponseFormatJSONObject | ResponseFormatJSONSchema


class StreamOptions(_Request, kw_only=True):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None
    continuous_usage_stats: bool | None = None  # vLLM extension


class StructuredOutputs(_Request, kw_only=True):
    """vLLM's `structured_outputs`: at most one of json / regex / choice / grammar."""

    json: dict[str, Any] | str | None = None
    regex: str | None = None
    choice: Annotated[list[str], Meta(min_length=1)] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    whitespace_pattern: str | None = None
    disable_any_whitespace: bool | None = None
    disable_additional_properties: bool | None = None


class SamplingFields(_Request, kw_only=True):
    """Fields shared by chat and legacy completions, with vLLM's sampling extensions."""

    model: str
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    logit_bias: dict[str, Annotated[float, Meta(ge=-100, le=100)]] | None = None
    max_tokens: NonNegativeInt | None = None
    n: NumChoices | None = None
    seed: Seed | None = None
    stop: Stop | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    user: str | None = None
    # vLLM extensions (sent with the SDK's `extra_body`)
    top_k: Annotated[int, Meta(ge=-1)] | None = None
    min_p: TopP | None = None
    repetition_penalty: Annotated[float, Meta(gt=0.0, le=10.0)] | None = None
    priority: int | None = None
    structured_outputs: StructuredOutputs | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    min_tokens: NonNegativeInt | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[TokenId] | None = None
    response_format: ResponseFormat | None = None


class ChatCompletionRequest(SamplingFields, kw_only=True):
    """POST /v1/chat/completions."""

    messages: Annotated[list[Message], Meta(min_length=1)]
    max_completion_tokens: NonNegativeInt | None = None
    logprobs: bool | None = None
    top_logprobs: TopLogprobs | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    functions: Annotated[list[FunctionDefinition], Meta(min_length=1, max_length=128)] | None = None
    function_call: Literal["none", "auto"] | NamedFunction | None = None
    # accepted OpenAI fields that do not change generation here
    store: bool | None = None
    metadata: dict[str, str] | None = None
    modalities: list[Literal["text", "audio"]] | None = None
    audio: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None
    service_tier: str | None = None
    web_search_options: dict[str, Any] | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    safety_identifier: str | None = None
    moderation: dict[str, Any] | None = None  # refused (`gateway.chat_api.fields`)
    # vLLM chat extensions
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None


class CompletionRequest(SamplingFields, kw_only=True):
    """POST /v1/completions (legacy)."""

    # msgspec allows one array-like type per union, so the four OpenAI shapes (a string, strings,
    # token ids, lists of token ids) are one list of a union; `check_completion` rejects mixtures.
    prompt: str | Annotated[list[str | TokenId | Annotated[list[TokenId], Meta(min_length=1)]], Meta(min_length=1)]
    logprobs: Annotated[int, Meta(ge=0, le=5)] | None = None
    echo: bool | None = None
    best_of: Annotated[int, Meta(ge=0, le=20)] | None = None
    suffix: str | None = None


class TokenizeBody(_Request, kw_only=True):
    """POST /tokenize (vLLM's shape): a `prompt`, or chat `messages`."""

    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Tool] | None = None
    return_token_strs: bool | None = None


class RenderBody(_Request, kw_only=True):
    """POST /switchyard/render: the template inspector."""

    model: str
    messages: Annotated[list[Message], Meta(min_length=1)]
    add_generation_prompt: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Tool] | None = None
    compare: bool | None = None  # every target of the route, side by side


class DetokenizeBody(_Request, kw_only=True):
    model: str | None = None
    tokens: list[TokenId]


# -- responses ----------------------------------------------------------------------------------


class _Response(Struct, kw_only=True, forbid_unknown_fields=True):
    """What the gateway sends. Encoded, never decoded by the gateway: `forbid_unknown_fields`
    only makes the published schema say that no other key appears."""


class PromptTokensDetails(_Response, kw_only=True):
    cached_tokens: int


class CompletionTokensDetails(_Response, kw_only=True):
    reasoning_tokens: int


class UsageBody(_Response, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None  # when the backend tells reasoning apart


class TopLogprobBody(_Response, kw_only=True):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprobBody(_Response, kw_only=True):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprobBody]


class ChoiceLogprobs(_Response, kw_only=True):
    content: list[TokenLogprobBody] | None
    refusal: list[TokenLogprobBody] | None = None


class ToolCallFunctionBody(_Response, kw_only=True):
    name: str
    arguments: str


class ToolCallBody(_Response, kw_only=True):
    id: str
    function: ToolCallFunctionBody
    type: str = "function"


class ChatMessageBody(_Response, kw_only=True):
    role: str = "assistant"
    content: str | None
    refusal: str | None = None
    tool_calls: list[ToolCallBody] | None = None
    # the model's thinking, under the name(s) `server.reasoning_field` picks; absent without any
    reasoning_content: str | msgspec.UnsetType = msgspec.UNSET
    reasoning: str | msgspec.UnsetType = msgspec.UNSET


class ChatChoice(_Response, kw_only=True):
    index: int
    message: ChatMessageBody
    logprobs: ChoiceLogprobs | None
    finish_reason: str | None


class ChatCompletion(_Response, kw_only=True):
    id: str
    object: str = "chat.completion"
    created: int
    model: str
    system_fingerprint: str | None
    choices: list[ChatChoice]
    usage: UsageBody


class CompletionLogprobs(_Response, kw_only=True):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(_Response, kw_only=True):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None


class Completion(_Response, kw_only=True):
    id: str
    object: str = "text_completion"
    created: int
    model: str
    system_fingerprint: str | None
    choices: list[CompletionChoice]
    usage: UsageBody


class ModelCard(_Response, kw_only=True):
    id: str
    object: str = "model"
    created: int
    owned_by: str
    max_model_len: int | None = None


class ModelList(_Response, kw_only=True):
    data: list[ModelCard]
    object: str = "list"


class TokenizeResponse(_Response, kw_only=True):
    count: int
    max_model_len: int | None
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(_Response, kw_only=True):
    prompt: str


class RenderedPrompt(_Response, kw_only=True):
    backend: str
    model: str
    text: str
    tokens: list[int]
    token_strs: list[str] | None


class RenderResponse(_Response, kw_only=True):
    model: str
    renders: list[RenderedPrompt]
    # index of the first token where the renders differ; None when all are identical
    first_difference: int | None


class HealthStatus(_Response, kw_only=True):
    status: Literal["ok", "ready", "unavailable"]


# -- stream chunks (written by `gateway/chat_api/chunks.py`; these structs describe them in the schema) -------


class ChunkFunction(_Response, kw_only=True):
    name: str | msgspec.UnsetType = msgspec.UNSET  # with a call's first fragment only
    arguments: str


class ChunkToolCall(_Response, kw_only=True):
    index: int
    id: str | msgspec.UnsetType = msgspec.UNSET  # with a call's first fragment only
    type: Literal["function"] | msgspec.UnsetType = msgspec.UNSET
    function: ChunkFunction


class ChunkDelta(_Response, kw_only=True):
    role: Literal["assistant"] | msgspec.UnsetType = msgspec.UNSET  # the first chunk of a choice
    content: str | msgspec.UnsetType = msgspec.UNSET
    reasoning_content: str | msgspec.UnsetType = msgspec.UNSET  # see `server.reasoning_field`
    reasoning: str | msgspec.UnsetType = msgspec.UNSET
    tool_calls: list[ChunkToolCall] | msgspec.UnsetType = msgspec.UNSET


class ChatChunkChoice(_Response, kw_only=True):
    index: int
    delta: ChunkDelta
    logprobs: ChoiceLogprobs | None
    finish_reason: Literal["stop", "length", "tool_calls"] | None


class ChatCompletionChunk(_Response, kw_only=True):
    """One `data:` event of a chat stream; the usage chunk has empty `choices`. `usage` is
    present (null on the other chunks) only with `stream_options.include_usage`."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    system_fingerprint: str | None
    choices: list[ChatChunkChoice]
    usage: UsageBody | None | msgspec.UnsetType = msgspec.UNSET


class CompletionChunkChoice(_Response, kw_only=True):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: Literal["stop", "length", "tool_calls"] | None


class CompletionChunk(_Response, kw_only=True):
    """One `data:` event of a legacy completions stream."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    system_fingerprint: str | None
    choices: list[CompletionChunkChoice]
    usage: UsageBody | None | msgspec.UnsetType = msgspec.UNSET



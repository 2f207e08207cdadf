"""The one internal interface between the gateway and every backend.

The gateway turns a validated HTTP request into a `RequestSpec`; a backend turns that spec into
an async stream of events; the gateway alone turns events into bytes. Events per request:

    TextDelta / ReasoningDelta / ToolCallDelta ...   (any number, per choice `index`)
    Finish(index, reason)           (exactly one per choice)
    Usage(...)                      (exactly one, last)

Embeddings are no generation: a backend that serves them also has `embed(EmbedRequest) ->
EmbedResult` (see `EmbeddingBackend`) and says so in `Capabilities.supports_embeddings`; the
gateway answers a clear 400 for a backend without it.

A failure is raised as a `plugins.contract.errors.SwitchyardError` from the iterator, before or after the
first event. Closing the iterator (`aclose()`) cancels the request: a backend frees what the
request held (sequences, KV blocks, the upstream connection) in its `finally`, and a backend
with an `in_flight()` method (`ReportsInFlight`) counts it no longer.

Which replica served is the attempt's outcome, not part of the request: a backend that serves
from several replicas returns an iterator with a `served_by` attribute (`ReportsServedBy`),
which the gateway reads for the request log and the trace. Nothing writes into the
`RequestSpec` a backend is given.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Literal, Protocol, runtime_checkable

import msgspec

FinishReason = Literal["stop", "length", "tool_calls"]

# vLLM-style extension fields a client may send in the body; a backend lists the ones it honours
# in `Capabilities.extensions`, and the gateway refuses the others with a 400 before routing.
EXTENSIONS: frozenset[str] = frozenset(
    {
        "top_k",
        "min_p",
        "repetition_penalty",
        "priority",
        "structured_outputs",
        "chat_template",
        "chat_template_kwargs",
        "add_generation_prompt",
        "continue_final_message",
        "include_stop_str_in_output",
        "skip_special_tokens",
        "min_tokens",
        "ignore_eos",
        "stop_token_ids",
        "continuous_usage_stats",
    }
)


class Sampling(msgspec.Struct, frozen=True, kw_only=True):
    """A request's sampling knobs (`RequestSpec.sampling`), with the OpenAI defaults filled in by
    the gateway, so one request means the same on every engine. `None` means "not limited" /
    "not set", never a magic int. (The built-in engine's own per-request parameters are
    `builtin_engine.scheduling.sampling_params.SamplingParams`.)"""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    max_tokens: int | None = None  # None: the rest of the context
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    logprobs: bool = False
    top_logprobs: int = 0


class RequestSpec(msgspec.Struct, kw_only=True):
    """A validated request, resolved to one backend and its upstream model name.

    `messages` are plain JSON-like dicts in OpenAI's shape (what chat templates and upstream
    servers consume). Exactly one of `messages` (kind "chat") and `prompt` (kind "completion")
    is set. `extensions` names the extension fields the client actually sent. Kind "embedding"
    carries neither: it routes and accounts an embeddings request, whose inputs go to the
    backend's `embed()` in an `EmbedRequest`; `generate` never sees it.

    `session` names the conversation a coding agent's request belongs to (its turns resend one
    growing prefix): the body's own id where the API has one (`prompt_cache_key` in chat and
    Responses, `session_id` in Messages' `metadata.user_id`), else the `X-Claude-Code-Session-Id`
    or `session-id` header (`gateway.http.sessions`). A routing hint, never part of the prompt:
    a `sticky` route's `session` key and `prefix_cache`'s session table read it.
    """

    request_id: str
    kind: Literal["chat", "completion", "embedding"]
    model: str  # the name the client asked for
    upstream_model: str  # the name the backend knows the model by
    sampling: Sampling
    messages: list[dict[str, Any]] | None = None
    prompt: str | list[int] | None = None
    stream: bool = False
    include_usage: bool = False
    continuous_usage_stats: bool = False
    priority: int = 0
    echo: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    user: str | None = None
    session: str | None = None  # the agent session it belongs to (see above); None: none said
    extensions: frozenset[str] = frozenset()
    headers: dict[str, str] = {}  # selected client headers (routing keys), the W3C trace context; never auth headers
    # the output limit the client asked for, where its route (`over_max_tokens = "clamp"`) lowered
    # it to `sampling.max_tokens`: the gateway says so in a response header; backends ignore it
    max_tokens_asked: int | None = None


class TopLogprob(msgspec.Struct, frozen=True):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(msgspec.Struct, frozen=True):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = []


class TextDelta(msgspec.Struct, frozen=True, tag="text"):
    """New text for choice `index`. `text` may be empty only when `logprobs` carry tokens whose
    text is held back (a partial UTF-8 character or a possible stop string)."""

    text: str
    index: int = 0
    token_ids: tuple[int, ...] = ()
    logprobs: list[TokenLogprob] | None = None


class ReasoningDelta(msgspec.Struct, frozen=True, tag="reasoning"):
    """New reasoning ("thinking") text for choice `index`, kept apart from the answer: a
    backend's reasoning parser splits it off (e.g. `<think>...</think>`); the front-ends send it
    as `reasoning_content`, Responses `reasoning` items or Messages `thinking` blocks."""

    text: str
    index: int = 0
    token_ids: tuple[int, ...] = ()


class ToolCallDelta(msgspec.Struct, frozen=True, tag="tool_call"):
    """A fragment of tool call `tool_index` of choice `index`: `id` and `name` come with the
    first fragment of a call, `arguments` is appended to what came before."""

    tool_index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None
    index: int = 0


class Finish(msgspec.Struct, frozen=True, tag="finish"):
    """`stop_sequence`: the stop string that ended the choice (reason "stop"), when one did and
    the backend can tell (Anthropic's `stop_reason: "stop_sequence"` needs it); else None."""

    reason: FinishReason
    index: int = 0
    stop_sequence: str | None = None


class Usage(msgspec.Struct, frozen=True, tag="usage"):
    """Counted by the backend: `prompt_tokens` after the chat template, `completion_tokens`
    summed over all choices; `cached_tokens` is None when the backend cannot tell."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None  # of completion_tokens; None when not told apart


Event = TextDelta | ReasoningDelta | ToolCallDelta | Finish | Usage


class Capabilities(msgspec.Struct, frozen=True, kw_only=True):
    extensions: frozenset[str] = frozenset()
    reports_cached_tokens: bool = False
    max_model_len: int | None = None
    max_n: int | None = None  # None: no limit beyond the gateway's own
    supports_tools: bool = False
    # OpenAI's JSON `response_format` (json_object / json_schema), apart from vLLM's
    # `structured_outputs` extension: a hosted OpenAI API honours the one, not the other
    supports_response_format: bool = False
    supports_logprobs: bool = False
    supports_completions: bool = True
    supports_embeddings: bool = False  # has `embed()` (see `EmbeddingBackend`)


class ModelInfo(msgspec.Struct, frozen=True, kw_only=True):
    id: str  # the backend's own model name (upstream_model)
    max_model_len: int | None = None
    owned_by: str = "switchyard"
    created: int = 0


class TokenizeRequest(msgspec.Struct, kw_only=True):
    """vLLM's /tokenize: either `prompt` or chat `messages`."""

    upstream_model: str
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    return_token_strs: bool = False


class TokenizeResult(msgspec.Struct, kw_only=True):
    tokens: list[int]
    max_model_len: int | None = None
    token_strs: list[str] | None = None


class EmbedRequest(msgspec.Struct, kw_only=True):
    """Embed each of `inputs` (a text, or token ids) with `upstream_model`. `dimensions`: the
    length the client wants (matryoshka truncation), None for the model's own; a backend whose
    model cannot shorten its vectors raises `InvalidRequest(param="dimensions")`."""

    request_id: str
    upstream_model: str
    inputs: list[str] | list[list[int]]
    dimensions: int | None = None
    user: str | None = None
    headers: dict[str, str] = {}  # as `RequestSpec.headers`: the W3C trace context for a proxied upstream


class EmbedResult(msgspec.Struct, kw_only=True):
    """One vector per input, in the inputs' order; `prompt_tokens` counts every input's tokens."""

    embeddings: list[list[float]]
    prompt_tokens: int


class Rendered(msgspec.Struct, kw_only=True):
    """What the template inspector shows: the prompt text a backend builds for a conversation
    and its token ids, exactly as a chat request would use them."""

    text: str
    tokens: list[int]
    token_strs: list[str] | None = None


@runtime_checkable
class Backend(Protocol):
    """What a backend plugin hands the gateway. `name` is the `[[backends]]` name in
    plugins.toml. All methods but `capabilities` and `name` are async."""

    name: str

    def capabilities(self) -> Capabilities: ...

    async def start(self) -> None:
        """Acquire resources (load weights, open connection pools). Called once in lifespan."""

    async def models(self) -> list[ModelInfo]: ...

    def generate(self, spec: RequestSpec) -> AsyncIterator[Event]:
        """The request's events (the grammar at the top of this module); a backend with
        replicas says on the iterator which one served (`ReportsServedBy`)."""

    async def health(self) -> bool: ...

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResult: ...

    async def detokenize(self, upstream_model: str, tokens: list[int]) -> str: ...

    async def render(
        self,
        upstream_model: str,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> Rendered:
        """The chat prompt as this backend builds it (template inspector). Backends that cannot
        tell raise `InvalidRequest`."""

    async def close(self) -> None: ...


@runtime_checkable
class ReportsInFlight(Protocol):
    """Optional for a backend: `in_flight()` is the number of requests it still holds resources
    for (engine sequences, open upstream responses, worker tasks), 0 once every `generate()` it
    began has ended or been closed and freed what it held. Cheap and non-blocking (called on the
    event loop); the conformance battery's cancellation check reads it."""

    def in_flight(self) -> int: ...


@runtime_checkable
class ReportsServedBy(Protocol):
    """Optional for the iterator `generate()` returns: `served_by` is the replica the attempt
    went to (its base URL) once the backend has picked it — after a failure before the first
    event, the replica tried last — and stays readable after the iterator ended or was closed.
    None while no replica was picked. A backend of one server or process has no replicas and
    leaves the attribute out (the gateway reads it as None); a wrapper around a backend's
    iterator (e.g. `plugins.parsers.reasoning.split_reasoning`) passes it on."""

    @property
    def served_by(self) -> str | None: ...


@runtime_checkable
class EmbeddingBackend(Protocol):
    """The optional method of a backend that serves `/v1/embeddings` (with
    `Capabilities.supports_embeddings` True). Cancelling the call (the client went away) must
    free what the request holds."""

    async def embed(self, request: EmbedRequest) -> EmbedResult: ...

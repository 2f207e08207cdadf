"""Events → Anthropic's wire shapes: the SSE stream, the whole `message`, the error object.

A stream is, in this order (SSE `event:` names as Anthropic sends them):

    message_start                                   (empty content, stop_reason null)
    content_block_start / ping (once, after the first block starts) / content_block_delta...
    content_block_stop                              (per block: thinking, text, tool_use)
    message_delta                                   (stop_reason, stop_sequence, usage)
    message_stop

A block ends when another kind of content begins, and the next one takes the next index. The
prompt's token counts are not known before the backend's `Usage` (the last event), so
`message_start` carries zeros and `message_delta` the counts (`input_tokens` too; the official
clients take it from there). A failure after the first byte ends the stream with an `error`
event. A thinking block gets an opaque `signature` (a random one: nothing here verifies it, and
one sent back is ignored); with `thinking.display: "omitted"` it carries no text (`omit_thinking`).
"""

from __future__ import annotations

import msgspec

from gateway.errors import ErrorResponse, status_and_type
from gateway.ids import token_hex
from gateway.messages_api import schemas as M
from gateway.messages_api.errors import error_response, overflow_message
from plugins.contract.errors import ContextLengthExceeded, SwitchyardError, UpstreamError
from plugins.contract.protocol import Event, Finish, ReasoningDelta, RequestSpec, TextDelta, ToolCallDelta, Usage

_encode = msgspec.json.Encoder().encode

def message_id() -> str:
    return "msg_" + token_hex(12)


def usage_body(usage: Usage) -> M.Usage:
    cached = usage.cached_tokens
    return M.Usage(
        input_tokens=usage.prompt_tokens - (cached or 0),
        output_tokens=usage.completion_tokens,
        cache_read_input_tokens=cached,
    )


def stop_reason(finish: str | None, stop_sequence: str | None, called_tools: bool) -> M.StopReason:
    """Anthropic's stop reason. A named tool choice finishes "stop" (as in vLLM): a call made
    is `tool_use` all the same."""
    if finish == "length":
        return "max_tokens"
    if stop_sequence is not None:
        return "stop_sequence"
    if finish == "tool_calls" or called_tools:
        return "tool_use"
    return "end_turn"


def _sse(name: bytes, event: M.StreamEvent) -> bytes:
    return b"event: " + name + b"\ndata: " + _encode(event) + b"\n\n"


_PING = _sse(b"ping", M.Ping())
_MESSAGE_STOP = _sse(b"message_stop", M.MessageStop())


class MessageStream:
    """One streamed message (a `gateway.service.stream_feed.StreamWriter`): which block is open (its kind
    and index), the tool calls seen, the finish."""

    def __init__(self, spec: RequestSpec, *, omit_thinking: bool = False) -> None:
        self.spec = spec
        self.omit_thinking = omit_thinking
        self.finished_with: Finish | None = None
        self.block: str | None = None  # "thinking" | "text" | "tool_use:<tool index>"
        self.index = -1  # of the open (or last) block
        self.pinged = False
        self.called_tools = False

    def start(self, first: list[Event]) -> bytes:
        message = M.MessageResponse(
            id=message_id(), model=self.spec.model, content=[], stop_reason=None, stop_sequence=None,
            usage=M.Usage(input_tokens=0, output_tokens=0),
        )
        return _sse(b"message_start", M.MessageStart(message=message))

    def feed(self, batch: list[Event]) -> bytes:
        out: list[bytes] = []
        for event in batch:
            if isinstance(event, TextDelta):
                if event.text:
                    out.append(self._open("text", M.TextContent(text="")))
                    out.append(self._delta(M.TextDelta(text=event.text)))
            elif isinstance(event, ReasoningDelta):
                if event.text:
                    out.append(self._open("thinking", M.ThinkingContent(thinking="", signature="")))
                    if not self.omit_thinking:
                        out.append(self._delta(M.ThinkingDelta(thinking=event.text)))
            elif isinstance(event, ToolCallDelta):
                out.append(self._tool_call(event))
            elif isinstance(event, Finish):
                if self.finished_with is not None:
                    raise UpstreamError("The backend finished the message twice.", kind="bad_gateway")
                self.finished_with = event
        return b"".join(out)

    def _tool_call(self, event: ToolCallDelta) -> bytes:
        out = b""
        key = f"tool_use:{event.tool_index}"
        if self.block != key:
            if event.id is None or event.name is None:
                raise UpstreamError("The backend continued a tool call it never started.", kind="bad_gateway")
            self.called_tools = True
            out = self._open(key, M.ToolUseContent(id=event.id, name=event.name, input={}))
        if event.arguments:
            out += self._delta(M.InputJSONDelta(partial_json=event.arguments))
        return out

    def _open(self, kind: str, block: M.Content) -> bytes:
        """Start a block of `kind` unless one is open (closing the open block of another kind)."""
        if self.block == kind:
            return b""
        out = self._close()
        self.block = kind
        self.index += 1
        out += _sse(b"content_block_start", M.ContentBlockStart(index=self.index, content_block=block))
        if not self.pinged:
            self.pinged = True
            out += _PING
        return out

    def _delta(self, delta: M.TextDelta | M.InputJSONDelta | M.ThinkingDelta | M.SignatureDelta) -> bytes:
        return _sse(b"content_block_delta", M.ContentBlockDelta(index=self.index, delta=delta))

    def _close(self) -> bytes:
        if self.block is None:
            return b""
        out = b""
        if self.block == "thinking":
            out = self._delta(M.SignatureDelta(signature=token_hex(16)))
        self.block = None
        return out + _sse(b"content_block_stop", M.ContentBlockStop(index=self.index))

    async def finish(self, usage: Usage) -> bytes:
        finish = self.finished_with
        if finish is None:
            raise UpstreamError("The backend ended without finishing the message.", kind="bad_gateway")
        out = self._close()
        if not self.pinged:
            out += _PING
        reason = stop_reason(finish.reason, finish.stop_sequence, self.called_tools)
        delta = M.StopDelta(stop_reason=reason, stop_sequence=finish.stop_sequence if reason == "stop_sequence" else None)
        return out + _sse(b"message_delta", M.MessageDelta(delta=delta, usage=usage_body(usage))) + _MESSAGE_STOP

    async def error(self, error: SwitchyardError, payload: ErrorResponse) -> bytes:
        message = payload.error.message
        if isinstance(error, ContextLengthExceeded):
            message = overflow_message(error, self.spec.sampling.max_tokens, message)
        return _sse(b"error", error_response(status_and_type(error)[0], message))


class MessageSink:
    """A message that does not stream, assembled from its events (a `gateway.service.attempts.EventSink`)."""

    def __init__(self, *, omit_thinking: bool = False) -> None:
        self.omit_thinking = omit_thinking
        self.reasoning: list[str] = []
        self.text: list[str] = []
        self.calls: dict[int, dict[str, str]] = {}  # tool index -> id, name, arguments
        self.finished_with: Finish | None = None

    def feed(self, event: Event) -> None:
        if isinstance(event, TextDelta):
            self.text.append(event.text)
        elif isinstance(event, ReasoningDelta):
            self.reasoning.append(event.text)
        elif isinstance(event, ToolCallDelta):
            call = self.calls.setdefault(event.tool_index, {"id": "", "name": "", "arguments": ""})
            call["id"] = event.id or call["id"]
            call["name"] = event.name or call["name"]
            call["arguments"] += event.arguments
        elif isinstance(event, Finish):
            if self.finished_with is not None:
                raise UpstreamError("The backend finished the message twice.", kind="bad_gateway")
            self.finished_with = event

    def check_complete(self, backend: str) -> None:
        if self.finished_with is None:
            raise UpstreamError(f"Backend `{backend}` ended without finishing the message.", kind="bad_gateway")

    def message(self, spec: RequestSpec, usage: Usage) -> M.MessageResponse:
        """The whole message; empty text is left out."""
        finish = self.finished_with
        assert finish is not None
        content: list[M.Content] = []
        reasoning, text = "".join(self.reasoning), "".join(self.text)
        if reasoning:
            content.append(M.ThinkingContent(thinking="" if self.omit_thinking else reasoning, signature=token_hex(16)))
        if text:
            content.append(M.TextContent(text=text))
        for _, call in sorted(self.calls.items()):
            content.append(M.ToolUseContent(id=call["id"] or "toolu_" + token_hex(12), name=call["name"],
                                            input=_arguments(call["arguments"])))
        reason = stop_reason(finish.reason, finish.stop_sequence, bool(self.calls))
        return M.MessageResponse(
            id=message_id(), model=spec.model, content=content, stop_reason=reason,
            stop_sequence=finish.stop_sequence if reason == "stop_sequence" else None, usage=usage_body(usage),
        )


def _arguments(text: str) -> dict:
    """A call's arguments as the object Anthropic's `input` is; `{}` for text that is no JSON
    object (a call cut short by max_tokens: `stop_reason` says so)."""
    try:
        value = msgspec.json.decode(text) if text.strip() else {}
    except msgspec.DecodeError:
        return {}
    return value if isinstance(value, dict) else {}

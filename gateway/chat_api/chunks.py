"""Server-Sent Events for chat and legacy completion streams.

`ChunkEncoder` pre-encodes the part of every chunk that is the same for the whole request (id,
created, model, fingerprint) once, so each delta costs one small string encode and a join; a
plain text delta (no logprobs, not the last) one encode and one `%` into a whole-chunk template.
"""

from __future__ import annotations

import msgspec

from gateway.errors import ErrorResponse
from plugins.contract.protocol import TokenLogprob, ToolCallDelta, Usage

DONE = b"data: [DONE]\n\n"

_encode = msgspec.json.Encoder().encode


def error_event(payload: ErrorResponse) -> bytes:
    return b"data: " + _encode(payload) + b"\n\n"


def usage_json(usage: Usage) -> bytes:
    total = usage.prompt_tokens + usage.completion_tokens
    body = b'{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d' % (
        usage.prompt_tokens,
        usage.completion_tokens,
        total,
    )
    if usage.cached_tokens is not None:
        body += b',"prompt_tokens_details":{"cached_tokens":%d}' % usage.cached_tokens
    if usage.reasoning_tokens is not None:
        body += b',"completion_tokens_details":{"reasoning_tokens":%d}' % usage.reasoning_tokens
    return body + b"}"


def _finish(reason: str | None) -> bytes:
    return b"null" if reason is None else b'"' + reason.encode() + b'"'


def chat_logprobs_json(logprobs: list[TokenLogprob] | None) -> bytes:
    if logprobs is None:
        return b"null"
    return b'{"content":' + _encode(logprobs) + b',"refusal":null}'


class ChunkEncoder:
    """Encodes `chat.completion.chunk` or `text_completion` stream events for one request."""

    __slots__ = ("chat", "_reasoning_keys", "_head", "_tail", "_plain_text")

    def __init__(self, *, id: str, created: int, model: str, fingerprint: str, chat: bool, include_usage: bool,
                 reasoning_field: str = "both") -> None:
        obj = b"chat.completion.chunk" if chat else b"text_completion"
        self.chat = chat
        names = ("reasoning_content", "reasoning") if reasoning_field == "both" else (reasoning_field,)
        self._reasoning_keys = [b'"' + name.encode() + b'":' for name in names]
        self._head = (
            b'data: {"id":'
            + _encode(id)
            + b',"object":"'
            + obj
            + b'","created":%d,"model":' % created
            + _encode(model)
            + b',"system_fingerprint":'
            + _encode(fingerprint)
            + b',"choices":['
        )
        self._set_tail(b'],"usage":null}\n\n' if include_usage else b"]}\n\n")

    def _set_tail(self, tail: bytes) -> None:
        self._tail = tail
        choice = b'{"index":%d,"delta":{"content":%b}' if self.chat else b'{"index":%d,"text":%b'
        self._plain_text = (self._head.replace(b"%", b"%%") + choice + b',"logprobs":null,"finish_reason":null}'
                            + tail.replace(b"%", b"%%"))

    def role(self, index: int) -> bytes:
        return (
            self._head
            + b'{"index":%d,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}' % index
            + self._tail
        )

    def plain_text(self, index: int, text: str) -> bytes:
        """`text(index, text)` of a non-empty text without logprobs or finish reason."""
        return self._plain_text % (index, _encode(text))

    def text(self, index: int, text: str, logprobs: bytes = b"null", finish: str | None = None) -> bytes:
        if text and finish is None and logprobs == b"null":
            return self.plain_text(index, text)
        if self.chat:
            delta = b'{"content":' + _encode(text) + b"}" if text else b"{}"
            choice = b'{"index":%d,"delta":' % index + delta
        else:
            choice = b'{"index":%d,"text":' % index + _encode(text)
        return self._head + choice + b',"logprobs":' + logprobs + b',"finish_reason":' + _finish(finish) + b"}" + self._tail

    def set_usage(self, usage: Usage) -> None:
        """`stream_options.continuous_usage_stats`: the chunks from now on carry this usage."""
        self._set_tail(b'],"usage":' + usage_json(usage) + b"}\n\n")

    def reasoning(self, index: int, text: str) -> bytes:
        value = _encode(text)
        delta = b",".join(key + value for key in self._reasoning_keys)
        return self._head + b'{"index":%d,"delta":{' % index + delta + b'},"logprobs":null,"finish_reason":null}' + self._tail

    def tool_call(self, delta: ToolCallDelta) -> bytes:
        call: dict[str, object] = {"index": delta.tool_index}
        function: dict[str, str] = {"arguments": delta.arguments}
        if delta.id is not None:
            call["id"] = delta.id
            call["type"] = "function"
        if delta.name is not None:
            function["name"] = delta.name
        call["function"] = function
        choice = b'{"index":%d,"delta":{"tool_calls":[' % delta.index + _encode(call) + b"]}"
        return self._head + choice + b',"logprobs":null,"finish_reason":null}' + self._tail

    def usage(self, usage: Usage) -> bytes:
        return self._head + b'],"usage":' + usage_json(usage) + b"}\n\n"

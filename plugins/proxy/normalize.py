"""OpenAI-compatible upstream responses → the gateway's protocol events and typed errors.

`StreamNormalizer` turns an upstream's chunks (`chat.completion.chunk` / `text_completion`, one
SSE `data` each, or a whole non-streamed object) into TextDelta / ReasoningDelta /
ToolCallDelta / Finish / Usage (an error event, through `plugins.proxy.errors`). Done once
here for every proxy backend (`plugins.proxy.backend`), whichever server (vLLM, llama.cpp, any
OpenAI-compatible one) sent them.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import msgspec

from plugins.contract.errors import UpstreamError
from plugins.contract.protocol import (
    Event,
    Finish,
    ReasoningDelta,
    RequestSpec,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    Usage,
)
from plugins.proxy.errors import map_upstream_error, status_of_error_event

_json_decode = msgspec.json.Decoder().decode
_json_encode = msgspec.json.Encoder().encode

# ------------------------------------------------------------------------------- normalizer

_FINISH = {
    "stop": "stop",
    "eos": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "content_filter": "stop",  # not in protocol.FinishReason (yet)
}


def _logprobs(raw: Any) -> list[TokenLogprob] | None:
    """Chat `{"content": [...]}` items (llama.cpp's extra `id` dropped) or legacy completions'
    `{"tokens", "token_logprobs", "top_logprobs"}` → TokenLogprob list."""
    if not isinstance(raw, dict):
        return None
    content = raw.get("content")
    if isinstance(content, list):
        out = []
        for item in content:
            top = [
                TopLogprob(token=t.get("token", ""), logprob=float(t.get("logprob", 0.0)), bytes=t.get("bytes"))
                for t in item.get("top_logprobs") or ()
            ]
            out.append(TokenLogprob(token=item.get("token", ""), logprob=float(item.get("logprob", 0.0)),
                                    bytes=item.get("bytes"), top_logprobs=top))
        return out or None
    tokens = raw.get("tokens")
    if isinstance(tokens, list):
        lps = raw.get("token_logprobs") or []
        tops = raw.get("top_logprobs") or []
        out = []
        for i, token in enumerate(tokens):
            lp = lps[i] if i < len(lps) and lps[i] is not None else 0.0
            top_map = tops[i] if i < len(tops) and isinstance(tops[i], dict) else {}
            top = [TopLogprob(token=k, logprob=float(v)) for k, v in top_map.items()]
            out.append(TokenLogprob(token=token, logprob=float(lp), bytes=list(token.encode()), top_logprobs=top))
        return out or None
    return None


def _stop_string(matched: Any, verbose: Any) -> str | None:
    """The stop string that ended a choice: vLLM's `stop_reason` (a string; a stop token id is
    an int), or llama.cpp's `__verbose.stopping_word` (sent when the request has `verbose`)."""
    if isinstance(matched, str) and matched:
        return matched
    if isinstance(verbose, dict) and verbose.get("stop_type") == "word":
        word = verbose.get("stopping_word")
        return word if isinstance(word, str) and word else None
    return None


def usage_from(raw: dict, timings: Any = None) -> Usage:
    details = raw.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if cached is None and isinstance(timings, dict) and isinstance(timings.get("cache_n"), int):
        cached = timings["cache_n"]  # llama.cpp builds without prompt_tokens_details
    completion = raw.get("completion_tokens_details")
    reasoning = completion.get("reasoning_tokens") if isinstance(completion, dict) else None
    return Usage(
        prompt_tokens=int(raw.get("prompt_tokens") or 0),
        completion_tokens=int(raw.get("completion_tokens") or 0),
        cached_tokens=None if cached is None else int(cached),
        reasoning_tokens=int(reasoning) if isinstance(reasoning, int) else None,
    )


class _Delta(msgspec.Struct):
    content: Any = None
    reasoning: Any = None
    reasoning_content: Any = None
    tool_calls: Any = None


class _Choice(msgspec.Struct):
    index: Any = 0
    delta: _Delta | None = None
    message: Any = None
    text: Any = None
    logprobs: Any = None
    finish_reason: Any = None
    stop_reason: Any = None


class _Chunk(msgspec.Struct):
    """The fields of a stream chunk the normalizer reads, decoded straight into attributes; a
    chunk that does not fit (a `choices` that is not a list of objects...) is read as a dict."""

    choices: list[_Choice] | None = None
    usage: Any = None
    timings: Any = None
    error: Any = msgspec.UNSET
    verbose: Any = msgspec.field(default=None, name="__verbose")


_decode_chunk = msgspec.json.Decoder(_Chunk).decode


class StreamNormalizer:
    """Upstream chunks (`chat.completion.chunk` / `text_completion`, one SSE `data` each) →
    protocol events. Text with a `finish_reason` in the same chunk comes out as TextDelta then
    Finish; empty deltas are dropped; the usage (whichever chunk carries it: vLLM's and
    llama.cpp's `choices: []` chunk, llama.cpp's last /v1/completions chunk) comes out once, by
    `finish()`, after the stream ended."""

    def __init__(self, *, kind: str, n: int, backend: str, spec: RequestSpec | None = None,
                 content_calls: Callable[[], Any] | None = None) -> None:
        """`content_calls`: for a tool_choice the gateway enforced itself with a grammar, a
        factory of the `plugins.parsers.tools` parser that reads the upstream's content
        as tool calls (one per choice)."""
        self.chat = kind == "chat"
        self.n = n
        self.backend = backend
        self.spec = spec
        self.finished: set[int] = set()
        self.usage: Usage | None = None
        self.done = False  # `data: [DONE]` seen
        self.tool_named: dict[tuple[int, int], bool] = {}  # (choice, tool index) -> its name went out
        self.content_calls = content_calls
        self.content_parsers: dict[int, Any] = {}

    def feed_data(self, data: str | bytes) -> list[Event]:
        """One SSE event's data: text, or its raw UTF-8 bytes (`SSEParser.whole_data`)."""
        if (data == b"[DONE]") if type(data) is bytes else (data == "[DONE]"):
            self.done = True
            return []
        try:
            chunk = _decode_chunk(data)
        except msgspec.DecodeError:  # not JSON, or not of a chunk's usual shape
            chunk = None
        if chunk is not None and (chunk.error is msgspec.UNSET or chunk.choices):  # (an error event: as a dict)
            try:
                events = self._feed_chunk(chunk)
            except (AttributeError, TypeError, ValueError, KeyError, IndexError) as exc:
                raise self._shape_error(exc) from None
            if events is not None:
                return events
        return self._feed_json(data)

    def plain_token(self, data: bytes) -> tuple[int, str] | None:
        """The choice index and text of `data` when it is a plain token (almost every chunk of a
        stream): `feed_data(data)` would give exactly `[TextDelta(text=text, index=index)]`, and
        calling it instead changes nothing either. None for any other data: `feed_data` it."""
        if self.content_calls is not None or data[:1] != b"{":
            return None
        try:
            chunk = _decode_chunk(data)
        except msgspec.DecodeError:
            return None
        choices = chunk.choices
        if choices is None or len(choices) != 1 or chunk.usage is not None or chunk.error is not msgspec.UNSET:
            return None
        choice = choices[0]
        if choice.logprobs is not None or choice.finish_reason:
            return None
        if self.chat:
            delta = choice.delta
            if (delta is None or choice.message is not None or delta.reasoning is not None
                    or delta.reasoning_content is not None or delta.tool_calls is not None):
                return None
            text = delta.content
        else:
            text = choice.text
        index = choice.index
        if type(text) is not str or not text or type(index) is not int or index in self.finished or index >= self.n:
            return None
        return index, text

    def _feed_json(self, data: str | bytes) -> list[Event]:
        """`feed_data` for whatever JSON the data holds (as a dict, checked field by field)."""
        try:
            obj = _json_decode(data)
        except msgspec.DecodeError:
            if type(data) is bytes:  # as text (bad UTF-8 replaced, as SSE reads it), or its error
                return self._feed_json(data.decode("utf-8", errors="replace"))
            raise UpstreamError(f"Backend `{self.backend}` sent an event that is not JSON: {data[:200]!r}",
                                kind="bad_gateway") from None
        if not isinstance(obj, dict):
            raise UpstreamError(f"Backend `{self.backend}` sent an unexpected event: {data[:200]!r}", kind="bad_gateway")
        return self.feed(obj)

    def feed(self, obj: dict) -> list[Event]:
        """One chunk's events. A chunk of the wrong shape (`choices` not a list of objects, a
        token count that is not a number...) is the upstream's fault like bad JSON is: an
        `UpstreamError`, never a TypeError escaping as a 500 or cutting a stream short."""
        try:
            return self._feed(obj)
        except (AttributeError, TypeError, ValueError, KeyError, IndexError) as exc:
            raise self._shape_error(exc) from None

    def _shape_error(self, exc: Exception) -> UpstreamError:
        return UpstreamError(f"Backend `{self.backend}` sent a chunk of an unexpected shape "
                             f"({type(exc).__name__}: {exc}).", kind="bad_gateway")

    def _feed(self, obj: dict) -> list[Event]:
        if "error" in obj and not obj.get("choices"):
            raise map_upstream_error(status_of_error_event(obj), obj, backend=self.backend, spec=self.spec)
        events: list[Event] = []
        for choice in obj.get("choices") or ():
            index = choice.get("index", 0)
            if not self._takes(index):
                continue
            if self.chat:
                delta = choice.get("delta") or choice.get("message") or {}
                text = delta.get("content")
                # vLLM >= 0.10 names it `reasoning`; llama.cpp, DeepSeek and older vLLM `reasoning_content`
                reasoning = delta.get("reasoning") or delta.get("reasoning_content")
                calls = delta.get("tool_calls")
            else:
                text, reasoning, calls = choice.get("text"), None, None
            ending = _Choice(logprobs=choice.get("logprobs"), finish_reason=choice.get("finish_reason"),
                             stop_reason=choice.get("stop_reason"))
            self._choice(events, index, text, reasoning, calls, ending, obj.get("__verbose"))
        self._usage(events, obj.get("usage"), obj.get("timings"))
        return events

    def _feed_chunk(self, chunk: _Chunk) -> list[Event] | None:
        """`_feed` for a chunk decoded into `_Chunk` (the same events, without a dict per
        object); None when it must be read as a dict after all (a chat choice with a `message`)."""
        choices = chunk.choices or ()
        chat = self.chat
        if chat:
            for choice in choices:
                if choice.message is not None:
                    return None  # (read only when `delta` is empty: a dict tells)
        events: list[Event] = []
        plain = self.content_calls is None
        for choice in choices:
            index = choice.index
            if not self._takes(index):
                continue
            if not chat:
                self._choice(events, index, choice.text, None, None, choice, chunk.verbose)
            elif (delta := choice.delta) is None:
                self._choice(events, index, None, None, None, choice, chunk.verbose)
            elif (plain and delta.reasoning is None and delta.reasoning_content is None and delta.tool_calls is None
                  and choice.logprobs is None and not choice.finish_reason):
                if text := delta.content:  # a plain token (almost every chunk): `_choice` would give this
                    events.append(TextDelta(text=text, index=index))
            else:
                self._choice(events, index, delta.content, delta.reasoning or delta.reasoning_content, delta.tool_calls,
                             choice, chunk.verbose)
        if chunk.usage is not None:
            self._usage(events, chunk.usage, chunk.timings)
        return events

    def _takes(self, index: Any) -> bool:
        """Whether a choice at `index` is read (not one that finished already)."""
        if not isinstance(index, int) or index in self.finished:
            return False
        if index >= self.n:
            raise UpstreamError(f"Backend `{self.backend}` sent choice {index} of {self.n}.", kind="bad_gateway")
        return True

    def _choice(self, events: list[Event], index: int, text: Any, reasoning: Any, calls: Any, choice: _Choice,
                verbose: Any) -> None:
        """One choice's events from its text (or completion text), reasoning, tool calls, and
        `choice`'s logprobs, finish reason and stop reason (llama.cpp's in the chunk's `verbose`)."""
        raw_logprobs, reason = choice.logprobs, choice.finish_reason
        if isinstance(reasoning, str) and reasoning:
            events.append(ReasoningDelta(text=reasoning, index=index))
        if calls:
            events += self._tool_calls(index, calls)
        logprobs = None if raw_logprobs is None else _logprobs(raw_logprobs)
        if self.chat and self.content_calls is not None:
            text = self._content_calls(index, text or "", events, ended=bool(reason))
        if text or logprobs:
            events.append(TextDelta(text=text or "", index=index, logprobs=logprobs))
        if reason:
            reason = self._reason(reason)
            parser = self.content_parsers.get(index)
            if reason == "stop" and parser is not None and parser.num_calls and parser.calls_finish_as_tool_calls:
                reason = "tool_calls"
            stop_sequence = _stop_string(choice.stop_reason, verbose) if reason == "stop" else None
            events.append(Finish(reason=reason, index=index, stop_sequence=stop_sequence))  # type: ignore[arg-type]
            self.finished.add(index)

    def _usage(self, events: list[Event], usage: Any, timings: Any) -> None:
        if isinstance(usage, dict):
            self.usage = usage_from(usage, timings)
            if self.spec is not None and self.spec.continuous_usage_stats:
                events.append(self.usage)

    def _content_calls(self, index: int, text: str, events: list[Event], *, ended: bool) -> str:
        """Content read as tool calls (`content_calls`): the calls go into `events`; what is
        left as content is returned."""
        parser = self.content_parsers.get(index)
        if parser is None:
            assert self.content_calls is not None
            parser = self.content_parsers[index] = self.content_calls()
        pieces = (parser.feed(text) if text else []) + (parser.finish() if ended else [])
        content = []
        for piece in pieces:
            if isinstance(piece, str):
                content.append(piece)
            else:
                events.append(ToolCallDelta(tool_index=piece.tool_index, arguments=piece.arguments, id=piece.id,
                                            name=piece.name, index=index))
        return "".join(content)

    def _tool_calls(self, index: int, calls: Any) -> list[ToolCallDelta]:
        """Upstream tool-call deltas in one shape: a call's first delta carries its id (made up
        when the upstream sent none) and function name, later ones only argument text (ids and
        names an upstream repeats are dropped). A whole message's calls have no `index`: their
        position is it."""
        out: list[ToolCallDelta] = []
        for position, call in enumerate(calls if isinstance(calls, list) else ()):
            if not isinstance(call, dict):
                continue
            tool_index = call.get("index")
            tool_index = tool_index if isinstance(tool_index, int) else position
            fn = call.get("function") if isinstance(call.get("function"), dict) else {}
            args = fn.get("arguments")
            if args is not None and not isinstance(args, str):  # an object instead of its JSON text
                args = _json_encode(args).decode()
            name = fn.get("name") if isinstance(fn.get("name"), str) else None
            key = (index, tool_index)
            if key not in self.tool_named:
                self.tool_named[key] = bool(name)
                call_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else None
                out.append(ToolCallDelta(tool_index=tool_index, arguments=args or "",
                                         id=call_id or f"call_{uuid.uuid4().hex[:24]}", name=name or None, index=index))
            elif args or (name and not self.tool_named[key]):
                send_name = name if name and not self.tool_named[key] else None
                self.tool_named[key] = self.tool_named[key] or bool(name)
                out.append(ToolCallDelta(tool_index=tool_index, arguments=args or "", name=send_name, index=index))
        return out

    def feed_response(self, obj: dict) -> list[Event]:
        """A whole non-streamed `chat.completion` / `text_completion` object (`message` is
        read like a delta)."""
        return self.feed(obj)

    def _reason(self, reason: str) -> str:
        if reason in ("abort", "error"):
            raise UpstreamError(f"Backend `{self.backend}` ended the generation with finish_reason {reason!r}.",
                                kind="bad_gateway")
        return _FINISH.get(reason, "stop")

    def finish(self) -> Usage:
        missing = set(range(self.n)) - self.finished
        if missing:
            raise UpstreamError(f"Backend `{self.backend}` ended the stream before choice {min(missing)} finished.",
                                kind="bad_gateway")
        if self.usage is None:
            raise UpstreamError(f"Backend `{self.backend}` sent no usage although it was asked for "
                                "(`stream_options.include_usage`).", kind="bad_gateway")
        return self.usage

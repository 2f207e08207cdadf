"""Reasoning parsers: a model's thinking split from its answer, for any backend.

A backend that generates plain text (the built-in engine, an upstream that does not split it
itself) runs its `TextDelta`s through a `ReasoningSplitter`, which turns the thinking into
`ReasoningDelta`s; every front-end then shows those its own way (`reasoning_content` on chat
completions, `reasoning` items on Responses, `thinking` blocks on Messages).

Parsers (`reasoning_parser` in a backend's options):
- `deepseek_r1`: the output starts inside the reasoning (the chat template opened `<think>`);
  an optional leading `<think>` is dropped, everything up to `</think>` is reasoning, the rest is
  the answer. Without `</think>` the whole output is reasoning (as vLLM's parser reads it).
- `auto`: chosen from the chat template: a template that writes `<think>` gets the tag parser,
  starting inside the reasoning only when the rendered prompt ends with an open `<think>`
  (otherwise a leading `<think>` in the output opens it); any other template gets none.
- `none`: the output is all answer.
`chat_template_kwargs.enable_thinking = false` turns parsing off for one request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Literal

from plugins.contract.protocol import Event, Finish, ReasoningDelta, TextDelta, Usage

ReasoningParserName = Literal["none", "deepseek_r1", "auto"]
REASONING_PARSERS: tuple[str, ...] = ("none", "deepseek_r1", "auto")

START_TAG = "<think>"
END_TAG = "</think>"


class ThinkTagParser:
    """`<think>...</think>` read incrementally from text deltas: `feed` returns (reasoning,
    answer) text for each delta, holding back a tail that may be the start of a tag."""

    def __init__(self, *, in_reasoning: bool) -> None:
        self.in_reasoning = in_reasoning
        self.phase: Literal["start", "reasoning", "answer"] = "start"
        self._held = ""

    @property
    def reasoning_open(self) -> bool:
        """Whether text fed now would be reasoning (the tag parser has not left it yet)."""
        return self.phase == "reasoning" or (self.phase == "start" and self.in_reasoning)

    def feed(self, text: str) -> tuple[str, str]:
        buffer = self._held + text
        self._held = ""
        if self.phase == "start":
            stripped = buffer.lstrip()
            if stripped.startswith(START_TAG):
                buffer = stripped[len(START_TAG) :]
                self.phase = "reasoning"
            elif START_TAG.startswith(stripped):  # still maybe a `<think>` (or only whitespace yet)
                self._held = buffer
                return "", ""
            else:
                self.phase = "reasoning" if self.in_reasoning else "answer"
        if self.phase == "answer":
            return "", buffer
        end = buffer.find(END_TAG)
        if end >= 0:
            self.phase = "answer"
            return buffer[:end], buffer[end + len(END_TAG) :]
        keep = _partial_suffix(buffer, END_TAG)
        if keep:
            self._held = buffer[-keep:]
            buffer = buffer[:-keep]
        return buffer, ""

    def finish(self) -> tuple[str, str]:
        """The held-back tail once the output ended."""
        held, self._held = self._held, ""
        return (held, "") if self.reasoning_open else ("", held)


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of `text` that is a proper start of `tag`."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


def thinking_disabled(chat_template_kwargs: Mapping[str, Any] | None) -> bool:
    return bool(chat_template_kwargs) and chat_template_kwargs.get("enable_thinking") is False  # type: ignore[union-attr]


def choose_parser(name: str, *, template_source: str | None, prompt_text: str | None,
                  chat_template_kwargs: Mapping[str, Any] | None = None) -> Callable[[], ThinkTagParser] | None:
    """The parser factory for one request (one parser per choice), or None: no parsing."""
    if name == "none" or thinking_disabled(chat_template_kwargs):
        return None
    if name == "deepseek_r1":
        return lambda: ThinkTagParser(in_reasoning=True)
    if template_source is None or START_TAG not in template_source:
        return None
    opened = prompt_text is not None and prompt_text.rstrip().endswith(START_TAG)
    return lambda: ThinkTagParser(in_reasoning=opened)


class ReasoningSplitter:
    """Turns a backend's events into reasoning and answer events, one parser per choice.

    `TextDelta`s go in; `ReasoningDelta`s and `TextDelta`s come out (token ids with the first
    piece, logprobs only with answer text); a choice's held-back tail is flushed before its
    `Finish`. `usage()` adds `reasoning_tokens`: the tokens of the deltas that arrived while the
    choice was still reasoning (when the backend sends token ids)."""

    def __init__(self, factory: Callable[[], ThinkTagParser]) -> None:
        self._factory = factory
        self._parsers: dict[int, ThinkTagParser] = {}
        self.reasoning_tokens = 0
        self._counted = False  # some delta carried token ids

    def feed(self, event: Event) -> list[Event]:
        if isinstance(event, TextDelta):
            parser = self._parser(event.index)
            if event.token_ids:
                self._counted = True
                if parser.reasoning_open:
                    self.reasoning_tokens += len(event.token_ids)
            reasoning, answer = parser.feed(event.text)
            return _pieces(event.index, reasoning, answer, event.token_ids, event.logprobs)
        if isinstance(event, Finish):
            parser = self._parsers.get(event.index)
            if parser is None:
                return [event]
            reasoning, answer = parser.finish()
            return [*_pieces(event.index, reasoning, answer, (), None), event]
        if isinstance(event, Usage):
            return [self.usage(event)]
        return [event]

    def _parser(self, index: int) -> ThinkTagParser:
        parser = self._parsers.get(index)
        if parser is None:
            parser = self._parsers[index] = self._factory()
        return parser

    def usage(self, usage: Usage) -> Usage:
        if usage.reasoning_tokens is not None or not self._counted:
            return usage
        return Usage(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
                     cached_tokens=usage.cached_tokens, reasoning_tokens=min(self.reasoning_tokens, usage.completion_tokens))


def _pieces(index: int, reasoning: str, answer: str, token_ids: tuple[int, ...], logprobs: Any) -> list[Event]:
    out: list[Event] = []
    if reasoning:
        out.append(ReasoningDelta(text=reasoning, index=index, token_ids=token_ids))
        token_ids = ()
    if answer or (logprobs and not reasoning):
        out.append(TextDelta(text=answer, index=index, token_ids=token_ids, logprobs=logprobs))
    return out


def split_reasoning(events: AsyncIterator[Event], splitter: ReasoningSplitter) -> SplitEvents:
    """`events` through `splitter`; closing this closes `events` (which cancels the request)."""
    return SplitEvents(events, splitter)


class SplitEvents:
    """A backend's events through a `ReasoningSplitter`. Its end, a failure or `aclose()`
    closes the backend's iterator; `served_by` is that iterator's
    (`plugins.contract.protocol.ReportsServedBy`), None when it has none."""

    __slots__ = ("_events", "_splitter", "_ready")

    def __init__(self, events: AsyncIterator[Event], splitter: ReasoningSplitter) -> None:
        self._events = events
        self._splitter = splitter
        self._ready: list[Event] = []  # split from the last event, not handed out yet

    @property
    def served_by(self) -> str | None:
        return getattr(self._events, "served_by", None)

    def __aiter__(self) -> SplitEvents:
        return self

    async def __anext__(self) -> Event:
        while not self._ready:
            try:
                self._ready = self._splitter.feed(await anext(self._events))
            except BaseException:  # its end (StopAsyncIteration), a failure, a cancellation
                await self.aclose()
                raise
        return self._ready.pop(0)

    async def aclose(self) -> None:
        await self._events.aclose()  # type: ignore[attr-defined]

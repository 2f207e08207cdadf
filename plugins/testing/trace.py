"""What one request did: the events a backend yielded, the error it raised, how long it took;
the one way the battery prints an event sequence; and `Failed`, a check's failure shown by the
traces behind it."""

from __future__ import annotations

from dataclasses import dataclass, field

from plugins.contract.protocol import Event, Finish, ReasoningDelta, RequestSpec, TextDelta, ToolCallDelta, Usage

SHOWN_HEAD = 24  # events printed from the start of a long sequence
SHOWN_TAIL = 8  # and from its end


class Failed(Exception):
    """The backend broke the check's rule: `message` says how, in plain words; `traces` are the
    requests that show it (their event sequences go into the verdict)."""

    def __init__(self, message: str, *traces: Trace) -> None:
        super().__init__(message)
        self.message = message
        self.traces = traces


@dataclass
class Trace:
    spec: RequestSpec
    label: str  # what was asked, in words ("chat, stream, n=2")
    events: list[Event] = field(default_factory=list)
    error: BaseException | None = None
    elapsed_s: float = 0.0
    served_by: object = None  # the stream's `served_by` once it ended (`ReportsServedBy`), when it has one

    def text(self, index: int = 0) -> str:
        return "".join(e.text for e in self.events if isinstance(e, TextDelta) and e.index == index)

    def finish(self, index: int = 0) -> str | None:
        """The choice's finish reason (its first Finish; how many there are is event_grammar's business)."""
        return next((e.reason for e in self.events if isinstance(e, Finish) and e.index == index), None)

    @property
    def usage(self) -> Usage | None:
        usages = [e for e in self.events if isinstance(e, Usage)]
        return usages[-1] if usages else None

    def ok(self, what: str = "") -> Trace:
        """This trace, or `Failed` when the request raised or ended without a Finish and a Usage."""
        if self.error is not None:
            raise Failed(f"{what or self.label}: the backend raised {describe_error(self.error)}", self)
        if self.usage is None or not any(isinstance(e, Finish) for e in self.events):
            raise Failed(f"{what or self.label}: the stream ended without a Finish and a Usage", self)
        return self

    def show(self) -> str:
        lines = [f"{self.label} ({self.elapsed_s:.2f} s):"]
        shown = [show_event(e) for e in self.events]
        if len(shown) > SHOWN_HEAD + SHOWN_TAIL:
            hidden = len(shown) - SHOWN_HEAD - SHOWN_TAIL
            shown = [*shown[:SHOWN_HEAD], f"... {hidden} more events ...", *shown[-SHOWN_TAIL:]]
        lines += [f"  {line}" for line in shown] or ["  (no events)"]
        if self.error is not None:
            lines.append(f"  raised {describe_error(self.error)}")
        return "\n".join(lines)


def show_event(event: object) -> str:
    if isinstance(event, TextDelta):
        return f"TextDelta[{event.index}] {event.text!r}" + (" +logprobs" if event.logprobs else "")
    if isinstance(event, ReasoningDelta):
        return f"ReasoningDelta[{event.index}] {event.text!r}"
    if isinstance(event, ToolCallDelta):
        head = f" id={event.id!r} name={event.name!r}" if event.id or event.name else ""
        return f"ToolCallDelta[{event.index}.{event.tool_index}]{head} {event.arguments!r}"
    if isinstance(event, Finish):
        return f"Finish[{event.index}] {event.reason}" + (f" {event.stop_sequence!r}" if event.stop_sequence else "")
    if isinstance(event, Usage):
        reasoning = "" if event.reasoning_tokens is None else f" reasoning={event.reasoning_tokens}"
        return (f"Usage prompt={event.prompt_tokens} completion={event.completion_tokens} "
                f"cached={event.cached_tokens}{reasoning}")
    return f"{type(event).__name__} (not a protocol event) {event!r:.120}"


def describe_error(error: BaseException) -> str:
    message = getattr(error, "message", None) or str(error)
    return f"{type(error).__module__}.{type(error).__qualname__}: {message[:300]}"

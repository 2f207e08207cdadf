"""Serving one Responses request over the shared machinery (`gateway.service.attempts`): the typed SSE
stream, the non-streamed response object, storing the finished response before the client sees
its end (so a follow-up with `previous_response_id` always finds it), and cancelling a
response in flight."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from gateway.errors import ErrorBody, ErrorResponse
from gateway.responses_api import response_schemas as R
from gateway.responses_api.encode import OutputBuilder, usage_body
from gateway.responses_api.reasoning_seal import ReasoningSeal
from gateway.responses_api.store import ResponseStore, StoredResponse
from gateway.responses_api.tools import ChatTools
from gateway.service.accounting import RequestAccounting
from gateway.service.attempts import Answer, collect_events, open_events, stream_body
from gateway.service.gateway import EventPump, Gateway
from plugins.contract.errors import ContextLengthExceeded, SwitchyardError
from plugins.contract.protocol import Event, RequestSpec, Usage

_encode = msgspec.json.Encoder().encode


class ResponseCancelled(SwitchyardError):
    """`POST /v1/responses/{id}/cancel` ended the response."""

    def __init__(self) -> None:
        super().__init__("The response was cancelled.", code="response_cancelled")


@dataclass
class InFlight:
    """A response being generated in this process: its pump (to cancel it) and its end."""

    pump: EventPump | None = None
    done: asyncio.Future[R.Response] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


@dataclass
class ResponsesState:
    """The Responses API's share of the app (`app.state.responses`): the store, the seal of
    reasoning items' `encrypted_content`, the responses in flight here."""

    store: ResponseStore | None
    seal: ReasoningSeal | None = None
    in_flight: dict[str, InFlight] = field(default_factory=dict)

    def cancel(self, response_id: str) -> InFlight | None:
        entry = self.in_flight.get(response_id)
        if entry is not None and entry.pump is not None:
            entry.pump.interrupt(ResponseCancelled())
        return entry


@dataclass
class Turn:
    """One request's response frame (everything but status, output and usage), what it stores
    (the conversation up to and including this turn's input), the tools the model was given
    (to name its calls) and the seal of its reasoning (None: not asked for)."""

    frame: R.Response
    conversation: list[dict[str, Any]]
    store: bool
    tools: ChatTools = field(default_factory=ChatTools)
    seal: ReasoningSeal | None = None

    def builder(self, *, stream: bool) -> OutputBuilder:
        return OutputBuilder(stream=stream, tools=self.tools, seal=self.seal)

    def response(self, status: R.Status, builder: OutputBuilder | None = None, usage: Usage | None = None,
                 error: R.ResponseError | None = None) -> R.Response:
        incomplete = R.IncompleteDetails(reason="max_output_tokens") if status == "incomplete" else None
        return msgspec.structs.replace(
            self.frame,
            status=status,
            output=list(builder.items) if builder is not None else [],
            usage=None if usage is None else usage_body(usage),
            error=error,
            incomplete_details=incomplete,
            completed_at=int(time.time()) if status == "completed" else None,
        )


def _final_status(builder: OutputBuilder) -> R.Status:
    return "incomplete" if builder.incomplete else "completed"


async def _finish_turn(state: ResponsesState, turn: Turn, response: R.Response, builder: OutputBuilder) -> None:
    entry = state.in_flight.pop(turn.frame.id, None)
    if turn.store and state.store is not None:
        conversation = turn.conversation + builder.chat_messages()
        await state.store.put(StoredResponse(response=response, conversation=conversation))
    if entry is not None and not entry.done.done():
        entry.done.set_result(response)


def _error_of(error: SwitchyardError, payload: ErrorResponse) -> tuple[R.Status, R.ResponseError]:
    if isinstance(error, ResponseCancelled):
        return "cancelled", R.ResponseError(code="cancelled", message=error.message)
    return "failed", R.ResponseError(code=payload.error.code or payload.error.type, message=payload.error.message)


class _StreamWriter:
    """`response.created`, `response.in_progress`, the builder's item events, and one of
    `response.completed` / `response.incomplete` / `response.failed` (a cancelled response
    ends with `response.failed` whose response has status "cancelled"); every event with
    `event:` and a `sequence_number`, counted from 0."""

    def __init__(self, state: ResponsesState, turn: Turn) -> None:
        self.state = state
        self.turn = turn
        self.builder = turn.builder(stream=True)
        self.sequence = 0

    def _sse(self, events: list[R._Event]) -> bytes:
        out = []
        for event in events:
            event.sequence_number = self.sequence
            self.sequence += 1
            out.append(b"event: " + event.__struct_config__.tag.encode() + b"\ndata: " + _encode(event) + b"\n\n")  # type: ignore[union-attr]
        return b"".join(out)

    def start(self, first: list[Event]) -> bytes:
        frame = self.turn.response("in_progress")
        return self._sse([R.ResponseCreated(sequence_number=0, response=frame),
                          R.ResponseInProgress(sequence_number=0, response=frame)])

    def feed(self, batch: list[Event]) -> bytes:
        for event in batch:
            self.builder.feed(event)
        return self._sse(self.builder.take_events())

    async def finish(self, usage: Usage) -> bytes:
        self.builder.check_complete("the backend")
        status = _final_status(self.builder)
        response = self.turn.response(status, self.builder, usage)
        await _finish_turn(self.state, self.turn, response, self.builder)
        end = R.ResponseIncomplete if status == "incomplete" else R.ResponseCompleted
        return self._sse(self.builder.take_events() + [end(sequence_number=0, response=response)])

    async def error(self, error: SwitchyardError, payload: ErrorResponse) -> bytes:
        self.builder.close()
        status, body = _error_of(error, payload)
        response = self.turn.response(status, self.builder, error=body)
        await _finish_turn(self.state, self.turn, response, self.builder)
        return self._sse(self.builder.take_events() + [R.ResponseFailed(sequence_number=0, response=response)])


def _registered(state: ResponsesState, turn: Turn) -> InFlight:
    entry = InFlight()
    state.in_flight[turn.frame.id] = entry
    return entry


async def open_stream(gateway: Gateway, spec: RequestSpec, state: ResponsesState, turn: Turn,
                      accounting: RequestAccounting | None = None) -> Answer:
    entry = _registered(state, turn)
    writer = _StreamWriter(state, turn)
    try:
        opened = await open_events(gateway, spec, on_pump=lambda pump: setattr(entry, "pump", pump), accounting=accounting)
    except ResponseCancelled as exc:
        return Answer(body=_cancelled_early(writer, exc), backend="")
    except ContextLengthExceeded as exc:
        _forget(state, turn)
        raise _too_long(exc) from None
    except BaseException:
        _forget(state, turn)
        raise
    return Answer(body=_until_done(state, turn, stream_body(opened, writer)), backend=opened.backend)


def _too_long(error: ContextLengthExceeded) -> ContextLengthExceeded:
    """A prompt too long, told before the stream began: a 400 naming `input` (code
    `context_length_exceeded`, which Codex keys on as it does on a `response.failed` with that
    code: either way its next turn compacts the conversation first)."""
    return ContextLengthExceeded(error.message, param="input", prompt_tokens=error.prompt_tokens,
                                 max_model_len=error.max_model_len)


async def _cancelled_early(writer: _StreamWriter, error: ResponseCancelled) -> Any:
    """The stream of a response cancelled before its first token."""
    yield writer.start([]) + await writer.error(error, ErrorResponse(error=_NO_ERROR))


_NO_ERROR = ErrorBody(message="", type="", param=None, code=None)


def _forget(state: ResponsesState, turn: Turn) -> None:
    entry = state.in_flight.pop(turn.frame.id, None)
    if entry is not None and not entry.done.done():
        entry.done.set_result(turn.response("failed"))


async def _until_done(state: ResponsesState, turn: Turn, body: Any) -> Any:
    try:
        async for chunk in body:
            yield chunk
    finally:
        _forget(state, turn)  # when the client went away mid-stream


async def collect(gateway: Gateway, spec: RequestSpec, state: ResponsesState, turn: Turn,
                  accounting: RequestAccounting | None = None) -> Answer:
    entry = _registered(state, turn)
    builders: list[OutputBuilder] = []

    def new_builder() -> OutputBuilder:
        builders.append(turn.builder(stream=False))
        return builders[-1]

    try:
        builder, usage, backend = await collect_events(gateway, spec, new_builder, on_pump=lambda pump: setattr(entry, "pump", pump),
                                                       accounting=accounting)
    except ResponseCancelled as exc:
        builder = builders[-1] if builders else turn.builder(stream=False)
        builder.close()
        response = turn.response("cancelled", builder, error=R.ResponseError(code="cancelled", message=exc.message))
        await _finish_turn(state, turn, response, builder)
        return Answer(body=response, backend="")
    except ContextLengthExceeded as exc:
        _forget(state, turn)
        raise _too_long(exc) from None
    except BaseException:
        _forget(state, turn)
        raise
    response = turn.response(_final_status(builder), builder, usage)
    await _finish_turn(state, turn, response, builder)
    return Answer(body=response, backend=backend)

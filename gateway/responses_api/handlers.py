"""The HTTP handlers of the Responses API and the lifespan that opens its store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import msgspec
from litestar import Litestar, Request, Response, delete, get, post
from litestar.datastructures import State
from litestar.params import FromPath

from gateway.config import StoreConfig
from gateway.http.common import answer, authorize, decode_body, response_headers
from gateway.responses_api import respond as service
from gateway.responses_api import response_schemas as O
from gateway.responses_api import schemas as R
from gateway.responses_api import translate
from gateway.responses_api.fields import RESPONSES_FIELDS
from gateway.responses_api.reasoning_seal import load_seal
from gateway.responses_api.store import open_store
from gateway.service.admission import check_messages
from gateway.service.gateway import Gateway
from plugins.contract.errors import InvalidRequest, NotFound

CANCEL_WAIT_S = 10.0  # how long a cancel waits for the response to end before answering
DROPPED_TOOLS_HEADER = "x-switchyard-dropped-tools"  # the hosted tool types left out (`hosted_tools = "drop"`)


def _state(state: State) -> service.ResponsesState:
    return state.responses


def _not_found(response_id: str, param: str | None = None) -> NotFound:
    return NotFound(f"Response with id {response_id!r} not found.", param=param, code="response_not_found")


@post("/v1/responses", status_code=200, summary="Create a model response (OpenAI Responses API).")
async def create_response(request: Request, state: State) -> Response:
    req = await decode_body(request, R.ResponsesRequest)
    gateway: Gateway = state.gateway
    responses = _state(state)
    authorize(request, req.model)
    translate.check_request(req)
    RESPONSES_FIELDS.screen(req, gateway.metrics.ignored_fields)
    history: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        previous = await responses.store.get(req.previous_response_id) if responses.store is not None else None
        if previous is None:
            raise _not_found(req.previous_response_id, "previous_response_id")
        history = previous.conversation
    items = translate.input_items(req)
    limits = gateway.limits_for(req.model)
    tools = translate.request_tools(req, items, limits.hosted_tools)
    all_turns = req.reasoning is not None and req.reasoning.context == "all_turns"
    turn_messages = translate.to_messages(items, translate.call_ids(history), seal=responses.seal, all_turns=all_turns)
    check_messages(len(history) + len(turn_messages), gateway.config.server.max_messages)
    spec = translate.to_spec(req, request_id=request.state.request_id, history=history, turn=turn_messages, tools=tools,
                             limits=limits)
    stored = req.store is not False and responses.store is not None
    sealing = responses.seal if req.include and "reasoning.encrypted_content" in req.include else None
    turn = service.Turn(frame=translate.response_frame(req, spec, stored=stored, tools=tools),
                        conversation=history + turn_messages, store=stored, tools=tools, seal=sealing)
    for kind in tools.dropped:
        gateway.metrics.dropped_tools.labels("responses", kind).inc()
    response = await answer(request, gateway, spec, _bound(service.open_stream, responses, turn),
                            _bound(service.collect, responses, turn))
    if tools.dropped:
        response.headers[DROPPED_TOOLS_HEADER] = ", ".join(tools.dropped)
    return response


def _bound(fn: Callable[..., Any], responses: service.ResponsesState, turn: service.Turn) -> Callable[..., Any]:
    return lambda gateway, spec, accounting: fn(gateway, spec, responses, turn, accounting)


@get("/v1/responses/{response_id:str}", summary="Retrieve a stored response.")
async def get_response(request: Request, state: State, response_id: FromPath[str]) -> Response:
    store = _state(state).store
    stored = await store.get(response_id) if store is not None else None
    if stored is None:
        raise _not_found(response_id)
    authorize(request, stored.response.model)
    return _json(request, stored.response)


@delete("/v1/responses/{response_id:str}", status_code=200, summary="Delete a stored response.")
async def delete_response(request: Request, state: State, response_id: FromPath[str]) -> Response:
    store = _state(state).store
    stored = await store.get(response_id) if store is not None else None
    if stored is None or store is None:
        raise _not_found(response_id)
    authorize(request, stored.response.model)
    await store.delete(response_id)
    return _json(request, O.DeletedResponse(id=response_id))


@post("/v1/responses/{response_id:str}/cancel", status_code=200, summary="Cancel a response in progress.")
async def cancel_response(request: Request, state: State, response_id: FromPath[str]) -> Response:
    """Ends a response this gateway process is generating (its stream ends with status
    "cancelled"); a finished response cannot be cancelled."""
    responses = _state(state)
    entry = responses.cancel(response_id)
    if entry is not None:
        try:
            response = await asyncio.wait_for(asyncio.shield(entry.done), CANCEL_WAIT_S)
        except TimeoutError:
            raise InvalidRequest(f"Response {response_id!r} did not stop within {CANCEL_WAIT_S:g} s.") from None
        return _json(request, response)
    stored = await responses.store.get(response_id) if responses.store is not None else None
    if stored is None:
        raise _not_found(response_id)
    raise InvalidRequest(f"Response {response_id!r} is {stored.response.status}; only a response in progress can be cancelled.",
                         param="response_id")


def _json(request: Request, body: msgspec.Struct) -> Response:
    return Response(content=msgspec.json.encode(body), media_type="application/json", headers=response_headers(request))


HANDLERS = [create_response, get_response, delete_response, cancel_response]


def lifespan(config: StoreConfig) -> Callable[[Litestar], AbstractAsyncContextManager[None]]:
    """Opens the response store and reads (or makes) the reasoning seal's key at start-up (a bad
    path or an unreachable server stops it, naming the key) and closes the store at shutdown."""

    @asynccontextmanager
    async def run(app: Litestar) -> AsyncIterator[None]:
        seal = await asyncio.to_thread(load_seal, config.reasoning_key_file)
        store = await open_store(config)
        app.state.responses = service.ResponsesState(store=store, seal=seal)
        try:
            yield
        finally:
            if store is not None:
                await store.close()

    return run

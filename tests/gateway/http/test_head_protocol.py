"""gateway/http/head_protocol.py: uvicorn's request cycle with the response head written together with
the first body piece: the same bytes in one write less."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from gateway.http.head_protocol import _HeadWithBodyCycle

pytestmark = pytest.mark.anyio


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


START = {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
PIECES = [b"data: one\n\n", b"data: two\n\n", b"data: [DONE]\n\n"]


async def _serve(cycle_class: type[RequestResponseCycle], *, keep_alive: bool) -> RecordingTransport:
    transport = RecordingTransport()
    log = logging.getLogger("test")
    cycle = cycle_class(scope={"method": "POST", "http_version": "1.1"}, transport=transport,  # type: ignore[arg-type]
                        flow=FlowControl(transport), logger=log, access_logger=log, access_log=False,  # type: ignore[arg-type]
                        default_headers=[(b"server", b"uvicorn")], message_event=asyncio.Event(),
                        expect_100_continue=False, keep_alive=keep_alive, on_response=lambda: None)
    messages: list[Any] = [START] + [{"type": "http.response.body", "body": p, "more_body": i < len(PIECES) - 1}
                                     for i, p in enumerate(PIECES)]
    for message in messages:
        await cycle.send(message)
        if message is START:
            assert transport.writes == [] or cycle_class is RequestResponseCycle
    return transport


@pytest.mark.parametrize("keep_alive", [True, False])
async def test_the_head_goes_out_with_the_first_piece_and_the_bytes_are_uvicorns(keep_alive: bool) -> None:
    plain = await _serve(RequestResponseCycle, keep_alive=keep_alive)
    ours = await _serve(_HeadWithBodyCycle, keep_alive=keep_alive)
    assert b"".join(ours.writes) == b"".join(plain.writes)
    assert len(ours.writes) == len(plain.writes) - 1 == len(PIECES)
    assert ours.writes[0].startswith(b"HTTP/1.1 200 OK\r\n") and ours.writes[0].endswith(b"data: one\n\n\r\n")
    assert ours.closed == plain.closed == (not keep_alive)


async def test_a_head_without_a_body_still_goes_out_when_the_app_returns() -> None:
    transport = RecordingTransport()
    log = logging.getLogger("test")
    cycle = _HeadWithBodyCycle(scope={"method": "POST", "http_version": "1.1"}, transport=transport,  # type: ignore[arg-type]
                               flow=FlowControl(transport), logger=log, access_logger=log, access_log=False,  # type: ignore[arg-type]
                               default_headers=[], message_event=asyncio.Event(), expect_100_continue=False,
                               keep_alive=True, on_response=lambda: None)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send(START)

    await cycle.run_asgi(app)
    assert transport.writes and transport.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")

"""Sending on an asyncio ZeroMQ socket without waiting, for the engine process and its clients."""

from __future__ import annotations

import zmq
import zmq.asyncio


def send_now(socket: zmq.asyncio.Socket, frames: list[bytes]) -> None:
    """Send `frames` at once or raise `zmq.ZMQError` (EAGAIN: no peer; EHOSTUNREACH: a ROUTER's
    peer left). Through the asyncio socket itself, never a plain shadow of it: ZeroMQ's file
    descriptor is edge-triggered and a send can consume the edge that announced a reply, so the
    asyncio socket's send (unlike a shadow's) looks for queued input afterwards and wakes the
    pending `recv`, which would otherwise wait forever with messages queued."""
    sent = socket.send_multipart(frames, flags=zmq.NOBLOCK)
    error = sent.exception()
    if error is not None:
        raise error

"""`EngineClient`: the engine's calls (`builtin_engine.process.calls`) made on an engine process
over ZeroMQ, with the same methods as the in-process `EngineService`, so the built-in backend
serves both the same way.

One DEALER socket per client, bound to the event loop that connected it; a reader task hands
each reply to its call (a stream's queue, or a result's future). A socket monitor watches the
connection: when the engine process goes away every call in flight fails at once with
`EngineDeadError` (a stream ends with an error event, a request not yet begun gets 503) and new
calls fail the same way until the engine is back; ZeroMQ reconnects by itself when a restarted
engine binds the address again. Closing a stream early sends `Abort`, which frees the request
in the engine within about one layer's time, as in process.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import zmq
import zmq.asyncio
from zmq.utils.monitor import recv_monitor_message

from builtin_engine.errors import EngineDeadError
from builtin_engine.outputs import RequestOutput
from builtin_engine.process.calls import (
    Abort,
    Describe,
    End,
    EngineInfo,
    EngineStats,
    Envelope,
    Failure,
    Generate,
    Output,
    Reply,
    Result,
    Stats,
    error_of,
)
from builtin_engine.process.zmq_send import send_now

log = logging.getLogger("switchyard.engine_client")

_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(list[Reply])
_END = object()  # a stream's queue item after its last output


class EngineClient:
    snapshot_max_age_s = 15.0

    def __init__(self, address: str, *, name: str) -> None:
        self.address = address
        self.name = name  # the backend's, for logs
        self.info: EngineInfo | None = None
        self.connected = False
        self._context: zmq.asyncio.Context | None = None
        self._socket: zmq.asyncio.Socket | None = None
        self._calls: dict[int, asyncio.Queue[Any] | asyncio.Future[Any]] = {}
        self._last_stats: tuple[EngineStats, float] | None = None
        self._ids = itertools.count(1)
        self._tasks: list[asyncio.Task[None]] = []
        self._connected_event: asyncio.Event | None = None

    # ---- lifecycle ------------------------------------------------------------------------------

    async def connect(self, timeout_s: float) -> None:
        """Connect and learn the engine's limits; waits up to `timeout_s` for the engine."""
        loop = asyncio.get_running_loop()
        self._context = zmq.asyncio.Context()
        socket = self._context.socket(zmq.DEALER)
        socket.setsockopt(zmq.IMMEDIATE, 1)  # no queueing for an engine that is not there: fail at once
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SNDHWM, 0)
        socket.setsockopt(zmq.RCVHWM, 0)
        socket.setsockopt(zmq.RECONNECT_IVL, 100)
        socket.setsockopt(zmq.RECONNECT_IVL_MAX, 200)
        monitor = socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        self._socket = socket
        self._connected_event = asyncio.Event()
        self._tasks = [loop.create_task(self._receive()), loop.create_task(self._watch(monitor))]
        socket.connect(self.address)
        try:
            await asyncio.wait_for(self._connected_event.wait(), timeout_s)
        except TimeoutError:
            await self.close()
            raise EngineDeadError(f"no engine answered at {self.address} within {timeout_s:g} s") from None
        self.info = await self.describe()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        self._fail_all(EngineDeadError("the engine client was closed"))
        if self._socket is not None:
            self._socket.disable_monitor()
            self._socket.close(linger=0)
        if self._context is not None:
            self._context.term()
        self._socket = self._context = None
        self.connected = False

    @property
    def max_model_len(self) -> int:
        assert self.info is not None
        return self.info.max_model_len

    # ---- the calls ------------------------------------------------------------------------------

    def generate(self, call: Generate) -> AsyncIterator[RequestOutput]:
        return self.stream(call)

    async def stream(self, call: Any) -> AsyncIterator[Any]:
        """A streamed call's items, as `EngineService.stream` yields them in the engine process."""
        call_id = next(self._ids)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._calls[call_id] = queue
        ended = False
        try:
            self._send(call_id, call)
            while True:
                item = await queue.get()
                if item is _END:
                    ended = True
                    return
                if isinstance(item, BaseException):
                    ended = True
                    raise item
                yield item
        finally:
            self._calls.pop(call_id, None)
            if not ended:
                self._abort(call_id)

    async def describe(self) -> EngineInfo:
        return await self.call(Describe())

    async def stats(self) -> EngineStats:
        stats = await self.call(Stats())
        self._last_stats = (stats, time.monotonic())
        return stats

    def snapshot(self) -> EngineStats | None:
        """The engine process's counts as of the last `stats()` (each health probe asks), or
        None when they are older than `snapshot_max_age_s`."""
        if self._last_stats is None:
            return None
        stats, at = self._last_stats
        return stats if time.monotonic() - at <= self.snapshot_max_age_s else None

    def in_flight(self) -> int:
        """This client's streams still open in the engine process (an engine request each, freed
        there within about a layer's time of its `Abort`); the engine's own count is `stats()`."""
        return sum(isinstance(pending, asyncio.Queue) for pending in self._calls.values())

    def num_unfinished(self) -> int:
        """Requests running or waiting in the engine process, as of the last health probe and
        never below this client's own open calls (those the probe may not have seen yet)."""
        stats = self.snapshot()
        return max(stats.num_unfinished_requests if stats is not None else 0, self.in_flight())

    async def health(self) -> bool:
        return self.connected and (await self.stats()).alive

    async def call(self, call: Any) -> Any:
        """A call's one result (decoded as the call's `result` type), as `EngineService.call`
        returns it in the engine process."""
        call_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = future
        try:
            self._send(call_id, call)
            raw = await future
        finally:
            self._calls.pop(call_id, None)
        return msgspec.msgpack.decode(raw, type=type(call).result)

    def _send(self, call_id: int, call: Any) -> None:
        if not self.connected or self._socket is None:
            raise EngineDeadError(f"the engine process of backend {self.name!r} is not running")
        try:
            send_now(self._socket, [_ENCODER.encode(Envelope(call_id, call))])
        except zmq.ZMQError as exc:  # EAGAIN: no engine connected (IMMEDIATE)
            raise EngineDeadError(f"the engine process of backend {self.name!r} is not reachable: {exc}") from None

    def _abort(self, call_id: int) -> None:
        if self.connected and self._socket is not None:
            try:
                send_now(self._socket, [_ENCODER.encode(Envelope(0, Abort(call_id=call_id, requested_at=time.monotonic())))])
            except zmq.ZMQError:
                pass  # the engine is gone, and the request with it

    # ---- replies and the connection -------------------------------------------------------------

    async def _receive(self) -> None:
        assert self._socket is not None
        while True:
            payload = await self._socket.recv()
            try:
                replies = _DECODER.decode(payload)
            except msgspec.DecodeError as exc:
                log.error("backend %r: dropped a reply the engine client cannot read: %s", self.name, exc)
                continue
            for reply in replies:
                self._deliver(reply)

    def _deliver(self, reply: Reply) -> None:
        pending = self._calls.get(reply.id)
        if pending is None:
            return  # a stream closed meanwhile
        kind = type(reply)
        if kind is Output:
            pending.put_nowait(reply.output)  # type: ignore[union-attr]
        elif kind is End:
            pending.put_nowait(_END)  # type: ignore[union-attr]
        elif isinstance(pending, asyncio.Queue):
            pending.put_nowait(error_of(reply) if kind is Failure else EngineDeadError("a stream got a result"))
        elif not pending.done():
            if kind is Result:
                pending.set_result(reply.value)
            else:
                pending.set_exception(error_of(reply))

    async def _watch(self, monitor: zmq.asyncio.Socket) -> None:
        try:
            while True:
                event = await recv_monitor_message(monitor)
                if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    self.connected = True
                    assert self._connected_event is not None
                    self._connected_event.set()
                    if self.info is not None:
                        log.warning("backend %r: connected to the engine process again", self.name)
                elif event["event"] == zmq.EVENT_DISCONNECTED and self.connected:
                    self.connected = False
                    log.error("backend %r: the engine process went away; %d calls in flight end with an error",
                              self.name, len(self._calls))
                    self._fail_all(EngineDeadError("the engine process went away"))
        finally:
            monitor.close(linger=0)

    def _fail_all(self, error: EngineDeadError) -> None:
        calls, self._calls = self._calls, {}
        for pending in calls.values():
            if isinstance(pending, asyncio.Queue):
                pending.put_nowait(error)
            elif not pending.done():
                pending.set_exception(error)

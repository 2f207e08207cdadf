"""The built-in engine in a process of its own: `python -m builtin_engine.process.server`.

The process reads one `ProcessLaunch` line (JSON) on stdin, loads the engine, binds a ZeroMQ
ROUTER socket at the launch's address and writes `Started` (or `LaunchFailed`, then exits 2) on
stdout. It then serves the engine's calls (`builtin_engine.process.calls`) to any number of
clients, each a DEALER socket in a gateway worker, until its stdin closes (the process that
started it asked it to stop, or died) or it gets SIGTERM: the engine then shuts down and every
stream still open ends with a `Failure` ("dead").

One event loop does the I/O; the engine's step thread hands it each step's outputs, and the
replies ready at once for one client leave in one message. A stream whose client has gone away
(the send finds no such peer) is aborted in the engine, as a client's `Abort` would.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from builtin_engine.process.calls import (
    Abort,
    End,
    Envelope,
    Failure,
    Generate,
    LaunchFailed,
    Output,
    ProcessLaunch,
    Reply,
    Result,
    Started,
    failure_of,
)
from builtin_engine.process.service import RESULTS, STREAMS, EngineService
from builtin_engine.process.zmq_send import send_now

_log = logging.getLogger("switchyard.engine_process")

_DECODER = msgspec.msgpack.Decoder(Envelope)
_ENCODER = msgspec.msgpack.Encoder()


class EngineServer:
    def __init__(self, service: EngineService, socket: zmq.asyncio.Socket) -> None:
        self.service = service
        self.socket = socket
        self._streams: dict[tuple[bytes, int], tuple[asyncio.Task[None], Any]] = {}
        self._outbox: dict[bytes, list[Reply]] = {}
        self._flush_scheduled = False

    async def receive(self) -> None:
        while True:
            identity, payload = await self.socket.recv_multipart()
            try:
                envelope = _DECODER.decode(payload)
            except msgspec.DecodeError as exc:
                _log.error("dropped a message that is no engine call: %s", exc)
                continue
            self.dispatch(identity, envelope.id, envelope.call)

    def dispatch(self, identity: bytes, call_id: int, call: Any) -> None:
        kind = type(call)
        if kind is Abort:
            self.abort(identity, call)
        elif kind in STREAMS:
            task = asyncio.get_running_loop().create_task(self._stream(identity, call_id, self.service.stream(call)))
            self._streams[(identity, call_id)] = (task, call)
        elif kind in RESULTS:
            asyncio.get_running_loop().create_task(self._result(identity, call_id, self.service.call(call)))
        else:
            self.send(identity, Failure(id=call_id, kind="engine", message=f"the engine serves no {kind.__name__} call"))

    def abort(self, identity: bytes, call: Abort) -> None:
        entry = self._streams.pop((identity, call.call_id), None)
        if entry is None:
            return  # it ended already
        task, stream_call = entry
        if isinstance(stream_call, Generate):
            self.service.abort(stream_call.request_id, requested_at=call.requested_at)
        task.cancel()

    def abort_client(self, identity: bytes) -> None:
        """The client is gone: abort every stream it had open."""
        for key in [k for k in self._streams if k[0] == identity]:
            task, call = self._streams.pop(key)
            if isinstance(call, Generate):
                self.service.abort(call.request_id)
            task.cancel()

    async def _stream(self, identity: bytes, call_id: int, items: AsyncIterator[Any]) -> None:
        try:
            async for item in items:
                self.send(identity, Output(call_id, item))
            self.send(identity, End(call_id))
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the client
            self._log_unexpected(exc)
            self.send(identity, failure_of(call_id, exc))
        finally:
            self._streams.pop((identity, call_id), None)

    async def _result(self, identity: bytes, call_id: int, value: Awaitable[Any]) -> None:
        try:
            result = await value
            self.send(identity, Result(call_id, msgspec.Raw(_ENCODER.encode(result))))
        except Exception as exc:  # noqa: BLE001
            self._log_unexpected(exc)
            self.send(identity, failure_of(call_id, exc))

    @staticmethod
    def _log_unexpected(exc: Exception) -> None:
        from builtin_engine.errors import EngineError

        if not isinstance(exc, EngineError):
            _log.error("an engine call failed", exc_info=exc)

    def send(self, identity: bytes, reply: Reply) -> None:
        """Queue a reply; every reply queued in one turn of the loop leaves in one message."""
        self._outbox.setdefault(identity, []).append(reply)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        outbox, self._outbox = self._outbox, {}
        for identity, replies in outbox.items():
            try:
                send_now(self.socket, [identity, _ENCODER.encode(replies)])
            except zmq.ZMQError as exc:
                if exc.errno != errno.EHOSTUNREACH:
                    _log.error("sending to a client failed: %s", exc)
                self.abort_client(identity)


async def serve(service: EngineService, address: str, stop: asyncio.Event) -> None:
    """Serve `service` at `address` until `stop` is set, then shut the engine down."""
    context = zmq.asyncio.Context()
    socket = context.socket(zmq.ROUTER)
    socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to a client that left fails: its streams end
    socket.setsockopt(zmq.SNDHWM, 0)
    socket.setsockopt(zmq.RCVHWM, 0)
    socket.setsockopt(zmq.LINGER, 0)
    socket.bind(address)
    server = EngineServer(service, socket)
    _report(Started(os.getpid()))
    receiver = asyncio.get_running_loop().create_task(server.receive())
    try:
        await stop.wait()
    finally:
        receiver.cancel()
        await service.close()  # streams still open end with EngineDeadError -> Failure("dead")
        await asyncio.sleep(0)  # let them queue their replies
        streams = [task for task, _ in server._streams.values()]
        await asyncio.gather(*streams, return_exceptions=True)
        server.flush()
        socket.close()
        context.term()


def _report(report: Started | LaunchFailed) -> None:
    """Write the launch report on stdout; from then on stdout goes to stderr, so nothing else
    can fill the pipe of a supervisor that no longer reads it."""
    sys.stdout.buffer.write(msgspec.json.encode(report) + b"\n")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())


def _stop_on_stdin_eof(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    def wait() -> None:
        while os.read(sys.stdin.fileno(), 4096):  # the raw fd: a buffered read here would block interpreter exit
            pass
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=wait, name="engine-lifeline", daemon=True).start()


def main() -> int:
    logging.basicConfig(level=os.environ.get("SWITCHYARD_ENGINE_LOG_LEVEL", "INFO").upper(),
                        format="%(asctime)s %(levelname)s engine[%(process)d] %(name)s: %(message)s")
    launch = msgspec.json.decode(sys.stdin.buffer.readline(), type=ProcessLaunch)
    from builtin_engine.errors import UnsupportedModelError
    from builtin_engine.text.tokenizer import TokenizerError

    try:
        service = EngineService.load(launch.engine)
    except (TokenizerError, UnsupportedModelError) as exc:
        _report(LaunchFailed(message=str(exc), param="model"))
        return 2
    except ValueError as exc:
        _report(LaunchFailed(message=str(exc)))
        return 2

    async def run() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        _stop_on_stdin_eof(loop, stop)
        await serve(service, launch.address, stop)

    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(run())
    return 0


def _loop_factory() -> Any:
    try:
        import uvloop  # the gateway's loop (uvicorn[standard]); the engine's I/O costs less on it
    except ImportError:
        return None
    return uvloop.new_event_loop


if __name__ == "__main__":
    sys.exit(main())

"""What a streamed request made is freed by reference counting when it ends: an object that
holds a bound method of itself (a callback kept for later) is a reference cycle, and it and all
it holds (the upstream response, the parser, the request's spec, the client's cycle...) wait for
the cyclic GC, whose young-generation passes at 256 streams took tens of milliseconds each."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import httpx
import pytest

from gateway.chat_api.chunks import ChunkEncoder
from gateway.service.attempts import Observed
from gateway.service.stream_feed import StreamFeed
from plugins.proxy.normalize import StreamNormalizer
from plugins.proxy.stream import UpstreamEvents
from plugins.proxy.upstream import BodyPieces
from plugins.transport.http1 import Response
from plugins.transport.sse import SSEParser
from tests.support.fault_gateway import ENGINES, chat
from tests.support.gateway_thread import GatewayThread
from tests.support.probes import wait_until

PER_REQUEST = (Observed, StreamFeed, ChunkEncoder, UpstreamEvents, BodyPieces, Response, SSEParser, StreamNormalizer)


@pytest.fixture
def no_cyclic_gc() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _alive() -> list[str]:
    return [type(o).__name__ for o in gc.get_objects() if isinstance(o, PER_REQUEST)]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("prompt", ["one two three four", "pace:2 one two three four"])
@pytest.mark.parametrize("stream", [True, False])
def test_a_request_leaves_nothing_for_the_cyclic_gc(gw: GatewayThread, no_cyclic_gc: None, engine: str, prompt: str,
                                                    stream: bool) -> None:
    """A request that ends well, streamed (events pushed from the upstream's reads when paced)
    or not. (A failed one may: an exception's traceback holds the frames that hold it.)"""
    assert wait_until(lambda: not _alive(), timeout=5), _alive()
    body = {**chat(f"m-{engine}", prompt, stream_options={"include_usage": True}), "stream": stream}
    if not stream:
        del body["stream_options"]
    with httpx.Client(base_url=gw.base, timeout=10) as http:
        for _ in range(3):
            resp = http.post("/v1/chat/completions", json=body)
            assert resp.status_code == 200
            assert resp.text.endswith("data: [DONE]\n\n") if stream else resp.json()["choices"]
    assert wait_until(lambda: not _alive(), timeout=5), _alive()

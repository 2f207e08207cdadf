"""A proxied stream read by the gateway's `EventPump` from the request's own task
(`UpstreamEvents.next_batch`): the same events as iterating it, an interrupt (deadline, drain)
while the request waits for the upstream ends it with the interrupt's error and hangs up on the
upstream, and a cancellation (the client went away) stays a cancellation."""

from __future__ import annotations

import asyncio

import pytest

from gateway.service.event_pump import EventPump
from plugins.contract.errors import UpstreamError
from plugins.contract.protocol import Event, TextDelta, Usage
from tests.plugins.proxy.replay import ReplayServer, replay
from tests.plugins.proxy.test_proxy_core import by_event, run, spec, vllm
from tests.support.recordings import find


async def _batches(pump: EventPump) -> list[list[Event]]:
    batches = []
    while (batch := await pump.next_batch()) is not None:
        batches.append(batch)
    return batches


def test_pump_batches_hold_the_same_events_as_iterating() -> None:
    rec = by_event(find("vllm", "05_chat_stream_include_usage"))

    async def main() -> tuple[list[Event], list[Event]]:
        async with ReplayServer(handler=replay(rec)) as server:
            backend = vllm(server.url)
            iterated = [e async for e in backend.generate(spec())]
            pump = EventPump(backend.generate(spec()))
            assert pump._task is None  # read from this task, no pump task
            batches = await _batches(pump)
            await pump.close()
            await backend.close()
            return iterated, [e for batch in batches for e in batch]

    iterated, pumped = run(main())
    assert pumped == iterated
    assert isinstance(pumped[-1], Usage) and sum(isinstance(e, Usage) for e in pumped) == 1


def test_interrupt_while_waiting_ends_with_its_error_and_hangs_up() -> None:
    rec = by_event(find("vllm", "05_chat_stream_include_usage"))
    never = asyncio.Event()

    async def main() -> None:
        async with ReplayServer(handler=replay(rec, pause_after=3, release=never)) as server:
            backend = vllm(server.url)
            pump = EventPump(backend.generate(spec()))
            first = await pump.next_batch()
            assert first and isinstance(first[0], TextDelta)
            error = UpstreamError("the request ran past its deadline", kind="timeout")
            asyncio.get_running_loop().call_later(0.05, pump.interrupt, error)
            with pytest.raises(UpstreamError) as info:
                while await pump.next_batch() is not None:
                    pass
            assert info.value is error
            assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
            await asyncio.wait_for(server.hung_up.wait(), 2)
            await pump.close()
            await backend.close()

    run(main())


def test_a_cancelled_reader_stays_cancelled_and_hangs_up() -> None:
    rec = by_event(find("vllm", "05_chat_stream_include_usage"))
    never = asyncio.Event()

    async def main() -> None:
        async with ReplayServer(handler=replay(rec, pause_after=3, release=never)) as server:
            backend = vllm(server.url)
            pump = EventPump(backend.generate(spec()))
            reader = asyncio.create_task(_batches(pump))
            await asyncio.sleep(0.1)
            reader.cancel()  # what the disconnect watch does when the client goes away
            with pytest.raises(asyncio.CancelledError):
                await reader
            await asyncio.wait_for(server.hung_up.wait(), 2)
            await pump.close()
            await backend.close()

    run(main())


def test_the_pump_knows_its_last_batch() -> None:
    """`exhausted` turns true with the batch that carries the usage (so that batch can go out
    with the end of the response), for a proxied stream and for a backend read by a task."""
    rec = by_event(find("vllm", "05_chat_stream_include_usage"))

    async def engine() -> object:
        yield TextDelta(text="a", index=0)
        yield Usage(prompt_tokens=1, completion_tokens=1)

    async def seen(pump: EventPump) -> list[tuple[bool, bool]]:
        marks = []  # (the batch has the usage, the pump says it was the last)
        while (batch := await pump.next_batch()) is not None:
            marks.append((isinstance(batch[-1], Usage), pump.exhausted))
        await pump.close()
        return marks

    async def main() -> tuple[list[tuple[bool, bool]], list[tuple[bool, bool]]]:
        async with ReplayServer(handler=replay(rec)) as server:
            backend = vllm(server.url)
            proxied = await seen(EventPump(backend.generate(spec())))
            await backend.close()
        return proxied, await seen(EventPump(engine()))

    for marks in run(main()):
        assert marks[-1] == (True, True)
        assert all(not exhausted for _, exhausted in marks[:-1])

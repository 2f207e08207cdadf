"""cancellation: a client that leaves frees the backend at once.

A backend tells the battery (and anyone else) what it still holds through an optional
`in_flight() -> int` method: the requests whose resources it has not yet freed (engine
sequences, upstream connections, worker tasks). Without it only the close time is checked.
"""

from __future__ import annotations

import asyncio
import time
from typing import Literal

from plugins.contract.protocol import Finish, ReasoningDelta, TextDelta, ToolCallDelta, Usage
from plugins.testing.checks.prompts import STORY
from plugins.testing.probe import Probe
from plugins.testing.registry import Skipped, check
from plugins.testing.trace import Failed, Trace, describe_error

CLOSE_LIMIT_S = 1.0  # closing a stream must return within this, and in_flight() reach 0 within it
HANG_S = 10.0  # how long a close that does not return is waited for before it is called hung
LONG_TOKENS = 1024
TOKEN_EVENTS = (TextDelta, ReasoningDelta, ToolCallDelta)


@check("cancellation", fix=(
    "Free the request in generate()'s `finally` (abort it in the engine, close the upstream response, cancel "
    "worker tasks) without waiting for the generation to end; it runs on GeneratorExit (aclose()) and on "
    "CancelledError (the gateway cancels the task reading the stream). Implement in_flight() -> int so the "
    "gateway and this check can see that nothing is left."))
async def cancellation(probe: Probe) -> str:
    """Closing a stream mid-generation returns within 1 s and the backend then reports nothing in flight."""
    before = await probe.wait_idle(CLOSE_LIMIT_S)
    if before:
        raise Failed(f"before this check, in_flight() already reports {before} request(s) that finished earlier")
    seen = []
    for how in ("aclose", "cancel"):
        trace, close_s = await _close_mid_stream(probe, how)
        if close_s > CLOSE_LIMIT_S:
            raise Failed(f"{trace.label}: closing took {close_s:.2f} s (limit {CLOSE_LIMIT_S:g} s)", trace)
        left = await probe.wait_idle(CLOSE_LIMIT_S)
        if left:
            raise Failed(f"{trace.label}: in_flight() still reports {left} request(s) {CLOSE_LIMIT_S:g} s after the "
                         "stream was closed: the backend keeps generating for a client that left", trace)
        seen.append(f"{how} {close_s * 1000:.1f} ms")
    note = "; nothing in flight after" if probe.in_flight() is not None else (
        " (no in_flight() method: whether the backend freed the request was not checked)")
    return ", ".join(seen) + note


def _long_request(probe: Probe) -> dict:
    room = (probe.max_model_len or LONG_TOKENS * 2) - 256
    body: dict = {"max_tokens": max(16, min(LONG_TOKENS, room)), "stream": True}
    if "ignore_eos" in probe.caps.extensions:
        body["ignore_eos"] = True
    return body


async def _close_mid_stream(probe: Probe, how: Literal["aclose", "cancel"]) -> tuple[Trace, float]:
    """Start a long stream, wait for its first token, then close it the way `how` says; the
    seconds the close took."""
    spec = probe.chat(STORY, **_long_request(probe))
    label = "aclose() after the first token" if how == "aclose" else "the reading task cancelled after the first token"
    trace = Trace(spec=spec, label=label)
    events = probe.backend.generate(spec)
    first = asyncio.Event()

    async def read() -> None:
        async for event in events:
            trace.events.append(event)
            if isinstance(event, TOKEN_EVENTS):
                first.set()
                if how == "aclose":
                    return

    reader = asyncio.create_task(read())
    waiter = asyncio.create_task(first.wait())
    await asyncio.wait([reader, waiter], timeout=probe.request_timeout_s, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    if not first.is_set():
        reader.cancel()
        error = (await asyncio.gather(reader, return_exceptions=True))[0]
        await events.aclose()  # type: ignore[attr-defined]
        if isinstance(error, Exception):
            trace.error = error
            raise Failed(f"{label}: the backend raised {describe_error(error)}", trace)
        if not any(isinstance(e, (Finish, Usage)) for e in trace.events):
            raise Failed(f"{label}: no token came within {probe.request_timeout_s:g} s", trace)
    if any(isinstance(e, (Finish, Usage)) for e in trace.events):
        raise Skipped(f"the request finished before it could be closed: {trace.text()!r}")
    began = time.perf_counter()
    try:
        if how == "aclose":
            await reader
            await asyncio.wait_for(events.aclose(), HANG_S)  # type: ignore[attr-defined]
        else:
            reader.cancel()
            await asyncio.wait_for(asyncio.gather(reader, return_exceptions=True), HANG_S)
    except TimeoutError:
        raise Failed(f"{label}: closing had not returned after {HANG_S:g} s", trace) from None
    except Exception as exc:  # noqa: BLE001 - a finally that raises
        trace.error = exc
        raise Failed(f"{label}: closing the stream raised {type(exc).__name__}: {exc}", trace) from None
    return trace, time.perf_counter() - began

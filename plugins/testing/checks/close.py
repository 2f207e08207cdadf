"""close: the backend shuts down cleanly (runs after every other check)."""

from __future__ import annotations

from plugins.testing.probe import Probe
from plugins.testing.registry import check
from plugins.testing.trace import Failed, describe_error


@check("close", needs_model=False, final=True, fix=(
    "close() frees everything (engine, connection pools, launched servers) and returns quietly when called "
    "again; requests still running end first."))
async def close(probe: Probe) -> str:
    """close() may be called twice and leaves no request in flight."""
    probe.closed = True
    for attempt in ("first", "second"):
        try:
            await probe.backend.close()
        except Exception as exc:  # noqa: BLE001 - the finding
            raise Failed(f"the {attempt} close() raised {describe_error(exc)}") from None
    left = probe.in_flight()
    if left:
        raise Failed(f"in_flight() reports {left} request(s) after close()")
    return "close() twice, quietly" + ("" if left is None else "; in_flight() 0")

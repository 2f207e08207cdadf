"""The JSONL request log that `switchyard ab-report` reads: one line per finished request.

The request path only appends a small record to a list (no I/O, no encoding, no sorting); a
background task hands each batch to a worker thread every `flush_interval_s`, which computes
the per-request ITL percentiles, encodes the lines and writes them: whole lines in one
`write()` on a file opened for appending, which the kernel never interleaves with another
process's, so the worker processes of one server share one valid JSONL file. Prompt text is
written only when `[server] log_prompts = true`; API keys and headers never are.

A line (keys in this order; null when unknown):

    {"ts": 1767225600.123, "request_id": "...", "route": "chat", "arm": "vllm", "backend": "vllm",
     "replica": "http://10.0.0.7:8000", "model": "llama-3-8b", "shadow": false, "kind": "chat", "stream": true, "outcome": "ok",
     "error": null, "ttft": 0.081, "e2e": 1.93, "itl_p50": 0.011, "itl_p95": 0.019, "n_itl": 120,
     "prompt_tokens": 35, "completion_tokens": 121, "cached_tokens": 16,
     "attempts": [{"backend": "vllm", "outcome": "ok"}]}

`replica` (the base URL of the replica that served, or was tried last) is there only for
backends that serve from several replicas; `queued_ms` (the time the request waited in its
backend's flow-control queue, `[server.flow_control]`) only for a request that waited; `session`
(the agent session the request belongs to, `RequestSpec.session`) only when there is one.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

log = logging.getLogger("switchyard.request_log")


class Attempt(msgspec.Struct, frozen=True):
    backend: str
    outcome: str  # "ok", an upstream error kind, or "unsupported"


class RequestRecord(msgspec.Struct, kw_only=True):
    """What the request path hands the log; `itl` is the request's list of gaps (not copied)."""

    ts: float
    request_id: str
    route: str
    arm: str
    backend: str
    model: str
    shadow: bool
    kind: str
    stream: bool
    outcome: str
    error: str | None
    ttft: float | None
    e2e: float
    itl: list[float]
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    attempts: list[Attempt]
    prompt: Any = None  # messages or prompt, only with log_prompts
    replica: str | None = None  # the replica of a fleet backend that served (its events' `served_by`)
    queued_ms: int | None = None  # waited in a flow-control queue (None: went straight through)
    session: str | None = None  # the agent session the request belongs to (`RequestSpec.session`)


class LogLine(msgspec.Struct, kw_only=True, omit_defaults=True):
    ts: float
    request_id: str
    route: str
    arm: str
    backend: str
    replica: str | None = None  # left out of the line when None (a backend of one server)
    session: str | None = None  # left out of the line when None
    model: str
    shadow: bool
    kind: str
    stream: bool
    outcome: str
    error: str | None
    queued_ms: int | None = None  # left out of the line when the request did not wait
    ttft: float | None
    e2e: float
    itl_p50: float | None
    itl_p95: float | None
    n_itl: int
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    attempts: list[Attempt]
    prompt: Any = None


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of an already sorted list; None when it is empty."""
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def to_line(r: RequestRecord) -> LogLine:
    gaps = sorted(r.itl)
    return LogLine(
        ts=round(r.ts, 6),
        request_id=r.request_id,
        route=r.route,
        arm=r.arm,
        backend=r.backend,
        replica=r.replica,
        session=r.session,
        model=r.model,
        shadow=r.shadow,
        kind=r.kind,
        stream=r.stream,
        outcome=r.outcome,
        error=r.error,
        queued_ms=r.queued_ms,
        ttft=r.ttft,
        e2e=r.e2e,
        itl_p50=percentile(gaps, 0.5),
        itl_p95=percentile(gaps, 0.95),
        n_itl=len(gaps),
        prompt_tokens=r.prompt_tokens,
        completion_tokens=r.completion_tokens,
        cached_tokens=r.cached_tokens,
        attempts=r.attempts,
        prompt=r.prompt,
    )


class RequestLog:
    def __init__(
        self,
        path: str | Path,
        *,
        flush_interval_s: float = 0.2,
        max_pending: int = 100_000,
        on_drop: Callable[[], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self.flush_interval_s = flush_interval_s
        self.max_pending = max_pending
        self.on_drop = on_drop
        self._pending: list[RequestRecord] = []
        self._file: Any = None
        self._task: asyncio.Task[None] | None = None
        self._write_lock = threading.Lock()  # taken only in worker threads, never on the loop
        self._encoder = msgspec.json.Encoder()

    def add(self, record: RequestRecord) -> None:
        """Called on the event loop for every finished request: an append, nothing more."""
        if len(self._pending) >= self.max_pending:
            if self.on_drop is not None:
                self.on_drop()
            return
        self._pending.append(record)

    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = await asyncio.to_thread(self.path.open, "ab", buffering=0)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="switchyard-request-log")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval_s)
            try:
                await self.flush()
            except Exception:  # a full disk must not take the gateway down; keep trying
                log.exception("writing the request log %s failed", self.path)

    async def flush(self) -> None:
        batch, self._pending = self._pending, []
        if batch and self._file is not None:
            await asyncio.to_thread(self._write, batch)

    def _write(self, batch: list[RequestRecord]) -> None:
        data = self._encoder.encode_lines([to_line(r) for r in batch])
        with self._write_lock:
            if self._file is None:  # closed meanwhile: the gateway is shutting down
                return
            view = memoryview(data)
            while view:  # a regular file takes it in one write, unless the disk fills up
                view = view[self._file.write(view):]

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        if self._file is not None:
            try:
                await self.flush()
            finally:
                await asyncio.to_thread(self._close_file)

    def _close_file(self) -> None:
        with self._write_lock:
            self._file.close()
            self._file = None

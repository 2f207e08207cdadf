"""Per-request bookkeeping beyond the metrics: the client key's reservation (settled on the
real usage) and the request's trace. A request gets a `RequestAccounting` only when one of the
two is on for it (a key with limits, `[telemetry]`); otherwise the request path carries None
and does no work for either.

`gateway.http.common.answer` calls `open_accounting` once per request, before serving it, and hands
the result through the front-end's `open_stream` / `collect` to `gateway.service.attempts`, whose
`Observed` reports each attempt, the events and the end; `finish` is idempotent, so `answer` also
calls it on any error that escapes before `Observed` took over (a refusal before the first
attempt, a cancellation). Every wire API answered through `answer` is thus limited and traced.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.keys import NO_RESERVATION, KeyLimits, Reservation, TokenCost
from gateway.service.outcomes import error_label, outcome_of
from plugins.contract.protocol import Event, Finish, ReasoningDelta, RequestSpec, TextDelta, ToolCallDelta, Usage

if TYPE_CHECKING:
    from gateway.observability.telemetry import RequestTrace
    from gateway.service.gateway import Gateway, Resolved


class RequestAccounting:
    __slots__ = ("reservation", "trace", "completion_seen", "finish_reasons", "done")

    def __init__(self, reservation: Reservation, trace: RequestTrace | None) -> None:
        self.reservation = reservation
        self.trace = trace
        self.completion_seen = 0  # tokens that reached the gateway, for a request that ends without usage
        self.finish_reasons: list[str] = []
        self.done = False

    @property
    def headers(self) -> dict[str, str]:
        """The `x-ratelimit-*` headers for the response."""
        return self.reservation.headers

    def on_attempt(self, resolved: Resolved, spec: RequestSpec) -> RequestSpec:
        """An attempt starts on `resolved`: its span, and `spec` carrying the span's
        `traceparent` to the upstream (proxies send `spec.headers`' trace headers on)."""
        if self.trace is None:
            return spec
        carrier = self.trace.start_attempt(resolved.backend.name, spec.upstream_model, getattr(resolved.backend, "base_url", None))
        return _with_headers(spec, carrier)

    def on_attempt_failed(self, error: BaseException, replica: str | None) -> None:
        """The attempt failed before its first token (on `replica`, when its backend has
        replicas) and the request moves on to another target."""
        if self.trace is not None:
            self.trace.end_attempt(error_label(error), replica)

    def on_events(self, batch: list[Event]) -> None:
        for event in batch:
            if isinstance(event, (TextDelta, ReasoningDelta)):
                if event.text or event.token_ids:
                    self.completion_seen += len(event.token_ids) or 1
            elif isinstance(event, ToolCallDelta):
                self.completion_seen += 1
            elif isinstance(event, Finish):
                self.finish_reasons.append(event.reason)

    def on_text(self) -> None:
        """`on_events` of one plain text delta."""
        self.completion_seen += 1

    def finish(
        self,
        error: BaseException | None,
        *,
        usage: Usage | None = None,
        resolved: Resolved | None = None,
        spec: RequestSpec | None = None,
        replica: str | None = None,
        timings: Mapping[str, Any] | None = None,
    ) -> None:
        """The request is over (served, failed or cancelled): settle the key's reservation and
        end the spans; `replica`: the one that served (or was tried last), when the backend has
        replicas. Only the first call counts."""
        if self.done:
            return
        self.done = True
        self.reservation.settle(usage, self.completion_seen)
        if self.trace is not None:
            self.trace.finish(
                backend=resolved.backend.name if resolved is not None else None,
                replica=replica,
                response_model=spec.upstream_model if spec is not None else None,
                usage=usage,
                ttft_s=timings.get("ttft") if timings else None,
                finish_reasons=self.finish_reasons,
                outcome=outcome_of(error),
                error_type=None if error is None or outcome_of(error) == "cancelled" else error_label(error),
            )


async def open_accounting(gateway: Gateway, spec: RequestSpec, headers: Mapping[str, str], limits: KeyLimits | None,
                          key_name: str | None = None, cost: TokenCost | None = None) -> RequestAccounting | None:
    """Start the request's trace and admit it under its key's limits (429 when over one: the
    trace records it); `cost` instead of `spec`'s estimate for a request that is no generation
    (embeddings). None when the key has no limits and tracing is off."""
    telemetry = gateway.telemetry
    if limits is None and telemetry is None:
        return None
    trace = telemetry.start_request(spec, headers, key_name) if telemetry is not None else None
    accounting = RequestAccounting(NO_RESERVATION, trace)
    try:
        accounting.reservation = await gateway.key_limiter.admit(limits, spec, cost=cost)
    except BaseException as exc:
        accounting.finish(exc)
        raise
    return accounting


def _with_headers(spec: RequestSpec, extra: dict[str, str]) -> RequestSpec:
    return msgspec.structs.replace(spec, headers={**spec.headers, **extra}) if extra else spec

"""Per-request bookkeeping beyond the metrics: the client key's reservation (settled on the
real usage), the request's trace, and what it asks of a full backend's queue (`asked`, with
`[server.flow_control]` on). A request gets a `RequestAccounting` only when one of them is on
for it (a key with limits, `[telemetry]`, flow control); otherwise the request path carries
None and does no work for any.

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

from gateway.flow_control import Asked
from gateway.keys import NO_RESERVATION, Reservation, TokenCost
from gateway.keys.keyring import ClientKey
from gateway.keys.limits import request_cost
from gateway.service.outcomes import error_label, outcome_of
from plugins.contract.errors import ModelNotFound
from plugins.contract.protocol import Event, Finish, ReasoningDelta, RequestSpec, TextDelta, ToolCallDelta, Usage

if TYPE_CHECKING:
    from gateway.observability.telemetry import RequestTrace
    from gateway.service.gateway import Gateway, Resolved


class RequestAccounting:
    __slots__ = ("reservation", "trace", "asked", "completion_seen", "finish_reasons", "done")

    def __init__(self, reservation: Reservation, trace: RequestTrace | None, asked: Asked | None = None) -> None:
        self.reservation = reservation
        self.trace = trace
        self.asked = asked  # its place in a full backend's queue, and the priority the engine is sent
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


async def open_accounting(gateway: Gateway, spec: RequestSpec, headers: Mapping[str, str], key: ClientKey | None,
                          cost: TokenCost | None = None) -> RequestAccounting | None:
    """Start the request's trace, say what it asks of a full backend's queue, and admit it under
    its key's limits (429 when over one: the trace records it); `cost` instead of `spec`'s
    estimate for a request that is no generation (embeddings). None when the key has no limits,
    tracing is off and so is flow control."""
    telemetry, flow = gateway.telemetry, gateway.flow
    limits = key.limits if key is not None else None
    if limits is None and telemetry is None and flow is None:
        return None
    key_name = key.name if key is not None else None
    trace = telemetry.start_request(spec, headers, key_name) if telemetry is not None else None
    asked = None
    if flow is not None:
        asked = flow.policy.ask(key, reserved=cost or request_cost(spec, _max_model_len(gateway, spec.model)), user=spec.user,
                                headers=headers, priority_sent=spec.priority if "priority" in spec.extensions else None,
                                slo_ms=gateway.limits_for(spec.model).ttft_slo_ms)
    accounting = RequestAccounting(NO_RESERVATION, trace, asked)
    try:
        accounting.reservation = await gateway.key_limiter.admit(limits, spec, cost=cost)
    except BaseException as exc:
        accounting.finish(exc)
        raise
    return accounting


def _max_model_len(gateway: Gateway, model: str) -> int | None:
    try:
        return gateway.model_card(model)[1]
    except ModelNotFound:
        return None  # answered as such once the request is routed


def _with_headers(spec: RequestSpec, extra: dict[str, str]) -> RequestSpec:
    return msgspec.structs.replace(spec, headers={**spec.headers, **extra}) if extra else spec

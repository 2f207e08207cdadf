"""OpenTelemetry traces: one span per request, one child span per upstream attempt, and the
attempt's W3C `traceparent` sent to proxied engines (vLLM continues the trace from it).

Off unless `[telemetry] otlp_endpoint` is set: then, and only then, the SDK is imported and the
request path does any tracing work. Spans go to the endpoint as OTLP/HTTP protobuf from the
SDK's batch processor, a thread of its own: exporting never waits on the event loop, nor the
loop on it. A client's own `traceparent` makes the request span its child.

Attribute names follow the OpenTelemetry GenAI semantic conventions (`gen_ai.*`, `error.type`,
`server.address`); what they do not name is under `switchyard.*` (route, backend, replica,
outcome). A fleet backend's attempt names the replica that served it (or was tried last), and
`server.address` / `server.port` are that replica's.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from gateway.config import Config, TelemetryConfig
from plugins.contract.errors import ConfigError
from plugins.contract.protocol import RequestSpec, Usage

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

TRACES_PATH = "/v1/traces"
OPERATIONS = {"chat": "chat", "completion": "text_completion", "embedding": "embeddings"}
PROPAGATED = ("traceparent", "tracestate")


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL: an endpoint given without a path gets `/v1/traces`."""
    return endpoint.rstrip("/") + TRACES_PATH if urlsplit(endpoint).path in ("", "/") else endpoint


def build_telemetry(config: Config) -> Telemetry | None:
    if config.telemetry.otlp_endpoint is None:
        return None
    check_telemetry(config)
    return Telemetry(config.telemetry, providers={b.name: b.type for b in config.backends})


def check_telemetry(config: Config) -> None:
    """With `otlp_endpoint` set, the OpenTelemetry packages must be installed."""
    if config.telemetry.otlp_endpoint is not None and importlib.util.find_spec("opentelemetry.exporter.otlp.proto.http") is None:
        raise ConfigError(
            f"{config.source}: `telemetry.otlp_endpoint` needs the OpenTelemetry packages: pip install 'switchyard[otel]'",
            param="telemetry.otlp_endpoint",
        )


class Telemetry:
    def __init__(self, config: TelemetryConfig, providers: Mapping[str, str], exporter: SpanExporter | None = None) -> None:
        """`providers`: each backend's type (`gen_ai.provider.name`); `exporter`: where finished
        spans go instead of the OTLP endpoint (tests)."""
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBasedTraceIdRatio
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(endpoint=traces_url(config.otlp_endpoint or ""))
        # a provider of our own, not the global one: the app's traces stay the app's
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": config.service_name}), sampler=ParentBasedTraceIdRatio(config.sample_ratio)
        )
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("switchyard")
        self.propagator = TraceContextTextMapPropagator()
        self.trace_api = trace
        self.providers = dict(providers)

    def start_request(self, spec: RequestSpec, headers: Mapping[str, str], key_name: str | None) -> RequestTrace:
        """The request's span, a child of the client's `traceparent` when it sent one."""
        parent = self.propagator.extract(carrier={k: headers[k] for k in PROPAGATED if k in headers})
        operation = OPERATIONS.get(spec.kind, spec.kind)
        sampling = spec.sampling
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": operation,
            "gen_ai.request.model": spec.model,
            "gen_ai.request.stream": spec.stream,
            "gen_ai.request.temperature": sampling.temperature,
            "gen_ai.request.top_p": sampling.top_p,
            "gen_ai.request.choice.count": sampling.n,
            "switchyard.route": spec.model,
            "switchyard.request_id": spec.request_id,
        }
        if sampling.max_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = sampling.max_tokens
        if sampling.seed is not None:
            attributes["gen_ai.request.seed"] = sampling.seed
        if key_name is not None:
            attributes["switchyard.api_key.name"] = key_name
        kind = self.trace_api.SpanKind.SERVER
        span = self.tracer.start_span(f"{operation} {spec.model}", context=parent, kind=kind, attributes=attributes)
        return RequestTrace(self, span, operation)

    def shutdown(self) -> None:
        """Flush what is still buffered (blocking: call it off the event loop)."""
        self.provider.shutdown()


class RequestTrace:
    """The spans of one request: the request's, and the current attempt's."""

    __slots__ = ("telemetry", "span", "operation", "attempt")

    def __init__(self, telemetry: Telemetry, span: Any, operation: str) -> None:
        self.telemetry = telemetry
        self.span = span
        self.operation = operation
        self.attempt: Any = None

    def start_attempt(self, backend: str, upstream_model: str, base_url: str | None) -> dict[str, str]:
        """A child span for one upstream attempt; returns the headers that carry it upstream."""
        api = self.telemetry.trace_api
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": self.operation,
            "gen_ai.request.model": upstream_model,
            "gen_ai.provider.name": self.telemetry.providers.get(backend, backend),
            "switchyard.backend": backend,
        }
        if base_url:
            attributes.update(_server_attributes(base_url))
        context = api.set_span_in_context(self.span)
        self.attempt = self.telemetry.tracer.start_span(
            f"{self.operation} {upstream_model}", context=context, kind=api.SpanKind.CLIENT, attributes=attributes
        )
        carrier: dict[str, str] = {}
        self.telemetry.propagator.inject(carrier, context=api.set_span_in_context(self.attempt))
        return carrier

    def end_attempt(self, error_type: str | None, replica: str | None = None) -> None:
        """`replica`: the base URL a fleet backend sent the attempt to (its events' `served_by`)."""
        if self.attempt is None:
            return
        if replica is not None:
            self.attempt.set_attributes(_replica_attributes(replica))
        self.attempt.set_attribute("switchyard.outcome", "ok" if error_type is None else error_type)
        if error_type is not None:
            self._failed(self.attempt, error_type)
        self.attempt.end()
        self.attempt = None

    def finish(
        self,
        *,
        backend: str | None,
        replica: str | None,
        response_model: str | None,
        usage: Usage | None,
        ttft_s: float | None,
        finish_reasons: Sequence[str],
        outcome: str,
        error_type: str | None,
    ) -> None:
        self.end_attempt(error_type, replica)
        span = self.span
        if backend is not None:
            span.set_attribute("switchyard.backend", backend)
        if replica is not None:
            span.set_attribute("switchyard.replica", replica)
        if response_model is not None:
            span.set_attribute("gen_ai.response.model", response_model)
        if usage is not None:
            span.set_attribute("gen_ai.usage.input_tokens", usage.prompt_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", usage.completion_tokens)
            if usage.cached_tokens is not None:
                span.set_attribute("gen_ai.usage.cache_read.input_tokens", usage.cached_tokens)
            if usage.reasoning_tokens is not None:
                span.set_attribute("gen_ai.usage.reasoning.output_tokens", usage.reasoning_tokens)
        if ttft_s is not None:
            span.set_attribute("gen_ai.response.time_to_first_chunk", ttft_s)
        if finish_reasons:
            span.set_attribute("gen_ai.response.finish_reasons", list(finish_reasons))
        span.set_attribute("switchyard.outcome", outcome)
        if error_type is not None:
            self._failed(span, error_type)
        span.end()

    def _failed(self, span: Any, error_type: str) -> None:
        api = self.telemetry.trace_api
        span.set_attribute("error.type", error_type)
        span.set_status(api.Status(api.StatusCode.ERROR, error_type))


def _server_attributes(url: str) -> dict[str, Any]:
    parts = urlsplit(url)
    attributes: dict[str, Any] = {}
    if parts.hostname:
        attributes["server.address"] = parts.hostname
    if parts.port:
        attributes["server.port"] = parts.port
    return attributes


def _replica_attributes(replica: str) -> dict[str, Any]:
    return {"switchyard.replica": replica, **_server_attributes(replica)}

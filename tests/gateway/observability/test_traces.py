"""OpenTelemetry through a real gateway process: its spans reach a real OTLP/HTTP receiver, and
the `traceparent` it sends reaches a real upstream process (the recording faulty upstream)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from gateway.observability.telemetry import traces_url
from tests.support import faulty_upstream
from tests.support.faulty_upstream import FaultyUpstream
from tests.support.otlp_receiver import OTLPReceiver, ReceivedSpan
from tests.support.probes import wait_until
from tests.support.server import ROOT, free_port, running_server


def traced_config(upstream: str, dead: str, collector: str) -> str:
    backends = ""
    for name, url in (("dead", dead), ("up-ok", upstream)):
        backends += f"""
[[backends]]
name = "{name}"
type = "vllm"
[backends.options]
base_url = "{url}"
models = {{ "m-{name}" = "up" }}
embeddings = true
[backends.options.timeouts]
connect_s = 1.0
"""
    backends += f"""
[[backends]]
name = "fleet"
type = "vllm"
[backends.options]
endpoints = ["{dead}", "{upstream}"]
balance = "round_robin"
models = {{ "m-fleet" = "up" }}
[backends.options.timeouts]
connect_s = 1.0
"""
    return f"""
[server]
health_interval_s = 0
breaker_failures = 1000

[telemetry]
otlp_endpoint = "{collector}"
service_name = "switchyard-under-test"

[plugins]
disable = ["builtin"]
{backends}
[[routes]]
name = "fallback"
strategy = "fallback"
[[routes.targets]]
backend = "dead"
model = "m-dead"
[[routes.targets]]
backend = "up-ok"
model = "m-up-ok"
"""


@pytest.fixture(scope="module")
def upstream() -> Iterator[FaultyUpstream]:
    up = faulty_upstream.start()
    try:
        yield up
    finally:
        faulty_upstream.stop(up)


@pytest.fixture(scope="module")
def receiver() -> Iterator[OTLPReceiver]:
    r = OTLPReceiver()
    try:
        yield r
    finally:
        r.close()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, upstream: FaultyUpstream, receiver: OTLPReceiver) -> Iterator[str]:
    config = traced_config(upstream.url, f"http://127.0.0.1:{free_port()}", receiver.url)
    env = {"OTEL_BSP_SCHEDULE_DELAY": "100"}  # export every 100 ms, not every 5 s
    with running_server(config, tmp_path_factory.mktemp("traced"), env=env) as base:
        yield base


def _spans(receiver: OTLPReceiver, trace_id: str, count: int) -> list[ReceivedSpan]:
    assert wait_until(lambda: len(receiver.trace(trace_id)) >= count, timeout=30), receiver.trace(trace_id)
    return receiver.trace(trace_id)


def test_a_request_is_one_span_with_a_child_per_attempt_and_its_traceparent_goes_upstream(
    gateway: str, upstream: FaultyUpstream, receiver: OTLPReceiver
) -> None:
    trace_id, client_span = secrets.token_hex(16), secrets.token_hex(8)
    request_id = "traced-" + secrets.token_hex(4)
    with openai.OpenAI(base_url=gateway + "/v1", api_key="x", max_retries=0) as client:
        stream = client.chat.completions.create(
            model="fallback",
            messages=[{"role": "user", "content": "trace me across the gateway"}],
            stream=True,
            stream_options={"include_usage": True},
            max_tokens=50,
            extra_headers={"traceparent": f"00-{trace_id}-{client_span}-01", "x-request-id": request_id},
        )
        chunks = list(stream)
    usage = chunks[-1].usage
    assert usage is not None

    spans = _spans(receiver, trace_id, 3)
    (request,) = [s for s in spans if s.kind == "SERVER"]
    attempts = sorted((s for s in spans if s.kind == "CLIENT"), key=lambda s: s.attributes["switchyard.backend"])
    assert [a.attributes["switchyard.backend"] for a in attempts] == ["dead", "up-ok"]

    assert request.service == "switchyard-under-test"
    assert (request.name, request.parent_span_id) == ("chat fallback", client_span)  # the client's span is its parent
    attrs = request.attributes
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == "fallback"
    assert attrs["gen_ai.response.model"] == "m-up-ok"  # the serving target's model
    assert attrs["gen_ai.request.max_tokens"] == 50 and attrs["gen_ai.request.stream"] is True
    assert attrs["gen_ai.usage.input_tokens"] == usage.prompt_tokens
    assert attrs["gen_ai.usage.output_tokens"] == usage.completion_tokens
    assert attrs["gen_ai.response.finish_reasons"] == ["stop"]
    assert attrs["gen_ai.response.time_to_first_chunk"] > 0
    assert (attrs["switchyard.route"], attrs["switchyard.backend"], attrs["switchyard.outcome"]) == ("fallback", "up-ok", "ok")
    assert attrs["switchyard.request_id"] == request_id
    assert request.status_code == 0 and "error.type" not in attrs

    dead, served = attempts
    for attempt in attempts:
        assert attempt.parent_span_id == request.span_id
        assert attempt.attributes["gen_ai.provider.name"] == "vllm"
        assert attempt.attributes["server.address"] == "127.0.0.1"
    assert (dead.attributes["error.type"], dead.status_code) == ("bad_gateway", 2)
    assert (served.name, served.attributes["gen_ai.request.model"], served.attributes["switchyard.outcome"]) == ("chat m-up-ok", "m-up-ok", "ok")

    seen = upstream.request(request_id)
    assert seen is not None and seen["traceparent"] == f"00-{trace_id}-{served.span_id}-01"


def test_a_responses_api_request_is_traced_the_same_way(gateway: str, upstream: FaultyUpstream, receiver: OTLPReceiver) -> None:
    """`/v1/responses` is served through the shared path: the same SERVER span with its usage,
    and the attempt's `traceparent` upstream."""
    trace_id, client_span = secrets.token_hex(16), secrets.token_hex(8)
    request_id = "traced-" + secrets.token_hex(4)
    with openai.OpenAI(base_url=gateway + "/v1", api_key="x", max_retries=0) as client:
        response = client.responses.create(
            model="m-up-ok",
            input="trace the responses api",
            max_output_tokens=40,
            extra_headers={"traceparent": f"00-{trace_id}-{client_span}-01", "x-request-id": request_id},
        )
    spans = _spans(receiver, trace_id, 2)
    (request,) = [s for s in spans if s.kind == "SERVER"]
    (attempt,) = [s for s in spans if s.kind == "CLIENT"]
    assert (request.name, request.parent_span_id) == ("chat m-up-ok", client_span)
    attrs = request.attributes
    assert attrs["gen_ai.request.max_tokens"] == 40 and attrs["gen_ai.request.stream"] is False
    assert attrs["gen_ai.usage.input_tokens"] == response.usage.input_tokens
    assert attrs["gen_ai.usage.output_tokens"] == response.usage.output_tokens
    assert (attrs["switchyard.backend"], attrs["switchyard.outcome"], attrs["switchyard.request_id"]) == ("up-ok", "ok", request_id)
    assert attempt.parent_span_id == request.span_id
    seen = upstream.request(request_id)
    assert seen is not None and seen["traceparent"] == f"00-{trace_id}-{attempt.span_id}-01"


def test_a_fleet_attempt_names_its_replica(gateway: str, upstream: FaultyUpstream, receiver: OTLPReceiver) -> None:
    """A fleet backend whose first replica is down retries on the next one: the spans name
    the replica that served (`switchyard.replica`, and it is the attempt's `server.*`)."""
    for _ in range(2):  # round robin: one of the two requests starts on the dead replica
        trace_id = secrets.token_hex(16)
        request_id = "traced-" + secrets.token_hex(4)
        with openai.OpenAI(base_url=gateway + "/v1", api_key="x", max_retries=0) as client:
            client.chat.completions.create(
                model="m-fleet",
                messages=[{"role": "user", "content": "which replica"}],
                max_tokens=5,
                extra_headers={"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01", "x-request-id": request_id},
            )
        spans = _spans(receiver, trace_id, 2)
        (request,) = [s for s in spans if s.kind == "SERVER"]
        (attempt,) = [s for s in spans if s.kind == "CLIENT"]
        assert request.attributes["switchyard.replica"] == attempt.attributes["switchyard.replica"] == upstream.url
        assert attempt.attributes["server.port"] == int(upstream.url.rsplit(":", 1)[1])
        seen = upstream.request(request_id)
        assert seen is not None and seen["traceparent"] == f"00-{trace_id}-{attempt.span_id}-01"


def test_an_embeddings_request_is_traced_and_its_traceparent_goes_upstream(
    gateway: str, upstream: FaultyUpstream, receiver: OTLPReceiver
) -> None:
    trace_id, client_span = secrets.token_hex(16), secrets.token_hex(8)
    request_id = "traced-" + secrets.token_hex(4)
    with openai.OpenAI(base_url=gateway + "/v1", api_key="x", max_retries=0) as client:
        result = client.embeddings.create(
            model="fallback",
            input=["one two three", "four"],
            extra_headers={"traceparent": f"00-{trace_id}-{client_span}-01", "x-request-id": request_id},
        )
    assert [d.embedding for d in result.data] == [[13.0, 3.0], [4.0, 1.0]]
    spans = _spans(receiver, trace_id, 3)
    (request,) = [s for s in spans if s.kind == "SERVER"]
    dead, served = sorted((s for s in spans if s.kind == "CLIENT"), key=lambda s: s.attributes["switchyard.backend"])
    assert (request.name, request.parent_span_id) == ("embeddings fallback", client_span)
    assert request.attributes["gen_ai.usage.input_tokens"] == result.usage.prompt_tokens == 4
    assert (request.attributes["switchyard.backend"], request.attributes["switchyard.outcome"]) == ("up-ok", "ok")
    assert dead.attributes["error.type"] == "bad_gateway" and served.parent_span_id == request.span_id
    seen = upstream.request(request_id)
    assert seen is not None and seen["path"] == "/v1/embeddings"
    assert seen["traceparent"] == f"00-{trace_id}-{served.span_id}-01"


def test_a_failed_request_is_an_error_span(gateway: str, receiver: OTLPReceiver) -> None:
    trace_id = secrets.token_hex(16)
    with openai.OpenAI(base_url=gateway + "/v1", api_key="x", max_retries=0) as client, pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="m-up-ok",
            messages=[{"role": "user", "content": "fault:status:400"}],
            extra_headers={"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"},
        )
    spans = _spans(receiver, trace_id, 2)
    (request,) = [s for s in spans if s.kind == "SERVER"]
    assert request.status_code == 2
    assert request.attributes["error.type"] == "invalid_request"  # the upstream's 400, mapped
    assert request.attributes["switchyard.outcome"] == "error:InvalidRequest"


def test_traces_url() -> None:
    assert traces_url("http://collector:4318") == "http://collector:4318/v1/traces"
    assert traces_url("http://collector:4318/") == "http://collector:4318/v1/traces"
    assert traces_url("https://collector/custom/path") == "https://collector/custom/path"


def test_tracing_off_imports_nothing_of_opentelemetry(tmp_path: Path) -> None:
    """Off by default: serving a request never loads the SDK, the tracing API or the exporter (nor
    the Redis client). (Litestar itself imports the bare `opentelemetry` package and its semantic
    conventions at app construction when they are installed: a start-up cost, not ours.)"""
    script = """
import asyncio, sys
from litestar.testing import AsyncTestClient
from gateway.app import create_app
from gateway.config import load_config

async def main():
    app = create_app(load_config(sys.argv[1]))
    async with AsyncTestClient(app) as client:
        r = await client.post("/v1/chat/completions", json={"model": "echo-1", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.text
    loaded = sorted(m for m in sys.modules if m.startswith(("opentelemetry.sdk", "opentelemetry.trace", "opentelemetry.exporter", "redis")))
    print("LOADED", loaded)

asyncio.run(main())
"""
    config = tmp_path / "plugins.toml"
    config.write_text('[plugins]\ndisable = ["builtin"]\nmodules = ["tests.support.echo_backend"]\n[[backends]]\nname = "echo"\ntype = "echo"\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", script, str(config)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "LOADED []" in proc.stdout

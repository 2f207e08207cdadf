"""Fallback decisions in process (what is retried, how often, what is recorded), shadow copies,
and the JSONL request log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.chat_api.encode import collect, open_stream
from plugins import hookimpl
from plugins.contract.errors import InvalidRequest, Overloaded, UpstreamError
from tests.support.probes import metric
from tests.support.routed_gateway import backend, config_text, route, running_gateway, spec

pytestmark = pytest.mark.anyio


class Observer:
    """A plugin that records the observer hooks."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.responses: list[tuple[str, str]] = []

    @hookimpl
    def switchyard_on_request(self, spec: Any, backend: Any) -> None:
        self.requests.append(backend.name)

    @hookimpl
    def switchyard_on_response(self, spec: Any, backend: Any, usage: Any, outcome: str, timings: dict) -> None:
        self.responses.append((backend.name, outcome))


@pytest.mark.parametrize("kind", ["unavailable", "timeout", "bad_gateway", "overloaded"])
@pytest.mark.parametrize("stream", [False, True])
async def test_retryable_failures_fall_through(kind: str, stream: bool) -> None:
    text = config_text(backend("first", fail=kind), backend("second", answer_prefix="2"), route("fb", [("first", 1), ("second", 1)], strategy="fallback"))
    async with running_gateway(text) as gateway:
        observer = Observer()
        gateway.pm.register(observer)
        served = await (open_stream if stream else collect)(gateway, spec("fb", stream=stream))
        if stream:
            body = b"".join([chunk async for chunk in served.body])
            assert b"2 hello big world" not in body and b'"content":"2"' in body and b"[DONE]" in body
        assert served.backend == "second"
        assert observer.requests == ["first", "second"], "on_request once per attempt"
        assert observer.responses == [("second", "ok")], "on_response once per request"
        text = gateway.metrics.render().decode()
        assert metric(text, "switchyard_route_attempts_total", route="fb", backend="first", outcome=kind) == 1
        assert metric(text, "switchyard_route_attempts_total", route="fb", backend="second", outcome="ok") == 1
        assert metric(text, "switchyard_requests_in_flight", route="fb") == 0
        assert gateway.in_flight == {"first": 0, "second": 0}


async def test_the_clients_own_errors_are_not_retried() -> None:
    text = config_text(backend("first"), backend("second"), route("fb", [("first", 1), ("second", 1)], strategy="fallback"))
    async with running_gateway(text) as gateway:
        with pytest.raises(InvalidRequest):
            await collect(gateway, spec("fb", "FAIL:invalid"))
        text = gateway.metrics.render().decode()
        assert metric(text, "switchyard_route_attempts_total", backend="second") == 0
        assert metric(text, "switchyard_requests_total", route="fb", backend="first", outcome="error:InvalidRequest") == 1


async def test_when_every_target_fails_the_last_error_is_the_answer() -> None:
    text = config_text(
        backend("first", fail="timeout"),
        backend("second", fail="overloaded"),
        route("fb", [("first", 1), ("second", 1)], strategy="fallback"),
        route("once", [("first", 1), ("second", 1)], strategy="fallback", max_attempts=1),
    )
    async with running_gateway(text) as gateway:
        with pytest.raises(Overloaded):
            await collect(gateway, spec("fb"))
        with pytest.raises(UpstreamError) as info:
            await open_stream(gateway, spec("once", stream=True))
        assert info.value.kind == "timeout"
        text = gateway.metrics.render().decode()
        assert metric(text, "switchyard_route_attempts_total", route="fb") == 2
        assert metric(text, "switchyard_route_attempts_total", route="once") == 1
        assert metric(text, "switchyard_requests_total", route="fb", backend="second", outcome="error:Overloaded") == 1
        assert metric(text, "switchyard_request_errors_total", route="once", backend="first", error="timeout") == 1


async def test_a_target_that_cannot_do_the_request_is_skipped_on_fallback() -> None:
    text = config_text(
        backend("first", fail="unavailable"),
        backend("plain", extensions=[]),
        backend("third", answer_prefix="3"),
        route("fb", [("first", 1), ("plain", 1), ("third", 1)], strategy="fallback"),
        route("plainfirst", [("plain", 1), ("third", 1)], strategy="fallback"),
    )
    async with running_gateway(text) as gateway:
        served = await collect(gateway, spec("fb", extensions=frozenset({"top_k"})))
        assert served.backend == "third"
        assert metric(gateway.metrics.render().decode(), "switchyard_route_attempts_total", backend="plain", outcome="unsupported") == 1
        with pytest.raises(InvalidRequest, match="top_k"):  # the route's first choice: the client's 400
            await collect(gateway, spec("plainfirst", extensions=frozenset({"top_k"})))


async def test_shadow_copies_are_fire_and_forget(tmp_path: Path) -> None:
    text = config_text(
        backend("main", answer_prefix="M"),
        backend("mirror", fail_after=1),
        route("r", [("main", 1)], shadow={"backend": "mirror", "fraction": 0.5}),
        server={"request_log": str(tmp_path / "log.jsonl")},
    )
    async with running_gateway(text) as gateway:
        for i in range(200):
            served = await collect(gateway, spec("r", request_id=f"q{i}"))
            assert served.backend == "main" and served.body.choices[0].message.content == "M hello big world"
        while gateway.shadow_tasks:
            await gateway.shadow_tasks.pop()
        text = gateway.metrics.render().decode()
        mirrored = metric(text, "switchyard_shadow_requests_total", route="r", backend="mirror")
        # a copy drawn but not sent is counted as skipped (at its max_concurrent when the machine
        # is slow to finish the copies): the draws are both, half of 200, give or take
        skipped = metric(text, "switchyard_shadow_skipped_total", route="r", backend="mirror")
        assert 60 <= mirrored + skipped <= 140 and mirrored > 0, (mirrored, skipped)
        assert metric(text, "switchyard_shadow_requests_total", route="r", backend="mirror", outcome="error:UpstreamError") == mirrored
        assert metric(text, "switchyard_shadow_time_to_first_token_seconds_count", route="r", backend="mirror") == mirrored
        assert metric(text, "switchyard_requests_total", backend="mirror") == 0
        assert gateway.in_flight["mirror"] == 0
    lines = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert sum(1 for r in lines if r["shadow"]) == mirrored and sum(1 for r in lines if not r["shadow"]) == 200


async def test_request_log_with_prompts_and_flush_on_close(tmp_path: Path) -> None:
    log = tmp_path / "sub" / "log.jsonl"
    text = config_text(backend("a", token_delay_s=0.001), route("r", [("a", 1)]), server={"request_log": str(log), "log_prompts": True})
    async with running_gateway(text) as gateway:
        await collect(gateway, spec("r", "one two three four", request_id="with-prompt"))
        with pytest.raises(UpstreamError):
            await collect(gateway, spec("r", "FAIL:bad_gateway", request_id="failed"))
        served = await open_stream(gateway, spec("r", "a b c d e f", request_id="streamed", stream=True))
        [chunk async for chunk in served.body]
    lines = {r["request_id"]: r for r in map(json.loads, log.read_text().splitlines())}
    ok = lines["with-prompt"]
    assert ok["prompt"] == [{"role": "user", "content": "one two three four"}]
    assert ok["outcome"] == "ok" and ok["error"] is None and ok["completion_tokens"] == 4 and ok["cached_tokens"] == 2
    assert ok["n_itl"] >= 1 and ok["itl_p50"] > 0 and ok["itl_p95"] >= ok["itl_p50"] and ok["stream"] is False
    failed = lines["failed"]
    assert failed["outcome"] == "error:UpstreamError" and failed["error"] == "bad_gateway" and failed["ttft"] is None
    assert failed["attempts"] == [{"backend": "a", "outcome": "bad_gateway"}] and failed["prompt_tokens"] is None
    assert lines["streamed"]["stream"] is True and lines["streamed"]["completion_tokens"] == 6

"""Routing through real gateway processes: the `x-switchyard-backend` header over a weighted
route, two replicas agreeing on every sticky key, fallback past a killed upstream process, no
retry after the first byte, shadow copies, and the request log read by `ab-report`."""

from __future__ import annotations

import collections
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import NamedTuple

import httpx
import pytest

from gateway.cli.main import main
from plugins.contract.config_types import Target
from plugins.routing.weighted import pick_weighted
from tests.gateway.helpers import chat_body, data_events
from tests.support.probes import metric, wait_until
from tests.support.routed_gateway import (
    SEED,
    backend,
    config_text,
    route,
    seeded_random,  # noqa: F401 - a fixture
)
from tests.support.server import echo_config, running_server

# `a` seeds the server's `random` at start-up: the weighted route's 300 picks are the same draws on every run
ARMS = backend("a", answer_prefix="A", seed_random=SEED) + backend("b", answer_prefix="B")
WEIGHTED_TARGETS = [Target(backend="a", model="echo-1", weight=70), Target(backend="b", model="echo-1", weight=30)]


class Replica(NamedTuple):
    base: str
    dir: Path  # its plugins.toml, its server log, its request log


def replica_config(request_log: Path) -> str:
    return config_text(
        ARMS,
        route("ab", [(t.backend, t.weight) for t in WEIGHTED_TARGETS]),
        route("st", [("a", 1), ("b", 1)], strategy="sticky", options={"key": ["user", "header:x-session-id"]}),
        server={"request_log": str(request_log)},
    )


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Replica, Replica]]:
    with ExitStack() as stack:
        dirs = [tmp_path_factory.mktemp(f"replica{i}") for i in range(2)]
        bases = [stack.enter_context(running_server(replica_config(d / "requests.jsonl"), d)) for d in dirs]
        yield Replica(bases[0], dirs[0]), Replica(bases[1], dirs[1])


def _post_all(base: str, bodies: list[dict], headers: list[dict] | None = None) -> list[httpx.Response]:
    with httpx.Client(base_url=base, timeout=30) as http, ThreadPoolExecutor(8) as pool:
        hs = headers or [{}] * len(bodies)
        return list(pool.map(lambda bh: http.post("/v1/chat/completions", json=bh[0], headers=bh[1]), zip(bodies, hs)))


def _lines(log: Path) -> list[dict]:
    """The request log's lines written so far (a line still being written is left for later)."""
    text = log.read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]


def test_weighted_route_end_to_end_header_names_the_arm(replicas: tuple[Replica, Replica], seeded_random: None) -> None:
    replica = replicas[0]
    responses = _post_all(replica.base, [chat_body("hello", model="ab") for _ in range(300)])
    served = collections.Counter()
    arm_of = {}
    for resp in responses:
        assert resp.status_code == 200, resp.text
        arm = resp.headers["x-switchyard-backend"]
        assert resp.json()["choices"][0]["message"]["content"] == ("A hello" if arm == "a" else "B hello")
        served[arm] += 1
        arm_of[resp.headers["x-request-id"]] = arm
    # why each request went where it went: one attempt, on the arm the header names (no retry, no fallback) ...
    log = replica.dir / "requests.jsonl"
    _wait_for(lambda: log.exists() and sum(r["route"] == "ab" for r in _lines(log)) == 300)
    for record in (r for r in _lines(log) if r["route"] == "ab"):
        assert record["attempts"] == [{"backend": arm_of[record["request_id"]], "outcome": "ok"}], record
    # ... and both arms were candidates for every pick: no breaker opened, no probe failed
    server_log = next(replica.dir.glob("server-*.log")).read_text().splitlines()
    assert not [line for line in server_log if "circuit" in line or "probe failed" in line]
    # so the split is exactly the seeded draws over both arms — the same on every run, however loaded the machine
    assert served == collections.Counter(pick_weighted(WEIGHTED_TARGETS).backend for _ in range(300))
    assert abs(served["a"] / 300 - 0.70) <= 0.09, served  # > 3 sigma; the exact split is tested in process
    with httpx.Client(base_url=replica.base) as http:
        assert {m["id"] for m in http.get("/v1/models").json()["data"]} >= {"ab", "st"}


def test_two_replicas_assign_every_sticky_key_identically(replicas: tuple[Replica, Replica]) -> None:
    users = [f"user-{i}" for i in range(120)]
    by_user = [chat_body("hi", model="st", user=u) for u in users]
    by_session = [chat_body("hi", model="st") for _ in range(60)]
    sessions = [{"x-session-id": f"session-{i}"} for i in range(60)]
    arms = []
    for replica in replicas:
        got = [r.headers["x-switchyard-backend"] for r in _post_all(replica.base, by_user + by_session, [{}] * len(by_user) + sessions)]
        arms.append(got)
    assert arms[0] == arms[1]
    assert set(arms[0][:120]) == {"a", "b"} and set(arms[0][120:]) == {"a", "b"}
    # and a key keeps its arm, request after request
    again = [r.headers["x-switchyard-backend"] for r in _post_all(replicas[1].base, by_user[:30])]
    assert again == arms[0][:30]


# -- fallback, shadow and the request log on one gateway ------------------------------------------


def _gateway_config(upstream: str, log: Path) -> str:
    proxy = (
        '[[backends]]\nname = "up"\ntype = "openai_compatible"\n[backends.options]\n'
        f'base_url = "{upstream}"\nmodels = {{ "echo-1" = "echo-1" }}\ntimeouts = {{ connect_s = 1.0, first_byte_s = 5.0 }}\n\n'
    )
    text = config_text(
        proxy,
        backend("local", answer_prefix="LOCAL"),
        backend("midfail", fail_after=2),
        backend("broken", fail="unavailable"),
        backend("slowshadow", token_delay_s=0.5),
        route("fb", [("up", 1), ("local", 1)], strategy="fallback"),
        route("mid", [("midfail", 1), ("local", 1)], strategy="fallback"),
        route("sh", [("local", 1)], shadow={"backend": "broken", "fraction": 1.0}),
        route("slow", [("local", 1)], shadow={"backend": "slowshadow"}),
        server={"request_log": str(log), "health_interval_s": 0.5},
    )
    return text.replace('modules = ["tests.support.echo_backend"]', 'modules = ["tests.support.echo_backend", "plugins.proxy.openai_compatible"]')


@pytest.fixture(scope="module")
def fallback_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ExitStack, Path]]:
    tmp = tmp_path_factory.mktemp("fallback")
    log = tmp / "requests.jsonl"
    upstream = ExitStack()
    up_base = upstream.enter_context(running_server(echo_config(), tmp_path_factory.mktemp("upstream")))
    try:
        with running_server(_gateway_config(up_base, log), tmp) as base:
            yield base, upstream, log
    finally:
        upstream.close()


def _metrics(http: httpx.Client) -> str:
    return http.get("/metrics").text


def _wait_for(check, timeout: float = 10.0) -> None:
    assert wait_until(check, timeout), "timed out"


def test_fallback_past_a_killed_upstream_process(fallback_gateway: tuple[str, ExitStack, Path]) -> None:
    base, upstream, _ = fallback_gateway
    with httpx.Client(base_url=base, timeout=30) as http:
        first = http.post("/v1/chat/completions", json=chat_body("hello there", model="fb"))
        assert first.status_code == 200 and first.headers["x-switchyard-backend"] == "up"
        assert first.json()["choices"][0]["message"]["content"] == "hello there"
        upstream.close()  # the upstream gateway process is stopped: connections are refused
        n = 8
        for i in range(n):
            if i % 2:
                resp = http.post("/v1/chat/completions", json=chat_body("hello there", model="fb"))
                assert resp.status_code == 200, resp.text
                assert resp.json()["choices"][0]["message"]["content"] == "LOCAL hello there"
            else:
                with http.stream("POST", "/v1/chat/completions", json=chat_body("hello there", model="fb", stream=True)) as resp:
                    assert resp.status_code == 200
                    events = data_events(resp.read())
                assert events[-1] == "[DONE]" and not any("error" in e for e in events[:-1])
                assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1]) == "LOCAL hello there"
            assert resp.headers["x-switchyard-backend"] == "local"
        text = _metrics(http)
        failed = metric(text, "switchyard_route_attempts_total", route="fb", backend="up", outcome="bad_gateway")
        assert 1 <= failed <= n, text
        assert metric(text, "switchyard_route_attempts_total", route="fb", backend="local", outcome="ok") == n
        assert metric(text, "switchyard_route_attempts_total", route="fb", backend="up", outcome="ok") == 1
        assert metric(text, "switchyard_requests_total", route="fb", backend="local", outcome="ok") == n
        # the breaker opens (the failures triggered a probe, which failed too); the route skips `up`
        _wait_for(lambda: metric(_metrics(http), "switchyard_backend_circuit_state", backend="up") == 2)
        before = metric(_metrics(http), "switchyard_route_attempts_total", route="fb", backend="up")
        assert http.post("/v1/chat/completions", json=chat_body("x", model="fb")).headers["x-switchyard-backend"] == "local"
        assert metric(_metrics(http), "switchyard_route_attempts_total", route="fb", backend="up") == before
        assert http.get("/ready").status_code == 200  # the other backends are fine


def test_no_retry_after_the_first_byte(fallback_gateway: tuple[str, ExitStack, Path]) -> None:
    base, _, _ = fallback_gateway
    with httpx.Client(base_url=base, timeout=30) as http:
        before = metric(_metrics(http), "switchyard_route_attempts_total", route="mid", backend="local")
        with http.stream("POST", "/v1/chat/completions", json=chat_body("one two three four", model="mid", stream=True)) as resp:
            assert resp.status_code == 200 and resp.headers["x-switchyard-backend"] == "midfail"
            events = data_events(resp.read())
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if isinstance(e, dict) and e.get("choices"))
        assert text == "one two"
        assert "error" in events[-2] and events[-1] == "[DONE]"
        # non-streaming: tokens had been generated, so the failure is the answer, not a retry
        resp = http.post("/v1/chat/completions", json=chat_body("one two three four", model="mid"))
        assert resp.status_code == 502 and resp.headers.get("x-request-id")
        assert metric(_metrics(http), "switchyard_route_attempts_total", route="mid", backend="local") == before


def test_shadow_failures_never_reach_the_client(fallback_gateway: tuple[str, ExitStack, Path]) -> None:
    base, _, _ = fallback_gateway
    n = 6
    with httpx.Client(base_url=base, timeout=30) as http:
        for i in range(n):
            body = chat_body("mirror me", model="sh", stream=bool(i % 2))
            resp = http.post("/v1/chat/completions", json=body)
            assert resp.status_code == 200 and resp.headers["x-switchyard-backend"] == "local"
            if body["stream"]:
                events = data_events(resp.content)
                assert events[-1] == "[DONE]" and not any("error" in e for e in events[:-1])
                assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1]) == "LOCAL mirror me"
            else:
                assert resp.json()["choices"][0]["message"]["content"] == "LOCAL mirror me"
        labels = {"route": "sh", "backend": "broken"}
        _wait_for(lambda: metric(_metrics(http), "switchyard_shadow_requests_total", outcome="error:UpstreamError", **labels) == n)
        text = _metrics(http)
        assert metric(text, "switchyard_shadow_request_errors_total", error="unavailable", **labels) == n
        assert metric(text, "switchyard_requests_total", route="sh", backend="local", outcome="ok") == n
        assert metric(text, "switchyard_requests_total", route="sh", backend="broken") == 0
        # a slow shadow does not slow the client: 2 tokens at 0.5 s each would be a second
        start = time.perf_counter()
        assert http.post("/v1/chat/completions", json=chat_body("quick answer", model="slow")).status_code == 200
        assert time.perf_counter() - start < 0.5
        _wait_for(lambda: metric(_metrics(http), "switchyard_shadow_requests_total", route="slow", outcome="ok") >= 1)
        text = _metrics(http)
        assert metric(text, "switchyard_shadow_time_to_first_token_seconds_count", route="slow", backend="slowshadow") >= 1


def test_request_log_lines_and_ab_report(fallback_gateway: tuple[str, ExitStack, Path], capsys: pytest.CaptureFixture[str]) -> None:
    base, _, log = fallback_gateway
    with httpx.Client(base_url=base, timeout=30) as http:
        resp = http.post("/v1/chat/completions", json=chat_body("secret prompt words", model="sh"), headers={"x-request-id": "logged-1"})
        assert resp.status_code == 200

    def logged() -> list[dict]:
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    _wait_for(lambda: any(r["request_id"] == "logged-1" for r in logged()))
    lines = logged()
    mine = next(r for r in lines if r["request_id"] == "logged-1")
    assert mine["route"] == "sh" and mine["arm"] == "local" and mine["backend"] == "local" and mine["model"] == "echo-1"
    assert mine["outcome"] == "ok" and mine["shadow"] is False and mine["attempts"] == [{"backend": "local", "outcome": "ok"}]
    assert mine["prompt_tokens"] == 4 and mine["completion_tokens"] == 4 and mine["ttft"] >= 0 and mine["e2e"] >= mine["ttft"]
    assert "prompt" not in mine and "secret" not in log.read_text(), "no prompt text unless log_prompts"
    _wait_for(lambda: any(r["request_id"] == "logged-1-shadow" for r in logged()))
    shadow = next(r for r in logged() if r["request_id"] == "logged-1-shadow")
    assert shadow["shadow"] is True and shadow["backend"] == "broken" and shadow["error"] == "unavailable"
    fallen = [r for r in lines if r["route"] == "fb" and r["backend"] == "local"]
    assert fallen and any(a["outcome"] == "bad_gateway" for r in fallen for a in r["attempts"])
    assert main(["ab-report", "--log", str(log), "--route", "sh"]) == 0
    out = capsys.readouterr().out
    assert "route sh" in out and "broken (shadow)" in out and "local" in out

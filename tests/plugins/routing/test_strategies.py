"""Routing decisions in process: weighted split, sticky (rendezvous) assignment, least busy,
fallback order, and the options each strategy accepts."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from gateway.chat_api.encode import collect
from gateway.cli.main import main
from plugins.contract.config_types import Route, Target
from plugins.routing import STRATEGIES
from plugins.routing.sticky import API_KEY_HASH_HEADER, pick_rendezvous, sticky_key
from tests.support.routed_gateway import backend, config_text, route, running_gateway, spec

pytestmark = pytest.mark.anyio

TWO_ARMS = backend("a", answer_prefix="A") + backend("b", answer_prefix="B")


async def test_weighted_70_30_over_1000_requests(seeded_random: None) -> None:
    text = config_text(TWO_ARMS, route("ab", [("a", 70), ("b", 30)]))
    async with running_gateway(text) as gateway:
        served = collections.Counter()
        for i in range(1000):
            result = await collect(gateway, spec("ab", request_id=f"r{i}"))
            served[result.backend] += 1
            # the answer comes from the backend the header names
            assert result.body.choices[0].message.content.startswith("A" if result.backend == "a" else "B")
    assert served["a"] + served["b"] == 1000
    assert abs(served["a"] / 1000 - 0.70) <= 0.03, served


async def test_sticky_same_key_same_arm_and_every_key_source() -> None:
    options = {"key": ["user", "header:x-session-id", "api_key"]}
    text = config_text(TWO_ARMS, route("ab", [("a", 1), ("b", 1)], strategy="sticky", options=options))
    async with running_gateway(text) as gateway:
        plan = gateway.plan("ab")
        arms = collections.Counter()
        for user in (f"user-{i}" for i in range(200)):
            first = gateway.pick(spec("ab", user=user), plan)
            for _ in range(5):
                assert gateway.pick(spec("ab", user=user), plan).target == first.target
            arms[first.target.backend] += 1
        assert 60 <= arms["a"] <= 140, arms  # both arms get users
        # a configured header is copied into spec.headers (and nothing else is)
        headers = {"x-session-id": "sess-1", "authorization": "Bearer sk-secret", "x-other": "1"}
        keyed = gateway.with_routing_keys(spec("ab"), headers)
        assert keyed.headers["x-session-id"] == "sess-1"
        assert "authorization" not in keyed.headers and "x-other" not in keyed.headers
        # the API key only as a hash
        assert "sk-secret" not in repr(keyed.headers) and len(keyed.headers[API_KEY_HASH_HEADER]) == 64
        # precedence: user, then the header, then the API key
        assert sticky_key(keyed, ("user", "header:x-session-id", "api_key")) == "header:x-session-id=sess-1"
        with_user = gateway.with_routing_keys(spec("ab", user="u"), headers)
        assert sticky_key(with_user, ("user", "header:x-session-id", "api_key")) == "user=u"
        only_key = gateway.with_routing_keys(spec("ab"), {"authorization": "Bearer sk-secret"})
        again = gateway.with_routing_keys(spec("ab"), {"authorization": "Bearer sk-secret"})
        assert gateway.pick(only_key, plan).target == gateway.pick(again, plan).target


async def test_sticky_on_the_agent_session() -> None:
    """`session` is a key source: every turn of a session on one arm, whichever way the session
    came (body or header); it wins over `user` when listed first."""
    options = {"key": ["session", "user"]}
    text = config_text(TWO_ARMS, route("ab", [("a", 1), ("b", 1)], strategy="sticky", options=options))
    async with running_gateway(text) as gateway:
        plan = gateway.plan("ab")
        arms = collections.Counter()
        for session in (f"0190a1b2-{i:04}" for i in range(200)):
            first = gateway.pick(spec("ab", session=session, user="same-user"), plan)
            for turn in range(5):
                assert gateway.pick(spec("ab", f"turn {turn}", session=session, user="same-user"), plan).target == first.target
            arms[first.target.backend] += 1
        assert 60 <= arms["a"] <= 140, arms  # one user's sessions spread over both arms
        assert sticky_key(spec("ab", session="s", user="u"), ("session", "user")) == "session=s"
        assert sticky_key(spec("ab", user="u"), ("session", "user")) == "user=u"


def test_sticky_weight_change_moves_only_its_share() -> None:
    keys = [f"user=u{i}" for i in range(20000)]
    before = [Target(backend="a", model="m", weight=50), Target(backend="b", model="m", weight=50)]
    after = [Target(backend="a", model="m", weight=60), Target(backend="b", model="m", weight=40)]
    old = [pick_rendezvous(k, "chat", before).backend for k in keys]
    new = [pick_rendezvous(k, "chat", after).backend for k in keys]
    moved = [(o, n) for o, n in zip(old, new) if o != n]
    assert 0.07 <= len(moved) / len(keys) <= 0.13, len(moved) / len(keys)
    assert all(o == "b" and n == "a" for o, n in moved), "keys only move towards the arm that gained weight"
    assert abs(old.count("a") / len(keys) - 0.5) < 0.02 and abs(new.count("a") / len(keys) - 0.6) < 0.02
    # a target that goes away moves only its own keys
    three = [*before, Target(backend="c", model="m", weight=50)]
    with_c = [pick_rendezvous(k, "chat", three).backend for k in keys]
    assert all(w == o for w, o in zip(with_c, old) if w != "c")
    # another route name gives an independent assignment
    other = [pick_rendezvous(k, "other", before).backend for k in keys]
    assert 0.4 < sum(o != x for o, x in zip(old, other)) / len(keys) < 0.6


def test_least_busy_picks_the_fewest_in_flight_per_weight() -> None:
    a, b = Target(backend="a", model="m"), Target(backend="b", model="m", weight=2)
    route = Route(name="lb", targets=(a, b), strategy="least_busy")

    def pick_least_busy(in_flight: dict[str, int]) -> Target:
        return STRATEGIES["least_busy"].pick(spec("lb"), route, [a, b], in_flight, {})

    assert pick_least_busy({"a": 3, "b": 1}) == b
    assert pick_least_busy({"a": 1, "b": 3}) == a
    assert pick_least_busy({"a": 2, "b": 5}) == a  # 2/1 < 5/2
    idle = collections.Counter(pick_least_busy({"a": 0, "b": 0}).backend for _ in range(300))
    assert idle == {"a": 100, "b": 200}, "ties are split by weight, not always the first target"


async def test_least_busy_follows_the_gateways_in_flight_counts() -> None:
    text = config_text(TWO_ARMS, route("lb", [("a", 1), ("b", 1)], strategy="least_busy"))
    async with running_gateway(text) as gateway:
        plan = gateway.plan("lb")
        gateway.in_flight["a"] = 5
        assert {gateway.pick(spec("lb"), plan).target.backend for _ in range(50)} == {"b"}
        gateway.in_flight["a"], gateway.in_flight["b"] = 0, 7
        assert {gateway.pick(spec("lb"), plan).target.backend for _ in range(50)} == {"a"}
        gateway.in_flight["b"] = 0


async def test_fallback_picks_in_order_and_skips_tried_targets() -> None:
    text = config_text(TWO_ARMS, backend("c"), route("fb", [("a", 1), ("b", 1), ("c", 1)], strategy="fallback"))
    async with running_gateway(text) as gateway:
        plan = gateway.plan("fb")
        assert plan.max_attempts == 3
        tried: list[Target] = []
        order = []
        while (resolved := gateway.pick(spec("fb"), plan, tried)) is not None:
            order.append(resolved.target.backend)
            tried.append(resolved.target)
        assert order == ["a", "b", "c"]


BAD_ROUTES = [
    ("unknown-option", route("r", [("a", 1)], strategy="sticky", options={"keys": ["user"]}), "`routes[0].options.keys`", "unknown key"),
    ("bad-source", route("r", [("a", 1)], strategy="sticky", options={"key": ["cookie-jar"]}), "`routes[0].options.key`", "cookie-jar"),
    ("auth-header", route("r", [("a", 1)], strategy="sticky", options={"key": ["header:Authorization"]}), "`routes[0].options.key`", "credentials"),
    ("weighted-takes-no-options", route("r", [("a", 1)], options={"x": 1}), "`routes[0].options.x`", "unknown key"),
    ("shadow-unknown-backend", route("r", [("a", 1)], shadow={"backend": "ghost"}), "`routes[0].shadow.backend`", "'ghost'"),
    ("shadow-fraction", route("r", [("a", 1)], shadow={"backend": "b", "fraction": 1.5}), "`routes[0].shadow.fraction`", "<= 1.0"),
    ("max-attempts", route("r", [("a", 1)], max_attempts=0), "`routes[0].max_attempts`", ">= 1"),
    ("strip-billing-header", route("r", [("a", 1)], strip_billing_header="yes"), "`routes[0].strip_billing_header`", "Expected `bool | null`"),
    ("max-sessions", route("r", [("a", 1)], strategy="prefix_cache", options={"max_sessions": -1}), "`routes[0].options.max_sessions`", ">= 0"),
    ("breaker", "", "`server.breaker_failures`", ">= 1"),
]


@pytest.mark.parametrize("table,key,reason", [b[1:] for b in BAD_ROUTES], ids=[b[0] for b in BAD_ROUTES])
def test_check_config_names_bad_routing_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str], table: str, key: str, reason: str) -> None:
    server = {"breaker_failures": 0} if not table else {}
    path = tmp_path / "plugins.toml"
    path.write_text(config_text(TWO_ARMS, table, server=server))
    assert main(["check-config", str(path)]) != 0
    err = capsys.readouterr().err
    assert key in err and reason in err and str(path) in err, err


def test_check_config_accepts_every_strategy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tables = [
        route("w", [("a", 70), ("b", 30)]),
        route("s", [("a", 1), ("b", 1)], strategy="sticky", options={"key": ["session", "header:x-session-id", "user"]}),
        route("p", [("a", 1), ("b", 1)], strategy="prefix_cache", options={"max_sessions": 1000}, strip_billing_header=False),
        route("l", [("a", 1), ("b", 1)], strategy="least_busy", shadow={"backend": "b", "fraction": 0.1}),
        route("f", [("a", 1), ("b", 1)], strategy="fallback", max_attempts=2),
    ]
    path = tmp_path / "plugins.toml"
    path.write_text(config_text(TWO_ARMS, *tables, server={"request_log": str(tmp_path / "log.jsonl"), "health_interval_s": 1.0}))
    assert main(["check-config", str(path)]) == 0, capsys.readouterr().err

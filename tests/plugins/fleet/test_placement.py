"""The placement policies, the prefix index and the session table, on plain candidates: bounded
memory, determinism, spreading distinct prefixes, following a prefix, the load margin,
staleness; agent sessions spread, stay, and move off an overloaded replica."""

from __future__ import annotations

import random
import sys
import time
import tracemalloc
import uuid
from dataclasses import dataclass

import msgspec

from plugins.contract.protocol import RequestSpec
from plugins.fleet.balance import make_balancer
from plugins.fleet.balance.prefix_index import PrefixIndex, prompt_blocks
from plugins.fleet.balance.session_table import ENTRY_BYTES as SESSION_ENTRY_BYTES
from plugins.fleet.balance.session_table import SessionTable
from plugins.fleet.load_signals import LoadSnapshot
from plugins.fleet.options import PrefixCacheOptions
from plugins.fleet.replica import Replica
from plugins.transport.http1 import Pool
from tests.plugins.fleet.conftest import chat, tenant_prompt


@dataclass(eq=False)
class Fake:
    name: str
    busy: float = 0.0
    in_flight: int = 0
    weight: float = 1.0

    def load(self) -> float:
        return self.busy

    def kv_cache_usage(self) -> float:
        return 0.0

    def cache_tokens(self) -> int | None:
        return None


def fleet(n: int) -> list[Fake]:
    return [Fake(f"r{i}") for i in range(n)]


def deep_size(index: PrefixIndex) -> int:
    """The bytes the index's tables hold: each replica's OrderedDict (its hash table and linked
    nodes, as `sys.getsizeof` counts them) and every key it keeps."""
    return sum(sys.getsizeof(lru) + sum(sys.getsizeof(k) for k in lru) for lru in index._lru.values())


def test_index_stays_under_its_byte_cap_with_100000_distinct_prompts() -> None:
    cap = 4 * 1024 * 1024
    index = PrefixIndex(max_bytes=cap)
    rng = random.Random(7)
    replicas = [f"http://10.0.0.{i}:8000" for i in range(8)]
    newest: list[int] = []
    peak = 0
    for i in range(100_000):
        newest = prompt_blocks(chat(f"{i}: " + "x" * rng.randint(100, 1200), system=f"tenant {i % 1000}"), 128)
        index.insert(replicas[i % len(replicas)], newest)
        if i % 10_000 == 9_999:
            peak = max(peak, deep_size(index))
    assert index.approx_bytes <= cap
    assert peak <= cap, f"the index held {peak} bytes, over its {cap}-byte cap"
    assert peak > cap // 2  # and it is filled: the cap, not a bug, bounds it
    # the newest prompts are still found, the oldest are gone
    assert index.match(replicas[99_999 % 8], newest) == len(newest)
    first = prompt_blocks(chat("0: " + "x" * random.Random(7).randint(100, 1200), system="tenant 0"), 128)
    assert index.match(replicas[0], first) == 0


def test_per_replica_horizon_evicts_a_chain_tail_first() -> None:
    index = PrefixIndex(max_bytes=1 << 20, per_replica_blocks=10)
    old = prompt_blocks(chat("a" * 128 * 8), 128)
    new = prompt_blocks(chat("b" * 128 * 6), 128)
    index.insert("r", old)
    index.insert("r", new)
    assert index.num_blocks("r") == 10
    assert index.match("r", new) == len(new)
    assert 0 < index.match("r", old) < len(old)  # the old chain kept its head


def trace(seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [(rng.randrange(8), rng.randrange(40)) for _ in range(600)]


def replay(balance: str, seed: int) -> list[str]:
    balancer = make_balancer(balance, PrefixCacheOptions(load_margin=2))
    candidates = fleet(4)
    chosen = []
    for step, (tenant, conversation) in enumerate(trace(seed)):
        for c in candidates:  # a load pattern that depends only on the trace
            c.busy = float((step + int(c.name[1:])) % 3)
        spec = chat(f"conversation {conversation} turn", system=tenant_prompt(tenant, 1200))
        chosen.append(balancer.choose(spec, candidates).candidate.name)
    return chosen


def test_decisions_are_deterministic_for_a_fixed_trace() -> None:
    for balance in ("prefix_cache", "least_load", "round_robin", "least_busy"):
        first = replay(balance, 3)
        assert replay(balance, 3) == first, balance
    assert replay("prefix_cache", 3) != replay("prefix_cache", 4)


def test_distinct_prefixes_spread_over_idle_candidates_and_follow_their_first() -> None:
    balancer = make_balancer("prefix_cache")
    candidates = fleet(3)
    first = {t: balancer.choose(chat("hello", system=tenant_prompt(t)), candidates) for t in range(5)}
    assert {c.candidate.name for c in first.values()} == {"r0", "r1", "r2"}
    assert all(c.reason == "prefix_miss" for c in first.values())
    for turn in range(3):
        for t in range(5):
            later = balancer.choose(chat(f"question {turn}", system=tenant_prompt(t)), candidates)
            assert later == (first[t].candidate, "prefix_hit")


def test_a_shared_short_preamble_does_not_pull_every_tenant_to_one_replica() -> None:
    balancer = make_balancer("prefix_cache")
    candidates = fleet(3)
    preamble = "You are the assistant of ACME Rail. " * 12  # ~400 characters every tenant shares
    chosen = {balancer.choose(chat("hi", system=preamble + tenant_prompt(t, 2000)), candidates).candidate.name for t in range(3)}
    assert chosen == {"r0", "r1", "r2"}


def test_same_prefix_together_stays_unless_overloaded() -> None:
    balancer = make_balancer("prefix_cache", PrefixCacheOptions(load_margin=2))
    candidates = fleet(3)
    system = tenant_prompt(1)
    home = balancer.choose(chat("q", system=system), candidates).candidate
    for burst in range(2):  # arrivals while home works: within the margin they follow
        home.busy += 1
        assert balancer.choose(chat(f"q{burst}", system=system), candidates).candidate is home
    home.busy += 1  # 3 above the idle ones: over the margin
    spill = balancer.choose(chat("q3", system=system), candidates)
    assert spill.candidate is not home and spill.reason == "prefix_overloaded"


def test_round_robin_least_busy_least_load() -> None:
    candidates = fleet(3)
    rr = make_balancer("round_robin")
    assert [rr.choose(chat("x"), candidates).candidate.name for _ in range(6)] == ["r0", "r1", "r2"] * 2
    busy = make_balancer("least_busy")
    assert [busy.choose(chat("x"), candidates).candidate.name for _ in range(6)] == ["r0", "r1", "r2"] * 2  # ties go round
    candidates[0].in_flight, candidates[1].in_flight, candidates[2].in_flight = 3, 1, 2
    assert make_balancer("least_busy").choose(chat("x"), candidates).candidate.name == "r1"
    candidates[0].busy, candidates[1].busy, candidates[2].busy = 0.0, 5.0, 5.0
    least = make_balancer("least_load")
    picks = [least.choose(chat("x"), candidates).candidate.name for _ in range(60)]
    # power of two choices: r0 whenever it is one of the two drawn (2 in 3 draws), else one of the
    # loaded pair — never a pure minimum that every gateway would pile onto between scrapes
    assert 30 <= picks.count("r0") < 60 and {"r1", "r2"} & set(picks)


def test_a_stale_load_signal_falls_back_to_the_gateway_in_flight_count() -> None:
    replica = Replica(url="http://127.0.0.1:9", pool=Pool("http://127.0.0.1:9"), stale_after_s=3.0)
    replica.in_flight = 2
    replica.observe(LoadSnapshot(running=5.0, waiting=4.0, at=time.monotonic()))
    replica.begin("least_load")  # sent since the scrape: counted on top of what the engine said
    assert replica.load() == 10.0
    replica.end("ok")
    assert replica.load() == 9.0
    replica.observe(LoadSnapshot(running=5.0, waiting=4.0, at=time.monotonic() - 3.5))  # older than 3 intervals
    assert replica.load() == 2.0


# ------------------------------------------------------------------------ agent sessions


def agent_turn(session: str | None, turn: int, system: str) -> RequestSpec:
    """Turn `turn` of an agent session: one long system prompt every session shares, then the
    session's own growing history."""
    history = [m for t in range(turn) for m in ({"role": "user", "content": f"{session}: step {t}"},
                                                  {"role": "assistant", "content": f"done {t}"})]
    return msgspec.structs.replace(chat(f"{session}: step {turn}", system=system), session=session,
                                   messages=[{"role": "system", "content": system}, *history,
                                             {"role": "user", "content": f"{session}: step {turn}"}])


def test_sessions_sharing_one_system_prompt_spread_and_stay() -> None:
    system = tenant_prompt(0, 3000)  # the agent's system prompt and tools: most of every turn
    sessions = [f"session-{i}" for i in range(6)]
    balancer = make_balancer("prefix_cache")
    candidates = fleet(3)
    first = {s: balancer.choose(agent_turn(s, 0, system), candidates) for s in sessions}
    assert all(c.reason == "session_new" for c in first.values())
    homes = [c.candidate.name for c in first.values()]
    assert sorted(homes) == ["r0", "r0", "r1", "r1", "r2", "r2"]  # two sessions each
    for turn in range(1, 6):
        for s in sessions:
            assert balancer.choose(agent_turn(s, turn, system), candidates) == (first[s].candidate, "session_hit")
    # the same requests without a session follow the shared prompt onto one replica
    plain = make_balancer("prefix_cache")
    assert len({plain.choose(agent_turn(None, 0, system), candidates).candidate.name for _ in sessions}) == 1


def test_an_overloaded_home_moves_the_session_and_it_stays_where_it_went() -> None:
    system = tenant_prompt(1, 2000)
    balancer = make_balancer("prefix_cache", PrefixCacheOptions(load_margin=2))
    candidates = fleet(3)
    home = balancer.choose(agent_turn("s", 0, system), candidates).candidate
    home.busy = 2.0  # within the margin: stays
    assert balancer.choose(agent_turn("s", 1, system), candidates) == (home, "session_hit")
    home.busy = 3.0  # over it
    moved = balancer.choose(agent_turn("s", 2, system), candidates)
    assert moved.candidate is not home and moved.reason == "session_moved"
    home.busy = 0.0
    assert balancer.choose(agent_turn("s", 3, system), candidates) == (moved.candidate, "session_hit")
    # a home that cannot be tried (its breaker open, already tried) moves it too
    others = [c for c in candidates if c is not moved.candidate]
    assert balancer.choose(agent_turn("s", 4, system), others).reason == "session_moved"


def test_the_session_table_is_a_bounded_lru_and_forgets_a_gone_replica() -> None:
    table = SessionTable(max_entries=2)
    table.went("a", "r0")
    table.went("b", "r1")
    table.went("a", "r0")  # a is the most recent now
    table.went("c", "r2")  # b, the least recent, is forgotten
    assert (table.home("a"), table.home("b"), table.home("c"), len(table)) == ("r0", None, "r2", 2)
    assert [table.num_sessions(r) for r in ("r0", "r1", "r2")] == [1, 0, 1]
    table.went("a", "r2")  # a moved
    assert [table.num_sessions(r) for r in ("r0", "r1", "r2")] == [0, 0, 2]
    table.drop("r2")
    assert (table.home("a"), table.home("c"), len(table), table.num_sessions("r2")) == (None, None, 0, 0)
    off = SessionTable(max_entries=0)
    off.went("a", "r0")
    assert off.home("a") is None and len(off) == 0


def test_a_forgotten_replica_s_sessions_are_placed_again_and_max_sessions_0_turns_sessions_off() -> None:
    system = tenant_prompt(2, 2000)
    balancer = make_balancer("prefix_cache")
    candidates = fleet(3)
    home = balancer.choose(agent_turn("s", 0, system), candidates).candidate
    balancer.forget(home.name)
    rest = [c for c in candidates if c is not home]
    assert balancer.choose(agent_turn("s", 1, system), rest).reason == "session_new"
    off = make_balancer("prefix_cache", PrefixCacheOptions(max_sessions=0))
    assert off.choose(agent_turn("s", 0, system), candidates).reason == "prefix_miss"
    assert off.choose(agent_turn("t", 0, system), candidates).reason == "prefix_hit"


def test_a_session_entry_costs_at_most_its_stated_bytes() -> None:
    table = SessionTable(max_entries=1 << 20)
    replicas = [f"http://10.0.0.{i}:8000" for i in range(8)]
    n = 20_000
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(n):
        table.went(str(uuid.UUID(int=i)), replicas[i % 8])  # 36-character ids, as both CLIs send
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(table) == n
    assert used / n <= SESSION_ENTRY_BYTES, f"{used / n:.0f} bytes per session"


def test_workers_that_saw_the_same_sessions_place_a_new_one_alike() -> None:
    """Each worker keeps its own table; a new session's ties are broken by a hash of the session,
    not by the worker's own turn counter, so two workers agree — here one had served plain
    requests in between."""
    system = tenant_prompt(3, 2000)
    one, two = make_balancer("prefix_cache"), make_balancer("prefix_cache")
    candidates = fleet(3)
    for i in range(5):
        two.choose(chat(f"plain {i}", system=tenant_prompt(10 + i, 500)), candidates)
    for s in (f"s{i}" for i in range(7)):
        assert one.choose(agent_turn(s, 0, system), candidates).candidate is two.choose(agent_turn(s, 0, system), candidates).candidate

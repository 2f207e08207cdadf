"""A top-band request's prefill kept apart from others' (`RequestSpec.top_band`, set by the
flow control's `isolate_top_band_prefill`), on a real `Fleet` of three replicas under
`least_busy`: the top-band request goes where no request waits for its first byte, even past a
less loaded replica; while it waits for its own, other requests go elsewhere, then its replica
is theirs again; with no other choice they still go; with a prefill on every replica it goes
beside an ordinary one, not another top-band one; an engine with no free slot is passed over; a
request that is not top band changes nothing."""

from __future__ import annotations

import time

import msgspec

from plugins.contract.protocol import RequestSpec
from plugins.fleet.discovery import StaticDiscovery
from plugins.fleet.fleet import Fleet
from plugins.fleet.load_signals import LoadSnapshot
from plugins.fleet.replica import Replica
from plugins.transport.http1 import Pool
from tests.plugins.fleet.conftest import chat

URLS = ["http://127.0.0.1:9001", "http://127.0.0.1:9002", "http://127.0.0.1:9003"]


def three() -> tuple[Fleet, list[Replica]]:
    fleet = Fleet("fleet", discovery=StaticDiscovery(URLS), make_pool=Pool, balance="least_busy")
    return fleet, [fleet.replicas[url] for url in URLS]


def request(name: str, *, top_band: bool = False) -> RequestSpec:
    return msgspec.structs.replace(chat(name, request_id=name), top_band=top_band)


def test_a_top_band_request_goes_where_no_request_is_in_its_prefill() -> None:
    fleet, (r0, r1, r2) = three()
    answering = [request(f"answering-{i}") for i in range(2)]
    for spec in answering:  # r2 runs two requests past their prefill: the most loaded
        assert fleet.choose(spec, [r0, r1]) is r2
        fleet.first_byte(r2, spec)
    assert {fleet.choose(request("prefilling-0")).url, fleet.choose(request("prefilling-1")).url} == {r0.url, r1.url}
    assert (r0.load(), r1.load(), r2.load()) == (1, 1, 2)
    top = request("top", top_band=True)
    assert fleet.choose(top) is r2  # least_busy alone would pick r0 or r1: both r0 and r1 are prefilling
    assert r2.prefills_top_band()


def test_others_keep_off_its_replica_until_its_first_byte() -> None:
    fleet, replicas = three()
    top = request("top", top_band=True)
    home = fleet.choose(top)  # every replica idle: the policy's pick
    others = [r for r in replicas if r is not home]
    placed = [fleet.choose(request(f"a-{i}")) for i in range(4)]  # home is the least loaded throughout
    assert home not in placed and sorted(r.url for r in placed) == sorted(2 * [others[0].url, others[1].url])
    fleet.first_byte(home, top)
    assert not home.prefills_top_band() and fleet.choose(request("after")) is home  # the least loaded again
    fleet.first_byte(home, top)  # a second call changes nothing
    fleet.finished(home, top, None)
    assert home.in_flight == 1 and len(home.prefilling) == 1  # "after" is still in its prefill


def test_with_every_replica_holding_a_top_band_prefill_others_still_go() -> None:
    fleet, replicas = three()
    tops = [request(f"top-{i}", top_band=True) for i in range(3)]
    assert {fleet.choose(spec).url for spec in tops} == set(URLS)  # one apiece: each goes where none prefills
    assert all(r.prefills_top_band() for r in replicas)
    assert fleet.choose(request("ordinary")) in replicas  # no replica is apart: it is placed anyway
    fleet.finished(replicas[1], tops[1], RuntimeError("failed before its first byte"))  # the end clears it too
    assert fleet.choose(request("next")) is replicas[1]


def test_a_top_band_request_passes_over_an_engine_with_no_free_slot() -> None:
    fleet, (r0, r1, r2) = three()
    now = time.monotonic()
    r0.observe(LoadSnapshot(running=3, waiting=0, at=now, slots=3))  # every slot busy, none prefilling here
    r1.observe(LoadSnapshot(running=1, waiting=0, at=now, slots=3))
    r2.observe(LoadSnapshot(running=2, waiting=1, at=now, slots=3))  # its engine queues
    busy = request("busy")
    assert fleet.choose(busy, [r0, r2]) is r1  # r1 now has a request in its prefill
    assert fleet.choose(request("top", top_band=True)) is r1  # the only free slot, prefilling or not
    r1.observe(LoadSnapshot(running=3, waiting=0, at=now, slots=3))
    r1.sent_since_scrape = 0
    assert fleet.choose(request("top-2", top_band=True)) is not r1  # no free slot anywhere: where the fewest prefill


def test_without_top_band_requests_placement_is_the_policy_s() -> None:
    fleet, replicas = three()
    plain, _ = three()
    for i in range(7):
        spec = request(f"r-{i}")
        assert fleet.choose(spec).url == plain.choose(spec).url


def test_with_a_prefill_everywhere_a_top_band_request_goes_beside_an_ordinary_one() -> None:
    fleet, (r0, r1, r2) = three()
    for replica, name in ((r0, "a-0"), (r1, "a-1")):
        answering = request(f"{name}-answering")  # r0 and r1 are the busier: one more request each, past its prefill
        assert fleet.choose(answering, [r for r in (r0, r1, r2) if r is not replica]) is replica
        fleet.first_byte(replica, answering)
        assert fleet.choose(request(name), [r for r in (r0, r1, r2) if r is not replica]) is replica
    assert fleet.choose(request("top-0", top_band=True), [r0, r1]) is r2
    assert [len(r.prefilling) for r in (r0, r1, r2)] == [1, 1, 1] and (r0.in_flight, r1.in_flight, r2.in_flight) == (2, 2, 1)
    assert fleet.choose(request("top-1", top_band=True)) in (r0, r1)  # least_busy alone: r2, beside the other top-band prefill

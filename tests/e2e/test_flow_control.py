"""Flow control through the real gateway in front of a real llama.cpp replica of one slot
(`replica_concurrency = 1`): a holder's stream fills the slot, requests queue behind it, and the
test releases the slot by closing the holder's connection. Served one at a time, the order the
queued requests finish in is the order the queue served them. Every wait is on an event or a
count (the queue depth in /metrics, a response), never a sleep standing in for one; the aging
test lets real time pass because aging is time.

The quiet tenant overtakes the flood's backlog; bands are honoured and aging releases the low
band; a request predicted to wait past its route's `ttft_slo_ms` is refused at once with 429 and
`Retry-After` in its API's own shape (and a fallback route serves it elsewhere); a client that
leaves while queued frees its place; two workers share one fair order through a real Redis; the
drain ends a waiter with 503; and nothing queues while the replica has room (no `queued_ms`)."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from engines.launch import ServerProcess, start_llamacpp
from tests.gateway.keys.conftest import redis, redis_session  # noqa: F401 - fixtures
from tests.plugins.fleet.conftest import MODEL, llamacpp_or_skip
from tests.support.probes import metric, wait_until, whole_request_log
from tests.support.queue_clients import Client, Holder, served_order
from tests.support.redis_server import RedisServer
from tests.support.server import running_server, server_process

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

KEYS = {"flood": 0, "quiet": 0, "holder": 0, "low": 1, "aged": 1, "fresh": 0}  # key name -> its default priority


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    llamacpp_or_skip()
    server = start_llamacpp(alias=MODEL, ctx_size=2048, parallel=1, threads=1, log_dir=tmp_path_factory.mktemp("replica"))
    try:
        yield server
    finally:
        server.stop()


def config(replica: ServerProcess, log: Path, *, flow: str = "", server: str = "", routes: str = "", spare: bool = False) -> str:
    keys = "".join(f'[[server.keys]]\nname = "{name}"\nkey = "sk-{name}"\npriority = {priority}\n' for name, priority in KEYS.items())
    backend = (f'[[backends]]\nname = "{{name}}"\ntype = "llamacpp"\n{{table}}[backends.options]\nbase_url = "{replica.base_url}"\n'
               f'models = {{{{ "{MODEL}" = "{MODEL}" }}}}\n')
    backends = backend.format(name="fleet", table="[backends.flow_control]\nreplica_concurrency = 1\n")
    if spare:
        backends += backend.format(name="spare", table="max_concurrent = 4\n")
    return (f'[server]\nrequest_log = "{log}"\nhealth_interval_s = 0\n{server}{keys}'
            f'[server.flow_control]\nenabled = true\n{flow}\n[plugins]\ndisable = ["builtin"]\n\n{backends}{routes}')


def depth(base: str) -> float:
    return metric(httpx.get(base + "/metrics").text, "switchyard_flow_queue_depth")


def wait_depth(base: str, expected: int) -> None:
    assert wait_until(lambda: depth(base) == expected, timeout=20, interval=0.02), f"queue depth {depth(base)}, not {expected}"


def test_nothing_queues_while_the_replica_has_room(replica: ServerProcess, tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    with running_server(config(replica, log), tmp_path) as base:
        for i, stream in enumerate((False, True, False)):
            client = Client(base, "quiet")
            assert client.chat(f"n{i}", stream=stream).status == 200
        text = httpx.get(base + "/metrics").text
        assert metric(text, "switchyard_flow_admissions_total", path="immediate", tenant="quiet") == 3
        assert metric(text, "switchyard_flow_admissions_total", path="queued") == 0
        assert depth(base) == 0
        lines = whole_request_log(log, 3)
    assert [("queued_ms" in lines[f"n{i}"]) for i in range(3)] == [False, False, False]


def test_the_quiet_tenant_overtakes_the_floods_backlog(replica: ServerProcess, tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    with running_server(config(replica, log), tmp_path) as base:
        with Holder(base) as holder:
            flood = [Client(base, "flood").send(f"a{i}") for i in range(4)]
            wait_depth(base, 4)
            quiet = Client(base, "quiet").send("b0")
            wait_depth(base, 5)
            holder.release()
            order = served_order([*flood, quiet])
        lines = whole_request_log(log, 6)
    assert order.index("b0") <= 1, order  # behind at most the flood's first, ahead of its backlog
    assert sorted(order) == ["a0", "a1", "a2", "a3", "b0"]
    assert all(lines[name]["queued_ms"] >= 0 and lines[name]["outcome"] == "ok" for name in order)


def test_bands_are_served_high_first(replica: ServerProcess, tmp_path: Path) -> None:
    with running_server(config(replica, tmp_path / "log.jsonl", flow="aging_s = 0\n"), tmp_path) as base:
        with Holder(base) as holder:
            low = Client(base, "low").send("low")  # its key's priority 1: band 2, and it came first
            wait_depth(base, 1)
            high = Client(base, "quiet").send("high")  # priority 0: band 1
            wait_depth(base, 2)
            # its own priority -1: band 0 — accepted on llama.cpp, which has no priority of its own
            urgent = Client(base, "quiet").send("urgent", extra={"priority": -1})
            wait_depth(base, 3)
            holder.release()
            order = served_order([low, high, urgent])
        text = httpx.get(base + "/metrics").text
    assert order == ["urgent", "high", "low"], order
    assert metric(text, "switchyard_flow_queue_wait_seconds_count", tenant="low", band="2") == 1


def test_aging_releases_the_low_band(replica: ServerProcess, tmp_path: Path) -> None:
    with running_server(config(replica, tmp_path / "log.jsonl", flow="aging_s = 1.0\n"), tmp_path) as base:
        with Holder(base) as holder:
            low = Client(base, "aged").send("aged")  # band 2: one band up per second waited
            wait_depth(base, 1)
            time.sleep(1.2)  # aging is time: it has risen to band 1, the band of what comes next
            high = [Client(base, "fresh").send(f"fresh{i}") for i in range(2)]
            wait_depth(base, 3)
            holder.release()
            order = served_order([low, *high])
    assert order[0] == "aged", order


SLO_ROUTES = ('[[routes]]\nname = "fast"\nttft_slo_ms = 1\n[[routes.targets]]\nbackend = "fleet"\nmodel = "' + MODEL + '"\n'
              '[[routes]]\nname = "spill"\nstrategy = "fallback"\nttft_slo_ms = 1\n[[routes.targets]]\nbackend = "fleet"\nmodel = "'
              + MODEL + '"\n[[routes.targets]]\nbackend = "spare"\nmodel = "' + MODEL + '"\n')


def test_a_predicted_wait_past_the_slo_is_refused_at_once(replica: ServerProcess, tmp_path: Path) -> None:
    from anthropic import Anthropic, RateLimitError
    from openai import OpenAI

    with running_server(config(replica, tmp_path / "log.jsonl", routes=SLO_ROUTES, spare=True), tmp_path) as base:
        assert Client(base, "quiet").chat("warm", model="fast").status == 200  # the queue learns its service rate
        with Holder(base, model="fast") as holder:
            first = Client(base, "quiet").send("first", model="fast")  # nothing ahead of it: it waits
            wait_depth(base, 1)
            openai = OpenAI(base_url=base + "/v1", api_key="sk-quiet", max_retries=0)
            with pytest.raises(Exception) as refused:
                openai.chat.completions.create(model="fast", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
            assert refused.value.status_code == 429  # type: ignore[attr-defined]
            assert refused.value.response.headers["retry-after"] == "1"  # type: ignore[attr-defined]
            assert refused.value.body["code"] == "queue_wait_over_slo"  # type: ignore[attr-defined]
            anthropic = Anthropic(base_url=base, api_key="sk-quiet", max_retries=0)
            with pytest.raises(RateLimitError) as limited:
                anthropic.messages.create(model="fast", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
            assert limited.value.response.headers["retry-after"] == "1"
            assert limited.value.body["type"] == "error" and limited.value.body["error"]["type"] == "rate_limit_error"
            spilled = Client(base, "quiet").send("spilled", model="spill")  # refused by `fleet`: `spare` serves it
            holder.release()
            assert served_order([first]) == ["first"] and first.result().status == 200
            assert spilled.result().status == 200 and spilled.result().headers["x-switchyard-backend"] == "spare"
        text = httpx.get(base + "/metrics").text
    assert metric(text, "switchyard_flow_sheds_total", backend="fleet", reason="slo") == 3


def test_a_client_that_leaves_while_queued_frees_its_place(replica: ServerProcess, tmp_path: Path) -> None:
    with running_server(config(replica, tmp_path / "log.jsonl"), tmp_path) as base:
        with Holder(base) as holder:
            leaving = Client(base, "flood").send("gone", stream=True)
            wait_depth(base, 1)
            staying = Client(base, "quiet").send("stays")
            wait_depth(base, 2)
            leaving.leave()
            wait_depth(base, 1)
            holder.release()
            assert served_order([staying]) == ["stays"]
        text = httpx.get(base + "/metrics").text
    assert metric(text, "switchyard_flow_sheds_total", tenant="flood", reason="cancelled") == 1
    assert metric(text, "switchyard_replica_attempts_total", backend="fleet") == 2  # the holder and `stays`: never `gone`


MIRROR_ROUTE = ('[[routes]]\nname = "mirror"\nshadow = { backend = "fleet", model = "' + MODEL + '" }\n'
                '[[routes.targets]]\nbackend = "spare"\nmodel = "' + MODEL + '"\n')


def test_a_shadow_copy_is_skipped_while_the_queue_has_waiters(replica: ServerProcess, tmp_path: Path) -> None:
    with running_server(config(replica, tmp_path / "log.jsonl", routes=MIRROR_ROUTE, spare=True), tmp_path) as base:
        with Holder(base) as holder:
            waiting = Client(base, "quiet").send("waits")
            wait_depth(base, 1)
            mirrored = Client(base, "flood").send("mirrored", model="mirror")  # served by `spare`; its copy would queue
            assert wait_until(lambda: metric(httpx.get(base + "/metrics").text, "switchyard_shadow_skipped_total",
                                             backend="fleet", reason="queue") == 1, timeout=10)
            holder.release()
            assert sorted(served_order([waiting, mirrored])) == ["mirrored", "waits"]
        assert depth(base) == 0


def test_two_workers_share_one_fair_order_through_redis(replica: ServerProcess, redis: RedisServer, tmp_path: Path) -> None:  # noqa: F811
    server = f'workers = 2\nstate = "{redis.url}"\n'
    with running_server(config(replica, tmp_path / "log.jsonl", server=server, flow="poll_interval_s = 0.01\n"), tmp_path) as base:
        clients = Client.on_each_worker(base, {"0": ["flood"] * 4, "1": ["quiet"]})
        flooders, quiet = clients["0"], clients["1"][0]
        with Holder(base) as holder:
            flood = [client.send(f"a{i}") for i, client in enumerate(flooders[:3])]
            wait_depth(base, 3)
            asked = quiet.send("b0")  # on the other worker
            wait_depth(base, 4)
            holder.release()
            order = served_order([*flood, asked])
    assert order.index("b0") <= 1, order
    keys = redis.command("KEYS", "switchyard:flow:*")
    assert b"switchyard:flow:{fleet}:vclock" in keys, keys  # the fair order lived in Redis
    assert b"running" not in keys and b"tag:" not in keys, keys  # and every entry has left it


def test_the_drain_ends_a_waiter_with_503(replica: ServerProcess, tmp_path: Path) -> None:
    with server_process(config(replica, tmp_path / "log.jsonl"), tmp_path, args=("--drain-seconds", "1")) as (proc, base, _):
        with Holder(base):
            waiting = Client(base, "quiet").send("late")
            wait_depth(base, 1)
            proc.send_signal(signal.SIGTERM)
            reply = waiting.result()
    assert reply.status == 503 and json.loads(reply.body)["error"]["code"] == "server_shutting_down"


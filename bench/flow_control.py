"""When the fleet is full (issue #34): three tenants on three llama.cpp replicas, side by side
through each arm.

    .venv/bin/python bench/flow_control.py --plan        # the trace and the arms, no server started
    .venv/bin/python bench/flow_control.py               # every arm (needs `make engines`, sglang-router:
                                                         # python bench/router_envs.py install)
    .venv/bin/python bench/flow_control.py --short       # a 40 s trace of smaller requests: ~12 min
    .venv/bin/python bench/flow_control.py --short --duration 90   # more B requests: ~25 min
    .venv/bin/python bench/flow_control.py --arms flow plain --duration 30

Every arm's replicas are three `llama-server`s of `slots + headroom` slots each (`-np 3` by
default), so that every arm has the same engines; the flow arms fill `--replica-concurrency` of
the ordinary ones (default 1). Capacity first: the plain arm under a closed
loop of `slots x replicas` streams for `--capacity-s` seconds gives the fleet's requests per
second. Then an open-loop trace (Poisson arrivals, fixed seed) of `--duration` seconds:

- tenant A (`key-a`): floods at 5x capacity, priority 0 (band 1);
- tenant B (`key-b`): interactive, 10% of capacity, priority -1 (band 0, the top band), its
  route's `ttft_slo_ms` applies;
- tenant C (`key-c`): batch, 30% of capacity, priority 10 (band 2), on a route without an SLO.

Every request: the same ~640-token prompt (`--short`: ~130) with a per-request nonce (no prefix-cache windfall),
`max_tokens` 32 (`--short`: 16), streamed. Keys have equal `weight`, so two tenants contending
are owed half each, three a third.

Arms: `flow` (Switchyard, flow control on, `replica_concurrency` 1 — one ordinary request per
replica, so that B's prefill shares a one-thread engine with at most one other —
`priority_headroom` = headroom, the keys' `priority`, `ttft_slo_ms` 4 s on A's and B's route),
`flow_no_headroom` (the same without the headroom: the top band waits for a slot like the
others), `plain` (Switchyard, flow control off, `prefix_cache` placement), `sglang_cache_aware`
(sglang-router), `engine_priority` (the engines' own priority alone: llama-server has none, so
this arm needs vLLM replicas and is skipped here), `b_alone` (only tenant B's requests through
`plain`: B's own baseline), and `b_host_busy` (B's requests straight to one replica that runs
nothing else, while a closed loop of `--replica-concurrency` A streams keeps each other replica
busy: what B's TTFT is when its engine is its own but the host's cores are not — the floor no
placement or queue can go under on a host whose replicas share cores).

Per arm and tenant: sent, served, refused (429 with Retry-After), lost (anything else: an error,
a timeout, a stream without tokens), TTFT p50/p99; per arm: output tokens/s. Per flow arm, from
its request log and /metrics: A's share of the grants made while B or C waited in the gateway
queue in A's band or above, against what its weight owed it then (`bench/flow_control_share.py`;
also over every band, which a lower band by design does not get), and the grants into the
headroom by tenant.

Targets: B's p99 TTFT under `flow` <= 1.5x its p99 in `b_alone`; `flow`'s output tokens/s >=
95% of `plain`'s; A's in-band share of the grants while B or C waited <= what it was owed; 0
requests lost in `flow`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import RESULTS, Server, free_port, pct, print_header, spawn, wait_ready, write_result  # noqa: E402
from bench.flow_control_share import a_share, read_log, requests_of  # noqa: E402

if TYPE_CHECKING:
    import httpx

MODEL = "smol"  # the interactive route (A and B), `ttft_slo_ms` in the flow arm
BATCH_MODEL = "smol-batch"  # C's route: the same fleet, no SLO (a batch job waits rather than be refused)
SLOTS = 2  # each replica's ordinary slots: every arm's engines run -np SLOTS + HEADROOM
HEADROOM = 1  # priority_headroom: the top band's more (`--headroom`)
REPLICA_CONCURRENCY = 1  # the flow arms' replica_concurrency (`--replica-concurrency`; runs 1-6 of bench/README.md: SLOTS)
TENANTS = {"A": ("key-a", 5.0, 0), "B": ("key-b", 0.10, -1), "C": ("key-c", 0.30, 10)}  # key, x capacity, priority
BAND_EDGES = (0, 1)  # priority < 0: band 0; 0: band 1; >= 1: band 2
AGING_S = 30.0
ARMS = ("flow", "flow_no_headroom", "plain", "sglang_cache_aware", "engine_priority", "b_alone", "b_host_busy")
FLOW_ARMS = ("flow", "flow_no_headroom")
PROMPT_WORDS = 150  # ~640 tokens (`--short`: 30, ~130)
MAX_TOKENS = 32  # (`--short`: 16)
TTFT_SLO_MS = 4000


@dataclass(frozen=True)
class Shot:
    tenant: str
    at_s: float
    nonce: int


@dataclass
class Outcome:
    tenant: str
    sent_s: float
    ttft_s: float | None = None
    done_s: float | None = None
    completion_tokens: int = 0
    status: int = 0
    retry_after: str | None = None
    error: str | None = None

    @property
    def lost(self) -> bool:
        return self.status != 429 and (self.error is not None or self.ttft_s is None)


def make_trace(seed: int, capacity_rps: float, duration_s: float, tenants: tuple[str, ...] = tuple(TENANTS)) -> list[Shot]:
    """Every tenant's arrivals, drawn in one order whatever `tenants` keeps: B alone sends the
    very requests B sends under the flood."""
    rng = random.Random(seed)
    shots: list[Shot] = []
    for tenant in TENANTS:
        rate = TENANTS[tenant][1] * capacity_rps
        t = rng.expovariate(rate)
        while t < duration_s:
            if tenant in tenants:
                shots.append(Shot(tenant, t, rng.randrange(1 << 30)))
            else:
                rng.randrange(1 << 30)
            t += rng.expovariate(rate)
    return sorted(shots, key=lambda s: s.at_s)


def body(shot: Shot, model: str = MODEL) -> dict:
    words = " ".join(f"w{(shot.nonce + i) % 997}" for i in range(PROMPT_WORDS))
    return {"model": model, "messages": [{"role": "user", "content": f"{shot.nonce}: summarize {words}"}], "max_tokens": MAX_TOKENS,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, "priority": TENANTS[shot.tenant][2]}


async def fire(url: str, trace: list[Shot], *, send_priority: bool, batch_route: bool = False) -> tuple[list[Outcome], float]:
    """`batch_route`: tenant C asks for the `smol-batch` route (Switchyard's arms), else `smol`."""
    import httpx

    outcomes: list[Outcome] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=httpx.Limits(max_connections=4096), trust_env=False) as client:
        t0 = time.perf_counter()

        async def one(shot: Shot) -> None:
            await asyncio.sleep(max(0.0, shot.at_s - (time.perf_counter() - t0)))
            out = Outcome(shot.tenant, time.perf_counter() - t0)
            outcomes.append(out)
            payload = body(shot, BATCH_MODEL if batch_route and shot.tenant == "C" else MODEL)
            if not send_priority:
                payload.pop("priority")
            headers = {"authorization": f"Bearer {TENANTS[shot.tenant][0]}", "x-request-id": f"{shot.tenant}-{shot.nonce}"}
            try:
                async with client.stream("POST", url + "/v1/chat/completions", json=payload, headers=headers) as response:
                    out.status = response.status_code
                    if response.status_code != 200:
                        out.retry_after = response.headers.get("retry-after")
                        out.error = (await response.aread())[:200].decode(errors="replace")
                        return
                    async for line in response.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        chunk = json.loads(line[6:])
                        if "error" in chunk:
                            out.error = str(chunk["error"])[:200]
                        if out.ttft_s is None and any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or ()):
                            out.ttft_s = time.perf_counter() - t0 - out.sent_s
                        if chunk.get("usage"):
                            out.completion_tokens = chunk["usage"].get("completion_tokens") or 0
            except Exception as exc:  # noqa: BLE001 - a lost request is a result
                out.error = f"{type(exc).__name__}: {exc}"[:200]
            out.done_s = time.perf_counter() - t0

        await asyncio.gather(*(one(shot) for shot in trace))
        return outcomes, time.perf_counter() - t0


async def closed_loop(client: httpx.AsyncClient, url: str, first_nonce: int, going: Callable[[], bool],
                      headers: dict[str, str] | None = None) -> int:
    """One stream of back-to-back requests to `url` while `going()`; how many completed. A kept-alive
    connection the server closed between two requests (llama-server does after a few) is retried."""
    import httpx

    done = 0
    while going():
        payload = body(Shot("A", 0.0, first_nonce + done))
        payload.pop("priority")
        try:
            async with client.stream("POST", url + "/v1/chat/completions", json=payload, headers=headers) as response:
                async for _ in response.aiter_lines():
                    pass
        except httpx.TransportError:
            continue
        done += 1
    return done


async def beside_a_busy_host(replicas: list[Server], trace: list[Shot], streams: int) -> tuple[list[Outcome], float]:
    """`trace` (B's requests) straight to the first replica, which runs nothing else, while a
    closed loop of `streams` A requests per replica keeps every other replica busy."""
    import httpx

    stop = asyncio.Event()
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), trust_env=False) as client:
        loops = [asyncio.create_task(closed_loop(client, replica.base, 1_000_000 * (i + 1) + 10_000 * j, lambda: not stop.is_set()))
                 for i, replica in enumerate(replicas[1:]) for j in range(streams)]
        await asyncio.sleep(2.0)  # every loop has a request running
        try:
            return await fire(replicas[0].base, trace, send_priority=False)
        finally:
            stop.set()
            await asyncio.gather(*loops)


def band_of(priority: int) -> int:
    return sum(priority >= edge for edge in BAND_EDGES)


def share_figures(request_log: Path) -> dict:
    """A's share of the grants while B or C waited (in A's band or above, and over every band),
    with what its weight owed it then (`bench/flow_control_share.py`)."""
    requests = requests_of(read_log(request_log))
    bands = {tenant: band_of(priority) for tenant, (_, _, priority) in TENANTS.items()}
    weights = {tenant: 1.0 for tenant in TENANTS}
    return {"in_band": a_share(requests, bands=bands, weights=weights, aging_s=AGING_S).as_dict(),
            "every_band": a_share(requests, bands=bands, weights=weights, aging_s=AGING_S, literal=True).as_dict()}


def headroom_grants(base: str) -> dict[str, float]:
    """`switchyard_flow_headroom_grants_total` by tenant, off the gateway's /metrics."""
    import httpx

    grants: dict[str, float] = {}
    for line in httpx.get(base + "/metrics", timeout=30).text.splitlines():
        if line.startswith("switchyard_flow_headroom_grants_total{"):
            tenant = line.split('tenant="', 1)[1].split('"', 1)[0]
            grants[tenant] = grants.get(tenant, 0.0) + float(line.rsplit(" ", 1)[1])
    return grants


def summarize(arm: str, outcomes: list[Outcome], wall_s: float) -> dict:
    row: dict = {"arm": arm, "output_tokens_per_s": sum(o.completion_tokens for o in outcomes) / wall_s, "tenants": {}}
    for tenant in TENANTS:
        mine = [o for o in outcomes if o.tenant == tenant]
        ttfts = [o.ttft_s for o in mine if o.ttft_s is not None]
        row["tenants"][tenant] = {
            "sent": len(mine), "served": len(ttfts), "refused_429": sum(o.status == 429 for o in mine),
            "refused_without_retry_after": sum(o.status == 429 and not o.retry_after for o in mine),
            "lost": sum(o.lost for o in mine),
            "ttft_p50_s": pct(ttfts, 0.5) if ttfts else None, "ttft_p99_s": pct(ttfts, 0.99) if ttfts else None,
        }
    return row


def targets(rows: dict[str, dict]) -> dict[str, bool | None]:
    flow, plain, alone = rows.get("flow"), rows.get("plain"), rows.get("b_alone")
    b_flow = flow and flow["tenants"]["B"]["ttft_p99_s"]
    b_alone = alone and alone["tenants"]["B"]["ttft_p99_s"]
    share = (flow or {}).get("share", {}).get("in_band", {})
    return {
        "b_p99_ttft_within_1.5x_alone": None if not (b_flow and b_alone) else b_flow <= 1.5 * b_alone,
        "throughput_at_least_95pct_of_plain": None if not (flow and plain) else
        flow["output_tokens_per_s"] >= 0.95 * plain["output_tokens_per_s"],
        "a_within_weighted_share": None if share.get("a_share") is None else share["a_share"] <= share["a_owed"],
        "zero_lost": None if not flow else sum(t["lost"] for t in flow["tenants"].values()) == 0,
    }


def floor(rows: dict[str, dict]) -> dict[str, float | None]:
    """B's p99 TTFT beside a busy host (its engine its own) and under `flow`, each over B alone."""
    alone = rows.get("b_alone", {}).get("tenants", {}).get("B", {}).get("ttft_p99_s")

    def over_alone(arm: str) -> float | None:
        p99 = rows.get(arm, {}).get("tenants", {}).get("B", {}).get("ttft_p99_s")
        return None if not (p99 and alone) else p99 / alone

    return {"b_p99_host_busy_over_alone": over_alone("b_host_busy"), "b_p99_flow_over_alone": over_alone("flow")}


def switchyard_config(replicas: list[Server], log_dir: Path, *, flow: bool, headroom: int = 0,
                      replica_concurrency: int = REPLICA_CONCURRENCY) -> str:
    keys = "".join(f'\n[[server.keys]]\nname = "{key}"\nkey = "{key}"\nweight = 1.0\npriority = {priority}\n' if flow else
                   f'\n[[server.keys]]\nname = "{key}"\nkey = "{key}"\n' for key, _, priority in TENANTS.values())
    flow_tables = (f"\n[server.flow_control]\nenabled = true\ntenant = \"key\"\nband_edges = {list(BAND_EDGES)}\n"
                   f"aging_s = {AGING_S}\n") if flow else ""
    routes = "".join(f'\n[[routes]]\nname = "{name}"\n{slo}[[routes.targets]]\nbackend = "fleet"\nmodel = "{MODEL}"\n'
                     for name, slo in ((MODEL, f"ttft_slo_ms = {TTFT_SLO_MS}\n" if flow else ""), (BATCH_MODEL, "")))
    backend_flow = (f"[backends.flow_control]\nreplica_concurrency = {replica_concurrency}\npriority_headroom = {headroom}\n"
                    if flow else "")
    return (f'[server]\nrequest_log = "{log_dir / "requests.jsonl"}"\nlog_level = "warning"\n{keys}{flow_tables}\n'
            f'[plugins]\ndisable = ["builtin"]\n\n[[backends]]\nname = "fleet"\ntype = "llamacpp"\n{backend_flow}'
            f'[backends.options]\nendpoints = {json.dumps([r.base for r in replicas])}\nmodels = {{ "{MODEL}" = "{MODEL}" }}\n'
            f'balance = "prefix_cache"\n[backends.options.timeouts]\nfirst_byte_s = 600\n{routes}')


def start_switchyard(replicas: list[Server], log_dir: Path, *, flow: bool, headroom: int = 0,
                     replica_concurrency: int = REPLICA_CONCURRENCY) -> Server | None:
    """None when the configuration is refused."""
    port = free_port()
    config = log_dir / f"switchyard-{'flow' if flow else 'plain'}.toml"
    (log_dir / "requests.jsonl").unlink(missing_ok=True)  # this run's requests only
    config.write_text(switchyard_config(replicas, log_dir, flow=flow, headroom=headroom, replica_concurrency=replica_concurrency))
    argv = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config), "--port", str(port)]
    server = spawn(f"switchyard-{'flow' if flow else 'plain'}", argv, port=port, log_dir=log_dir)
    try:
        wait_ready(server, path="/ready", timeout=120)
    except Exception:  # noqa: BLE001 - exited at start-up: the knobs are not read yet
        server.stop()
        return None
    return server


async def measure_capacity(url: str, streams: int, seconds: float) -> float:
    """Requests per second the fleet completes under a closed loop of `streams` streams."""
    import httpx

    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), trust_env=False) as client:
        t0 = time.perf_counter()
        done = await asyncio.gather(*(closed_loop(client, url, i * 100_000, lambda: time.perf_counter() - t0 < seconds,
                                                  headers={"authorization": "Bearer key-b"}) for i in range(streams)))
        return sum(done) / (time.perf_counter() - t0)


def run_arm(arm: str, args: argparse.Namespace, capacity_rps: float) -> dict | None:
    from bench.fleet_routing import start_peer, start_replicas

    log_dir = args.results_dir / "flow_control_logs" / arm
    log_dir.mkdir(parents=True, exist_ok=True)
    replicas = start_replicas(log_dir, cache_ram=128, parallel=SLOTS + args.headroom)
    router: Server | None = None
    flow = arm in FLOW_ARMS
    try:
        if arm in (*FLOW_ARMS, "plain", "b_alone"):
            router = start_switchyard(replicas, log_dir, flow=flow, headroom=args.headroom if arm == "flow" else 0,
                                      replica_concurrency=args.replica_concurrency)
            if router is None:
                print(f"  {arm}: Switchyard refused its configuration: skipped", flush=True)
                return None
        elif arm == "sglang_cache_aware":
            router = start_peer("sglang_cache_aware", replicas, log_dir)
        trace = make_trace(args.seed, capacity_rps, args.duration, ("B",) if arm in ("b_alone", "b_host_busy") else tuple(TENANTS))
        if arm == "b_host_busy":
            outcomes, wall = asyncio.run(beside_a_busy_host(replicas, trace, args.replica_concurrency))
        else:
            outcomes, wall = asyncio.run(fire(router.base, trace, send_priority=flow,  # type: ignore[union-attr]
                                              batch_route=arm in (*FLOW_ARMS, "plain", "b_alone")))
        row = summarize(arm, outcomes, wall)
        if flow:
            row["share"] = share_figures(log_dir / "requests.jsonl")
            row["headroom_grants"] = headroom_grants(router.base)  # type: ignore[union-attr]
        return row
    finally:
        if router is not None:
            router.stop()
        for replica in replicas:
            replica.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--duration", type=float, help="seconds of arrivals (default 60; --short: 40)")
    parser.add_argument("--capacity-s", type=float, default=20.0)
    parser.add_argument("--capacity-rps", type=float, help="skip the capacity measurement: the fleet's requests per second")
    parser.add_argument("--seed", type=int, default=34)
    parser.add_argument("--headroom", type=int, default=HEADROOM,
                        help="the `flow` arm's priority_headroom; every arm's engines run -np slots + this")
    parser.add_argument("--replica-concurrency", type=int, default=REPLICA_CONCURRENCY,
                        help="the flow arms' replica_concurrency (the engines keep -np slots + headroom in every arm)")
    parser.add_argument("--plan", action="store_true", help="print the trace and the arms; start nothing")
    parser.add_argument("--short", action="store_true", help="a 40 s trace of ~130-token prompts and 16-token answers")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.short:  # a smaller request, so that a loaded 2-core machine serves enough of them
        global PROMPT_WORDS, MAX_TOKENS
        args.capacity_s, PROMPT_WORDS, MAX_TOKENS = 15.0, 30, 16
    if args.duration is None:
        args.duration = 40.0 if args.short else 60.0
    if args.plan:
        capacity = args.capacity_rps or 4.0
        trace = make_trace(args.seed, capacity, args.duration)
        counts = {t: sum(s.tenant == t for s in trace) for t in TENANTS}
        print(f"plan: capacity {capacity:g} req/s (assumed), {args.duration:g} s, {len(trace)} requests: {counts}")
        print(f"arms: {', '.join(args.arms)}  (engine_priority needs vLLM replicas: skipped with llama.cpp)")
        return 0
    print_header("flow control: three tenants on a full fleet", {"duration_s": str(args.duration), "seed": str(args.seed),
                                                                 "prompt_words": str(PROMPT_WORDS), "max_tokens": str(MAX_TOKENS),
                                                                 "slots": str(SLOTS), "headroom": str(args.headroom),
                                                                 "replica_concurrency": str(args.replica_concurrency)})
    capacity = args.capacity_rps
    if capacity is None:
        from bench.fleet_routing import start_replicas

        log_dir = args.results_dir / "flow_control_logs" / "capacity"
        log_dir.mkdir(parents=True, exist_ok=True)
        replicas = start_replicas(log_dir, cache_ram=128, parallel=SLOTS + args.headroom)
        router = start_switchyard(replicas, log_dir, flow=False)
        try:
            assert router is not None
            capacity = asyncio.run(measure_capacity(router.base, SLOTS * len(replicas), args.capacity_s))
        finally:
            if router is not None:
                router.stop()
            for replica in replicas:
                replica.stop()
    print(f"capacity: {capacity:.2f} requests/s", flush=True)
    rows: dict[str, dict] = {}
    for arm in args.arms:
        if arm == "engine_priority":
            print("  engine_priority: llama-server has no request priority (needs vLLM replicas): skipped", flush=True)
            continue
        row = run_arm(arm, args, capacity)
        if row is not None:
            rows[arm] = row
            print(json.dumps(row), flush=True)
    report = {"capacity_rps": capacity, "arms": rows, "targets": targets(rows), "floor": floor(rows)}
    print(json.dumps({**report["targets"], **report["floor"]}, indent=2))
    write_result("flow_control", report, results_dir=args.results_dir, smoke=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

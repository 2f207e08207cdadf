"""What flow control costs a request when the backend has room (issue #34: "no added latency
when there is room"): the time of `FlowQueue.admit` on the in-process ledger when it grants at
once, and of a whole admit + release (the release's ledger step included), side by side with
today's `BackendLimiter.acquire` + `release` and with an event-loop turn alone. With `--redis`
also the Redis ledger's admission (one EVALSHA round trip on loopback), for reference. With
`--http`, the whole request through two real gateways in front of the bench upstream
(bench/upstream.py), one with today's limiter (`max_concurrent`), one with flow control on (the
same `max_concurrent` as its capacity, a client key), one request at a time, the two taking
turns: what flow control adds to a request's latency when nothing queues.

Each figure is the median of `--rounds` rounds of `--calls` calls, the arms taking turns in
every round so that all see the same moments of a noisy machine; the loop is uvloop, as the
gateway's. Both the wall time and this process's CPU time per call are shown: on a machine that
other processes keep busy the wall time includes their turns on the core, the CPU time does not.
Not a test: nothing here asserts a time.

    .venv/bin/python bench/flow_control_fast_path.py              # ~20 s
    .venv/bin/python bench/flow_control_fast_path.py --redis      # starts its own redis-server
    .venv/bin/python bench/flow_control_fast_path.py --http       # two gateways, ~1 min
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from tempfile import TemporaryDirectory
from time import process_time

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import free_port, median, print_header, use_uvloop  # noqa: E402
from gateway.flow_control.ledger.memory_ledger import MemoryLedger  # noqa: E402
from gateway.flow_control.queue import Ask, FlowQueue  # noqa: E402
from gateway.service.admission import BackendLimiter  # noqa: E402

ASK = Ask("team-a", 1, 1124, weight=1.0)
SLOTS = 1_000_000  # never full: every admission goes straight through


async def loop_turn(calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        await asyncio.sleep(0)
    return time.perf_counter() - started


async def limiter_cycle(calls: int) -> float:
    limiter = BackendLimiter("b", max_concurrent=SLOTS)
    started = time.perf_counter()
    for _ in range(calls):
        await limiter.acquire()
        limiter.release()
        await asyncio.sleep(0)
    return time.perf_counter() - started


async def admit_only(calls: int) -> float:
    queue = FlowQueue("b", MemoryLedger(3, 30.0), lambda: SLOTS, has_room=lambda: True)
    tickets = []
    started = time.perf_counter()
    for _ in range(calls):
        tickets.append(await queue.admit(ASK))
    elapsed = time.perf_counter() - started
    for ticket in tickets:
        ticket.release()
    await queue.close()
    return elapsed


async def admit_release_cycle(calls: int) -> float:
    queue = FlowQueue("b", MemoryLedger(3, 30.0), lambda: SLOTS, has_room=lambda: True)
    started = time.perf_counter()
    for _ in range(calls):
        ticket = await queue.admit(ASK)
        ticket.release()
        await asyncio.sleep(0)  # the release's ledger step runs in this turn
    elapsed = time.perf_counter() - started
    await queue.close()
    return elapsed


def redis_admit(url: str) -> Callable[[int], Awaitable[float]]:
    async def run(calls: int) -> float:
        from gateway.flow_control.ledger.redis_ledger import RedisLedger
        from gateway.keys.resp import RespClient

        client = RespClient(url, timeout_s=2.0)
        ledger = RedisLedger(client, "bench", num_bands=3, aging_s=30.0, owner="bench", lease_s=600.0, expiry_s=60.0)
        queue = FlowQueue("b", ledger, lambda: SLOTS, has_room=lambda: True)
        (await queue.admit(ASK)).release()  # connect, load the script
        await queue.close()
        elapsed = 0.0
        for _ in range(calls):
            started = time.perf_counter()
            ticket = await queue.admit(ASK)
            elapsed += time.perf_counter() - started
            ticket.release()
            await queue.close()  # its release step done before the next admission
        await client.close()
        return elapsed

    return run


async def measure(arms: dict[str, Callable[[int], Awaitable[float]]], calls: int, rounds: int) -> dict[str, tuple[float, float]]:
    """Per arm: (wall µs, CPU µs) per call, medians over the rounds."""
    wall: dict[str, list[float]] = {name: [] for name in arms}
    cpu: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(rounds):
        for name, arm in arms.items():
            cpu_before = process_time()
            wall[name].append(await arm(calls) / calls)
            cpu[name].append((process_time() - cpu_before) / calls)
    return {name: (median(wall[name]) * 1e6, median(cpu[name]) * 1e6) for name in arms}


HTTP_KEY = "sk-bench-flow-0001"


def gateway_config(upstream_port: int, *, flow: bool) -> str:
    from bench.arms import switchyard_config

    text = switchyard_config(upstream_port).replace('[server]\nlog_level = "warning"\n',
                                                    f'[server]\nlog_level = "warning"\n[[server.keys]]\nname = "bench"\nkey = "{HTTP_KEY}"\n', 1)
    text = text.replace('[backends.options]', 'max_concurrent = 100000\n[backends.options]', 1)
    return text + ("\n[server.flow_control]\nenabled = true\n" if flow else "")


async def interleaved_http(ports: dict[str, int], *, stream: bool, rounds: int) -> dict[str, dict[str, float]]:
    """One request at a time, the gateways taking turns: per arm p50/p99 ms."""
    from bench.arms import MODEL
    from bench.common import Connection, chat_body, pct

    data = chat_body(MODEL, stream=stream, max_tokens=4)
    conns = {name: await Connection.open(port, headers={"authorization": f"Bearer {HTTP_KEY}"}) for name, port in ports.items()}
    totals: dict[str, list[float]] = {name: [] for name in ports}
    for i in range(rounds + 50):
        for name, conn in conns.items():
            timing = await conn.post("/v1/chat/completions", data)
            if i >= 50:
                totals[name].append(timing.total_s)
    for conn in conns.values():
        conn.close()
    return {name: {"p50_ms": pct(t, 0.5) * 1e3, "p99_ms": pct(t, 0.99) * 1e3} for name, t in totals.items()}


def http_arms(rounds: int, workdir: Path) -> dict[str, dict[str, dict[str, float]]]:
    from bench.arms import start_upstream
    from bench.common import spawn, stopping, tree_cpu_seconds, wait_ready

    upstream = start_upstream(workdir, tokens=4, pace_ms=0.0)
    servers = {}
    try:
        for name, flow in (("limiter", False), ("flow_control", True)):
            port = free_port()
            config = workdir / f"{name}.toml"
            config.write_text(gateway_config(upstream.port, flow=flow))
            server = spawn(name, [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config), "--port", str(port)],
                           port=port, log_dir=workdir)
            servers[name] = server
            wait_ready(server, "/health", timeout=60)
        out = {}
        for stream in (False, True):
            cpu0 = {name: tree_cpu_seconds(s.pid) for name, s in servers.items()}
            rows = asyncio.run(interleaved_http({name: s.port for name, s in servers.items()}, stream=stream, rounds=rounds))
            for name, s in servers.items():
                rows[name]["cpu_us_per_request"] = (tree_cpu_seconds(s.pid) - cpu0[name]) / (rounds + 50) * 1e6
            out["stream" if stream else "json"] = rows
        return out
    finally:
        with stopping(upstream, *servers.values()):
            pass


def start_redis(workdir: str) -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed: python -m engines.install redis")
    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", workdir], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    return proc, f"redis://127.0.0.1:{port}/0"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--redis", action="store_true", help="also time the Redis ledger's admission (own redis-server)")
    parser.add_argument("--http", action="store_true", help="the whole request through two gateways, limiter vs flow control")
    parser.add_argument("--http-rounds", type=int, default=2000)
    args = parser.parse_args()
    if args.http:
        print_header("flow control: a request with room, through the gateway", {"loop": use_uvloop()})
        with TemporaryDirectory() as workdir:
            rows = http_arms(args.http_rounds, Path(workdir))
        for kind, arms in rows.items():
            for name, row in arms.items():
                print(f"{kind:<6} {name:<13} p50 {row['p50_ms']:6.3f} ms  p99 {row['p99_ms']:7.3f} ms  "
                      f"gateway CPU {row['cpu_us_per_request']:6.0f} us/request")
            added = arms["flow_control"]["p50_ms"] - arms["limiter"]["p50_ms"]
            print(f"{kind:<6} flow control adds p50 {added * 1e3:+.0f} us, p99 "
                  f"{(arms['flow_control']['p99_ms'] - arms['limiter']['p99_ms']) * 1e3:+.0f} us, CPU "
                  f"{arms['flow_control']['cpu_us_per_request'] - arms['limiter']['cpu_us_per_request']:+.0f} us/request")
        return
    loop_name = use_uvloop()
    print_header("flow control: the cost of a request that finds room", {"loop": loop_name})
    arms: dict[str, Callable[[int], Awaitable[float]]] = {
        "loop turn alone (sleep(0))": loop_turn,
        "BackendLimiter acquire+release+turn": limiter_cycle,
        "FlowQueue.admit (granted at once)": admit_only,
        "FlowQueue admit+release+turn": admit_release_cycle,
    }
    with TemporaryDirectory() as workdir:
        redis = start_redis(workdir) if args.redis else None
        try:
            if redis is not None:
                arms["FlowQueue.admit on Redis (round trip)"] = redis_admit(redis[1])
            results = asyncio.run(measure(arms, args.calls, args.rounds))
        finally:
            if redis is not None:
                redis[0].terminate()
                redis[0].wait()
    print(f"{'':<42} {'wall':>9} {'CPU':>9}   per call, median of {args.rounds} rounds x {args.calls}")
    for name, (wall_us, cpu_us) in results.items():
        print(f"{name:<42} {wall_us:7.2f}us {cpu_us:7.2f}us")
    print("  (the admit-only and Redis arms' CPU includes setting up and releasing outside the timed calls)")
    turn_cpu = results["loop turn alone (sleep(0))"][1]
    print(f"CPU beyond a loop turn: FlowQueue admit+release {results['FlowQueue admit+release+turn'][1] - turn_cpu:.2f} us, "
          f"today's BackendLimiter acquire+release {results['BackendLimiter acquire+release+turn'][1] - turn_cpu:.2f} us")


if __name__ == "__main__":
    main()

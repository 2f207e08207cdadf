"""What per-key limits add to a request: the same Switchyard, the same client key, with its
`rpm`/`tpm` off, counted in the gateway process, and counted in Redis on loopback.

Three Switchyard servers in front of one bench upstream (bench/upstream.py), side by side in one
run; each closed-loop cell runs every arm in turn (the order rotates) `--repeats` times and keeps
the medians. The client key is the same in all three (authentication costs the same); in the
`memory` and `redis` arms it has `rpm` and `tpm` set high enough never to refuse, so every
request pays the admission (one EVALSHA round trip to Redis before the request goes upstream)
and the settlement (a second one, after the response, off the response's path). "added" is the
arm's figure minus the `off` arm's.

First, the admission alone, in this process: `KeyLimiter.admit` on each store, one request at a
time (each settled right after, as the gateway does), its wall time per call — what the limiter
puts on a request's path without the HTTP noise around it. Then one request at a time through
each gateway, interleaved (off, memory, redis, off, ...), so that all three see the same moments
of a noisy machine; then the closed-loop cells.

    .venv/bin/python bench/key_limits_overhead.py                # ~6 min on 2 cores
    .venv/bin/python bench/key_limits_overhead.py --smoke
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import shutil
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from tempfile import TemporaryDirectory

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.arms import MODEL, Arm, start_upstream, switchyard_config, switchyard_version  # noqa: E402
from bench.common import (  # noqa: E402
    RESULTS,
    Connection,
    chat_body,
    pct,
    fmt,
    free_port,
    load_average,
    load_note,
    median_of_rows,
    print_header,
    spawn,
    uptime_line,
    use_uvloop,
    wait_quiet,
    wait_ready,
    write_result,
)
from bench.gateway_overhead import closed_loop  # noqa: E402

ARMS = ("off", "memory", "redis")
KEY = "sk-bench-key-0001"
NEVER_REFUSES = 'rpm = 100000000\ntpm = 1000000000000\n'


def arm_config(upstream_port: int, arm: str, redis_url: str) -> str:
    base = switchyard_config(upstream_port)
    server = "[server]\nlog_level = \"warning\"\n"
    if arm == "redis":
        server += f'state = "{redis_url}"\n'
    key = f'\n[[server.keys]]\nname = "bench"\nkey = "{KEY}"\n' + (NEVER_REFUSES if arm != "off" else "")
    return base.replace('[server]\nlog_level = "warning"\n', server + key, 1)


def start_redis(log_dir: Path) -> tuple[subprocess.Popen, str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed: python -m engines.install redis")
    port = free_port()
    log = (log_dir / "redis.log").open("wb")
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                            stdout=log, stderr=subprocess.STDOUT)
    return proc, f"redis://127.0.0.1:{port}/0"


def start_arms(stack: ExitStack, log_dir: Path, args: argparse.Namespace, redis_url: str) -> dict[str, Arm]:
    upstream = start_upstream(log_dir, tokens=args.tokens, pace_ms=args.pace_ms)
    stack.callback(upstream.stop)
    arms = {}
    for name in ARMS:
        port = free_port()
        config = log_dir / f"switchyard-{name}.toml"
        config.write_text(arm_config(upstream.port, name, redis_url))
        argv = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config), "--host", "127.0.0.1",
                "--port", str(port), "--drain-seconds", "1"]
        server = spawn(f"switchyard-{name}", argv, port=port, log_dir=log_dir)
        stack.callback(server.stop)
        wait_ready(server, "/health", timeout=60)
        arms[name] = Arm(name, port, "/v1/chat/completions", {"authorization": f"Bearer {KEY}"}, server, switchyard_version())
    return arms


async def admission_timings(redis_url: str, samples: int) -> dict[str, dict]:
    from prometheus_client import CollectorRegistry

    from gateway.keys import KeyLimiter, KeyLimits, TokenCost
    from gateway.keys.redis_store import RedisStore
    from gateway.keys.store import MemoryStore

    out = {}
    key = KeyLimits(name="bench-admit", rpm=100_000_000, tpm=1_000_000_000_000)
    for name, store in (("memory", MemoryStore()), ("redis", RedisStore(redis_url, timeout_s=2.0))):
        limiter = KeyLimiter(store, registry=CollectorRegistry())
        await limiter.start()
        times = []
        cpu0 = time.process_time()
        for i in range(samples + 200):
            started = time.perf_counter()
            reservation = await limiter.admit(key, cost=TokenCost(10, 16))
            if i >= 200:  # the first ones connect and load the script
                times.append(time.perf_counter() - started)
            reservation.settle(None, 5)
            await asyncio.sleep(0)
        await limiter.close()
        cpu = (time.process_time() - cpu0) / (samples + 200)
        times.sort()
        out[name] = {"p50_us": times[len(times) // 2] * 1e6, "p99_us": times[int(len(times) * 0.99)] * 1e6,
                     "client_cpu_us_per_admit_and_settle": cpu * 1e6}
        print(f"admission {name:<7} p50 {out[name]['p50_us']:7.1f} us  p99 {out[name]['p99_us']:7.1f} us  "
              f"client CPU {out[name]['client_cpu_us_per_admit_and_settle']:.1f} us per admit+settle", flush=True)
    return out


async def interleaved(arms: dict[str, Arm], *, stream: bool, rounds: int, tokens: int) -> list[dict]:
    """One request at a time, the arms taking turns; per arm p50/p99 and added vs `off`."""
    data = chat_body(MODEL, stream=stream, max_tokens=tokens)
    conns = {name: await Connection.open(arm.port, headers=arm.headers) for name, arm in arms.items()}
    totals: dict[str, list[float]] = {name: [] for name in arms}
    for i in range(rounds + 20):
        for name in ARMS:
            timing = await conns[name].post(arms[name].path, data)
            if i >= 20:  # warm-up: connections, the script's first load
                totals[name].append(timing.total_s)
    for conn in conns.values():
        conn.close()
    rows = [{"arm": name, "stream": stream, "requests": rounds, "p50_ms": pct(totals[name], 0.5) * 1e3,
             "p99_ms": pct(totals[name], 0.99) * 1e3} for name in ARMS]
    for row in rows:
        row["added_p50_ms"] = row["p50_ms"] - rows[0]["p50_ms"]
        row["added_p99_ms"] = row["p99_ms"] - rows[0]["p99_ms"]
        print(f"interleaved {'stream' if stream else 'json  '} {row['arm']:<7} p50 {row['p50_ms']:6.3f} ms p99 {row['p99_ms']:7.3f} ms  "
              f"added p50 {row['added_p50_ms']:+6.3f} p99 {row['added_p99_ms']:+7.3f} ms", flush=True)
    return rows


async def run(args: argparse.Namespace, arms: dict[str, Arm]) -> list[dict]:
    cells = []
    for stream, concurrency in itertools.product((False, True), args.concurrency):
        requests = max(args.min_requests, args.per_connection * concurrency)
        runs: dict[str, list[dict]] = {n: [] for n in ARMS}
        for rep in range(args.repeats):
            order = ARMS[rep % len(ARMS):] + ARMS[: rep % len(ARMS)]
            for name in order:
                busy = wait_quiet(args.wait_quiet) if args.wait_quiet > 0 else 0.0
                row = await closed_loop(arms[name], stream=stream, concurrency=concurrency, requests=requests,
                                        tokens=args.tokens, max_seconds=args.max_cell_seconds)
                row["others_busy_pct"] = busy * 100
                runs[name].append(row)
        group = [median_of_rows(runs[n]) for n in ARMS]
        off = group[0]
        for row in group:
            row["added_p50_ms"] = row["p50_ms"] - off["p50_ms"]
            row["added_p99_ms"] = row["p99_ms"] - off["p99_ms"]
            row["added_cpu_s_per_1k"] = (row["cpu_s_per_1k"] or 0) - (off["cpu_s_per_1k"] or 0)
            print(f"{'stream' if stream else 'json  '} c={concurrency:<3} {row['arm']:<7} p50 {row['p50_ms']:7.2f} ms "
                  f"p99 {row['p99_ms']:7.2f} ms  added p50 {row['added_p50_ms']:+6.3f} p99 {row['added_p99_ms']:+6.3f} ms  "
                  f"CPU {fmt(row['cpu_s_per_1k'])} s/1k ({row['added_cpu_s_per_1k']:+.3f})  errors {row['errors']}", flush=True)
        cells.extend(group)
    return cells


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--rounds", type=int, default=2000, help="interleaved: requests per arm, one at a time")
    # a fast upstream: the limiter's fraction of a millisecond is not lost in the upstream's pacing
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--pace-ms", type=float, default=0.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--min-requests", type=int, default=500)
    parser.add_argument("--per-connection", type=int, default=20)
    parser.add_argument("--max-cell-seconds", type=float, default=20.0)
    parser.add_argument("--wait-quiet", type=float, default=2.0)
    parser.add_argument("--admit-samples", type=int, default=5000, help="admissions timed per store")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.concurrency, args.repeats, args.min_requests, args.per_connection, args.rounds = [4], 1, 10, 2, 20
        args.tokens, args.pace_ms, args.wait_quiet, args.max_cell_seconds, args.admit_samples = 4, 1.0, 0.0, 5.0, 200
    versions = {"switchyard": switchyard_version(), "redis-server": _redis_version(), "client": use_uvloop()}
    info = print_header("per-key limits overhead: off vs in-process vs Redis", versions)
    load0 = load_average()
    with TemporaryDirectory(prefix="bench-keys-") as tmp, ExitStack() as stack:
        redis, redis_url = start_redis(Path(tmp))
        stack.callback(lambda: (redis.terminate(), redis.wait(10)))
        time.sleep(0.5)
        admission = asyncio.run(admission_timings(redis_url, args.admit_samples))
        arms = start_arms(stack, Path(tmp), args, redis_url)
        time.sleep(0.5)
        sequential = [row for stream in (False, True)
                      for row in asyncio.run(interleaved(arms, stream=stream, rounds=args.rounds, tokens=args.tokens))]
        cells = asyncio.run(run(args, arms))
    load1 = load_average()
    report = {"machine": info, "versions": versions, "config": {k: str(v) for k, v in vars(args).items()},
              "admission": admission, "interleaved": sequential, "cells": cells,
              "load_note": load_note(load0, load1), "uptime_after": uptime_line()}
    write_result("key_limits_overhead", report, results_dir=args.results_dir, smoke=args.smoke)
    return 0


def _redis_version() -> str | None:
    binary = shutil.which("redis-server")
    if binary is None:
        return None
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    return next((part.split("=", 1)[1] for part in out.split() if part.startswith("v=")), out.strip())


if __name__ == "__main__":
    raise SystemExit(main())

"""What a gateway adds on top of a fast upstream: Switchyard against LiteLLM's proxy, side by side.

One OpenAI-compatible upstream written for the bench (bench/upstream.py: raw asyncio,
TCP_NODELAY, `--tokens` tokens `--pace-ms` apart) is reached three ways with the same load:
(a) direct, (b) through Switchyard (an `openai_compatible` backend pointing at it), (c) through
LiteLLM's proxy (pinned, its own venv: bench/litellm_env.py). The client is a minimal
keep-alive HTTP/1.1 client on raw asyncio (uvloop), in this process.

Phase 1, closed loop: concurrency 1, 16, 64, 256, streaming and not; each cell runs every arm
in turn (the order rotates) `--repeats` times and keeps the median of each figure. The workers
start spread over one request's duration, so a cell holds that many streams in flight
(`--start together`: all at once, a burst of simultaneous arrivals every round). Per arm:
p50/p99 latency and time to first token, the same minus direct's ("added"), requests/s,
gateway CPU seconds per 1,000 requests (user+system of the server's process tree, psutil), peak
RSS (sampled every 50 ms).

Phase 2, open loop (streaming): offered rates rising by x1.5 for `--step-seconds` each, sent on a
fixed schedule whatever the answers do (latency counted from the scheduled send, so a lagging
gateway cannot hide it); per arm the highest rate whose p99 stays within 2x its own low-rate
p99 ("before p99 doubles"), and within 2x direct's low-rate p99 ("at equal p99").

    .venv/bin/python bench/gateway_overhead.py                       # ~10 min on 2 cores
    .venv/bin/python bench/gateway_overhead.py --smoke               # a few seconds, no LiteLLM unless installed
    .venv/bin/python bench/gateway_overhead.py --arms direct switchyard --concurrency 64
    .venv/bin/python bench/gateway_overhead.py --workers 1 2 --concurrency 64 256 --stream-only   # issue #17's rows

`--workers 1 2` runs each gateway arm once per worker count (`switchyard`, `switchyard-2w`,
`litellm`, `litellm-2w`), and the ratios compare Switchyard and LiteLLM with as many workers.
`--arms ... nginx` adds nginx relaying the same streams (bench/nginx_env.py; `python -m
engines.install nginx`): the floor, what a proxy in C pays on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.arms import MODEL, Arm, arm_name, arm_versions, started_arms  # noqa: E402
from bench.common import (  # noqa: E402
    RESULTS,
    ClientError,
    Connection,
    ResourceMeter,
    cpu_busy,
    chat_body,
    fmt,
    load_average,
    load_note,
    median_of_rows,
    pct,
    print_header,
    ratio,
    uptime_line,
    use_uvloop,
    vm_hwm,
    wait_quiet,
    write_result,
)

ARMS = ("direct", "switchyard", "litellm")
PEER_FLOOR = "nginx"  # on request only (`--arms ... nginx`): the C proxy floor, bench/nginx_env.py


# ------------------------------------------------------------------------------ closed loop


async def closed_loop(arm: Arm, *, stream: bool, concurrency: int, requests: int, tokens: int,
                      max_seconds: float, stagger: bool = True) -> dict:
    data = chat_body(MODEL, stream=stream, max_tokens=tokens)
    conns = await asyncio.gather(*(Connection.open(arm.port, headers=arm.headers) for _ in range(concurrency)))
    # one request per connection first: connections open and warm on both sides of the gateway
    warm = await asyncio.gather(*(c.post(arm.path, data) for c in conns))
    # workers start spread over one request's duration, so that the cell measures `concurrency`
    # streams in flight rather than `concurrency` requests arriving in the same millisecond
    spread = sorted(t.total_s for t in warm)[len(warm) // 2] if stagger else 0.0
    totals: list[float] = []
    ttfts: list[float] = []
    errors = 0
    issued = 0
    deadline = time.perf_counter() + max_seconds

    async def worker(conn: Connection, delay: float) -> None:
        nonlocal issued, errors
        await asyncio.sleep(delay)
        while issued < requests and time.perf_counter() < deadline:
            issued += 1
            try:
                t = await conn.post(arm.path, data)
            except (ClientError, ConnectionError, asyncio.IncompleteReadError) as exc:
                errors += 1
                if errors <= 3:
                    print(f"  {arm.name}: {type(exc).__name__}: {exc}", flush=True)
                conn.close()
                try:
                    conn = await Connection.open(arm.port, headers=arm.headers)
                except OSError:
                    return
                continue
            totals.append(t.total_s)
            ttfts.append(t.ttft_s)

    load0 = load_average()
    with ResourceMeter(arm.pid) as meter:
        start = time.perf_counter()
        await asyncio.gather(*(worker(c, i * spread / concurrency) for i, c in enumerate(conns)))
        wall = time.perf_counter() - start
    for c in conns:
        c.close()
    done = len(totals)
    return {
        "arm": arm.name, "stream": stream, "concurrency": concurrency, "requests": done, "errors": errors,
        "p50_ms": pct(totals, 0.5) * 1e3, "p99_ms": pct(totals, 0.99) * 1e3,
        "ttft_p50_ms": pct(ttfts, 0.5) * 1e3, "ttft_p99_ms": pct(ttfts, 0.99) * 1e3,
        "requests_per_s": done / wall if wall else float("nan"),
        "cpu_s_per_1k": meter.cpu_s / done * 1e3 if arm.pid is not None and done else None,
        "peak_rss_mib": meter.peak_rss / 2**20 if arm.pid is not None else None,
        "load1_before": load0[0], "load1_after": load_average()[0],
    }


def add_deltas(rows: list[dict]) -> None:
    direct = {(r["stream"], r["concurrency"]): r for r in rows if r["arm"] == "direct"}
    for r in rows:
        d = direct.get((r["stream"], r["concurrency"]))
        if d is None:
            continue
        r["added_p50_ms"] = r["p50_ms"] - d["p50_ms"]
        r["added_p99_ms"] = r["p99_ms"] - d["p99_ms"]
        r["added_ttft_p50_ms"] = r["ttft_p50_ms"] - d["ttft_p50_ms"]
        r["added_ttft_p99_ms"] = r["ttft_p99_ms"] - d["ttft_p99_ms"]


# -------------------------------------------------------------------------------- open loop


async def open_loop_step(arm: Arm, pool: list[Connection], *, rate: float, seconds: float, tokens: int) -> dict:
    """Send `rate` streamed requests per second for `seconds` on a fixed schedule; idle pooled
    connections are reused, new ones opened when none is idle."""
    data = chat_body(MODEL, stream=True, max_tokens=tokens)
    count = max(1, int(rate * seconds))
    latencies: list[float] = []
    errors = 0
    loop_start = time.perf_counter() + 0.05

    async def one(i: int) -> None:
        nonlocal errors
        scheduled = loop_start + i / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        conn = pool.pop() if pool else None
        try:
            if conn is None:
                conn = await Connection.open(arm.port, headers=arm.headers)
            await conn.post(arm.path, data)
            latencies.append(time.perf_counter() - scheduled)
            pool.append(conn)
        except (ClientError, OSError, asyncio.IncompleteReadError):
            errors += 1
            if conn is not None:
                conn.close()

    with ResourceMeter(arm.pid) as meter:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(count)))
        wall = time.perf_counter() - t0
    return {"arm": arm.name, "offered_rps": rate, "achieved_rps": len(latencies) / max(wall, seconds),
            "requests": len(latencies), "errors": errors, "p50_ms": pct(latencies, 0.5) * 1e3,
            "p99_ms": pct(latencies, 0.99) * 1e3,
            "cpu_s_per_1k": meter.cpu_s / len(latencies) * 1e3 if arm.pid is not None and latencies else None,
            "peak_rss_mib": meter.peak_rss / 2**20 if arm.pid is not None else None,
            "load1": load_average()[0]}


async def rate_sweep(arm: Arm, *, start_rps: float, max_rps: float, seconds: float, tokens: int,
                     limit_ms: float | None) -> dict:
    """Rising rates until p99 exceeds 2x the first step's (and the common limit, when given),
    or fewer than 90% of the offered requests complete."""
    pool: list[Connection] = []
    steps = []
    rate = start_rps
    base = None
    knee_own = knee_equal = None
    own_done = equal_done = False
    while rate <= max_rps and not (own_done and equal_done):
        step = await open_loop_step(arm, pool, rate=rate, seconds=seconds, tokens=tokens)
        steps.append(step)
        print(f"  open loop {arm.name:<10} offered {rate:7.1f}/s achieved {step['achieved_rps']:7.1f}/s "
              f"p50 {step['p50_ms']:8.2f} ms p99 {step['p99_ms']:8.2f} ms errors {step['errors']}", flush=True)
        if base is None:
            base = step["p99_ms"]
        healthy = step["errors"] == 0 and step["requests"] >= 0.9 * rate * seconds
        if not own_done:
            if healthy and step["p99_ms"] <= 2 * base:
                knee_own = step["achieved_rps"]
            else:
                own_done = True
        if limit_ms is not None and not equal_done:
            if healthy and step["p99_ms"] <= limit_ms:
                knee_equal = step["achieved_rps"]
            else:
                equal_done = True
        elif limit_ms is None:
            equal_done = True
        rate *= 1.5
    for c in pool:
        c.close()
    return {"arm": arm.name, "base_p99_ms": base, "max_rps_before_p99_doubles": knee_own,
            "max_rps_at_equal_p99": knee_equal, "equal_p99_limit_ms": limit_ms, "steps": steps}


# -------------------------------------------------------------------------------------- main


def quiet(args: argparse.Namespace) -> float:
    """How busy the others keep the cores just before a cell (waiting up to --wait-quiet s for
    them to drop under 25%)."""
    return wait_quiet(args.wait_quiet) if args.wait_quiet > 0 else cpu_busy(0.2)


async def run(args: argparse.Namespace, arms: dict[str, Arm]) -> dict:
    names = list(arms)
    idle = {}
    for name in names:  # what a gateway burns with no traffic (health probes, timers), CPU % of one core
        if arms[name].pid is not None:
            with ResourceMeter(arms[name].pid) as meter:
                await asyncio.sleep(args.idle_seconds)
            idle[name] = 100 * meter.cpu_s / args.idle_seconds
            print(f"{name} idle: {idle[name]:.1f}% of a core, RSS {meter.peak_rss / 2**20:.0f} MiB", flush=True)
    cells: list[dict] = []
    for stream, concurrency in itertools.product((True,) if args.stream_only else (False, True), args.concurrency):
        requests = max(args.min_requests, args.per_connection * concurrency)
        runs: dict[str, list[dict]] = {n: [] for n in names}
        for rep in range(args.repeats):
            order = names[rep % len(names):] + names[: rep % len(names)]
            for name in order:
                busy = quiet(args)
                row = await closed_loop(arms[name], stream=stream, concurrency=concurrency, requests=requests,
                                        tokens=args.tokens, max_seconds=args.max_cell_seconds,
                                        stagger=args.start == "staggered")
                row["others_busy_pct"] = busy * 100
                runs[name].append(row)
        group = [median_of_rows(runs[n]) for n in names]
        add_deltas(group)
        for row in group:
            print(_format(row), flush=True)
            if row["arm"] != "direct" and row.get("peak_rss_mib") is not None:
                row["vm_hwm_mib"] = (vm_hwm(arms[row["arm"]].pid) or 0) / 2**20
        cells.extend(group)

    sweeps = {}
    if not args.skip_rate_sweep:
        for name in names:
            limit = None if name == "direct" else 2 * sweeps["direct"]["base_p99_ms"] if "direct" in sweeps else None
            busy = quiet(args)
            sweeps[name] = await rate_sweep(arms[name], start_rps=args.start_rps, max_rps=args.max_rps,
                                            seconds=args.step_seconds, tokens=args.tokens, limit_ms=limit)
            sweeps[name]["others_busy_pct_before"] = busy * 100
    return {"idle_cpu_pct": idle, "cells": cells, "rate_sweeps": sweeps}


def _format(row: dict) -> str:
    kind = "stream" if row["stream"] else "json  "
    text = (f"{kind} c={row['concurrency']:<3} {row['arm']:<10} n={row['requests']:<5} p50 {row['p50_ms']:8.2f} "
            f"p99 {row['p99_ms']:8.2f} ttft50 {row['ttft_p50_ms']:8.2f} ms  {row['requests_per_s']:7.1f} req/s")
    if row["arm"] != "direct":
        text += (f"  added p50 {fmt(row.get('added_p50_ms'), '+.2f')} p99 {fmt(row.get('added_p99_ms'), '+.2f')} "
                 f"ttft50 {fmt(row.get('added_ttft_p50_ms'), '+.2f')} ms  cpu/1k {fmt(row['cpu_s_per_1k'])} s  "
                 f"rss {fmt(row['peak_rss_mib'], '.0f')} MiB")
    if row.get("errors"):
        text += f"  ERRORS {row['errors']}"
    return text + f"  [others {row.get('others_busy_pct', float('nan')):.0f}% busy]"


def headline(result: dict, targets_c: int, workers: list[int]) -> dict:
    """Switchyard / LiteLLM ratios (with as many workers) and the issues' targets."""
    cells = {(r["arm"], r["stream"], r["concurrency"]): r for r in result["cells"]}
    out: dict = {"ratios_switchyard_over_litellm": [], "targets": {}}
    sw = result["rate_sweeps"]
    for w in workers:
        sy_name, ll_name = arm_name("switchyard", w), arm_name("litellm", w)
        for (arm, stream, c), sy in sorted(cells.items(), key=lambda kv: (kv[0][1], kv[0][2])):
            ll = cells.get((ll_name, stream, c))
            if arm != sy_name or ll is None:
                continue
            out["ratios_switchyard_over_litellm"].append({
                "workers": w, "stream": stream, "concurrency": c,
                "added_p50": ratio(sy.get("added_p50_ms"), ll.get("added_p50_ms")),
                "added_p99": ratio(sy.get("added_p99_ms"), ll.get("added_p99_ms")),
                "requests_per_s": ratio(sy["requests_per_s"], ll["requests_per_s"]),
                "cpu_s_per_1k": ratio(sy["cpu_s_per_1k"], ll["cpu_s_per_1k"]),
                "peak_rss": ratio(sy["peak_rss_mib"], ll["peak_rss_mib"]),
            })
        sy256 = cells.get((sy_name, True, 256))
        if sy256 is not None:
            cpu = sy256.get("cpu_s_per_1k")
            out["targets"][f"cpu_s_per_1k_streamed_at_256<=0.6 ({sy_name})"] = {"value": cpu, "met": cpu is not None and cpu <= 0.6}
            if w == 2:
                added = sy256.get("added_p50_ms")
                out["targets"][f"added_p50_ms_at_256_streams<=5 ({sy_name})"] = {"value": added,
                                                                                 "met": added is not None and added <= 5.0}
        if sy_name in sw and ll_name in sw:
            r_equal = ratio(sw[sy_name]["max_rps_at_equal_p99"], sw[ll_name]["max_rps_at_equal_p99"])
            if r_equal is None and sw[sy_name]["max_rps_at_equal_p99"] and sw[ll_name]["steps"]:
                # LiteLLM missed the common p99 limit already at the lowest offered rate: a lower bound
                r_equal = sw[sy_name]["max_rps_at_equal_p99"] / sw[ll_name]["steps"][0]["offered_rps"]
                out[f"rps_at_equal_p99_ratio_is_lower_bound ({w} workers)"] = True
            r_own = ratio(sw[sy_name]["max_rps_before_p99_doubles"], sw[ll_name]["max_rps_before_p99_doubles"])
            out["targets"][f"rps_at_equal_p99_ratio>=10 ({w} workers)"] = {"value": r_equal,
                                                                           "met": r_equal is not None and r_equal >= 10}
            out[f"rps_before_p99_doubles_ratio ({w} workers)"] = r_own
    sy64 = cells.get(("switchyard", True, targets_c))
    if sy64 is not None:
        out["targets"][f"added_p50_ms_at_{targets_c}_streams<=1"] = {"value": sy64.get("added_p50_ms"),
                                                                      "met": (sy64.get("added_p50_ms") or 0) <= 1.0}
        out["targets"][f"added_p99_ms_at_{targets_c}_streams<=3"] = {"value": sy64.get("added_p99_ms"),
                                                                      "met": (sy64.get("added_p99_ms") or 0) <= 3.0}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="a few seconds; LiteLLM only if already installed")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=(*ARMS, PEER_FLOOR))
    parser.add_argument("--workers", type=int, nargs="+", default=[1],
                        help="worker processes of the gateway arms, one arm per count (Switchyard, LiteLLM, nginx alike)")
    parser.add_argument("--stream-only", action="store_true", help="closed loop: streaming cells only")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--tokens", type=int, default=16, help="tokens per answer")
    parser.add_argument("--pace-ms", type=float, default=10.0, help="upstream milliseconds between tokens")
    parser.add_argument("--repeats", type=int, default=3, help="closed-loop runs per cell (median kept)")
    parser.add_argument("--min-requests", type=int, default=60, help="closed loop: at least this many per cell")
    parser.add_argument("--per-connection", type=int, default=4, help="closed loop: requests per connection")
    parser.add_argument("--max-cell-seconds", type=float, default=30.0, help="closed loop: cap on one cell")
    parser.add_argument("--start", choices=("staggered", "together"), default="staggered",
                        help="closed loop: workers start spread over one request's duration (steady state), or "
                             "all at once (a burst of `concurrency` simultaneous arrivals every round)")
    parser.add_argument("--idle-seconds", type=float, default=5.0, help="idle CPU of each gateway, measured first")
    parser.add_argument("--skip-rate-sweep", action="store_true")
    parser.add_argument("--start-rps", type=float, default=20.0)
    parser.add_argument("--max-rps", type=float, default=3000.0)
    parser.add_argument("--step-seconds", type=float, default=3.0)
    parser.add_argument("--switchyard-keepalive", type=int, default=None,
                        help="Switchyard's pool.max_keepalive_connections (default: its own default)")
    parser.add_argument("--wait-quiet", type=float, default=5.0,
                        help="before each cell wait up to this many s for the others to use < 25%% of the cores")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.wait_quiet = 0.0
        args.concurrency, args.tokens, args.pace_ms, args.repeats = [1, 8], 4, 1.0, 1
        args.min_requests, args.per_connection, args.max_cell_seconds = 8, 2, 5.0
        args.start_rps, args.max_rps, args.step_seconds, args.idle_seconds = 20.0, 30.0, 0.4, 0.5
    loop_name = use_uvloop()
    versions = {**arm_versions(), "client": loop_name}
    info = print_header("gateway overhead: " + " vs ".join(args.arms), versions)
    print(f"upstream: {args.tokens} tokens {args.pace_ms:g} ms apart; concurrency {args.concurrency}; "
          f"repeats {args.repeats}; closed-loop workers start {args.start}", flush=True)
    load0 = load_average()
    names = [a for a in args.arms if a == "direct"] + [arm_name(a, w) for w in args.workers for a in args.arms if a != "direct"]
    with started_arms(names, tokens=args.tokens, pace_ms=args.pace_ms,
                      keepalive=args.switchyard_keepalive) as (_upstream, arms):
        skipped = [a for a in names if a not in arms]
        result = asyncio.run(run(args, arms))
    load1 = load_average()
    report = {"machine": info, "versions": versions, "skipped_arms": skipped,
              "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              **result, "load_before": load0, "load_after": load1, "load_note": load_note(load0, load1),
              "uptime_after": uptime_line()}
    report["headline"] = headline(result, 64, args.workers)
    _print_headline(report)
    write_result("gateway_overhead", report, results_dir=args.results_dir, smoke=args.smoke)
    return 0


def _print_headline(report: dict) -> None:
    h = report["headline"]
    print("\nSwitchyard / LiteLLM")
    for r in h["ratios_switchyard_over_litellm"]:
        kind = "stream" if r["stream"] else "json  "
        print(f"  {r['workers']}w {kind} c={r['concurrency']:<3} added p50 {fmt(r['added_p50'])}x  added p99 {fmt(r['added_p99'])}x  "
              f"req/s {fmt(r['requests_per_s'])}x  cpu/1k {fmt(r['cpu_s_per_1k'])}x  rss {fmt(r['peak_rss'])}x")
    for name, sweep in report["rate_sweeps"].items():
        print(f"  {name:<10} max req/s before p99 doubles {fmt(sweep['max_rps_before_p99_doubles'], '.1f')}  "
              f"at equal p99 (<= {fmt(sweep['equal_p99_limit_ms'], '.1f')} ms) {fmt(sweep['max_rps_at_equal_p99'], '.1f')}")
    for key, value in h.items():
        if key.startswith("rps_before_p99_doubles_ratio"):
            print(f"  ratio req/s before p99 doubles{key[len('rps_before_p99_doubles_ratio'):]}: {fmt(value)}x")
    for name, t in h["targets"].items():
        print(f"  target {name}: {fmt(t['value'])} -> {'met' if t['met'] else 'MISSED'}")
    print(f"  load: {report['load_note']} (before {report['load_before'][0]:.2f}, after {report['load_after'][0]:.2f})")


if __name__ == "__main__":
    raise SystemExit(main())

"""Stream timing fidelity: does a gateway pass tokens on as they come, or does it buffer them?

The bench upstream (bench/upstream.py, stdlib asyncio loop for its finer timers) emits
`--tokens` tokens (default 200) at a steady `--pace-ms` (default 5 ms). The client records the
arrival time of every SSE event (events that arrive in one socket read share its time), direct
and through each gateway, and looks at the gaps between consecutive content tokens:

- clumped share: gaps under 1 ms (a gateway that buffers shows about half of them);
- p50 / p99 of |gap - pace|.

`--concurrency` streams run at once (default: 1, then 16); every stream's gaps count. Each arm
runs `--repeats` times, interleaved, and the figures are the medians over repeats.

    .venv/bin/python bench/stream_fidelity.py            # ~1 min
    .venv/bin/python bench/stream_fidelity.py --smoke
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.arms import MODEL, Arm, arm_versions, started_arms  # noqa: E402
from bench.common import (  # noqa: E402
    RESULTS,
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
    uptime_line,
    use_uvloop,
    wait_quiet,
    write_result,
)

ARMS = ("direct", "switchyard", "litellm")


def content_arrivals(events: list[tuple[float, bytes]]) -> list[float]:
    """Arrival times of the events that carry a content token (role, finish, usage, [DONE] out)."""
    out = []
    for when, data in events:
        if data == b"[DONE]":
            continue
        if b'"content":""' in data.replace(b" ", b"") or (b'"content"' not in data and b'"text"' not in data):
            continue
        if b'"content":null' in data.replace(b" ", b""):
            continue
        out.append(when)
    return out


async def one_stream(arm: Arm, tokens: int) -> list[float]:
    conn = await Connection.open(arm.port, headers=arm.headers)
    try:
        await conn.post(arm.path, chat_body(MODEL, stream=True, max_tokens=2))  # warm the connection
        _start, events = await conn.post_events(arm.path, chat_body(MODEL, stream=True, max_tokens=tokens))
    finally:
        conn.close()
    arrivals = content_arrivals(events)
    if len(arrivals) != tokens:
        raise RuntimeError(f"{arm.name}: {len(arrivals)} content events for {tokens} tokens")
    return [b - a for a, b in zip(arrivals, arrivals[1:])]


async def measure(arm: Arm, *, tokens: int, pace_s: float, concurrency: int) -> dict:
    load0 = load_average()
    with ResourceMeter(arm.pid) as meter:
        per_stream = await asyncio.gather(*(one_stream(arm, tokens) for _ in range(concurrency)))
    gaps = [g for s in per_stream for g in s]
    dev = [abs(g - pace_s) for g in gaps]
    return {
        "arm": arm.name, "concurrency": concurrency, "gaps": len(gaps),
        "clumped_pct": 100.0 * sum(g < 1e-3 for g in gaps) / len(gaps),
        "dev_p50_ms": pct(dev, 0.5) * 1e3, "dev_p99_ms": pct(dev, 0.99) * 1e3,
        "gap_p50_ms": pct(gaps, 0.5) * 1e3, "gap_max_ms": max(gaps) * 1e3,
        "cpu_s": meter.cpu_s if arm.pid is not None else None,
        "gaps_ms": [round(g * 1e3, 3) for g in gaps[:4000]],  # for the plots
        "load1_before": load0[0], "load1_after": load_average()[0],
    }


async def run(args: argparse.Namespace, arms: dict[str, Arm]) -> list[dict]:
    names = [n for n in ARMS if n in arms]
    rows = []
    for concurrency in args.concurrency:
        runs: dict[str, list[dict]] = {n: [] for n in names}
        for rep in range(args.repeats):
            order = names[rep % len(names):] + names[: rep % len(names)]
            for name in order:
                busy = wait_quiet(args.wait_quiet) if args.wait_quiet > 0 else cpu_busy(0.2)
                row = await measure(arms[name], tokens=args.tokens, pace_s=args.pace_ms / 1e3, concurrency=concurrency)
                row["others_busy_pct"] = busy * 100
                runs[name].append(row)
        direct = None
        for name in names:
            row = median_of_rows(runs[name])
            row["clumped_pct_runs"] = [r["clumped_pct"] for r in runs[name]]
            if name == "direct":
                direct = row
            elif direct is not None:
                row["clumped_points_vs_direct"] = row["clumped_pct"] - direct["clumped_pct"]
            rows.append(row)
            print(f"c={concurrency:<3} {name:<10} gaps {row['gaps']:<5} clumped {row['clumped_pct']:6.2f}% "
                  f"(runs {', '.join(f'{v:.1f}' for v in row['clumped_pct_runs'])})  |gap-{args.pace_ms:g}ms| "
                  f"p50 {row['dev_p50_ms']:.3f} p99 {row['dev_p99_ms']:.3f} ms  max gap {row['gap_max_ms']:.2f} ms"
                  + (f"  vs direct {row['clumped_points_vs_direct']:+.2f} pts" if 'clumped_points_vs_direct' in row else "")
                  + f"  [others {row['others_busy_pct']:.0f}% busy]",
                  flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--pace-ms", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--wait-quiet", type=float, default=5.0,
                        help="before each run wait up to this many s for the others to use < 25%% of the cores")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.wait_quiet = 0.0
        args.tokens, args.concurrency, args.repeats = 30, [1], 1
    versions = {**arm_versions(), "client": use_uvloop()}
    info = print_header("stream timing fidelity", versions)
    print(f"upstream: {args.tokens} tokens {args.pace_ms:g} ms apart; concurrency {args.concurrency}; "
          f"repeats {args.repeats}", flush=True)
    load0 = load_average()
    with started_arms(args.arms, tokens=args.tokens, pace_ms=args.pace_ms, upstream_uvloop=False) as (_u, arms):
        skipped = [a for a in args.arms if a not in arms]
        rows = asyncio.run(run(args, arms))
    load1 = load_average()
    targets = {}
    for row in rows:
        if row["arm"] == "switchyard" and "clumped_points_vs_direct" in row:
            targets[f"clumped_within_2_points_of_direct_c{row['concurrency']}"] = {
                "value": row["clumped_points_vs_direct"], "met": row["clumped_points_vs_direct"] <= 2.0}
    report = {"machine": info, "versions": versions, "skipped_arms": skipped,
              "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "rows": rows, "targets": targets, "load_before": load0, "load_after": load1,
              "load_note": load_note(load0, load1), "uptime_after": uptime_line()}
    for name, t in targets.items():
        print(f"target {name}: {fmt(t['value'], '+.2f')} points -> {'met' if t['met'] else 'MISSED'}")
    print(f"load: {report['load_note']}")
    write_result("stream_fidelity", report, results_dir=args.results_dir, smoke=args.smoke)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

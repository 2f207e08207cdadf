"""A/B of the gateway's CPU per 1,000 streamed requests between two source trees (two commits of
this repository checked out side by side), behind one paced upstream, in interleaved rounds.

Each tree serves from its own `switchyard serve` process (`--workers` of them); every round runs
the closed-loop cell of `bench/gateway_overhead.py` (`--concurrency` persistent streams whose
workers start staggered over one request's duration, `--requests` requests) against the upstream
directly and then against each tree in turn (the order alternating). A tree's figure is its
process tree's user + system CPU over the cell divided by the requests it served, and its added
p50 against the direct cell of the same round. The median over rounds is what to compare: a
change smaller than the spread between rounds is noise on a shared machine.

    git worktree add /tmp/before <commit>
    .venv/bin/python bench/ab_gateway_cpu.py /tmp/before . --rounds 8
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.arms import Arm, start_switchyard, start_upstream  # noqa: E402
from bench.common import use_uvloop  # noqa: E402
from bench.gateway_overhead import closed_loop  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trees", nargs=2, type=Path, help="the two source trees (A, B)")
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=16, help="tokens per streamed response, 10 ms apart")
    parser.add_argument("--requests", type=int, default=2048, help="requests per cell")
    parser.add_argument("--workers", type=int, default=1, help="`[server] workers` of both trees")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()

    use_uvloop()
    log_dir = Path(tempfile.mkdtemp(prefix="ab-gateway-cpu-"))
    upstream = start_upstream(log_dir, tokens=args.tokens, pace_ms=10.0)
    servers = []

    def cell(arm: Arm, requests: int) -> dict:
        return asyncio.run(closed_loop(arm, stream=True, concurrency=args.concurrency, requests=requests,
                                       tokens=args.tokens, max_seconds=60))

    try:
        for i, tree in enumerate(args.trees):
            servers.append(start_switchyard(log_dir, upstream.port, workers=args.workers, tree=tree, name=f"tree{i}"))
        arms = [Arm(f"tree{i}", s.port, "/v1/chat/completions", {}, s) for i, s in enumerate(servers)]
        direct = Arm("direct", upstream.port, "/v1/chat/completions", {}, None)
        for arm in arms:  # warm up: connections, caches
            cell(arm, 2 * args.concurrency)
        per_tree: list[list[tuple[float, float, float]]] = [[] for _ in arms]
        for r in range(args.rounds):
            base = cell(direct, args.requests)["p50_ms"]
            for i in (range(len(arms)) if r % 2 == 0 else reversed(range(len(arms)))):
                row = cell(arms[i], args.requests)
                per_tree[i].append((row["cpu_s_per_1k"], row["p50_ms"] - base, row["requests_per_s"]))
                print(f"round {r} {args.trees[i]}: {row['cpu_s_per_1k']:.3f} s/1k, added p50 "
                      f"{row['p50_ms'] - base:+.2f} ms, {row['requests_per_s']:.0f} req/s "
                      f"(load {row['load1_before']:.2f})", flush=True)
        for tree, rows in zip(args.trees, per_tree):
            cpus = [cpu for cpu, _, _ in rows]
            print(f"MEDIAN {tree}: {statistics.median(cpus):.3f} s/1k (min {min(cpus):.3f}, max {max(cpus):.3f}), "
                  f"added p50 {statistics.median(p for _, p, _ in rows):+.2f} ms, "
                  f"{statistics.median(rate for _, _, rate in rows):.0f} req/s")
        lower = sum(b[0] < a[0] for a, b in zip(*per_tree))
        print(f"B below A in {lower} of {args.rounds} rounds")
    finally:
        for server in servers:
            server.stop()
        upstream.stop()


if __name__ == "__main__":
    main()

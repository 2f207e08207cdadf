"""A/B of the gateway's CPU per 1,000 streamed requests between two source trees (two commits of
this repository checked out side by side), behind one paced upstream, in interleaved rounds.

Each tree serves from its own `switchyard serve` process; every round drives `--concurrency`
persistent streams at each in turn (the order alternating), and the server's user + system CPU (its children too)
over the round is divided by the requests it served. The median over rounds is what to compare:
a change smaller than the spread between rounds is noise on a shared machine.

    git worktree add /tmp/before <commit>
    .venv/bin/python bench/ab_gateway_cpu.py /tmp/before . --rounds 6
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.arms import Arm, start_upstream, switchyard_config  # noqa: E402
from bench.common import free_port, spawn, tree_cpu_seconds, use_uvloop, wait_ready  # noqa: E402
from bench.profile_gateway import load  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trees", nargs=2, type=Path, help="the two source trees (A, B)")
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=16, help="tokens per streamed response, 10 ms apart")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0, help="length of one round per tree")
    args = parser.parse_args()

    use_uvloop()
    log_dir = Path(tempfile.mkdtemp(prefix="ab-gateway-cpu-"))
    upstream = start_upstream(log_dir, tokens=args.tokens, pace_ms=10.0)
    servers = []
    try:
        for i, tree in enumerate(args.trees):
            port, config = free_port(), log_dir / f"tree{i}.toml"
            config.write_text(switchyard_config(upstream.port))
            server = spawn(f"tree{i}", [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config),
                                        "--host", "127.0.0.1", "--port", str(port), "--drain-seconds", "1"],
                           port=port, log_dir=log_dir, cwd=tree.resolve())
            servers.append(server)
            wait_ready(server, "/health", timeout=60)
        arms = [Arm(f"tree{i}", s.port, "/v1/chat/completions", {}, s) for i, s in enumerate(servers)]
        for arm in arms:  # warm up: connections, caches
            asyncio.run(load(arm, args.concurrency, True, args.tokens, 1.5))
        per_tree: list[list[tuple[float, float]]] = [[] for _ in arms]
        for r in range(args.rounds):
            for i in (range(len(arms)) if r % 2 == 0 else reversed(range(len(arms)))):
                before, start = tree_cpu_seconds(servers[i].pid), time.perf_counter()
                served = asyncio.run(load(arms[i], args.concurrency, True, args.tokens, args.seconds))
                cpu = (tree_cpu_seconds(servers[i].pid) - before) / served * 1000
                elapsed = time.perf_counter() - start
                per_tree[i].append((cpu, served / elapsed))
                print(f"round {r} {args.trees[i]}: {cpu:.3f} s/1k, {served / elapsed:.0f} req/s", flush=True)
        for tree, rows in zip(args.trees, per_tree):
            cpus = [cpu for cpu, _ in rows]
            print(f"MEDIAN {tree}: {statistics.median(cpus):.3f} s/1k (min {min(cpus):.3f}, max {max(cpus):.3f}), "
                  f"{statistics.median(rate for _, rate in rows):.0f} req/s")
    finally:
        for server in servers:
            server.stop()
        upstream.stop()


if __name__ == "__main__":
    main()

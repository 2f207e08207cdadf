"""Where Switchyard's per-request cost goes: the gateway_overhead load (one cell) against a
Switchyard server while py-spy samples it; prints the top functions by own time and by
inclusive time, and keeps the collapsed stacks (bench/results/profile_gateway.txt) for a
flame graph.

    .venv/bin/python bench/profile_gateway.py [--concurrency 64] [--stream] [--seconds 15]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.arms import MODEL, Arm, started_arms  # noqa: E402
from bench.common import RESULTS, Connection, chat_body, print_header, use_uvloop  # noqa: E402
from bench.arms import arm_versions  # noqa: E402


async def load(arm: Arm, concurrency: int, stream: bool, tokens: int, seconds: float) -> int:
    data = chat_body(MODEL, stream=stream, max_tokens=tokens)
    conns = await asyncio.gather(*(Connection.open(arm.port, headers=arm.headers) for _ in range(concurrency)))
    deadline = time.perf_counter() + seconds
    done = 0

    async def worker(conn: Connection) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await conn.post(arm.path, data)
            done += 1

    await asyncio.gather(*(worker(c) for c in conns))
    for c in conns:
        c.close()
    return done


def summarize(collapsed: Path, top: int) -> str:
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        own[frames[-1]] += n
        for frame in set(frames):
            incl[frame] += n
    out = [f"{total} samples", "", "own time:"]
    out += [f"  {100 * n / total:5.1f}%  {f}" for f, n in own.most_common(top)]
    out += ["", "inclusive:"]
    out += [f"  {100 * n / total:5.1f}%  {f}" for f, n in incl.most_common(top * 2)
            if not f.startswith("<module>") and "(asyncio" not in f and "run (uvicorn" not in f][:top * 2]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--pace-ms", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(pyspy).exists():
        print("py-spy not found (pip install py-spy)")
        return 1
    use_uvloop()
    print_header("profile: Switchyard under the gateway_overhead load", arm_versions())
    args.results_dir.mkdir(parents=True, exist_ok=True)
    out = args.results_dir / "profile_gateway.txt"
    with started_arms(["switchyard"], tokens=args.tokens, pace_ms=args.pace_ms) as (_u, arms):
        arm = arms["switchyard"]
        asyncio.run(load(arm, args.concurrency, args.stream, args.tokens, 1.0))  # warm
        spy = subprocess.Popen([pyspy, "record", "--pid", str(arm.pid), "--duration", str(int(args.seconds)),
                                "--rate", "200", "--format", "raw", "--output", str(out), "--nonblocking"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        time.sleep(1.0)
        done = asyncio.run(load(arm, args.concurrency, args.stream, args.tokens, args.seconds - 1.5))
        spy.wait(timeout=args.seconds + 60)
    print(f"{done} requests ({'stream' if args.stream else 'json'}, c={args.concurrency}) while sampling; "
          f"collapsed stacks in {out}")
    print(summarize(out, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""CPU per streamed request as the load changes: the same requests (16 tokens, 10 ms apart) at 1,
16, 64 and 256 streams, against the bench upstream directly (its own process's CPU per request:
a control that does the least work per event, one write, and no Switchyard), through nginx with
one and two workers (the floor: a proxy in C relaying the same sockets unparsed; left out when
not installed: `python -m engines.install nginx`) and through Switchyard with one and two
workers (the gateway's process tree). The ratios are Switchyard's ÷ nginx's with as many
workers, or ÷ the upstream's without nginx.

On a machine whose cores idle between events, a process pays for every wake-up: the switch, and
code and data that went cold meanwhile. So the CPU per request of any server here falls as the
load rises and each wake-up serves more events; and two workers, each with half the streams,
wake more often than one. The table shows how much of a figure is that, for the upstream and for
Switchyard alike: compare within a column, and the ratios, not absolute values across machines.

    .venv/bin/python bench/cpu_by_load.py [--concurrency 1 16 64 256] [--seconds 8]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from contextlib import ExitStack
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import nginx_env  # noqa: E402
from bench.arms import Arm, start_nginx, start_switchyard, start_upstream  # noqa: E402
from bench.common import cpu_model, use_uvloop  # noqa: E402
from bench.gateway_overhead import closed_loop  # noqa: E402

TOKENS = 16
PACE_MS = 10.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--seconds", type=float, default=8.0, help="about how long each cell runs")
    args = parser.parse_args()

    use_uvloop()
    with ExitStack() as stack:
        arms = started(stack)
        run_cells(arms, args.concurrency, args.seconds)


def started(stack: ExitStack) -> list[Arm]:
    """The upstream (the control), nginx's arms (the floor) when installed, Switchyard's; each
    stopped by `stack`."""
    log_dir = Path(tempfile.mkdtemp(prefix="cpu-by-load-"))
    upstream = start_upstream(log_dir, tokens=TOKENS, pace_ms=PACE_MS)
    stack.callback(upstream.stop)
    starts = [partial(start_switchyard, workers=w, name=f"switchyard-{w}w") for w in (1, 2)]
    if nginx_env.installed():
        starts[:0] = [partial(start_nginx, workers=w, name=f"nginx-{w}w") for w in (1, 2)]
    else:
        print("SKIPPED nginx arms: not installed (python -m engines.install nginx)", flush=True)
    servers = []
    for start in starts:
        servers.append(start(log_dir, upstream.port))
        stack.callback(servers[-1].stop)
    control = Arm("upstream (direct)", upstream.port, "/v1/chat/completions", {}, upstream)
    return [control] + [Arm(s.name, s.port, "/v1/chat/completions", {}, s) for s in servers]


def run_cells(arms: list[Arm], concurrencies: list[int], seconds: float) -> None:
    # Switchyard's two arms (the last) against nginx's with as many workers, else the upstream's
    with_floor = len(arms) == 5
    pairs = [(len(arms) - 2 + i, 1 + i if with_floor else 0) for i in range(2)]
    request_s = TOKENS * PACE_MS / 1e3 + 0.01

    def cell(arm: Arm, concurrency: int, requests: int) -> dict:
        return asyncio.run(closed_loop(arm, stream=True, concurrency=concurrency, requests=requests, tokens=TOKENS,
                                       max_seconds=4 * seconds + 30))

    for arm in arms[1:]:  # warm up: connections, caches
        cell(arm, 64, 512)
    print(f"# CPU s per 1,000 streamed requests ({TOKENS} tokens, {PACE_MS:g} ms apart), {cpu_model()}")
    print("| streams | " + " | ".join(a.name for a in arms) + " | "
          + " | ".join(f"{arms[o].name} ÷ {arms[p].name}" for o, p in pairs) + " |")
    print("|---" * (1 + len(arms) + len(pairs)) + "|")
    for concurrency in concurrencies:
        requests = max(concurrency, int(seconds / request_s * concurrency))
        cpu = [cell(arm, concurrency, requests)["cpu_s_per_1k"] for arm in arms]
        ratios = [f"{cpu[o] / cpu[p]:.2f}" if cpu[p] else "–" for o, p in pairs]  # (CPU time counts in 10 ms ticks)
        print(f"| {concurrency} | " + " | ".join(f"{c:.2f}" for c in cpu) + " | " + " | ".join(ratios) + " |",
              flush=True)


if __name__ == "__main__":
    main()

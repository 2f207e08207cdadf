"""Coding-agent sessions through a fleet: the recorded Claude Code and Codex request shapes, many
turns each, through three real llama.cpp replicas, routed four ways side by side.

    .venv/bin/python bench/agent_sessions.py --passes 2           # the four arms twice, ~45 min on 2 busy cores
    .venv/bin/python bench/agent_sessions.py --arms switchyard oracle switchyard_no_strip
    .venv/bin/python bench/agent_sessions.py --smoke              # seconds: 2 sessions x 2 turns, one arm

The sessions (`tests/support/agent_sessions.py`, fixed seed): `--sessions` (8) sessions, Claude
Code's (`POST /v1/messages?beta=true`, its headers, `metadata.user_id`, its billing line with a
`cch=` new every request) and Codex's (`POST /v1/responses`, `session-id`, `prompt_cache_key`)
alternating, all started at once, `--turns` (6) turns each. Every turn resends the whole
conversation: the system prompt and tools of the recording (cut to `--system-chars` and
`--tools` tools, to fit the small model), the model's earlier answers, and from the second
turn on `--turn-chars` of pasted command output per user turn (what tool results add), then the
next question; `--think-s` between turns; temperature 0, `--max-tokens` per answer.

Replicas: three `llama-server` (b11434), one thread each, `--slots` slots of `--ctx-per-slot`
tokens, the prompt cache's host-memory copy capped at `--cache-ram` MiB; restarted for every arm,
so every arm starts cold.

Arms — every arm's client talks to a Switchyard, so that each request is translated the same way
and only the choice of replica differs:
- `switchyard`: one `llamacpp` backend over the three replicas, `balance = "prefix_cache"`:
  the session table (a session's turns where its last turn went, new sessions spread) and the
  prefix index; `strip_billing_header` on (the default).
- `round_robin`: the same with `balance = "round_robin"`.
- `sglang_cache_aware`: Switchyard (one `openai_compatible` backend: translation and the
  billing line's strip only) in front of sglang-router 0.3.2 `--policy cache_aware` over the
  three replicas: sglang-router speaks chat completions only, so an agent reaches it through a
  translating gateway in any case.
- `oracle`: each session pinned by hand (session i -> replica i mod 3), through three
  single-replica backends and a route per replica.
- `switchyard_no_strip` (not run by default): `switchyard` with `strip_billing_header = false`.

`--passes` N runs the arms N times, interleaved (every other pass in reverse order), and pools
each arm's turns: on a shared machine the others' load drifts over an arm's minutes.

Per arm: TTFT p50/p99 of turns >= 2 (and of first turns), the cached-token ratio (sum of
`cached_tokens` / sum of prompt tokens from the usage the client got) of turns >= 2 and overall,
per replica the prompt tokens it prefilled (llama-server's `/metrics`), the sessions that stayed
on one replica (Switchyard's request log), the gateway's CPU seconds per 1,000 requests (also
less its idle background work — health probes, load scrapes — measured for `--idle-s` before
each pass), errors.
Ratios: ours (`switchyard`) ÷ each peer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (  # noqa: E402
    RESULTS,
    Server,
    cpu_busy,
    fmt,
    free_port,
    pct,
    print_header,
    ratio,
    spawn,
    tree_cpu_seconds,
    uptime_line,
    wait_ready,
    write_result,
)
from bench.fleet_routing import REPLICAS, start_peer, start_replicas  # noqa: E402
from bench.router_envs import ROUTERS  # noqa: E402
from tests.support.agent_sessions import AgentSession, Fit, Turn, send_turn, sessions  # noqa: E402
from tests.support.probes import request_log as request_log_lines  # noqa: E402

MODEL = "smol"
ARMS = ("switchyard", "round_robin", "sglang_cache_aware", "oracle", "switchyard_no_strip")
DEFAULT_ARMS = ARMS[:4]
SGLANG = ROUTERS["sglang-router"]


@dataclass
class Sent:
    """One turn as the bench saw it."""

    turn: Turn
    index: int  # the session's
    started: float


# ------------------------------------------------------------------------------------ servers


def backend_table(name: str, type_: str, urls: list[str], balance: str | None = None) -> str:
    where = f'endpoints = {json.dumps(urls)}' if len(urls) > 1 else f'base_url = "{urls[0]}"'
    return (f'[[backends]]\nname = "{name}"\ntype = "{type_}"\n[backends.options]\ntools = true\n{where}\n'
            f'models = {{ "{MODEL}" = "{MODEL}" }}\n' + (f'balance = "{balance}"\n' if balance else "")
            + "[backends.options.timeouts]\nfirst_byte_s = 900\nidle_s = 900\n\n")


def switchyard_config(arm: str, replicas: list[Server], router: Server | None, log: Path) -> str:
    urls = [r.base for r in replicas]
    strip = "false" if arm == "switchyard_no_strip" else "true"
    text = (f'[server]\nrequest_log = "{log}"\nlog_level = "warning"\nstrip_billing_header = {strip}\n\n'
            '[plugins]\ndisable = ["builtin"]\n\n')
    if arm in ("switchyard", "switchyard_no_strip"):
        return text + backend_table("fleet", "llamacpp", urls, "prefix_cache")
    if arm == "round_robin":
        return text + backend_table("fleet", "llamacpp", urls, "round_robin")
    if arm == "sglang_cache_aware":
        assert router is not None
        return text + backend_table("sglang", "openai_compatible", [router.base])
    tables = [backend_table(f"r{i}", "llamacpp", [url]) for i, url in enumerate(urls)]
    routes = [f'[[routes]]\nname = "pin{i}"\n[[routes.targets]]\nbackend = "r{i}"\nmodel = "{MODEL}"\n\n'
              for i in range(len(urls))]
    return text + "".join(tables) + "".join(routes)


def start_switchyard(arm: str, replicas: list[Server], router: Server | None, log_dir: Path) -> tuple[Server, Path]:
    port = free_port()
    log = log_dir / f"requests-{arm}-{port}.jsonl"
    config = log_dir / f"switchyard-{arm}.toml"
    config.write_text(switchyard_config(arm, replicas, router, log))
    argv = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config), "--port", str(port)]
    server = spawn(f"switchyard-{arm}", argv, port=port, log_dir=log_dir)
    wait_ready(server, path="/ready", timeout=120)
    return server, log


def prefilled(replica: Server) -> dict[str, float]:
    """The replica's own counters: prompt tokens prefilled and read from its cache."""
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(replica.base + "/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        for name in ("prompt_tokens_total", "prompt_tokens_cached_total"):
            if line.startswith(f"llamacpp:{name} "):
                out[name] = float(line.split()[1])
    return out


# ------------------------------------------------------------------------------------ one arm


async def run_sessions(base: str, agents: list[AgentSession], args: argparse.Namespace, oracle: bool) -> list[Sent]:
    import httpx

    rng = random.Random(args.seed)
    thinks = {a.index: [rng.expovariate(1 / args.think_s) if args.think_s else 0.0 for _ in range(args.turns)] for a in agents}
    sent: list[Sent] = []
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=httpx.Timeout(900.0), limits=limits, trust_env=False) as client:
        t0 = time.perf_counter()

        async def one(agent: AgentSession) -> None:
            model = f"pin{agent.index % REPLICAS}" if oracle else None
            for turn in range(args.turns):
                started = time.perf_counter() - t0
                result = await send_turn(client, base, agent, turn, model=model, request_id=f"s{agent.index}t{turn}")
                sent.append(Sent(result, agent.index, started))
                await asyncio.sleep(thinks[agent.index][turn])

        await asyncio.gather(*(one(a) for a in agents))
    return sent


@dataclass
class Run:
    """One pass of one arm: its turns (with the replica that served, where known) and its costs."""

    arm: str
    sent: list[Sent]
    replica_of: dict[str, str]  # request id -> replica0..2
    prefilled: list[float]  # per replica
    wall: float
    cpu: float  # the gateway's, over the pass
    idle_cpu_per_s: float  # the same gateway's before the pass, idle
    router_cpu: float | None
    others: float


def run_arm(arm: str, args: argparse.Namespace) -> Run:
    log_dir = args.results_dir / "agent_sessions_logs"
    fit = Fit(system_chars=args.system_chars, tools=args.tools, tool_chars=args.tool_chars, max_tokens=args.max_tokens,
              turn_chars=args.turn_chars)
    agents = sessions(args.sessions, MODEL, fit, seed=args.seed)
    others = cpu_busy(1.0)
    replicas = start_replicas(log_dir, args.cache_ram, args.slots, ctx_per_slot=args.ctx_per_slot, alias=MODEL,
                              timeout=120)
    router = gateway = None
    try:
        router = start_peer("sglang_cache_aware", replicas, log_dir) if arm == "sglang_cache_aware" else None
        gateway, request_log = start_switchyard(arm, replicas, router, log_dir)
        idle0, t_idle = tree_cpu_seconds(gateway.pid), time.perf_counter()
        time.sleep(args.idle_s)  # the gateway's own background work (health probes, load scrapes) per second
        cpu0 = tree_cpu_seconds(gateway.pid)
        idle_rate = (cpu0 - idle0) / (time.perf_counter() - t_idle)
        router_cpu0 = tree_cpu_seconds(router.pid) if router else 0.0
        wall0 = time.perf_counter()
        sent = asyncio.run(run_sessions(gateway.base, agents, args, oracle=arm == "oracle"))
        wall = time.perf_counter() - wall0
        cpu = tree_cpu_seconds(gateway.pid) - cpu0
        router_cpu = tree_cpu_seconds(router.pid) - router_cpu0 if router else None
        per_replica = [prefilled(r).get("prompt_tokens_total", 0.0) for r in replicas]
        logged = request_log_lines(request_log, len(sent))
    finally:
        for server in (gateway, router, *replicas):
            if server is not None:
                server.stop()
    alias = {r.base: f"replica{i}" for i, r in enumerate(replicas)} | {f"r{i}": f"replica{i}" for i in range(REPLICAS)}
    # the replica that served, where the request log can tell (not behind sglang-router)
    replica_of = {rid: name for rid, line in logged.items()
                  if (name := alias.get(line.get("replica") or "") or alias.get(line["backend"]))}
    run = Run(arm, sent, replica_of, per_replica, wall, cpu, idle_rate, router_cpu, others)
    print(f"    {arm} pass: {len(sent)} turns, wall {wall:.0f} s, prefilled {per_replica}, others {others:.0%} busy before",
          flush=True)
    return run


def summarize(arm: str, runs: list[Run]) -> dict:
    """The arm's figures over all its passes (turns pooled)."""
    sent = [s for run in runs for s in run.sent]
    ok = [s for s in sent if s.turn.error is None]
    later = [s.turn for s in ok if s.turn.turn >= 1]
    first = [s.turn for s in ok if s.turn.turn == 0]

    def cached_ratio(turns: list[Turn]) -> float | None:
        prompt = sum(t.prompt_tokens for t in turns)
        return sum(t.cached_tokens for t in turns) / prompt if prompt else None

    homes: dict[tuple[int, int], set[str]] = {}
    for n, run in enumerate(runs):
        for s in run.sent:
            if s.turn.error is None and s.turn.request_id in run.replica_of:
                homes.setdefault((n, s.index), set()).add(run.replica_of[s.turn.request_id])
    requests = len(sent)
    later_ttft = [t.ttft for t in later if t.ttft is not None]
    row = {
        "arm": arm, "passes": len(runs), "requests": requests, "errors": requests - len(ok),
        "error_samples": sorted({s.turn.error for s in sent if s.turn.error})[:3],
        "ttft_later_p50_s": pct(later_ttft, 0.5) if later_ttft else None,
        "ttft_later_p99_s": pct(later_ttft, 0.99) if later_ttft else None,
        "ttft_later_p50_per_pass_s": [pct([s.turn.ttft for s in run.sent if s.turn.turn >= 1 and s.turn.ttft is not None], 0.5)
                                      for run in runs],
        "ttft_first_p50_s": pct([t.ttft for t in first if t.ttft is not None], 0.5) if first else None,
        "cached_ratio_later": cached_ratio(later), "cached_ratio_all": cached_ratio([s.turn for s in ok]),
        "prefilled_tokens_per_pass": [sum(run.prefilled) for run in runs],
        "prefilled_tokens_per_replica": [run.prefilled for run in runs],
        "sessions_on_one_replica": f"{sum(1 for h in homes.values() if len(h) == 1)}/{len(homes)}" if homes else None,
        "gateway_cpu_s_per_1k": sum(r.cpu for r in runs) / requests * 1000 if requests else None,
        "gateway_idle_cpu_s_per_s": sum(r.idle_cpu_per_s for r in runs) / len(runs),
        "gateway_cpu_s_per_1k_less_idle": (sum(r.cpu - r.idle_cpu_per_s * r.wall for r in runs) / requests * 1000
                                           if requests else None),
        "router_cpu_s_per_1k": (sum(r.router_cpu or 0.0 for r in runs) / requests * 1000
                                if requests and runs[0].router_cpu is not None else None),
        "wall_s": [run.wall for run in runs], "others_busy_before": [run.others for run in runs],
    }
    print(f"  {arm:<20} n={requests:<3} err={row['errors']:<2} turn>=2 TTFT p50/p99 "
          f"{fmt(row['ttft_later_p50_s'])}/{fmt(row['ttft_later_p99_s'])} s (per pass {[round(x, 1) for x in row['ttft_later_p50_per_pass_s']]})"
          f"  first-turn p50 {fmt(row['ttft_first_p50_s'])} s  cached turn>=2 {fmt(row['cached_ratio_later'], '.3f')} "
          f"(all {fmt(row['cached_ratio_all'], '.3f')})  prefilled/pass {row['prefilled_tokens_per_pass']}  "
          f"one-replica sessions {row['sessions_on_one_replica']}  gateway CPU/1k {fmt(row['gateway_cpu_s_per_1k'], '.1f')} s "
          f"(less idle {fmt(row['gateway_cpu_s_per_1k_less_idle'], '.1f')})",
          flush=True)
    return row


def targets(rows: dict[str, dict]) -> dict:
    ours = rows.get("switchyard")
    out: dict[str, object] = {}
    if not ours:
        return out
    for peer, limit in (("round_robin", 0.5), ("sglang_cache_aware", 0.8)):
        if peer in rows:
            value = ratio(ours["ttft_later_p50_s"], rows[peer]["ttft_later_p50_s"])
            out[f"ttft_later_p50_switchyard_over_{peer}"] = value
            out[f"ttft_later_p50_vs_{peer}_met (<= {limit})"] = value is not None and value <= limit
            out[f"ttft_later_p99_switchyard_over_{peer}"] = ratio(ours["ttft_later_p99_s"], rows[peer]["ttft_later_p99_s"])
    for peer in ("oracle", "round_robin", "sglang_cache_aware", "switchyard_no_strip"):
        if peer in rows:
            out[f"cached_ratio_later_switchyard_over_{peer}"] = ratio(ours["cached_ratio_later"], rows[peer]["cached_ratio_later"])
    if "oracle" in rows:
        value = out["cached_ratio_later_switchyard_over_oracle"]
        out["cached_ratio_vs_oracle_met (>= 0.9)"] = value is not None and value >= 0.9  # type: ignore[operator]
    out["gateway_cpu_s_per_1k_agent_requests"] = ours["gateway_cpu_s_per_1k"]
    out["gateway_cpu_s_per_1k_agent_requests_less_idle"] = ours["gateway_cpu_s_per_1k_less_idle"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(DEFAULT_ARMS))
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--system-chars", type=int, default=2400, help="the recorded system prompt cut to this")
    parser.add_argument("--tools", type=int, default=2, help="the first N recorded tools")
    parser.add_argument("--tool-chars", type=int, default=240, help="each tool's description cut to this")
    parser.add_argument("--turn-chars", type=int, default=400, help="pasted command output per later user turn")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--think-s", type=float, default=0.5, help="mean pause between a session's turns")
    parser.add_argument("--slots", type=int, default=4, help="llama-server -np")
    parser.add_argument("--ctx-per-slot", type=int, default=3072)
    parser.add_argument("--cache-ram", type=int, default=256, help="llama-server --cache-ram MiB per replica")
    parser.add_argument("--seed", type=int, default=32)
    parser.add_argument("--passes", type=int, default=1, help="passes over the arms, interleaved; turns pooled per arm")
    parser.add_argument("--idle-s", type=float, default=10.0, help="the gateway's idle CPU measured this long first")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.sessions, args.turns, args.system_chars, args.tools, args.turn_chars, args.think_s = 2, 2, 600, 1, 120, 0.0
        args.max_tokens, args.slots, args.ctx_per_slot, args.idle_s = 8, 2, 1536, 1.0
        args.arms = [a for a in args.arms if a in ("switchyard", "oracle")] or ["switchyard"]
    versions = {"llama.cpp": "b11434", SGLANG.name: SGLANG.version if SGLANG.installed() else None}
    info = print_header("agent sessions: recorded Claude Code / Codex shapes, 3 llama.cpp replicas", versions)
    arms = [a for a in args.arms if a != "sglang_cache_aware" or SGLANG.installed()]
    skipped = sorted(set(args.arms) - set(arms))
    if skipped:
        print(f"skipped (run `python bench/router_envs.py install`): {', '.join(skipped)}")
    print(f"sessions: {args.sessions} (Claude Code and Codex alternating) x {args.turns} turns, system {args.system_chars} "
          f"chars, {args.tools} tools, {args.turn_chars} chars pasted per later turn, think {args.think_s} s; replicas "
          f"-t 1 -np {args.slots} x {args.ctx_per_slot} tokens, --cache-ram {args.cache_ram} MiB", flush=True)
    report = {"machine": info, "versions": versions, "config": vars(args) | {"results_dir": str(args.results_dir)},
              "skipped_arms": skipped, "rows": [], "targets": {}}
    runs: dict[str, list[Run]] = {arm: [] for arm in arms}
    for n in range(args.passes):  # interleaved, every other pass in reverse, so that the machine's drift hits every arm
        print(f"pass {n + 1} of {args.passes} ({uptime_line()})", flush=True)
        for arm in arms if n % 2 == 0 else arms[::-1]:
            runs[arm].append(run_arm(arm, args))
        rows = {arm: summarize(arm, done) for arm, done in runs.items() if done}
        report |= {"rows": list(rows.values()), "targets": targets(rows), "uptime_after": uptime_line()}
        write_result("agent_sessions", report, results_dir=args.results_dir, smoke=args.smoke)  # after every pass
    for key, value in report["targets"].items():
        print(f"  {key}: {value if not isinstance(value, float) else round(value, 3)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

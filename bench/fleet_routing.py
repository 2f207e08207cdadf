"""Routing a fleet: one multi-tenant chat trace through every router, on the same three real
llama.cpp replicas, side by side.

    .venv/bin/python bench/fleet_routing.py --kill               # every arm, ~60 min on 2 cores
    .venv/bin/python bench/fleet_routing.py --arms prefix_cache round_robin oracle
    .venv/bin/python bench/fleet_routing.py --smoke              # seconds: a tiny trace, two arms

The trace (fixed seed): `--tenants` tenants (8), each with its own system prompt (`--system-words`
500: ~650 tokens); `--conversations` (24) conversations of 3-5 turns, each turn resending the whole conversation (the
model's own earlier answers included), started at Poisson arrivals (`--rate` 0.08 conversations per
second: about what this 2-core machine's three one-thread replicas sustain with ideal routing;
the issue's 64 conversations of ~1,000-token prompts take ~15 min per arm here), the next turn sent a think time after the previous answer; `max_tokens` 32,
temperature 0.

Replicas: three `llama-server` (b11434), one thread each (`-t 1`), two slots (`-np 2`), the
prompt cache on, its host-memory copy capped at `--cache-ram` MiB (default 128: about 5,500
tokens of this small model's KV, i.e. a replica can keep a few tenants' prompts, not all eight —
the KV budget of a real GPU replica relative to its traffic). They are restarted for every arm,
so every arm starts cold.

Arms: Switchyard (one `llamacpp` backend whose `endpoints` are the three replicas) with
`balance` = `round_robin`, `least_busy`, `least_load`, `prefix_cache`; `sglang-router`
(`cache_aware`, `round_robin`) and `vllm-router` (`cache_aware`), pinned, each in its venv
(`bench/router_envs.py`); `oracle`: the client sends every request of a tenant straight to one
replica (tenant i -> replica i mod 3), the ceiling. With `--kill`, one more `prefix_cache` run
in which replica 2 is killed (SIGKILL) a third of the way through the trace.

Per arm: TTFT and end-to-end p50/p99, output tokens/s, the prefix-cache hit ratio (sum of
`cached_tokens` / sum of `prompt_tokens` from the usage the client got), each replica's share of
the requests (from the request log for Switchyard, from the replica's alias in the response's
`model` otherwise), the router's CPU seconds per 1,000 requests, errors.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (  # noqa: E402
    RESULTS,
    Server,
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
from bench.router_envs import ROUTERS  # noqa: E402

MODEL = "smol"
REPLICAS = 3
SWITCHYARD_ARMS = ("round_robin", "least_busy", "least_load", "prefix_cache")
PEER_ARMS = {"sglang_cache_aware": ("sglang-router", "cache_aware"), "sglang_round_robin": ("sglang-router", "round_robin"),
             "vllm_router_cache_aware": ("vllm-router", "cache_aware")}
ALL_ARMS = (*SWITCHYARD_ARMS, *PEER_ARMS, "oracle")
WORDS = ("signal track wagon siding engine brake coupling hump yard switch freight timetable crew shunt "
         "platform junction ballast sleeper gauge points lever cabin route block token dispatcher").split()


# ------------------------------------------------------------------------------------ the trace


@dataclass
class Conversation:
    tenant: int
    start_s: float
    questions: list[str]
    think_s: list[float]


def system_prompt(rng: random.Random, tenant: int, words: int) -> str:
    body = " ".join(rng.choice(WORDS) for _ in range(words))
    return f"You are the dispatcher assistant of yard {tenant}. House rules of yard {tenant}: {body}."


def make_trace(*, seed: int, tenants: int, conversations: int, rate: float, system_words: int) -> tuple[list[str], list[Conversation]]:
    rng = random.Random(seed)
    systems = [system_prompt(rng, t, system_words) for t in range(tenants)]
    out, t = [], 0.0
    for _ in range(conversations):
        t += rng.expovariate(rate)
        turns = rng.randint(3, 5)
        questions = [f"Question {rng.randint(1, 999)}: which {rng.choice(WORDS)} comes after the {rng.choice(WORDS)} "
                     f"on track {rng.randint(1, 40)}?" for _ in range(turns)]
        out.append(Conversation(rng.randrange(tenants), t, questions, [rng.expovariate(1.0) for _ in range(turns)]))
    return systems, out


# ------------------------------------------------------------------------------------ the client


@dataclass
class Result:
    tenant: int
    start: float
    ttft: float | None = None
    e2e: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    replica: str | None = None
    error: str | None = None
    request_id: str = ""


@dataclass
class Arm:
    name: str
    url: str  # where requests go (oracle: unused)
    router: Server | None = None
    replica_urls: list[str] = field(default_factory=list)
    request_log: Path | None = None


async def one_turn(client, url: str, messages: list[dict], result: Result) -> str:  # noqa: ANN001
    body = {"model": MODEL, "messages": messages, "max_tokens": 32, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    text: list[str] = []
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body,
                                 headers={"x-request-id": result.request_id}) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return ""
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    result.error = str(chunk["error"])[:200]
                    continue
                result.replica = result.replica or chunk.get("model")
                for choice in chunk.get("choices") or ():
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        if result.ttft is None:
                            result.ttft = time.perf_counter() - t0
                        text.append(piece)
                usage = chunk.get("usage")
                if usage:
                    result.prompt_tokens = usage.get("prompt_tokens") or 0
                    result.completion_tokens = usage.get("completion_tokens") or 0
                    result.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    except Exception as exc:  # noqa: BLE001 - a lost request is a result, not a crash
        result.error = f"{type(exc).__name__}: {exc}"[:200]
    result.e2e = time.perf_counter() - t0
    if result.error is None and result.ttft is None:
        result.error = "no token"
    return "".join(text)


async def run_trace(arm: Arm, systems: list[str], trace: list[Conversation], *, kill: Server | None = None,
                    kill_at_s: float | None = None) -> tuple[list[Result], float]:
    import httpx

    results: list[Result] = []
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits, trust_env=False) as client:
        t0 = time.perf_counter()

        async def conversation(i: int, conv: Conversation) -> None:
            await asyncio.sleep(conv.start_s)
            messages = [{"role": "system", "content": systems[conv.tenant]}]
            url = arm.replica_urls[conv.tenant % len(arm.replica_urls)] if arm.name == "oracle" else arm.url
            for turn, question in enumerate(conv.questions):
                messages.append({"role": "user", "content": question})
                result = Result(conv.tenant, time.perf_counter() - t0, request_id=f"c{i}t{turn}")
                results.append(result)
                answer = await one_turn(client, url, messages, result)
                messages.append({"role": "assistant", "content": answer})
                await asyncio.sleep(conv.think_s[turn])

        async def killer() -> None:
            assert kill is not None and kill_at_s is not None
            await asyncio.sleep(kill_at_s)
            kill.proc.send_signal(signal.SIGKILL)
            print(f"  killed replica {kill.base} at t={kill_at_s:.0f} s", flush=True)

        tasks = [conversation(i, c) for i, c in enumerate(trace)]
        if kill is not None:
            tasks.append(killer())
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
    return results, wall


# ------------------------------------------------------------------------------------ the servers


def start_replicas(log_dir: Path, cache_ram: int, parallel: int = 2, *, ctx_per_slot: int = 2048,
                   alias: str | None = None, timeout: float = 60.0) -> list[Server]:
    """`REPLICAS` llama-servers of `parallel` slots, `ctx_per_slot` tokens of context each, serving
    the model as `alias` (default: `replica<i>`, so each names itself)."""
    from engines import install

    binary = install.llama_server_path()
    model = install.install_gguf()
    servers = []
    for i in range(REPLICAS):
        port = free_port()
        argv = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c",
                str(ctx_per_slot * parallel), "-np", str(parallel), "-t", "1", "-a", alias or f"replica{i}",
                "--metrics", "--slots", "--cache-ram", str(cache_ram)]
        servers.append(spawn(f"replica{i}", argv, port=port, log_dir=log_dir))
    for server in servers:
        wait_ready(server, timeout=timeout)
    return servers


def start_switchyard(balance: str, replicas: list[Server], log_dir: Path) -> tuple[Server, Path]:
    port = free_port()
    request_log = log_dir / f"requests-{balance}-{port}.jsonl"
    config = log_dir / f"switchyard-{balance}.toml"
    config.write_text(
        f'[server]\nrequest_log = "{request_log}"\nlog_level = "warning"\n\n[plugins]\ndisable = ["builtin"]\n\n'
        f'[[backends]]\nname = "fleet"\ntype = "llamacpp"\n[backends.options]\n'
        f'endpoints = {json.dumps([r.base for r in replicas])}\nmodels = {{ "{MODEL}" = "{MODEL}" }}\nbalance = "{balance}"\n'
        f'[backends.options.timeouts]\nfirst_byte_s = 600\n')
    argv = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config), "--port", str(port)]
    server = spawn(f"switchyard-{balance}", argv, port=port, log_dir=log_dir)
    wait_ready(server, path="/ready", timeout=120)
    return server, request_log


def start_peer(arm: str, replicas: list[Server], log_dir: Path) -> Server:
    router_name, policy = PEER_ARMS[arm]
    router = ROUTERS[router_name]
    port = free_port()
    server = spawn(arm, router.argv(port, [r.base for r in replicas], policy), port=port, log_dir=log_dir)
    wait_ready(server, path="/health", timeout=120)
    return server


def replicas_from_log(path: Path, results: list[Result], replicas: list[Server]) -> None:
    alias = {r.base: f"replica{i}" for i, r in enumerate(replicas)}
    deadline = time.monotonic() + 10
    by_id: dict[str, str] = {}
    while time.monotonic() < deadline:
        lines = path.read_text().splitlines() if path.exists() else []
        by_id = {(d := json.loads(line))["request_id"]: alias.get(d.get("replica") or "", "?") for line in lines}
        if all(r.request_id in by_id for r in results):
            break
        time.sleep(0.2)
    for r in results:
        r.replica = by_id.get(r.request_id, r.replica)


# ------------------------------------------------------------------------------------ one arm


def run_arm(name: str, args: argparse.Namespace, systems: list[str], trace: list[Conversation], *,
            kill: bool = False) -> dict:
    log_dir = args.results_dir / "fleet_logs"
    replicas = start_replicas(log_dir, args.cache_ram)
    router: Server | None = None
    try:
        request_log = None
        if name in SWITCHYARD_ARMS:
            router, request_log = start_switchyard(name, replicas, log_dir)
        elif name in PEER_ARMS:
            router = start_peer(name, replicas, log_dir)
        arm = Arm(name, router.base if router else "", router, [r.base for r in replicas], request_log)
        cpu0 = tree_cpu_seconds(router.pid) if router else 0.0
        kill_at = trace[len(trace) // 3].start_s if kill else None
        results, wall = asyncio.run(run_trace(arm, systems, trace, kill=replicas[2] if kill else None, kill_at_s=kill_at))
        cpu = (tree_cpu_seconds(router.pid) - cpu0) if router else None
        if request_log is not None:
            replicas_from_log(request_log, results, replicas)
        if name == "oracle":
            for r in results:
                r.replica = f"replica{r.tenant % REPLICAS}"
    finally:
        if router is not None:
            router.stop()
        for r in replicas:
            r.stop()
    return summarize(name + ("_killed" if kill else ""), results, wall, cpu, kill_at)


def summarize(name: str, results: list[Result], wall: float, cpu_s: float | None, kill_at: float | None) -> dict:
    ok = [r for r in results if r.error is None]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    e2e = [r.e2e for r in ok if r.e2e is not None]
    prompt = sum(r.prompt_tokens for r in ok)
    shares: dict[str, int] = {}
    for r in ok:
        shares[r.replica or "?"] = shares.get(r.replica or "?", 0) + 1
    row = {
        "arm": name, "requests": len(results), "errors": len(results) - len(ok),
        "error_samples": sorted({r.error for r in results if r.error})[:3],
        "ttft_p50_s": pct(ttft, 0.5) if ttft else None, "ttft_p99_s": pct(ttft, 0.99) if ttft else None,
        "e2e_p50_s": pct(e2e, 0.5) if e2e else None, "e2e_p99_s": pct(e2e, 0.99) if e2e else None,
        "output_tokens_per_s": sum(r.completion_tokens for r in ok) / wall if wall else None,
        "hit_ratio": sum(r.cached_tokens for r in ok) / prompt if prompt else None,
        "replica_share": {k: round(v / len(ok), 3) for k, v in sorted(shares.items())} if ok else {},
        "max_share_over_fair": max(shares.values()) / (len(ok) / REPLICAS) if ok else None,
        "router_cpu_s_per_1k": cpu_s / len(results) * 1000 if cpu_s is not None and results else None,
        "wall_s": wall,
    }
    if kill_at is not None:
        after = [r for r in ok if r.start > kill_at + 1.0]
        row["after_kill_share"] = {k: round(sum(1 for r in after if r.replica == k) / len(after), 3)
                                   for k in sorted({r.replica or "?" for r in after})} if after else {}
        row["lost_after_first_byte"] = sum(1 for r in results if r.error and r.ttft is not None)
    print(f"  {name:<26} n={row['requests']:<4} err={row['errors']:<3} ttft p50/p99 {fmt(row['ttft_p50_s'])}/"
          f"{fmt(row['ttft_p99_s'])} s  e2e p50/p99 {fmt(row['e2e_p50_s'])}/{fmt(row['e2e_p99_s'])} s  "
          f"out {fmt(row['output_tokens_per_s'], '.1f')} tok/s  hit {fmt(row['hit_ratio'], '.3f')}  "
          f"share {row['replica_share']}  cpu/1k {fmt(row['router_cpu_s_per_1k'], '.1f')} s", flush=True)
    return row


def targets(rows: dict[str, dict]) -> dict:
    pc, rr = rows.get("prefix_cache"), rows.get("round_robin")
    sg, oracle = rows.get("sglang_cache_aware"), rows.get("oracle")
    out: dict[str, object] = {}
    if pc and rr:
        out["ttft_p50_prefix_cache_over_round_robin"] = ratio(pc["ttft_p50_s"], rr["ttft_p50_s"])
        out["ttft_p50_vs_round_robin_met (<= 0.5)"] = (out["ttft_p50_prefix_cache_over_round_robin"] or 9) <= 0.5
    if pc and sg:
        out["ttft_p50_prefix_cache_over_sglang_cache_aware"] = ratio(pc["ttft_p50_s"], sg["ttft_p50_s"])
        out["ttft_p50_vs_sglang_met (<= 0.9)"] = (out["ttft_p50_prefix_cache_over_sglang_cache_aware"] or 9) <= 0.9
    if pc and oracle:
        out["hit_ratio_prefix_cache_over_oracle"] = ratio(pc["hit_ratio"], oracle["hit_ratio"])
        out["hit_ratio_met (>= 0.9)"] = (out["hit_ratio_prefix_cache_over_oracle"] or 0) >= 0.9
    if pc:
        out["max_share_over_fair_prefix_cache"] = pc["max_share_over_fair"]
        out["share_met (<= 1.5)"] = (pc["max_share_over_fair"] or 9) <= 1.5
    killed = rows.get("prefix_cache_killed")
    if killed:
        out["killed_run_errors"] = killed["errors"]
        out["killed_run_lost_after_first_byte"] = killed["lost_after_first_byte"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", nargs="+", choices=ALL_ARMS, default=list(ALL_ARMS))
    parser.add_argument("--tenants", type=int, default=8)
    parser.add_argument("--conversations", type=int, default=24)
    parser.add_argument("--rate", type=float, default=0.08, help="conversations started per second (Poisson)")
    parser.add_argument("--system-words", type=int, default=500, help="words per system prompt (~650 tokens)")
    parser.add_argument("--cache-ram", type=int, default=128, help="llama-server --cache-ram MiB per replica")
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--kill", action="store_true", help="also a prefix_cache run with a replica killed mid-trace")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.tenants, args.conversations, args.rate, args.system_words = 2, 3, 2.0, 60
        args.arms = [a for a in args.arms if a in ("prefix_cache", "round_robin")] or ["prefix_cache"]
    versions = {"llama.cpp": "b11434", **{r.name: r.version if r.installed() else None for r in ROUTERS.values()}}
    info = print_header("fleet routing: one chat trace through every router, 3 llama.cpp replicas", versions)
    arms = [a for a in args.arms if a not in PEER_ARMS or ROUTERS[PEER_ARMS[a][0]].installed()]
    skipped = sorted(set(args.arms) - set(arms))
    if skipped:
        print(f"skipped (run `python bench/router_envs.py install`): {', '.join(skipped)}")
    systems, trace = make_trace(seed=args.seed, tenants=args.tenants, conversations=args.conversations,
                                rate=args.rate, system_words=args.system_words)
    print(f"trace: {args.tenants} tenants, {len(trace)} conversations, {sum(len(c.questions) for c in trace)} requests, "
          f"rate {args.rate}/s, system prompts ~{args.system_words} words, --cache-ram {args.cache_ram} MiB", flush=True)
    rows: dict[str, dict] = {}
    report = {"machine": info, "versions": versions, "config": vars(args) | {"results_dir": str(args.results_dir)},
              "skipped_arms": skipped, "rows": [], "targets": {}}
    runs = [(name, False) for name in arms] + ([("prefix_cache", True)] if args.kill else [])
    for name, kill in runs:
        row = run_arm(name, args, systems, trace, kill=kill)
        rows[row["arm"]] = row
        report |= {"rows": list(rows.values()), "targets": targets(rows), "uptime_after": uptime_line()}
        write_result("fleet_routing", report, results_dir=args.results_dir, smoke=args.smoke)  # after every arm
    for key, value in report["targets"].items():
        print(f"  {key}: {value if not isinstance(value, float) else round(value, 3)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Turn bench/results/*.json into one markdown summary (bench/results/SUMMARY.md) and PNG plots
(bench/results/*.png). Reads whichever results exist; `--smoke` reads the `*.smoke.json` ones.

    .venv/bin/python bench/summarize.py [--results-dir DIR] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import RESULTS, fmt  # noqa: E402


def _load(results: Path, name: str, smoke: bool) -> dict | None:
    path = results / (f"{name}.smoke.json" if smoke else f"{name}.json")
    return json.loads(path.read_text()) if path.is_file() else None


def _machine_line(rep: dict) -> str:
    m = rep["machine"]
    return (f"{m['cores']} cores {m['cpu_model']}, {m['date']}; load before "
            f"{rep['load_before'][0]:.2f}, after {rep['load_after'][0]:.2f}: {rep['load_note']}")


def gateway_md(rep: dict) -> list[str]:
    cfg = rep["config"]
    out = ["## Gateway overhead (bench/gateway_overhead.py)", "",
           f"{_machine_line(rep)}. Upstream: {cfg['tokens']} tokens {cfg['pace_ms']:g} ms apart; medians of "
           f"{cfg['repeats']} runs; versions: " + ", ".join(f"{k} {v}" for k, v in rep["versions"].items()), "",
           "| mode | conc | arm | req/s | p50 ms | p99 ms | added p50 | added p99 | TTFT added p50 | CPU s/1k req "
           "| peak RSS MiB | others busy |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rep["cells"]:
        out.append(f"| {'stream' if r['stream'] else 'json'} | {r['concurrency']} | {r['arm']} | "
                   f"{r['requests_per_s']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
                   f"{fmt(r.get('added_p50_ms'), '+.2f')} | {fmt(r.get('added_p99_ms'), '+.2f')} | "
                   f"{fmt(r.get('added_ttft_p50_ms'), '+.2f')} | {fmt(r.get('cpu_s_per_1k'))} | "
                   f"{fmt(r.get('peak_rss_mib'), '.0f')} | {fmt(r.get('others_busy_pct'), '.0f')}% |")
    if rep.get("idle_cpu_pct"):
        out += ["", "Idle (no traffic, before the cells): " + ", ".join(
            f"{k} {v:.1f}% of a core" for k, v in rep["idle_cpu_pct"].items())]
    sweeps = rep.get("rate_sweeps") or {}
    if sweeps:
        out += ["", "Open loop (streaming), max requests/s:", "",
                "| arm | low-rate p99 ms | before p99 doubles | at p99 <= 2x direct's |", "|---|---|---|---|"]
        for name, s in sweeps.items():
            out.append(f"| {name} | {fmt(s['base_p99_ms'])} | {fmt(s['max_rps_before_p99_doubles'], '.0f')} | "
                       f"{fmt(s['max_rps_at_equal_p99'], '.0f')} |")
    h = rep.get("headline") or {}
    if h.get("ratios_switchyard_over_litellm"):
        out += ["", "Switchyard / LiteLLM (as many workers):", "",
                "| workers | mode | conc | added p50 | added p99 | req/s | CPU/1k | RSS |", "|---|---|---|---|---|---|---|---|"]
        for r in h["ratios_switchyard_over_litellm"]:
            out.append(f"| {r.get('workers', 1)} | {'stream' if r['stream'] else 'json'} | {r['concurrency']} | {fmt(r['added_p50'])}x | "
                       f"{fmt(r['added_p99'])}x | {fmt(r['requests_per_s'])}x | {fmt(r['cpu_s_per_1k'])}x | "
                       f"{fmt(r['peak_rss'])}x |")
    for name, t in (h.get("targets") or {}).items():
        out.append(f"- target `{name}`: {fmt(t['value'])} — {'met' if t['met'] else '**missed**'}")
    return out + [""]


def fidelity_md(rep: dict) -> list[str]:
    cfg = rep["config"]
    out = ["## Stream timing fidelity (bench/stream_fidelity.py)", "",
           f"{_machine_line(rep)}. {cfg['tokens']} tokens {cfg['pace_ms']:g} ms apart; medians of {cfg['repeats']} runs.",
           "", "| conc | arm | gaps | clumped (<1 ms) | vs direct | abs(gap-pace) p50 ms | p99 ms | max gap ms |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rep["rows"]:
        out.append(f"| {r['concurrency']} | {r['arm']} | {r['gaps']} | {r['clumped_pct']:.2f}% | "
                   f"{fmt(r.get('clumped_points_vs_direct'), '+.2f')} pts | {r['dev_p50_ms']:.3f} | "
                   f"{r['dev_p99_ms']:.3f} | {r['gap_max_ms']:.2f} |")
    for name, t in (rep.get("targets") or {}).items():
        out.append(f"- target `{name}`: {fmt(t['value'], '+.2f')} points — {'met' if t['met'] else '**missed**'}")
    return out + [""]


def engines_md(rep: dict) -> list[str]:
    cfg = rep["config"]
    out = ["## Engines (bench/engines_compare.py)", "",
           f"{_machine_line(rep)}. {cfg['prompt_tokens']} prompt + {cfg['output_tokens']} output tokens per stream, "
           f"greedy, ignore_eos; {cfg['threads']} threads each; medians of {cfg['repeats']} runs; versions: "
           + ", ".join(f"{k} {v}" for k, v in rep["versions"].items()), ""]
    if rep.get("skipped"):
        out += [f"- skipped {k}: {v[:300]}" for k, v in rep["skipped"].items()] + [""]
    out += ["| engine | streams | output tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | others busy |",
            "|---|---|---|---|---|---|---|---|"]
    for r in rep["rows"]:
        out.append(f"| {r['engine']} | {r['streams']} | {r['tokens_per_s']:.1f} | {r['ttft_p50_ms']:.1f} | "
                   f"{r['ttft_p99_ms']:.1f} | {r['itl_p50_ms']:.2f} | {r['itl_p99_ms']:.2f} | "
                   f"{fmt(r.get('others_busy_pct'), '.0f')}% |")
    if rep.get("ratios"):
        out += ["", "builtin / peer (output tokens/s):", ""]
        for e in rep["ratios"]:
            out.append(f"- {e.get('engine', 'builtin')}, {e['streams']} streams: "
                       + ", ".join(f"{k} {fmt(v)}x" for k, v in e.items()
                                   if k not in ("engine", "streams") and v is not None))
    if rep.get("prefix_cache"):
        out += ["", "| engine | prefix tokens | first ms | second ms | gain |", "|---|---|---|---|---|"]
        for name, p in rep["prefix_cache"].items():
            out.append(f"| {name} | {p['prefix_tokens']} | {p['first_ms']:.1f} | {p['second_ms']:.1f} | "
                       f"{fmt(p['gain'])}x |")
    for name, t in (rep.get("targets") or {}).items():
        out.append(f"- target `{name}`: {fmt(t['value'])} — {'met' if t['met'] else '**missed**'}")
    return out + [""]


def memory_md(rep: dict) -> list[str]:
    out = ["## Memory (bench/memory.py)", "", f"{_machine_line(rep)}.", "",
           "| gateway | streams | idle RSS MiB | peak RSS MiB | per stream KiB | errors |", "|---|---|---|---|---|---|"]
    for r in rep["gateway_rss"]:
        out.append(f"| {r['arm']} | {r['streams']} | {r['idle_rss_mib']:.1f} | {r['peak_rss_mib']:.1f} | "
                   f"{r['per_stream_kib']:.1f} | {r['errors']} |")
    out += ["", "| builtin KV dtype | allocated B/token | theory 2·L·Hkv·D·size | ratio |", "|---|---|---|---|"]
    for k in rep["kv_cache"]:
        out.append(f"| {k['dtype']} | {k['bytes_per_token']:.0f} | 2·{k['layers']}·{k['kv_heads']}·{k['head_dim']}·"
                   f"{k['dtype_bytes']} = {k['theoretical_bytes_per_token']} | {k['ratio_to_theory']:.3f} |")
    return out + [""]


def plots(results: Path, reps: dict[str, dict], suffix: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    colors = {"direct": "tab:gray", "switchyard": "tab:blue", "litellm": "tab:red"}
    g = reps.get("gateway_overhead")
    if g:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for ax, stream in zip(axes, (False, True)):
            for arm in ("switchyard", "litellm"):
                rows = [r for r in g["cells"] if r["arm"] == arm and r["stream"] == stream and "added_p50_ms" in r]
                if not rows:
                    continue
                xs = [r["concurrency"] for r in rows]
                ax.plot(xs, [max(r["added_p50_ms"], 1e-3) for r in rows], "o-", color=colors[arm], label=f"{arm} p50")
                ax.plot(xs, [max(r["added_p99_ms"], 1e-3) for r in rows], "s--", color=colors[arm], label=f"{arm} p99")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("concurrent requests")
            ax.set_ylabel("added latency vs direct (ms)")
            ax.set_title("streaming" if stream else "non-streaming")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        written.append(results / f"gateway_added_latency{suffix}.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
        if g.get("rate_sweeps"):
            fig, ax = plt.subplots(figsize=(6, 4))
            for arm, s in g["rate_sweeps"].items():
                steps = s["steps"]
                ax.plot([x["offered_rps"] for x in steps], [x["p99_ms"] for x in steps], "o-",
                        color=colors.get(arm), label=arm)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("offered requests/s (open loop, streaming)")
            ax.set_ylabel("p99 latency (ms)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
            fig.tight_layout()
            written.append(results / f"gateway_rate_sweep{suffix}.png")
            fig.savefig(written[-1], dpi=110)
            plt.close(fig)
    f = reps.get("stream_fidelity")
    if f:
        concs = sorted({r["concurrency"] for r in f["rows"]})
        fig, axes = plt.subplots(1, len(concs), figsize=(5.5 * len(concs), 4), squeeze=False)
        for ax, c in zip(axes[0], concs):
            for r in f["rows"]:
                if r["concurrency"] != c or not r.get("gaps_ms"):
                    continue
                gaps = sorted(r["gaps_ms"])
                ax.plot(gaps, [(i + 1) / len(gaps) for i in range(len(gaps))], color=colors.get(r["arm"]),
                        label=f"{r['arm']} ({r['clumped_pct']:.1f}% < 1 ms)")
            ax.axvline(f["config"]["pace_ms"], color="k", lw=0.5)
            ax.axvline(1.0, color="k", lw=0.5, ls=":")
            ax.set_xlim(0, 3 * f["config"]["pace_ms"])
            ax.set_xlabel("gap between content chunks at the client (ms; longer gaps off the right edge)")
            ax.set_ylabel("CDF")
            ax.set_title(f"{c} concurrent stream(s)")
            ax.legend(fontsize=8)
            ax.grid(True, alpha=0.3)
        fig.tight_layout()
        written.append(results / f"stream_fidelity{suffix}.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    e = reps.get("engines_compare")
    if e and e["rows"]:
        streams = sorted({r["streams"] for r in e["rows"]})
        engines = list(dict.fromkeys(r["engine"] for r in e["rows"]))
        by = {(r["engine"], r["streams"]): r["tokens_per_s"] for r in e["rows"]}
        fig, ax = plt.subplots(figsize=(8, 4))
        width = 0.8 / len(engines)
        for i, eng in enumerate(engines):
            xs = [j + i * width for j, n in enumerate(streams) if (eng, n) in by or eng == "hf-serial"]
            ys = [by.get((eng, n), by.get((eng, 1), 0)) for n in streams if (eng, n) in by or eng == "hf-serial"]
            ax.bar(xs, ys, width, label=eng)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(streams))], [f"{n} streams" for n in streams])
        ax.set_ylabel("output tokens/s")
        ax.legend(fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
        fig.tight_layout()
        written.append(results / f"engines_throughput{suffix}.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    return written


def interference_md(rep: dict) -> list[str]:
    cfg = rep["config"]
    out = ["## Interference (bench/interference.py)", "", _machine_line(rep), "",
           f"Proxied route at {cfg['streams']} streams ({cfg['tokens']} tokens {cfg['pace_ms']} ms apart), engine idle "
           f"vs serving {cfg['engine_streams']} streams ({cfg['engine_threads']} thread(s)); added = through the gateway "
           "minus direct, medians.", "",
           "| engine | idle: added p50 / p99 ms | busy: added p50 / p99 ms | busy - idle p50 |", "|---|---|---|---|"]
    for r in rep["results"]:
        out.append(f"| {r['mode']} | {fmt(r['idle']['added_p50_ms'], '+.2f')} / {fmt(r['idle']['added_p99_ms'], '+.2f')} | "
                   f"{fmt(r['busy']['added_p50_ms'], '+.2f')} / {fmt(r['busy']['added_p99_ms'], '+.2f')} | "
                   f"{fmt(r['busy_minus_idle_added_p50_ms'], '+.2f')} |")
    for name, t in rep["targets"].items():
        out.append(f"- target `{name}`: {fmt(t['value'])} — {'met' if t['met'] else '**missed**'}")
    return out + [""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    names = ("gateway_overhead", "stream_fidelity", "engines_compare", "memory", "interference")
    reps = {n: r for n in names if (r := _load(args.results_dir, n, args.smoke)) is not None}
    if not reps:
        print(f"no results in {args.results_dir}", file=sys.stderr)
        return 1
    lines = ["# Switchyard benchmarks", ""]
    for name, fn in (("gateway_overhead", gateway_md), ("stream_fidelity", fidelity_md),
                     ("engines_compare", engines_md), ("memory", memory_md), ("interference", interference_md)):
        if name in reps:
            lines += fn(reps[name])
    suffix = ".smoke" if args.smoke else ""
    for png in plots(args.results_dir, reps, suffix):
        lines.append(f"![{png.stem}]({png.name})")
    out = args.results_dir / f"SUMMARY{suffix}.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Every benchmark in one run, side by side, then the markdown summary and plots: what `make
bench` runs. Installs LiteLLM's pinned proxy into its cache venv first (not in --smoke).

    .venv/bin/python bench/run_all.py                 # ~30 min on 2 cores
    .venv/bin/python bench/run_all.py --smoke         # ~1 min, writes *.smoke.json
    .venv/bin/python bench/run_all.py --only gateway_overhead stream_fidelity
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import RESULTS, ROOT, uptime_line  # noqa: E402

SCRIPTS = ("gateway_overhead", "stream_fidelity", "memory", "engines_compare", "key_limits_overhead")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--only", nargs="+", choices=SCRIPTS, default=list(SCRIPTS))
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    parser.add_argument("--no-litellm-install", action="store_true")
    args = parser.parse_args(argv)
    if not args.smoke and not args.no_litellm_install:
        subprocess.run([sys.executable, str(ROOT / "bench" / "litellm_env.py"), "install"], check=True)
    failed = []
    for name in args.only:
        cmd = [sys.executable, str(ROOT / "bench" / f"{name}.py"), "--results-dir", str(args.results_dir)]
        if args.smoke:
            cmd.append("--smoke")
        print(f"\n### {name}  [{uptime_line()}]", flush=True)
        started = time.monotonic()
        if subprocess.run(cmd, cwd=ROOT).returncode != 0:
            failed.append(name)
        print(f"### {name} took {time.monotonic() - started:.0f} s  [{uptime_line()}]", flush=True)
    summary = [sys.executable, str(ROOT / "bench" / "summarize.py"), "--results-dir", str(args.results_dir)]
    subprocess.run(summary + (["--smoke"] if args.smoke else []), cwd=ROOT, check=False)
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Each benchmark script in its `--smoke` mode (seconds), so the scripts cannot rot. Results go
to a temporary directory, never to bench/results/. Nothing heavy is installed: the LiteLLM arm
runs only when `python bench/litellm_env.py install` already put it in its cache, vLLM is left
out of the engines smoke (its start alone takes 40-90 s), llama.cpp runs only when installed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import litellm_env  # noqa: E402


def run_script(name: str, tmp_path: Path, *args: str, timeout: float = 300) -> dict:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / f"{name}.py"), "--smoke", "--results-dir",
                           str(tmp_path), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "machine:" in proc.stdout and "versions:" in proc.stdout, proc.stdout[:2000]
    return json.loads((tmp_path / f"{name}.smoke.json").read_text())


def test_gateway_overhead_smoke(tmp_path: Path) -> None:
    report = run_script("gateway_overhead", tmp_path)
    arms = {r["arm"] for r in report["cells"]}
    assert {"direct", "switchyard"} <= arms
    if litellm_env.installed():
        assert "litellm" in arms and report["headline"]["ratios_switchyard_over_litellm"]
    else:
        assert report["skipped_arms"] == ["litellm"]
    for row in report["cells"]:
        assert row["errors"] == 0 and row["requests"] > 0, row
        if row["arm"] != "direct":
            assert row["cpu_s_per_1k"] is not None and row["peak_rss_mib"] > 0
    assert report["rate_sweeps"]["switchyard"]["steps"]
    assert report["machine"]["cores"] and report["machine"]["cpu_model"]


def test_stream_fidelity_smoke(tmp_path: Path) -> None:
    report = run_script("stream_fidelity", tmp_path, "--arms", "direct", "switchyard")
    rows = {r["arm"]: r for r in report["rows"]}
    assert rows["direct"]["gaps"] == rows["switchyard"]["gaps"] == report["config"]["tokens"] - 1
    assert 0 <= rows["switchyard"]["clumped_pct"] <= 100
    assert "clumped_within_2_points_of_direct_c1" in report["targets"]


def test_memory_smoke(tmp_path: Path) -> None:
    report = run_script("memory", tmp_path, "--arms", "switchyard")
    (rss,) = report["gateway_rss"]
    assert rss["errors"] == 0 and rss["peak_rss_mib"] > 0
    for kv in report["kv_cache"]:  # nothing beyond K and V of every slot, plus one pad block for padded decode rows
        assert kv["pad_slots"] == kv["tensor_shape"][1]  # one block of block_size slots
        assert kv["allocated_bytes"] == kv["theoretical_bytes_per_token"] * (kv["token_slots"] + kv["pad_slots"])


def test_engines_compare_smoke(tmp_path: Path) -> None:
    report = run_script("engines_compare", tmp_path, timeout=600)
    engines = {r["engine"] for r in report["rows"]}
    assert {"builtin", "builtin-fast", "hf-serial", "hf-batched"} <= engines, report.get("skipped")
    fast = report["engines"]["builtin-fast"]
    assert fast["dtype"] == "bfloat16" and fast["start_cold_s"] > 0 and fast["start_warm_s"] > 0
    assert "vllm" in report["skipped"]  # smoke never starts vLLM unless asked
    for row in report["rows"]:
        assert row["tokens_per_s"] > 0 and not row["short_streams"], row
    assert report["prefix_cache"]["builtin"]["first_ms"] > 0
    assert report["ratios"] and report["ratios"][0]["hf-serial"] > 0

    # the summary and plots from what the smokes wrote
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "summarize.py"), "--smoke", "--results-dir",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = (tmp_path / "SUMMARY.smoke.md").read_text()
    assert "## Engines" in summary and (tmp_path / "engines_throughput.smoke.png").is_file()


def test_litellm_pin_is_not_a_compromised_release() -> None:
    assert litellm_env.LITELLM_VERSION not in litellm_env.BAD_VERSIONS
    assert litellm_env.LITELLM_VERSION.count(".") == 2  # pinned exactly


def test_interference_smoke(tmp_path: Path) -> None:
    report = run_script("interference", tmp_path)
    assert [r["mode"] for r in report["results"]] == ["in_process", "engine_process"]
    for result in report["results"]:
        for cell in (result["idle"], result["busy"]):
            assert cell["direct"]["errors"] == 0 and cell["switchyard"]["errors"] == 0, cell
            assert cell["switchyard"]["requests"] > 0
    assert "engine_process: busy - idle added p50 <= 1 ms" in report["targets"]


def test_fleet_routing_smoke(tmp_path: Path) -> None:
    from engines import install

    if not install.llamacpp_installed():
        pytest.skip("llama.cpp is not installed; run `python -m engines.install llamacpp`")
    report = run_script("fleet_routing", tmp_path, "--arms", "prefix_cache")
    (row,) = report["rows"]
    assert row["arm"] == "prefix_cache" and row["errors"] == 0 and row["requests"] > 0, row
    assert row["hit_ratio"] is not None and row["router_cpu_s_per_1k"] is not None
    assert sum(row["replica_share"].values()) == pytest.approx(1.0, abs=0.01) and "?" not in row["replica_share"]


def test_agent_sessions_smoke(tmp_path: Path) -> None:
    from engines import install

    if not install.llamacpp_installed():
        pytest.skip("llama.cpp is not installed; run `python -m engines.install llamacpp`")
    report = run_script("agent_sessions", tmp_path, "--arms", "switchyard")
    (row,) = report["rows"]
    assert row["arm"] == "switchyard" and row["errors"] == 0 and row["requests"] == 4, row
    assert row["sessions_on_one_replica"] == "2/2" and row["cached_ratio_later"] > 0.5, row
    assert row["gateway_cpu_s_per_1k"] is not None and row["ttft_later_p50_s"] is not None


def test_gpu_check_smoke(tmp_path: Path) -> None:
    """bench/gpu_check.py on the CPU: kernels in Triton's interpreter, the tiny model's bfloat16
    tokens against float32, throughput with the compiled decode step on and off."""
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--smoke", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["ok"] and report["kernels"]["ok"] and report["kernels"]["checks"] > 20
    assert report["kernels"]["decode_fraction_of_copy"] is not None
    assert len(report["first_divergence"]) == 8
    assert {(r["streams"], r["graphs"]) for r in report["throughput"]} == {(s, g) for s in (1, 2, 4) for g in (True, False)}
    assert all(r["tokens_per_s"] > 0 for r in report["throughput"])


def test_key_limits_overhead_smoke(tmp_path: Path) -> None:
    import shutil

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed; run `python -m engines.install redis`")
    report = run_script("key_limits_overhead", tmp_path)
    assert set(report["admission"]) == {"memory", "redis"}
    assert {r["arm"] for r in report["cells"]} == {"off", "memory", "redis"}
    for row in report["cells"]:
        assert row["errors"] == 0 and row["requests"] > 0, row


def test_ab_gateway_cpu_small(tmp_path: Path) -> None:
    """The A/B script on one tree against itself, a few requests: both trees serve every round."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "ab_gateway_cpu.py"), str(ROOT), str(ROOT),
                           "--concurrency", "4", "--requests", "8", "--rounds", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rounds = [line for line in proc.stdout.splitlines() if line.startswith("round ")]
    assert len(rounds) == 4 and all("s/1k, added p50" in line for line in rounds), proc.stdout
    assert proc.stdout.count("MEDIAN ") == 2 and "B below A in" in proc.stdout, proc.stdout


def test_cpu_by_load_small(tmp_path: Path) -> None:
    """The load table on a few requests: a row per concurrency, a figure for every arm and ratio
    (the nginx arms where nginx is installed)."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "cpu_by_load.py"), "--concurrency", "1", "2",
                           "--seconds", "0.2"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    header = next(line for line in proc.stdout.splitlines() if line.startswith("| streams |")).strip("| ").split(" | ")
    arms = [name for name in header[1:] if "÷" not in name]
    assert arms[0] == "upstream (direct)" and arms[-2:] == ["switchyard-1w", "switchyard-2w"], header
    assert arms[1:-2] in ([], ["nginx-1w", "nginx-2w"]), header
    assert ("SKIPPED nginx arms" in proc.stdout) == (len(arms) == 3), proc.stdout
    rows = [line.strip("| ").split(" | ") for line in proc.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [row[0] for row in rows] == ["1", "2"], proc.stdout
    for row in rows:  # (a few requests may take less CPU than one 10 ms tick: a figure of 0, its ratio "–")
        assert len(row) == len(header) and all(float(cell) >= 0 for cell in row[1:1 + len(arms)]), proc.stdout
        assert all(cell == "–" or float(cell) >= 0 for cell in row[1 + len(arms):]), proc.stdout


def test_flow_control_scripts_small() -> None:
    """The flood benchmark's plan (its trace, no server) and the fast path's timing on a few calls."""
    plan = subprocess.run([sys.executable, str(ROOT / "bench" / "flow_control.py"), "--plan", "--short"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert plan.returncode == 0 and "'A': " in plan.stdout and "'B': " in plan.stdout, plan.stdout + plan.stderr
    fast = subprocess.run([sys.executable, str(ROOT / "bench" / "flow_control_fast_path.py"), "--calls", "200", "--rounds", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert fast.returncode == 0, fast.stdout[-4000:] + fast.stderr[-4000:]
    assert "FlowQueue admit+release+turn" in fast.stdout and "CPU beyond a loop turn" in fast.stdout, fast.stdout


def test_flow_control_arms_configs_start_up_checks_pass() -> None:
    """Each Switchyard arm of the flood benchmark writes a configuration start-up accepts, with
    the knobs the arm names."""
    from types import SimpleNamespace

    from bench.flow_control import switchyard_config
    from gateway.config import parse_config

    replicas = [SimpleNamespace(base=f"http://127.0.0.1:{9000 + i}") for i in range(3)]
    for arm, headroom in (("flow", 1), ("flow_no_headroom", 0)):
        config = parse_config(switchyard_config(replicas, Path("/tmp"), flow=True, headroom=headroom), f"{arm}.toml")  # type: ignore[arg-type]
        table = config.backends[0].flow_control
        assert table is not None and config.server.flow_control.enabled
        assert (table.replica_concurrency, table.priority_headroom) == (1, headroom)
    plain = parse_config(switchyard_config(replicas, Path("/tmp"), flow=False), "plain.toml")  # type: ignore[arg-type]
    assert not plain.server.flow_control.enabled and plain.backends[0].flow_control is None

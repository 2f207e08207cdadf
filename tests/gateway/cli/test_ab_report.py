"""`switchyard ab-report` on a generated log with known differences between the arms."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from gateway.cli.ab_report import build_report, read_log
from gateway.cli.main import main

N = 1500
TTFT_SHIFT = 0.040  # arm b is 40 ms slower to first token: the true difference of medians
ERROR_RATES = {"a": 0.02, "b": 0.08}


def write_log(path: Path, seed: int = 7) -> None:
    rng = np.random.default_rng(seed)
    lines = []
    for arm in ("a", "b"):
        for i in range(N):
            failed = rng.random() < ERROR_RATES[arm]
            ttft = 0.1 + rng.exponential(0.05) + (TTFT_SHIFT if arm == "b" else 0.0)
            itl = 0.010 + rng.exponential(0.002)
            completion = int(rng.integers(20, 60)) + (10 if arm == "b" else 0)
            lines.append(
                {
                    "ts": time.time(), "request_id": f"{arm}{i}", "route": "chat", "arm": arm, "backend": arm, "model": "m",
                    "shadow": False, "kind": "chat", "stream": True,
                    "outcome": "error:UpstreamError" if failed else "ok", "error": "timeout" if failed else None,
                    "ttft": None if failed else ttft, "e2e": ttft + completion * itl,
                    "itl_p50": None if failed else itl, "itl_p95": None if failed else itl * 1.5, "n_itl": completion,
                    "prompt_tokens": 30, "completion_tokens": None if failed else completion, "cached_tokens": 10,
                    "attempts": [{"backend": arm, "outcome": "timeout" if failed else "ok"}],
                }
            )
    lines.append({**lines[0], "route": "other", "request_id": "o1"})
    lines.append({**lines[1], "route": "chat", "arm": "c", "shadow": True, "request_id": "s1"})
    lines.append({**lines[2], "route": "chat", "arm": "c", "shadow": True, "request_id": "s2"})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ab") / "requests.jsonl"
    write_log(path)
    return path


def test_report_numbers_and_cis_cover_the_true_differences(log: Path) -> None:
    (report,) = build_report(read_log(log), route="chat", baseline="a")
    arms = {a.label: a for a in report.arms}
    assert set(arms) == {"a", "b", "c (shadow)"} and arms["a"].n == N and arms["b"].n == N
    assert abs(arms["a"].error_rate - 0.02) < 0.015 and abs(arms["b"].error_rate - 0.08) < 0.025
    diffs = {d.metric: d for d in report.differences["b"]}
    ttft = diffs["ttft_p50_s"]
    assert ttft.low <= TTFT_SHIFT <= ttft.high and ttft.significant
    assert ttft.high - ttft.low < 0.02, "1500 requests per arm pin the median down to a few ms"
    err = diffs["error_rate"]
    assert err.low <= 0.06 <= err.high and err.significant
    tokens = diffs["completion_tokens_mean"]
    assert tokens.low <= 10 <= tokens.high
    itl = diffs["itl_p50_s"]
    assert itl.low <= 0.0 <= itl.high and not itl.significant, "no true ITL difference"
    # the same log and seed give the same interval
    runs = [build_report(read_log(log), route="chat", baseline="a", resamples=300)[0] for _ in range(2)]
    assert [(d.low, d.high) for d in runs[0].differences["b"]] == [(d.low, d.high) for d in runs[1].differences["b"]]


def test_cli_prints_the_table_and_writes_the_plot(log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "latency.png"
    assert main(["ab-report", "--log", str(log), "--plot", str(png), "--resamples", "300"]) == 0
    out = capsys.readouterr().out
    assert "route chat" in out and "route other" in out
    assert "b vs a" in out and "ttft_p50_s" in out and "95% CI" in out
    table = out.split("route chat", 1)[1]
    header = next(line for line in table.splitlines() if "requests" in line)
    assert "err%" in header and "ttft p50" in header and "itl p95" in header and "compl/req" in header
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert main(["ab-report", "--log", str(log), "--route", "nope"]) == 1
    assert main(["ab-report", "--log", str(tmp_path / "absent.jsonl")]) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json}\n")
    assert main(["ab-report", "--log", str(bad)]) == 2
    assert "bad.jsonl:1" in capsys.readouterr().err

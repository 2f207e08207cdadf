"""`switchyard ab-report`: per route and per arm, what the request log says — counts, error
rate, TTFT / ITL / end-to-end latency percentiles, tokens per request — and each arm's
difference from a baseline arm with a bootstrap 95% confidence interval.

The bootstrap resamples each arm's requests independently (with replacement, `resamples`
times, a fixed seed so the same log gives the same report), computes the statistic on each
resample and takes the 2.5th and 97.5th percentiles of the differences. Latencies are compared
by their medians (and TTFT also by its 95th percentile), error rates and token counts by their
means. Latency statistics use successful requests only; ITL is each request's median gap
between token events. Shadow copies are arms of their own, labelled "<arm> (shadow)".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import numpy as np

MAX_CHUNK_ELEMENTS = 4_000_000  # bootstrap index matrix per chunk: bounds memory on big logs
MIN_SAMPLES = 10  # fewer values in either arm: no interval for that metric


class Entry(msgspec.Struct, kw_only=True):
    """The fields of a request log line the report reads (others are ignored)."""

    route: str
    arm: str
    outcome: str
    shadow: bool = False
    ttft: float | None = None
    e2e: float | None = None
    itl_p50: float | None = None
    itl_p95: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None

    @property
    def label(self) -> str:
        return f"{self.arm} (shadow)" if self.shadow else self.arm


def read_log(path: str | Path) -> list[Entry]:
    decoder = msgspec.json.Decoder(Entry)
    entries = []
    with Path(path).open("rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                entries.append(decoder.decode(line))
            except msgspec.DecodeError as exc:
                raise ValueError(f"{path}:{number}: not a request log line: {exc}") from None
    return entries


@dataclass
class ArmData:
    label: str
    n: int = 0  # every request
    ok: int = 0
    errors: int = 0
    cancelled: int = 0
    ttft: np.ndarray = field(default_factory=lambda: np.empty(0))
    itl: np.ndarray = field(default_factory=lambda: np.empty(0))
    itl_p95: np.ndarray = field(default_factory=lambda: np.empty(0))
    e2e: np.ndarray = field(default_factory=lambda: np.empty(0))
    failed: np.ndarray = field(default_factory=lambda: np.empty(0))  # 1.0 per error, 0.0 per ok
    prompt_tokens: np.ndarray = field(default_factory=lambda: np.empty(0))
    completion_tokens: np.ndarray = field(default_factory=lambda: np.empty(0))
    cached_tokens: np.ndarray = field(default_factory=lambda: np.empty(0))

    @property
    def error_rate(self) -> float:
        return self.errors / (self.ok + self.errors) if self.ok + self.errors else float("nan")


@dataclass
class Difference:
    metric: str
    baseline: float
    value: float
    diff: float  # value - baseline
    low: float
    high: float

    @property
    def significant(self) -> bool:
        return not (self.low <= 0.0 <= self.high)


@dataclass
class RouteReport:
    route: str
    arms: list[ArmData]
    baseline: str
    differences: dict[str, list[Difference]]  # per non-baseline arm


def _values(entries: list[Entry], get: Callable[[Entry], float | int | None]) -> np.ndarray:
    return np.array([v for v in (get(e) for e in entries) if v is not None], dtype=float)


def arm_data(label: str, entries: list[Entry]) -> ArmData:
    ok = [e for e in entries if e.outcome == "ok"]
    errors = sum(1 for e in entries if e.outcome.startswith("error"))
    return ArmData(
        label=label,
        n=len(entries),
        ok=len(ok),
        errors=errors,
        cancelled=sum(1 for e in entries if e.outcome == "cancelled"),
        ttft=_values(ok, lambda e: e.ttft),
        itl=_values(ok, lambda e: e.itl_p50),
        itl_p95=_values(ok, lambda e: e.itl_p95),
        e2e=_values(ok, lambda e: e.e2e),
        failed=np.array([1.0 if e.outcome.startswith("error") else 0.0 for e in entries if e.outcome != "cancelled"]),
        prompt_tokens=_values(ok, lambda e: e.prompt_tokens),
        completion_tokens=_values(ok, lambda e: e.completion_tokens),
        cached_tokens=_values(ok, lambda e: e.cached_tokens),
    )


def _median(x: np.ndarray) -> np.ndarray:
    return np.median(x, axis=-1)


def _p95(x: np.ndarray) -> np.ndarray:
    return np.percentile(x, 95, axis=-1)


def _mean(x: np.ndarray) -> np.ndarray:
    return np.mean(x, axis=-1)


# (name, the arm's sample, the statistic compared)
COMPARED: list[tuple[str, Callable[[ArmData], np.ndarray], Callable[[np.ndarray], np.ndarray]]] = [
    ("error_rate", lambda a: a.failed, _mean),
    ("ttft_p50_s", lambda a: a.ttft, _median),
    ("ttft_p95_s", lambda a: a.ttft, _p95),
    ("itl_p50_s", lambda a: a.itl, _median),
    ("e2e_p50_s", lambda a: a.e2e, _median),
    ("completion_tokens_mean", lambda a: a.completion_tokens, _mean),
]


def bootstrap_difference(
    a: np.ndarray, b: np.ndarray, stat: Callable[[np.ndarray], np.ndarray], *, resamples: int, rng: np.random.Generator
) -> tuple[float, float, float]:
    """stat(b) - stat(a) and its percentile-bootstrap 95% interval."""
    diffs = np.empty(resamples)
    chunk = max(1, min(resamples, MAX_CHUNK_ELEMENTS // max(len(a), len(b))))
    for start in range(0, resamples, chunk):
        k = min(chunk, resamples - start)
        ra = a[rng.integers(0, len(a), size=(k, len(a)))]
        rb = b[rng.integers(0, len(b), size=(k, len(b)))]
        diffs[start : start + k] = stat(rb) - stat(ra)
    low, high = np.percentile(diffs, [2.5, 97.5])
    return float(stat(b) - stat(a)), float(low), float(high)


def build_report(
    entries: Iterable[Entry], *, route: str | None = None, baseline: str | None = None, resamples: int = 2000, seed: int = 0
) -> list[RouteReport]:
    by_route: dict[str, dict[str, list[Entry]]] = {}
    for e in entries:
        if route is None or e.route == route:
            by_route.setdefault(e.route, {}).setdefault(e.label, []).append(e)
    rng = np.random.default_rng(seed)
    reports = []
    for name in sorted(by_route):
        arms = [arm_data(label, es) for label, es in sorted(by_route[name].items())]
        primary = [a for a in arms if not a.label.endswith("(shadow)")] or arms
        base = next((a for a in arms if a.label == baseline), None) or min(primary, key=lambda a: (-a.n, a.label))
        differences: dict[str, list[Difference]] = {}
        for arm in arms:
            if arm is base:
                continue
            rows = []
            for metric, sample, stat in COMPARED:
                a, b = sample(base), sample(arm)
                if len(a) < MIN_SAMPLES or len(b) < MIN_SAMPLES:
                    continue
                diff, low, high = bootstrap_difference(a, b, stat, resamples=resamples, rng=rng)
                rows.append(Difference(metric, float(stat(a)), float(stat(b)), diff, low, high))
            differences[arm.label] = rows
        reports.append(RouteReport(route=name, arms=arms, baseline=base.label, differences=differences))
    return reports


def _q(x: np.ndarray, q: float, scale: float = 1000.0) -> str:
    return "-" if len(x) == 0 else f"{np.percentile(x, q) * scale:.1f}"


def _m(x: np.ndarray) -> str:
    return "-" if len(x) == 0 else f"{x.mean():.1f}"


def _fmt(metric: str, v: float) -> str:
    if metric.endswith("_s"):
        return f"{v * 1000:+.2f} ms"
    if metric == "error_rate":
        return f"{v * 100:+.2f} pt"
    return f"{v:+.2f}"


def _plain(metric: str, v: float) -> str:
    if metric.endswith("_s"):
        return f"{v * 1000:.2f} ms"
    if metric == "error_rate":
        return f"{v * 100:.2f}%"
    return f"{v:.2f}"


def format_report(reports: list[RouteReport]) -> str:
    out: list[str] = []
    for r in reports:
        out.append(f"route {r.route}  (baseline: {r.baseline})")
        header = ("arm", "requests", "ok", "errors", "err%", "ttft p50", "ttft p95", "itl p50", "itl p95", "e2e p50", "e2e p95",
                  "prompt/req", "compl/req", "cached/req")
        rows = [header]
        for a in r.arms:
            err = "-" if a.ok + a.errors == 0 else f"{a.error_rate * 100:.2f}"
            rows.append((a.label, str(a.n), str(a.ok), str(a.errors), err, _q(a.ttft, 50), _q(a.ttft, 95), _q(a.itl, 50),
                         _q(a.itl_p95, 95), _q(a.e2e, 50), _q(a.e2e, 95), _m(a.prompt_tokens), _m(a.completion_tokens),
                         _m(a.cached_tokens)))
        out += _table(rows)
        out.append("  (latencies in ms over successful requests; itl p95 is the 95th percentile of each request's own p95)")
        for label, diffs in r.differences.items():
            out.append(f"  {label} vs {r.baseline}: difference with bootstrap 95% CI")
            if not diffs:
                out.append(f"    (fewer than {MIN_SAMPLES} requests in an arm: no intervals)")
                continue
            rows = [("metric", r.baseline, label, "difference", "95% CI", "")]
            for d in diffs:
                rows.append((d.metric, _plain(d.metric, d.baseline), _plain(d.metric, d.value), _fmt(d.metric, d.diff),
                             f"[{_fmt(d.metric, d.low)}, {_fmt(d.metric, d.high)}]", "*" if d.significant else ""))
            out += ["  " + line for line in _table(rows)]
        out.append("  * the interval excludes 0")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))).rstrip()
            for row in rows]


def plot_report(reports: list[RouteReport], path: str | Path) -> None:
    """One row per route: the empirical CDFs of TTFT, ITL (per-request median) and end-to-end
    latency, one line per arm, on a log time axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("time to first token", "ttft"), ("inter-token latency (per-request median)", "itl"), ("end-to-end", "e2e"))
    fig, axes = plt.subplots(len(reports), 3, figsize=(15, 3.8 * len(reports)), squeeze=False)
    for row, report in zip(axes, reports):
        for ax, (title, attr) in zip(row, panels):
            for arm in report.arms:
                x = np.sort(getattr(arm, attr)) * 1000
                if len(x) == 0:
                    continue
                ax.step(x, np.arange(1, len(x) + 1) / len(x), where="post", label=f"{arm.label} (n={len(x)})")
            ax.set_xscale("log")
            ax.set_xlabel("ms")
            ax.set_ylabel("fraction of requests")
            ax.set_title(f"{report.route}: {title}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

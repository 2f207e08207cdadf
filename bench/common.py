"""What the bench scripts share: the machine description, a small raw-asyncio HTTP/1.1 client
that timestamps what arrives, percentiles, CPU/RSS of a server's process tree, starting and
stopping servers, and writing results.

Kept free of heavy imports (no torch): the gateway scripts load it in a few milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


# ------------------------------------------------------------------------------------ machine


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> tuple[float, float, float]:
    try:
        return os.getloadavg()
    except OSError:
        return (float("nan"),) * 3


def uptime_line() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: %.2f, %.2f, %.2f" % load_average()


def machine() -> dict:
    try:
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem_gib = float("nan")
    return {
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": round(mem_gib, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "uptime": uptime_line(),
    }


def dist_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def print_header(title: str, versions: dict[str, str | None]) -> dict:
    info = machine()
    print(f"== {title}", flush=True)
    print(f"machine: {info['cores']} cores, {info['cpu_model']}, {info['memory_gib']} GiB, Python {info['python']}")
    print("versions: " + ", ".join(f"{k} {v or 'not installed'}" for k, v in versions.items()))
    print(f"load: {info['uptime']}", flush=True)
    return info


def _cpu_ticks() -> tuple[int, int]:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields[:8]), idle


def cpu_busy(interval: float = 0.5) -> float:
    """Share of all cores busy over `interval` seconds (from /proc/stat), 0..1; nan if unknown.
    Taken while the bench itself is idle, it says how busy the others keep the machine."""
    try:
        t0, i0 = _cpu_ticks()
        time.sleep(interval)
        t1, i1 = _cpu_ticks()
    except (OSError, ValueError, IndexError):
        return float("nan")
    return 1.0 - (i1 - i0) / (t1 - t0) if t1 > t0 else float("nan")


def wait_quiet(max_wait: float, threshold: float = 0.25, interval: float = 1.0) -> float:
    """Wait up to `max_wait` s until the others use under `threshold` of the cores; returns the
    last busy share seen (so a row can say how busy the machine was when it started)."""
    deadline = time.monotonic() + max_wait
    busy = cpu_busy(min(interval, 0.5))
    while busy == busy and busy > threshold and time.monotonic() < deadline:
        busy = cpu_busy(interval)
    return busy


def load_note(before: tuple[float, float, float], after: tuple[float, float, float], cores: int | None = None) -> str:
    """A plain warning when other work on the machine made a figure unreliable. The bench's own
    processes add to the load too, so the threshold is generous: 1-minute load above the core
    count before a run means others were busy."""
    cores = cores or os.cpu_count() or 1
    if before[0] > cores * 0.75:
        return f"UNRELIABLE: 1-min load {before[0]:.2f} on {cores} cores before the run (others were busy)"
    if after[0] > cores * 2:
        return f"noisy: 1-min load reached {after[0]:.2f} on {cores} cores during the run"
    return "ok"


# ---------------------------------------------------------------------------------- statistics


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1); nan when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered) + 0.5)) - 1))]


def median(values: Sequence[float]) -> float:
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


def median_of_rows(rows: list[dict]) -> dict:
    """Key-by-key median of repeated runs' rows (numbers); other values from the first row."""
    out = dict(rows[0])
    for key, value in rows[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
            if all(v == value for v in values):
                continue  # a parameter (streams, concurrency), not a measurement: keep it as it is
            out[key] = median(values)
    out["repeats"] = len(rows)
    return out


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0 or a != a or b != b:
        return None
    return a / b


# -------------------------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    name: str
    proc: subprocess.Popen
    port: int
    log_path: Path
    _log: object = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # workers left in its own group
        if self._log is not None:
            self._log.close()  # type: ignore[attr-defined]
            self._log = None


def spawn(name: str, argv: list[str], *, port: int, log_dir: Path, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> Server:
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}-{port}.log"
    log = log_path.open("wb")
    log.write(("$ " + " ".join(argv) + "\n").encode())
    log.flush()
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=env if env is not None else os.environ.copy(), cwd=cwd or ROOT,
                            start_new_session=True)
    return Server(name=name, proc=proc, port=port, log_path=log_path, _log=log)


def wait_ready(server: Server, path: str = "/health", timeout: float = 120.0, headers: dict[str, str] | None = None) -> float:
    """Poll GET `path` until 200; returns seconds waited. Stops the server and raises on failure."""
    start = time.monotonic()
    while True:
        if server.proc.poll() is not None:
            raise RuntimeError(f"{server.name} exited with {server.proc.returncode}:\n{server.log_tail()}")
        try:
            req = urllib.request.Request(server.base + path, headers=headers or {})
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            with opener.open(req, timeout=2) as resp:
                if resp.status == 200:
                    return time.monotonic() - start
        except (urllib.error.URLError, OSError, ValueError):
            pass
        if time.monotonic() - start > timeout:
            server.stop()
            raise RuntimeError(f"{server.name} not ready after {timeout:.0f} s:\n{server.log_tail()}")
        time.sleep(0.1)


def process_tree(pid: int):  # noqa: ANN201 - psutil objects
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its live children (psutil)."""
    import psutil

    total = 0.0
    for p in process_tree(pid):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def tree_rss(pid: int) -> int:
    import psutil

    total = 0
    for p in process_tree(pid):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            total += p.memory_info().rss
    return total


def vm_hwm(pid: int) -> int | None:
    """The kernel's peak RSS (VmHWM) of one process, in bytes."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class ResourceMeter:
    """CPU seconds and peak RSS (sampled every `interval` s, process tree) of a server PID over a
    `with` block. `pid=None` measures nothing."""

    def __init__(self, pid: int | None, interval: float = 0.05) -> None:
        self.pid, self.interval = pid, interval
        self.cpu_s = float("nan")
        self.peak_rss = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> ResourceMeter:
        if self.pid is not None:
            self._cpu0 = tree_cpu_seconds(self.pid)
            self.peak_rss = tree_rss(self.pid)
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak_rss = max(self.peak_rss, tree_rss(self.pid))  # type: ignore[arg-type]

    def __exit__(self, *exc: object) -> None:
        if self.pid is not None:
            self._stop.set()
            assert self._thread is not None
            self._thread.join()
            self.peak_rss = max(self.peak_rss, tree_rss(self.pid))
            self.cpu_s = tree_cpu_seconds(self.pid) - self._cpu0


# ------------------------------------------------------------------------------ HTTP client

_CONTENT = re.compile(rb'"(?:content|text)"\s*:\s*"[^"]')


class ClientError(Exception):
    pass


@dataclass
class Timing:
    total_s: float
    ttft_s: float  # first body piece holding non-empty content (== total_s for plain JSON)
    status: int = 200


class Connection:
    """One keep-alive HTTP/1.1 connection on raw asyncio streams (TCP_NODELAY) that POSTs JSON.

    `post()` is the cheap path for load: it finds the first content and then only looks for the
    end of the body. `post_events()` records the arrival time of every SSE event (events that
    arrive in one read share its timestamp), for the timing-fidelity bench."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str,
                 headers: dict[str, str]) -> None:
        self.reader, self.writer = reader, writer
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._head = f"host: {host}\r\ncontent-type: application/json\r\n{extra}".encode()

    @classmethod
    async def open(cls, port: int, host: str = "127.0.0.1", headers: dict[str, str] | None = None) -> Connection:
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(reader, writer, f"{host}:{port}", headers or {})

    def _send(self, path: str, data: bytes) -> None:
        self.writer.write(b"POST %s HTTP/1.1\r\n%scontent-length: %d\r\n\r\n%s"
                          % (path.encode(), self._head, len(data), data))

    async def _head_of_response(self) -> tuple[int, bytes]:
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        return status, head.lower()

    async def post(self, path: str, data: bytes) -> Timing:
        start = time.perf_counter()
        self._send(path, data)
        status, head = await self._head_of_response()
        if b"transfer-encoding: chunked" in head:
            ttft = None
            buf = b""
            while True:
                piece = await self.reader.read(1 << 16)
                if not piece:
                    raise ClientError("connection closed mid-body")
                if ttft is None:
                    buf += piece
                    if _CONTENT.search(buf):
                        ttft = time.perf_counter() - start
                        buf = buf[-8:]
                else:
                    buf = buf[-8:] + piece
                if buf.endswith(b"\r\n0\r\n\r\n") or buf == b"0\r\n\r\n":
                    break
            total = time.perf_counter() - start
            return Timing(total, ttft if ttft is not None else total, status)
        length = int(head.split(b"content-length:")[1].split(b"\r\n")[0])
        body = await self.reader.readexactly(length)
        total = time.perf_counter() - start
        if status != 200:
            raise ClientError(f"HTTP {status}: {body[:300]!r}")
        return Timing(total, total, status)

    async def post_events(self, path: str, data: bytes) -> tuple[float, list[tuple[float, bytes]]]:
        """(start time, [(arrival perf_counter, SSE data payload)]) for a streamed response."""
        start = time.perf_counter()
        self._send(path, data)
        status, head = await self._head_of_response()
        if status != 200 or b"transfer-encoding: chunked" not in head:
            raise ClientError(f"expected a chunked 200, got {head[:200]!r}")
        events: list[tuple[float, bytes]] = []
        raw = b""   # chunked wire bytes not yet decoded
        body = b""  # decoded body bytes not yet split into SSE events
        done = False
        while not done:
            piece = await self.reader.read(1 << 16)
            now = time.perf_counter()
            if not piece:
                raise ClientError("connection closed mid-body")
            raw += piece
            while True:  # decode complete chunks
                eol = raw.find(b"\r\n")
                if eol < 0:
                    break
                size = int(raw[:eol].split(b";")[0], 16)
                if len(raw) < eol + 2 + size + 2:
                    break
                body += raw[eol + 2: eol + 2 + size]
                raw = raw[eol + 2 + size + 2:]
                if size == 0:
                    done = True
                    break
            body = body.replace(b"\r\n", b"\n")
            while (end := body.find(b"\n\n")) >= 0:
                event, body = body[:end], body[end + 2:]
                for line in event.split(b"\n"):
                    if line.startswith(b"data:"):
                        events.append((now, line[5:].strip()))
        return start, events

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


def chat_body(model: str, *, stream: bool, max_tokens: int, prompt: str = "hello", extra: dict | None = None) -> bytes:
    payload: dict = {"model": model, "messages": [{"role": "user", "content": prompt}], "stream": stream,
                     "max_tokens": max_tokens}
    if stream:
        payload["stream_options"] = {"include_usage": True}
    payload.update(extra or {})
    return json.dumps(payload).encode()


def use_uvloop() -> str:
    """Run the client on uvloop when it is installed (it is, with uvicorn[standard]): the
    client shares the cores with the servers, so its own cost must stay small."""
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        return "uvloop " + uvloop.__version__
    except ImportError:
        return "asyncio"


# ---------------------------------------------------------------------------------- results


def write_result(name: str, report: dict, *, results_dir: Path, smoke: bool) -> Path:
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / (f"{name}.smoke.json" if smoke else f"{name}.json")
    path.write_text(json.dumps(report, indent=2, default=str))
    print(f"wrote {path}", flush=True)
    return path


@contextlib.contextmanager
def stopping(*servers: Server | None) -> Iterator[None]:
    try:
        yield
    finally:
        for s in servers:
            if s is not None:
                s.stop()


def fmt(value: float | None, spec: str = ".2f", none: str = "-") -> str:
    if value is None or value != value:
        return none
    return format(value, spec)

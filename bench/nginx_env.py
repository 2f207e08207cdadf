"""nginx as the gateway benchmarks' floor: a reverse proxy in C that relays the upstream's
stream without parsing it (`proxy_buffering off`, HTTP/1.1 keep-alive to the upstream), one
master and N worker processes each with its own listening socket (`reuseport`).

What it costs per request is what any gateway on this machine pays at least for the same
sockets: the reads, the writes and the wake-ups. Debian's `nginx-light`, installed by
`python -m engines.install nginx`; the package's own service is not used.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from engines.install import debian_binary


def binary() -> Path | None:
    return debian_binary("nginx")


def installed() -> bool:
    return binary() is not None


def version() -> str | None:
    found = binary()
    if found is None:
        return None
    try:  # "nginx version: nginx/1.22.1" on stderr
        out = subprocess.run([str(found), "-v"], capture_output=True, text=True, timeout=10).stderr
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().rpartition("/")[2] or None


def write_config(directory: Path, *, port: int, upstream_port: int, workers: int = 1) -> Path:
    """nginx.conf in `directory` (its prefix: pid file and temp paths live there too)."""
    directory.mkdir(parents=True, exist_ok=True)
    temp = " ".join(f"{kind}_temp_path {directory / kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi",
                                                                          "scgi"))
    config = directory / "nginx.conf"
    config.write_text(f"""daemon off;
master_process on;
worker_processes {workers};
pid {directory / "nginx.pid"};
error_log stderr warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    {temp}
    keepalive_requests 1000000;
    upstream bench_upstream {{
        server 127.0.0.1:{upstream_port};
        keepalive 1024;
        keepalive_requests 1000000;
    }}
    server {{
        listen 127.0.0.1:{port} reuseport;
        location / {{
            proxy_pass http://bench_upstream;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 300s;
        }}
    }}
}}
""")
    return config


def server_argv(config: Path) -> list[str]:
    found = binary()
    if found is None:
        raise RuntimeError("nginx is not installed: python -m engines.install nginx")
    return [str(found), "-p", str(config.parent), "-c", str(config)]

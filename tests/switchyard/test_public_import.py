"""`switchyard.plugin` is Switchyard's, whatever other `plugins` package comes first on sys.path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.server import ROOT

PROBE = """
import sys
import switchyard.plugin as api
from switchyard.plugin import PLUGIN_API_VERSION, BackendType, TextDelta, hookimpl, ContextLengthExceeded
import plugins
assert plugins.__file__ == {own!r}, plugins.__file__
from plugins.manager import backend_types, build_plugin_manager
assert "builtin" in backend_types(build_plugin_manager())
assert PLUGIN_API_VERSION[0] == 1 and TextDelta.__module__ == "plugins.contract.protocol"
import switchyard.testing
assert "concurrency" in switchyard.testing.CHECKS
print("ok", sys.path.index({decoy!r}) < sys.path.index({root!r}))
"""


def test_public_import_wins_over_a_decoy_plugins_package(tmp_path: Path) -> None:
    for name in ("plugins", "gateway"):  # both generic names the kit relies on
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError('the decoy {name} package was imported')\n")
    code = PROBE.format(own=str(ROOT / "plugins" / "__init__.py"), decoy=str(tmp_path), root=str(ROOT))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok True"


def test_a_decoy_imported_first_is_named_not_silently_replaced(tmp_path: Path) -> None:
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "__init__.py").write_text("")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    done = subprocess.run([sys.executable, "-c", "import plugins, switchyard.plugin"], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 1
    assert "the top-level name 'plugins' is already taken by" in done.stderr
    assert str(tmp_path / "plugins" / "__init__.py") in done.stderr


def test_everything_a_plugin_needs_is_exported() -> None:
    import switchyard.plugin as api
    from plugins.contract import config_types as registry
    from plugins.contract import errors, protocol

    for module in (errors, protocol):
        public = {n for n, v in vars(module).items() if isinstance(v, type) and v.__module__ == module.__name__}
        assert public <= set(api.__all__), public - set(api.__all__)
    assert {"BackendType", "Route", "Target", "hookimpl", "PLUGIN_API_VERSION"} <= set(api.__all__)
    assert all(hasattr(api, name) for name in api.__all__)
    assert registry.BackendType is api.BackendType


def test_the_old_name_of_sampling_still_imports() -> None:
    from switchyard.plugin import Sampling, SamplingParams

    assert SamplingParams is Sampling  # deprecated alias for plugins written against API 1.0's name

"""Plugins: a third-party backend installed as a package is discovered through the entry-point
group `switchyard` and serves; the hooks and the configuration keys are documented."""

from __future__ import annotations

import base64
import hashlib
import inspect
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import msgspec
import openai
import pytest

from gateway import config as config_module
from plugins.contract import hookspecs
from plugins.manager import ENTRY_POINT_GROUP
from tests.gateway.conftest import Server
from tests.gateway.helpers import user
from tests.support.server import ROOT, running_server

PLUGIN_MODULE = '''
"""A third-party Switchyard backend: answers every request with a fixed text."""

import msgspec

from plugins import hookimpl
from plugins.contract.protocol import Capabilities, Finish, ModelInfo, TextDelta, TokenizeResult, Usage
from plugins.contract.config_types import BackendType


class FixedOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    answer: str = "fixed"
    model: str = "fixed-1"


class FixedBackend:
    def __init__(self, name, options):
        self.name = name
        self.options = options

    def capabilities(self):
        return Capabilities()

    async def start(self):
        pass

    async def models(self):
        return [ModelInfo(id=self.options.model, owned_by="thirdparty")]

    async def health(self):
        return True

    async def close(self):
        pass

    async def tokenize(self, request):
        return TokenizeResult(tokens=[1, 2])

    async def detokenize(self, upstream_model, tokens):
        return "?"

    async def generate(self, spec):
        words = self.options.answer.split(" ")
        for index in range(spec.sampling.n):
            for i, word in enumerate(words):
                yield TextDelta(text=word if i == 0 else " " + word, index=index)
            yield Finish(reason="stop", index=index)
        yield Usage(prompt_tokens=7, completion_tokens=len(words) * spec.sampling.n)


@hookimpl
def switchyard_backend_types():
    return [BackendType(name="fixed", options=FixedOptions, create=FixedBackend, description="third-party test")]
'''

DIST = "switchyard_fixed_plugin"
VERSION = "0.1.0"


def _record_line(root: Path, rel: str) -> str:
    data = (root / rel).read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{rel},sha256={digest},{len(data)}"


def install_plugin_package(site: Path) -> None:
    """Lay out what `pip install` writes into site-packages for a wheel of this plugin: the
    package and its `.dist-info` (METADATA, WHEEL, entry_points.txt, INSTALLER, RECORD)."""
    pkg = site / "fixedplugin"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "plugin.py").write_text(PLUGIN_MODULE)
    info = site / f"{DIST}-{VERSION}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST}\nVersion: {VERSION}\nRequires-Dist: switchyard\n")
    (info / "WHEEL").write_text("Wheel-Version: 1.0\nGenerator: hand (switchyard tests)\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nfixed = fixedplugin.plugin\n")
    (info / "INSTALLER").write_text("pip\n")
    files = ["fixedplugin/__init__.py", "fixedplugin/plugin.py", *(f"{info.name}/{n}" for n in ("METADATA", "WHEEL", "entry_points.txt", "INSTALLER"))]
    record = [_record_line(site, f) for f in files] + [f"{info.name}/RECORD,,"]
    (info / "RECORD").write_text("\n".join(record) + "\n")


def plugin_config(disable: list[str]) -> str:
    # Note: no `modules = [...]`: the only way the server can find the plugin is its entry point.
    quoted = ", ".join(f'"{d}"' for d in disable)
    return textwrap.dedent(
        f"""\
        [plugins]
        disable = [{quoted}]

        [[backends]]
        name = "thirdparty"
        type = "fixed"
        [backends.options]
        answer = "hello from a plugin"
        """
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("site-packages")
    install_plugin_package(site)
    return site


def _env(site: Path) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}


@pytest.fixture(scope="module")
def plugin_server(site: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(plugin_config(["builtin"]), tmp_path_factory.mktemp("gateway-plugin"), env=_env(site)) as base:
        yield Server(base=base)


def test_entry_point_plugin_serves(plugin_server: Server) -> None:
    with openai.OpenAI(base_url=plugin_server.v1, api_key="x", max_retries=0) as client:
        assert [m.id for m in client.models.list()] == ["fixed-1"]
        raw = client.chat.completions.with_raw_response.create(model="fixed-1", messages=user("anything"))
        assert raw.headers["x-switchyard-backend"] == "thirdparty"
        resp = raw.parse()
        assert resp.choices[0].message.content == "hello from a plugin"
        assert resp.usage.total_tokens == 7 + 4
        with client.chat.completions.create(model="fixed-1", messages=user("x"), stream=True, n=2) as stream:
            chunks = list(stream)
        for index in (0, 1):
            assert "".join(ch.delta.content or "" for c in chunks for ch in c.choices if ch.index == index) == "hello from a plugin"
        # the plugin declares no extension, so the gateway refuses one on its behalf
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="fixed-1", messages=user("x"), extra_body={"top_k": 2})
        assert "thirdparty" in info.value.message


def _check_config(path: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "check-config", str(path)],
        cwd=ROOT,
        env={**os.environ, **_env(site)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_entry_point_plugin_options_are_validated_and_it_can_be_disabled(site: Path, tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text(plugin_config(["builtin"]))
    assert _check_config(good, site).returncode == 0
    typo = tmp_path / "typo.toml"
    typo.write_text(plugin_config(["builtin"]).replace("answer =", "anwser ="))
    proc = _check_config(typo, site)
    assert proc.returncode != 0 and "backends[0].options.anwser" in proc.stderr
    # disabled by its entry-point name, the plugin's backend type is gone
    off = tmp_path / "off.toml"
    off.write_text(plugin_config(["builtin", "fixed"]))
    proc = _check_config(off, site)
    assert proc.returncode != 0
    assert "unknown backend type 'fixed'" in proc.stderr
    # and without the package on the path it is not found either: discovery is the entry point
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "check-config", str(good)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and "'fixed'" in proc.stderr


# -- documentation --------------------------------------------------------------------------------

README = ROOT / "README.md"
PLUGINS_TOML = ROOT / "plugins.toml"


def _hookspecs() -> list[tuple[str, object]]:
    specs = [(name, fn) for name, fn in inspect.getmembers(hookspecs, inspect.isfunction) if hasattr(fn, "switchyard_spec")]
    assert len(specs) >= 5, specs
    return specs


def test_every_hookspec_has_a_docstring() -> None:
    for name, fn in _hookspecs():
        doc = inspect.getdoc(fn) or ""
        assert len(doc) >= 40, f"hook {name} is not documented at its declaration"


def test_every_hookspec_is_documented_in_readme() -> None:
    assert README.exists(), "README.md is missing"
    text = README.read_text()
    for name, _ in _hookspecs():
        assert re.search(rf"\b{name}\b", text), f"README.md does not mention hook {name}"


def _config_keys() -> set[str]:
    structs = [
        obj
        for _, obj in inspect.getmembers(config_module, inspect.isclass)
        if issubclass(obj, msgspec.Struct) and obj.__module__ == config_module.__name__ and obj.__name__ != "_Config"
    ]
    assert {s.__name__ for s in structs} >= {"Config", "ServerConfig", "PluginsConfig", "BackendConfig", "RouteConfig", "TargetConfig"}
    keys = {f.encode_name for s in structs for f in msgspec.structs.fields(s)}
    return keys - {"source"}  # Config.source records the file; it is not a TOML key


def test_every_config_key_is_documented() -> None:
    assert README.exists(), "README.md is missing"
    readme = README.read_text()
    comments = "\n".join(line for line in PLUGINS_TOML.read_text().splitlines() if line.lstrip().startswith("#")) if PLUGINS_TOML.exists() else ""
    missing = sorted(k for k in _config_keys() if not re.search(rf"\b{k}\b", readme) and not re.search(rf"\b{k}\b", comments))
    assert not missing, f"config keys documented neither in README.md nor in plugins.toml comments: {missing}"

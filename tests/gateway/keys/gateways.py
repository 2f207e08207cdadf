"""Gateway configurations for the per-key limit tests: echo backends, and one key per test so
the tests of one server do not share counts."""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from tests.support.server import _toml

SLOW_TOKEN_S = 0.05


@dataclass(frozen=True)
class Key:
    name: str
    limits: dict[str, object]

    @property
    def secret(self) -> str:
        return f"sk-{self.name}-0123456789"

    @property
    def auth(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.secret}"}


BURST = Key("burst", {"rpm": 10})
TOKENS = Key("tokens", {"tpm": 60, "budget_tokens": 100_000})
STREAM = Key("stream", {"budget_tokens": 100_000, "max_parallel": 5})
PARALLEL = Key("parallel", {"max_parallel": 2})
BUDGET = Key("budget", {"budget_tokens": 60, "budget_period": "month"})
PLAIN = Key("plain", {})
RESPONSES = Key("responses", {"rpm": 1, "budget_tokens": 100_000})  # the Responses API, served through the same path
ALL_KEYS = (BURST, TOKENS, STREAM, PARALLEL, BUDGET, PLAIN, RESPONSES)


def limits_config(*, keys: tuple[Key, ...] = ALL_KEYS, **server: object) -> str:
    text = "[server]\nhealth_interval_s = 0\n"
    text += "".join(f"{k} = {_toml(v)}\n" for k, v in server.items())
    for key in keys:
        text += f'\n[[server.keys]]\nname = "{key.name}"\nkey = "{key.secret}"\n'
        text += "".join(f"{k} = {_toml(v)}\n" for k, v in key.limits.items())
    text += """
[plugins]
disable = ["builtin"]
modules = ["tests.support.echo_backend"]

[[backends]]
name = "echo"
type = "echo"
[backends.options]
models = ["echo-1"]

[[backends]]
name = "slow"
type = "echo"
[backends.options]
models = ["slow-1"]
max_model_len = 4096
"""
    return text + f"token_delay_s = {SLOW_TOKEN_S}\n"


def chat(model: str = "echo-1", content: str = "one two three", **extra: object) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": content}], **extra}


def usage_of(base: str, name: str) -> dict:
    """One key's entry in the gateway's usage report."""
    body = httpx.get(base + "/switchyard/keys/usage", headers=PLAIN.auth, timeout=10).json()
    return next(entry for entry in body["keys"] if entry["name"] == name)

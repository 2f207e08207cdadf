"""`switchyard new-plugin NAME`: writes a minimal installable backend plugin package — a
pyproject registering the `switchyard` entry point, a backend class with typed options (a toy
engine that answers with the user's words, to be replaced by calls to a real one) and a test that
runs the conformance battery. As generated it passes `switchyard plugin-check`."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from string import Template

from plugins.contract.errors import ConfigError

NAME = re.compile(r"^[a-z][a-z0-9_]*$")

PYPROJECT = '''\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "$dist"
version = "0.1.0"
description = "A Switchyard backend plugin: backend type `$type`."
requires-python = ">=3.11"
dependencies = ["switchyard", "msgspec"]

[project.optional-dependencies]
test = ["pytest"]

# how Switchyard finds the plugin: `switchyard serve` loads every module of this group
[project.entry-points.switchyard]
$type = "$pkg.plugin"

[tool.setuptools]
packages = ["$pkg"]
'''

PLUGIN = '''\
"""Backend type `$type` for Switchyard.

    [[backends]]
    name = "$type"
    type = "$type"
    [backends.options]
    model = "$type-1"

The engine here is a toy — it answers with the words of the last message, one word per token —
so that the package runs and passes `switchyard plugin-check` as generated. Replace `_answer`
and `_encode` with calls to your engine; keep what `generate` promises around them: the events in
order, max_tokens, stop strings, usage counted as `tokenize` counts, and the `finally` that frees
the request when the client leaves.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from switchyard.plugin import (
    PLUGIN_API_VERSION,
    BackendType,
    Capabilities,
    ContextLengthExceeded,
    Event,
    Finish,
    InvalidRequest,
    ModelInfo,
    ModelNotFound,
    Rendered,
    RequestSpec,
    TextDelta,
    TokenizeRequest,
    TokenizeResult,
    Usage,
    hookimpl,
)

if PLUGIN_API_VERSION[0] != 1:
    raise ImportError(f"$pkg needs Switchyard's plugin API 1.x, not {PLUGIN_API_VERSION}")


class ${Class}Options(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """`[backends.options]`: an unknown key or a bad value stops Switchyard's start-up naming it."""

    model: str = "$type-1"
    max_model_len: int = 2048
    token_delay_s: float = 0.002  # the toy engine's time per token


class ${Class}Backend:
    def __init__(self, name: str, options: ${Class}Options) -> None:
        self.name = name
        self.options = options
        self._running: set[str] = set()  # request ids being generated

    def capabilities(self) -> Capabilities:
        return Capabilities(max_model_len=self.options.max_model_len)

    async def start(self) -> None:
        pass  # load weights, open connection pools

    async def close(self) -> None:
        pass  # free them again; called once at shutdown, harmless twice

    async def health(self) -> bool:
        return True

    def in_flight(self) -> int:
        return len(self._running)

    async def models(self) -> list[ModelInfo]:
        return [ModelInfo(id=self.options.model, max_model_len=self.options.max_model_len, owned_by=self.name)]

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResult:
        self._check_model(request.upstream_model)
        return TokenizeResult(tokens=self._encode(_prompt_text(request)), max_model_len=self.options.max_model_len)

    async def detokenize(self, upstream_model: str, tokens: list[int]) -> str:
        raise InvalidRequest(f"Backend `{self.name}` does not detokenize.", param="tokens")

    async def render(self, upstream_model: str, messages: list[dict[str, Any]], **_: Any) -> Rendered:
        self._check_model(upstream_model)
        text = _prompt_text(TokenizeRequest(upstream_model=upstream_model, messages=messages))
        return Rendered(text=text, tokens=self._encode(text))

    async def generate(self, spec: RequestSpec) -> AsyncIterator[Event]:
        self._check_model(spec.upstream_model)
        prompt = self._encode(_prompt_text(spec))
        sampling = spec.sampling
        room = self.options.max_model_len - len(prompt)
        if room < 1 or (sampling.max_tokens or 0) > room:
            raise ContextLengthExceeded(
                f"The prompt ({len(prompt)} tokens) and max_tokens ({sampling.max_tokens}) do not fit "
                f"max_model_len={self.options.max_model_len}.",
                param="messages" if spec.kind == "chat" else "prompt",
            )
        limit = sampling.max_tokens or room
        self._running.add(spec.request_id)
        try:
            completion_tokens = 0
            for index in range(sampling.n):
                text, sent, reason = "", 0, "stop"
                for position, word in enumerate(self._answer(spec)):
                    if position == limit:
                        reason = "length"
                        break
                    await asyncio.sleep(self.options.token_delay_s)  # the engine decodes one token
                    completion_tokens += 1
                    text += word if position == 0 else " " + word
                    stop_at = _first_stop(text, sampling.stop)
                    if stop_at is not None:
                        text = text[:stop_at]
                        break
                    safe = len(text) - _held_back(text, sampling.stop)
                    if safe > sent:
                        yield TextDelta(text=text[sent:safe], index=index)
                        sent = safe
                if len(text) > sent:
                    yield TextDelta(text=text[sent:], index=index)
                yield Finish(reason=reason, index=index)
            yield Usage(prompt_tokens=len(prompt), completion_tokens=completion_tokens)
        finally:
            self._running.discard(spec.request_id)  # also when the client left mid-stream

    # -- the toy engine: replace with yours ----------------------------------------------------

    def _answer(self, spec: RequestSpec) -> list[str]:
        if spec.messages is not None:
            return _content(spec.messages[-1]).split()
        return _prompt_text(spec).split()

    def _encode(self, text: str) -> list[int]:
        return [len(word) for word in text.split()]  # one token per word

    def _check_model(self, model: str) -> None:
        if model != self.options.model:
            raise ModelNotFound(model)


def _content(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    return content if isinstance(content, str) else " ".join(part.get("text", "") for part in content)


def _prompt_text(request: RequestSpec | TokenizeRequest) -> str:
    """The prompt as the engine sees it: a chat rendered one "role: content" line per message."""
    if request.messages is not None:
        return "\\n".join(f"{m['role']}: {_content(m)}" for m in request.messages)
    if isinstance(request.prompt, str):
        return request.prompt
    raise InvalidRequest("This backend takes text prompts, not token ids.", param="prompt")


def _first_stop(text: str, stops: tuple[str, ...]) -> int | None:
    found = [at for at in (text.find(stop) for stop in stops) if at >= 0]
    return min(found) if found else None


def _held_back(text: str, stops: tuple[str, ...]) -> int:
    """Characters at the end of `text` that may be the start of a stop string (not sent yet)."""
    return max((k for stop in stops for k in range(1, len(stop)) if text.endswith(stop[:k])), default=0)


@hookimpl
def switchyard_backend_types() -> list[BackendType]:
    return [BackendType(name="$type", options=${Class}Options, create=${Class}Backend,
                        description="$type: a toy engine (replace it)")]
'''

CONFTEST = '''\
pytest_plugins = ["switchyard.testing"]  # the conformance battery's fixtures
'''

TEST = '''\
"""Switchyard's conformance battery against this backend, loaded through its entry point (install
the package first: `pip install -e .`). One test per check; a failure prints the verdict, its
fix and the events the check saw."""

import pytest

from switchyard.testing import Subject


@pytest.fixture(scope="module")
def switchyard_subject() -> Subject:
    return Subject.of_type("$type", {"model": "$type-1"})


def test_conformance(switchyard_battery, switchyard_check):
    switchyard_battery.assert_passes(switchyard_check)
'''

README = '''\
# $dist

A [Switchyard](https://example.invalid/switchyard) backend plugin: backend type `$type`.

    pip install -e .                     # registers the entry point `switchyard` -> $pkg.plugin
    pytest                               # the conformance battery, one test per check
    switchyard plugin-check plugins.toml --backend $type

with a plugins.toml holding

    [[backends]]
    name = "$type"
    type = "$type"
'''


def write_package(name: str, where: Path) -> Path:
    """The package for backend type `name` in `where/switchyard-<name>`; its directory."""
    if not NAME.match(name):
        raise ConfigError(f"plugin name {name!r}: use lower-case letters, digits and '_', starting with a letter")
    values = {"type": name, "pkg": f"switchyard_{name}", "dist": f"switchyard-{name.replace('_', '-')}",
              "Class": "".join(part.capitalize() for part in name.split("_"))}
    root = where / values["dist"]
    if root.exists():
        raise ConfigError(f"{root} exists already; choose another name or directory")
    files = {
        "pyproject.toml": PYPROJECT,
        "README.md": README,
        f"{values['pkg']}/__init__.py": '"""Backend type `$type` for Switchyard (see plugin.py)."""\n',
        f"{values['pkg']}/plugin.py": PLUGIN,
        "conftest.py": CONFTEST,
        "tests/test_conformance.py": TEST,
    }
    for relative, template in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(Template(template).substitute(values), encoding="utf-8")
    return root


def new_plugin(args: argparse.Namespace) -> int:
    root = write_package(args.name, Path(args.dir))
    print(f"{root}: backend type `{args.name}`")
    print(f"next: pip install -e {root} && pytest {root} && switchyard plugin-check CONFIG --backend {args.name}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("new-plugin", help="write a minimal installable backend plugin package")
    parser.add_argument("name", help="the backend type (lower case, digits, '_'): package switchyard_<name>")
    parser.add_argument("--dir", default=".", help="where to create switchyard-<name>/ (default: here)")
    parser.set_defaults(func=new_plugin)

"""The coding-agent CLIs Claude Code and Codex, from npm (about 30 s, 0.8 GB), each pinned by
version and by the registry's integrity hash of its tarball, checked against npm's lock file.

Their root is their own: `$SWITCHYARD_AGENTS_CACHE`, else `$SWITCHYARD_CACHE/agents`, else
`~/.cache/switchyard/agents`, one npm prefix per version:

    claude-code-2.1.332/node_modules/.bin/claude   + switchyard-engine.json
    codex-0.171.0/node_modules/.bin/codex          + switchyard-engine.json

`$SWITCHYARD_CLAUDE` / `$SWITCHYARD_CODEX` name other executables instead.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from engines.install.common import MARKER, EngineInstallError, cache_root, lock, run, say, write_marker


@dataclass(frozen=True)
class AgentCLI:
    """A coding-agent CLI from the npm registry, pinned by version and by the registry's
    integrity hash of its tarball (`npm view <package>@<version> dist.integrity`)."""

    key: str  # the cache folder's name, before `-<version>`
    package: str
    version: str
    integrity: str
    bin: str  # the command it installs under node_modules/.bin
    env_override: str  # an executable given here is used instead of the cache's


# Both ship their program as a native binary in an optional per-platform package (Claude Code:
# `@anthropic-ai/claude-code-linux-x64`, copied over bin/claude.exe by its postinstall script;
# Codex: `@openai/codex-linux-x64` = `@openai/codex@<version>-linux-x64`, which bin/codex.js
# execs). Claude Code's package says node >= 22; npm warns on node 20 and the binary runs.
CLAUDE_CODE = AgentCLI(
    key="claude-code", package="@anthropic-ai/claude-code", version="2.1.332",
    integrity="sha512-tvSh6bLvEbd97APD31AnojOrRC3AmcRj5R8sF8QIQitu3x2ucOb1kKmTkGDw41kjva+CGJfpkt+wYouk6yv56Q==",
    bin="claude", env_override="SWITCHYARD_CLAUDE",
)
CODEX = AgentCLI(
    key="codex", package="@openai/codex", version="0.171.0",
    integrity="sha512-1IOFzL2Xg86tLdw6kDo3GoKbkQENgQi7TI6rlEvN132R7ngSw7SNOIQoTcnKzSZZ8kf9N9GynCweSoaFbqk2Eg==",
    bin="codex", env_override="SWITCHYARD_CODEX",
)
AGENT_CLIS = (CLAUDE_CODE, CODEX)


def agents_root() -> Path:
    env = os.environ.get("SWITCHYARD_AGENTS_CACHE")
    return Path(env).expanduser() if env else cache_root() / "agents"


def agent_dir(cli: AgentCLI) -> Path:
    return agents_root() / f"{cli.key}-{cli.version}"


def agent_path(cli: AgentCLI) -> Path:
    """Where the CLI's command is once installed (`cli.env_override` overrides)."""
    env = os.environ.get(cli.env_override)
    return Path(env) if env else agent_dir(cli) / "node_modules" / ".bin" / cli.bin


def agent_installed(cli: AgentCLI) -> bool:
    if os.environ.get(cli.env_override):
        return agent_path(cli).is_file()
    return (agent_dir(cli) / MARKER).is_file() and agent_path(cli).is_file()


def install_agent(cli: AgentCLI) -> Path:
    """`npm install` one pinned agent CLI into its own prefix once; return its command."""
    if agent_installed(cli):
        return agent_path(cli)
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            raise EngineInstallError(f"installing {cli.package} needs `{tool}` on PATH (Node.js 20 or newer)")
    root = agents_root()
    with lock(f"agent-{cli.key}", root):
        if agent_installed(cli):
            return agent_path(cli)
        started = time.monotonic()
        staging = root / f".stage-{cli.key}-{cli.version}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        log = staging / "install.log"
        say(f"installing {cli.package}@{cli.version} from the npm registry; log: {log}")
        run(["npm", "install", "--prefix", str(staging), "--save-exact", "--no-audit", "--no-fund",
             "--no-update-notifier", f"{cli.package}@{cli.version}"], what=f"npm install {cli.package}", log=log)
        locked = _npm_locked_packages(staging)
        main = locked.get(f"node_modules/{cli.package}", {})
        if main.get("version") != cli.version or main.get("integrity") != cli.integrity:
            raise EngineInstallError(f"{cli.package}: npm installed version {main.get('version')} integrity "
                                     f"{main.get('integrity')}, pinned {cli.version} {cli.integrity}")
        command = staging / "node_modules" / ".bin" / cli.bin
        if not _agent_answers_version(command, cli) and cli is CLAUDE_CODE:
            # its postinstall copies the native binary over the bin/claude.exe placeholder; npm
            # versions that hold back install scripts leave the placeholder, so run it here
            run(["node", "install.cjs"], what="placing Claude Code's native binary",
                cwd=staging / "node_modules" / cli.package, log=log)
        if not _agent_answers_version(command, cli):
            raise EngineInstallError(f"{command} --version does not print {cli.version}; log {log}")
        native = {name.removeprefix("node_modules/"): entry.get("version") for name, entry in locked.items()
                  if name.startswith(f"node_modules/{cli.package}-") and (staging / name).is_dir()}
        write_marker(staging, {"agent": cli.key, "package": cli.package, "version": cli.version,
                               "integrity": cli.integrity, "native_packages": native,
                               "node": _tool_version("node"), "npm": _tool_version("npm"),
                               "install_seconds": round(time.monotonic() - started)})
        target = agent_dir(cli)
        if target.exists():
            shutil.rmtree(target)
        os.rename(staging, target)
        say(f"{cli.bin} {cli.version} ready in {time.monotonic() - started:.0f} s: {agent_path(cli)}")
        return agent_path(cli)


def install_agents() -> list[Path]:
    return [install_agent(cli) for cli in AGENT_CLIS]


def _npm_locked_packages(prefix: Path) -> dict[str, dict[str, object]]:
    try:
        return json.loads((prefix / "package-lock.json").read_text(encoding="utf-8"))["packages"]
    except (OSError, ValueError, KeyError) as exc:
        raise EngineInstallError(f"npm wrote no readable {prefix / 'package-lock.json'}: {exc}") from None


def _agent_answers_version(command: Path, cli: AgentCLI) -> bool:
    try:
        out = subprocess.run([str(command), "--version"], capture_output=True, text=True, timeout=120, check=False,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and cli.version in out.stdout


def _tool_version(tool: str) -> str:
    out = subprocess.run([tool, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.strip()

"""Run the real coding-agent CLIs (Claude Code, Codex) non-interactively against a base URL on
loopback, with nothing else reached: the commands, environments and config files that do it.

Installed by `python -m engines.install agents` (part of `all`, so of `make test`). Each run gets
a fresh `home` folder that stands in for `$HOME`, so neither CLI reads or writes the user's own
settings, sessions or credentials; a second turn of a session reuses the same `home`.

    claude = agents.claude_command("Say hi", base_url=url, home=tmp)      # -> argv, env
    subprocess.run(claude.argv, env=claude.env, cwd=tmp, ...)

Facts behind the settings (Claude Code 2.1.332, Codex 0.171.0), checked with `strace -f -e
trace=connect` while each CLI ran against a loopback server: scripts/record_agent_requests.py
and tests/recordings/agents/README.md.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from engines import install

API_KEY = "sk-switchyard-agents"  # a gateway without keys ignores it; the CLIs refuse to start without one
CODEX_PROVIDER = "switchyard"
CODEX_KEY_ENV = "SWITCHYARD_API_KEY"

# Claude Code: `CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC` alone stops every connection but the
# API calls (without it: a `HEAD /api/hello` probe of the base URL and DNS lookups of
# api.anthropic.com); the three it implies are spelled out too. The key goes as `x-api-key`.
CLAUDE_OFFLINE_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
}

# Codex: a provider of our own (the built-in `openai` one takes no base URL from the config)
# speaking the Responses API, its key from an environment variable. `[features] plugins = false`
# stops the curated-plugin sync (git ls-remote github.com, api.github.com, chatgpt.com) that
# every start runs otherwise; it leaves the request unchanged. Codex ignores unknown keys
# silently, so only keys seen to matter are here. Retries off: a failure shows at once.
CODEX_CONFIG = """\
{model_line}{top}model_provider = "{provider}"
approval_policy = "never"
sandbox_mode = "read-only"

[model_providers.{provider}]
name = "Switchyard"
base_url = "{base_url}"
wire_api = "responses"
env_key = "{key_env}"
request_max_retries = 0
stream_max_retries = 0

[features]
plugins = false
{features}"""

# Codex has no flag that turns its tools off; these settings leave only request_user_input,
# view_image (and apply_patch for models it knows): no shell, goals, sub-agents, tool search
# or web search (each seen to drop its tool from the request).
CODEX_FEWEST_TOOLS = {"top": 'web_search = "disabled"',
                      "features": {"shell_tool": False, "goals": False, "multi_agent": False, "tool_search": False}}


@dataclass(frozen=True)
class AgentCommand:
    argv: list[str]
    env: dict[str, str]


def claude_path() -> Path:
    return install.agent_path(install.CLAUDE_CODE)


def codex_path() -> Path:
    return install.agent_path(install.CODEX)


def installed() -> dict[str, bool]:
    return {cli.key: install.agent_installed(cli) for cli in install.AGENT_CLIS}


def version(cli: install.AgentCLI) -> str:
    """What the installed command says it is (`2.1.332`, `0.171.0`)."""
    out = subprocess.run([str(install.agent_path(cli)), "--version"], capture_output=True, text=True, timeout=120,
                         check=True, stdin=subprocess.DEVNULL)
    return next(word for word in out.stdout.split() if word[:1].isdigit())


def _base_env(home: Path, extra: Mapping[str, str] | None) -> dict[str, str]:
    env = {
        "HOME": str(home),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "TMPDIR": str(home / "tmp"),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
    }
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    return {**env, **(extra or {})}


def claude_command(prompt: str, *, base_url: str, home: Path, model: str | None = None,
                   tools: Sequence[str] | None = None, system_prompt: str | None = None,
                   resume: bool = False, max_turns: int | None = None, api_key: str = API_KEY,
                   extra_args: Sequence[str] = (), extra_env: Mapping[str, str] | None = None) -> AgentCommand:
    """`claude -p <prompt> --output-format stream-json --verbose` against `base_url` (no `/v1`).

    `tools=[]` turns every built-in tool off (`--tools ""`); None keeps Claude Code's defaults.
    `system_prompt` replaces the default one. `resume` continues the last session of this
    `home` and working directory (`--continue`)."""
    argv = [str(claude_path()), "-p", "--output-format", "stream-json", "--verbose"]
    if model is not None:
        argv += ["--model", model]
    if tools is not None:
        argv += ["--tools", ",".join(tools)]
    if system_prompt is not None:
        argv += ["--system-prompt", system_prompt]
    if resume:
        argv.append("--continue")
    if max_turns is not None:
        argv += ["--max-turns", str(max_turns)]
    # `--`: `--tools` takes several values and would swallow a prompt after it
    argv += [*extra_args, "--", prompt]
    env = _base_env(home, {
        **CLAUDE_OFFLINE_ENV,
        "CLAUDE_CONFIG_DIR": str(home / ".claude"),
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": api_key,
        **(extra_env or {}),
    })
    return AgentCommand(argv=argv, env=env)


def write_codex_home(home: Path, *, base_url: str, model: str | None, top: str = "",
                     features: Mapping[str, bool] | None = None) -> Path:
    """`$CODEX_HOME` (inside `home`) with a config.toml naming `base_url` (with `/v1`); `model`
    None leaves Codex's own default. `top` is TOML for the top level, `features` more flags."""
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    text = CODEX_CONFIG.format(
        model_line=f'model = "{model}"\n' if model else "", top=f"{top}\n" if top else "", provider=CODEX_PROVIDER,
        base_url=base_url, key_env=CODEX_KEY_ENV,
        features="".join(f"{name} = {str(on).lower()}\n" for name, on in (features or {}).items()))
    (codex_home / "config.toml").write_text(text, encoding="utf-8")
    return codex_home


def codex_command(prompt: str, *, base_url: str, home: Path, model: str | None, resume: bool = False,
                  fewest_tools: bool = False, api_key: str = API_KEY, extra_args: Sequence[str] = (),
                  extra_env: Mapping[str, str] | None = None) -> AgentCommand:
    """`codex exec --json <prompt>` against `base_url` (with `/v1`: Codex appends `/responses`).

    `resume` continues the last session (`codex exec resume --last`); `fewest_tools` writes
    CODEX_FEWEST_TOOLS into the config."""
    codex_home = write_codex_home(home, base_url=base_url, model=model, **(CODEX_FEWEST_TOOLS if fewest_tools else {}))
    argv = [str(codex_path()), "exec"]
    if resume:
        argv += ["resume", "--last"]
    argv += ["--json", "--skip-git-repo-check", *extra_args, prompt]
    env = _base_env(home, {"CODEX_HOME": str(codex_home), CODEX_KEY_ENV: api_key, **(extra_env or {})})
    return AgentCommand(argv=argv, env=env)

"""The requests the real coding-agent CLIs sent (tests/recordings/agents/, written by
`scripts/record_agent_requests.py`; its README says how and what they carry), loaded for tests.

    for request in agent_recordings.load(cli="claude"):
        request.body["thinking"], request.header("anthropic-beta"), request.query["beta"]
"""

from __future__ import annotations

import json
import re
import urllib.parse
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

RECORDINGS = Path(__file__).resolve().parents[1] / "recordings" / "agents"
FILE_NAME = re.compile(r"^(?P<cli>claude|codex)-(?P<version>\d+\.\d+\.\d+)-(?P<scenario>[a-z]+)-(?P<n>\d+)\.json$")
CLIS = ("claude", "codex")
SCENARIOS = ("bare", "default", "model", "tool", "resume")
API_PATH = {"claude": "/v1/messages", "codex": "/v1/responses"}


@dataclass(frozen=True)
class AgentRequest:
    file: Path
    cli: str  # "claude" | "codex"
    cli_version: str
    scenario: str
    turn: int  # the CLI run within the scenario, from 1 (`resume` has two)
    n: int  # the request within the scenario, from 1
    method: str
    target: str  # the path with its query, as sent
    headers: tuple[tuple[str, str], ...]  # as sent, in order; secrets are "<dropped>"
    body: Any  # the JSON body, or None
    reply: str  # what the capture server answered

    @property
    def id(self) -> str:
        return self.file.stem

    @property
    def path(self) -> str:
        return urllib.parse.urlsplit(self.target).path

    @property
    def query(self) -> dict[str, list[str]]:
        return urllib.parse.parse_qs(urllib.parse.urlsplit(self.target).query, keep_blank_values=True)

    def header(self, name: str) -> str | None:
        """The first header of that name, any case."""
        return next((value for key, value in self.headers if key.lower() == name.lower()), None)

    def body_bytes(self) -> bytes:
        """The body as JSON bytes to send again (not byte-identical to what the CLI sent)."""
        return json.dumps(self.body, ensure_ascii=False).encode()


def _read(file: Path) -> AgentRequest:
    data = json.loads(file.read_text(encoding="utf-8"))
    return AgentRequest(
        file=file, cli=data["cli"], cli_version=data["cli_version"], scenario=data["scenario"], turn=data["turn"],
        n=data["n"], method=data["method"], target=data["path"],
        headers=tuple((key, value) for key, value in data["headers"]), body=data["body"], reply=data["reply"],
    )


@cache
def load_all() -> tuple[AgentRequest, ...]:
    """Every recording, ordered by CLI, scenario and request number."""
    files = [f for f in RECORDINGS.glob("*.json")]
    requests = [_read(f) for f in files]
    return tuple(sorted(requests, key=lambda r: (r.cli, r.cli_version, r.scenario, r.n)))


def load(cli: str | None = None, scenario: str | None = None) -> list[AgentRequest]:
    return [r for r in load_all() if (cli is None or r.cli == cli) and (scenario is None or r.scenario == scenario)]


def api_requests(cli: str | None = None) -> list[AgentRequest]:
    """The model calls (`POST /v1/messages`, `POST /v1/responses`), not probes."""
    return [r for r in load(cli) if r.method == "POST" and r.path == API_PATH[r.cli]]

"""The conformance battery: checks any backend plugin against the contract the gateway relies
on (`plugins.contract.protocol`), with a plain-language verdict per check.

It stands where the gateway stands, in front of a backend, and builds its requests with the
gateway's own validation, which its runner is handed (`plugins.testing.specs`): nothing under
`plugins/` imports `gateway`. Three ways in, each with the gateway's builder:
- `switchyard plugin-check [CONFIG] --backend NAME` — the backend named in a plugins.toml;
- `pytest -p switchyard.testing --switchyard-backend=TYPE --switchyard-options='{...}'` — one test per check;
- the `switchyard_battery` / `switchyard_check` fixtures in an author's own tests (override
  `switchyard_subject` to name the backend).

A check is one small function in `plugins/testing/checks/`, registered with
`plugins.testing.registry.check`.
"""

from plugins.testing.registry import CHECKS, Check, Skipped, Verdict, check
from plugins.testing.report import format_summary, format_verdict
from plugins.testing.runner import Battery, run_battery
from plugins.testing.subject import Subject
from plugins.testing.trace import Failed

__all__ = [
    "CHECKS", "Battery", "Check", "Failed", "Skipped", "Subject", "Verdict", "check", "format_summary",
    "format_verdict", "run_battery",
]

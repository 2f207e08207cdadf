"""The conformance battery for plugin authors (`plugins.testing`, its requests built by the
gateway's own decoding and validation), under Switchyard's own name:

    from switchyard.testing import Subject, run_battery

and, in a conftest.py, `pytest_plugins = ["switchyard.testing"]` for the `switchyard_battery` /
`switchyard_check` fixtures and the `--switchyard-backend` options (or `pytest -p switchyard.testing`).
"""

from __future__ import annotations

import switchyard

switchyard.bind("gateway")  # the battery builds requests with the gateway's own validation

from gateway.chat_api.translate import spec_of_body  # noqa: E402
from plugins import testing as _kit  # noqa: E402
from plugins.testing import (  # noqa: E402
    CHECKS,
    Check,
    Failed,
    Skipped,
    Subject,
    Verdict,
    check,
    format_summary,
    format_verdict,
)


class Battery(_kit.Battery):
    """`plugins.testing.Battery` with the gateway's own requests."""

    def __init__(self, subject: Subject, **limits: float) -> None:
        super().__init__(subject, build_spec=spec_of_body, **limits)


async def run_battery(subject: Subject, names: list[str] | None = None, **limits: float) -> list[Verdict]:
    """Every check (or those named) against a fresh backend, in order; its verdicts."""
    return await Battery(subject, **limits).run_all(names)


pytest_plugins = ["switchyard.pytest_plugin"]

__all__ = [
    "CHECKS", "Battery", "Check", "Failed", "Skipped", "Subject", "Verdict", "check", "format_summary",
    "format_verdict", "run_battery",
]

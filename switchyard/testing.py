"""The conformance battery for plugin authors (`plugins.testing` under Switchyard's own name):

    from switchyard.testing import Subject, run_battery

and, in a conftest.py, `pytest_plugins = ["switchyard.testing"]` for the `switchyard_battery` /
`switchyard_check` fixtures and the `--switchyard-backend` options.
"""

import switchyard

switchyard.bind("gateway")  # the battery builds requests with the gateway's own validation

from plugins.testing import (  # noqa: E402
    CHECKS,
    Battery,
    Check,
    Failed,
    Skipped,
    Subject,
    Verdict,
    check,
    format_summary,
    format_verdict,
    run_battery,
)

pytest_plugins = ["plugins.testing.pytest_plugin"]

__all__ = [
    "CHECKS", "Battery", "Check", "Failed", "Skipped", "Subject", "Verdict", "check", "format_summary",
    "format_verdict", "run_battery",
]

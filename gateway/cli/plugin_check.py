"""`switchyard plugin-check [CONFIG] --backend NAME`: the conformance battery against a backend
of a plugins.toml, its plugin loaded as `switchyard serve` loads it (built-ins, entry points,
`[plugins] modules`, less `[plugins] disable`), its options validated the same way."""

from __future__ import annotations

import argparse
import asyncio

from gateway.chat_api.translate import spec_of_body
from plugins.contract.errors import ConfigError
from plugins.testing import Subject, format_summary, format_verdict
from plugins.testing.registry import CHECKS, Check, ordered
from plugins.testing.runner import Battery


def subject_from_config(path: str, backend: str, *, model: str | None = None) -> Subject:
    from gateway.config import load_config, resolve_backend_options
    from plugins.manager import backend_types, build_plugin_manager

    config = load_config(path)
    pm = build_plugin_manager(config.plugins.disable, config.plugins.modules)
    for table, btype, options in resolve_backend_options(config, backend_types(pm)):
        if table.name == backend:
            return Subject(label=f"backend `{backend}` (type `{table.type}`) from {config.source}",
                           create=lambda: btype.create(table.name, options), model=model)
    names = ", ".join(b.name for b in config.backends) or "none"
    raise ConfigError(f"{config.source}: no [[backends]] table is named {backend!r} (backends: {names})")


async def _run(battery: Battery, checks: list[Check]) -> int:
    """Print each verdict as it comes; 1 when any check failed."""
    verdicts = []
    try:
        for check in checks:
            verdict = await battery.run(check.name)
            verdicts.append(verdict)
            print(format_verdict(verdict), flush=True)
    finally:
        await battery.shutdown()
    print(format_summary(verdicts))
    return 0 if all(v.passed for v in verdicts) else 1


def plugin_check(args: argparse.Namespace) -> int:
    checks = ordered(args.check or None)
    subject = subject_from_config(args.config, args.backend, model=args.model)
    print(f"plugin-check: {subject.label}", flush=True)
    return asyncio.run(_run(Battery(subject, build_spec=spec_of_body, request_timeout_s=args.request_timeout), checks))


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("plugin-check", help="run the conformance battery against a backend of a plugins.toml")
    parser.add_argument("config", nargs="?", default="plugins.toml", help="path to plugins.toml (default: plugins.toml)")
    parser.add_argument("--backend", required=True, help="the [[backends]] name to check")
    parser.add_argument("--model", default=None, help="the model to test (default: the first the backend lists)")
    parser.add_argument("--check", action="append", metavar="NAME", help=f"only this check; repeatable ({', '.join(CHECKS)})")
    parser.add_argument("--request-timeout", type=float, default=120.0, help="seconds one request may take (default 120)")
    parser.set_defaults(func=plugin_check)

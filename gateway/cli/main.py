"""`switchyard` command line: serve, check-config, models fetch, ab-report, keys usage, fields,
plugin-check, new-plugin."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from plugins.contract.errors import ConfigError

if TYPE_CHECKING:
    from gateway.config import Config

DEFAULT_CONFIG = "plugins.toml"


def _serve(args: argparse.Namespace) -> int:
    import msgspec

    from gateway.config import load_config
    from gateway.server import serve
    from gateway.worker_pool import serve_workers, worker_count

    config = load_config(args.config)
    # everything check-config checks, before uvicorn: a bad backend option or strategy then stops
    # start-up with the one-line message naming the file and key, not a lifespan traceback
    _validate(config)
    _make_reasoning_key(config)
    host = args.host or config.server.host
    port = config.server.port if args.port is None else args.port
    drain_s = config.server.drain_timeout_s if args.drain_seconds is None else args.drain_seconds
    workers = worker_count(config.server.workers)
    # the count, not "auto": a worker whose flow-control ledger is its own takes its share of each backend
    config = msgspec.structs.replace(config, server=msgspec.structs.replace(config.server, workers=workers))
    if workers > 1:
        return serve_workers(config, host=host, port=port, drain_s=drain_s, workers=workers)
    serve(config, host=host, port=port, drain_s=drain_s)
    return 0


def _validate(config: Config) -> None:
    from gateway.config import resolve_backend_options
    from gateway.observability.telemetry import check_telemetry
    from gateway.service.route_plan import validate_routes
    from plugins.manager import backend_types, build_plugin_manager

    pm = build_plugin_manager(config.plugins.disable, config.plugins.modules)
    resolve_backend_options(config, backend_types(pm))
    validate_routes(config, pm)
    check_telemetry(config)


def _make_reasoning_key(config: Config) -> None:
    """The Responses API's reasoning seal key, read (or made) before any worker starts: an
    unusable file stops start-up naming `responses.reasoning_key_file`."""
    from gateway.responses_api.reasoning_seal import load_seal

    load_seal(config.responses.reasoning_key_file)


def _check_config(args: argparse.Namespace) -> int:
    from gateway.config import load_config

    config = load_config(args.path)
    _validate(config)
    print(f"{config.source}: OK ({len(config.backends)} backends, {len(config.routes)} routes)")
    return 0


def _models_fetch(args: argparse.Namespace) -> int:
    from builtin_engine.model.store import fetch_model

    path = fetch_model(args.name, progress=True)
    print(path)
    return 0


def _ab_report(args: argparse.Namespace) -> int:
    from gateway.cli.ab_report import build_report, format_report, plot_report, read_log

    try:
        records = read_log(args.log)
    except OSError as exc:
        print(f"switchyard: cannot read the request log {args.log}: {exc.strerror}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"switchyard: {exc}", file=sys.stderr)
        return 2
    reports = build_report(records, route=args.route, baseline=args.baseline, resamples=args.resamples, seed=args.seed)
    if not reports:
        print(f"switchyard: no requests{f' for route {args.route!r}' if args.route else ''} in {args.log}", file=sys.stderr)
        return 1
    print(format_report(reports))
    if args.plot:
        plot_report(reports, args.plot)
        print(f"\nplot: {args.plot}")
    return 0


def _render(args: argparse.Namespace) -> int:
    """Ask a running gateway how its backends render a conversation (POST /switchyard/render)."""
    import json
    from pathlib import Path

    import httpx

    messages = json.loads(Path(args.messages).read_text(encoding="utf-8"))
    payload = {"model": args.model, "messages": messages, "compare": args.compare}
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    response = httpx.post(args.url.rstrip("/") + "/switchyard/render", json=payload, headers=headers, timeout=120)
    body = response.json()
    if response.status_code != 200:
        print(f"switchyard render: {body['error']['message']}", file=sys.stderr)
        return 1
    print(format_renders(body))
    return 0


def format_renders(body: dict) -> str:
    """Each backend's prompt text and tokens; with several, the first differing token marked."""
    diff = body["first_difference"]
    lines: list[str] = []
    for r in body["renders"]:
        lines.append(f"== {r['backend']} ({r['model']}): {len(r['tokens'])} tokens")
        lines.append(r["text"])
        strs = r["token_strs"] or [str(t) for t in r["tokens"]]
        shown = [f">>>{t}:{s!r}<<<" if i == diff else f"{t}:{s!r}" for i, (t, s) in enumerate(zip(r["tokens"], strs))]
        lines.append(" ".join(shown))
    if len(body["renders"]) > 1:
        lines.append("identical" if diff is None else f"first difference at token {diff}")
    return "\n".join(lines)


def _keys_usage(args: argparse.Namespace) -> int:
    import json

    import httpx

    from gateway.config import load_config
    from gateway.keys.store import StateStoreError
    from gateway.keys.usage import format_report, read_report

    config = load_config(args.config)
    try:
        body = read_report(config, args.url)
    except (StateStoreError, httpx.HTTPError) as exc:
        print(f"switchyard keys usage: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(body, indent=2) if args.json else format_report(body))
    return 0


def _engines(args: argparse.Namespace) -> int:
    from engines.install.cli import main as install_main

    return install_main([args.what])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="switchyard", description="One OpenAI-compatible endpoint for many engines.")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve the gateway")
    serve.add_argument("--config", default=DEFAULT_CONFIG, help="path to plugins.toml")
    serve.add_argument("--host", default=None, help="bind address (default: server.host)")
    serve.add_argument("--port", type=int, default=None, help="port (default: server.port)")
    serve.add_argument(
        "--drain-seconds", type=float, default=None, help="grace period for requests in flight on SIGTERM (default: server.drain_timeout_s)"
    )
    serve.set_defaults(func=_serve)

    check = sub.add_parser("check-config", help="validate a plugins.toml and exit")
    check.add_argument("path", nargs="?", default=DEFAULT_CONFIG)
    check.set_defaults(func=_check_config)

    report = sub.add_parser("ab-report", help="per-arm statistics of a request log, with bootstrap confidence intervals")
    report.add_argument("--log", required=True, help="the JSONL request log ([server] request_log)")
    report.add_argument("--route", default=None, help="only this route (default: every route in the log)")
    report.add_argument("--baseline", default=None, help="the arm the others are compared with (default: the busiest)")
    report.add_argument("--plot", default=None, metavar="OUT.png", help="also plot the latency distributions per arm")
    report.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples (default 2000)")
    report.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0; the report is reproducible)")
    report.set_defaults(func=_ab_report)

    render = sub.add_parser("render", help="show the prompt a running gateway's backends build for a conversation")
    render.add_argument("--model", required=True, help="a model or route name")
    render.add_argument("--messages", required=True, help="a JSON file with the messages array")
    render.add_argument("--compare", action="store_true", help="every target of the route, side by side")
    render.add_argument("--url", default="http://127.0.0.1:8000", help="the gateway's base URL")
    render.add_argument("--api-key", default=None)
    render.set_defaults(func=_render)

    keys = sub.add_parser("keys", help="client keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    usage = keys_sub.add_parser("usage", help="each key's usage of its limits (from Redis, or from the running gateway)")
    usage.add_argument("config", nargs="?", default=DEFAULT_CONFIG)
    usage.add_argument("--url", default=None, help="the gateway to ask when state is in-process (default: server.host:port)")
    usage.add_argument("--json", action="store_true", help="print the JSON report")
    usage.set_defaults(func=_keys_usage)

    engines = sub.add_parser("engines", help="install the real engines the proxy backends can start")
    engines_sub = engines.add_subparsers(dest="engines_command", required=True)
    install = engines_sub.add_parser("install", help="build/install into ~/.cache/switchyard/engines (once per machine)")
    from engines.install.cli import CHOICES as install_choices

    install.add_argument("what", choices=install_choices)
    install.set_defaults(func=_engines)

    from gateway.cli import fields, plugin_check
    from gateway.cli import scaffold as new_plugin

    fields.add_parser(sub)
    plugin_check.add_parser(sub)
    new_plugin.add_parser(sub)

    models = sub.add_parser("models", help="manage bundled models")
    models_sub = models.add_subparsers(dest="models_command", required=True)
    fetch = models_sub.add_parser("fetch", help="download and convert a known model into the cache")
    fetch.add_argument("name")
    fetch.set_defaults(func=_models_fetch)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"switchyard: configuration error: {exc.message}", file=sys.stderr)
        return 2


"""Each key's usage of its limits: `switchyard keys usage [CONFIG]`, and the gateway endpoint
`GET /switchyard/keys/usage` it reads when the counts live in a gateway process.

With `[server] state = "redis://..."` the command reads Redis itself (what every replica
shares). With the in-process store the counts exist only inside the running gateway, so the
command asks it (`--url`, default the config's host and port) — only callers on the loopback
interface may, authenticated as any other request.
"""

from __future__ import annotations

import ipaddress
import math
from typing import Any

import msgspec
from litestar import Request, Response, get

from gateway.config import Config
from gateway.errors import StateUnavailable
from gateway.keys.limiter import go_duration
from gateway.keys.limits import BudgetPeriod, KeyLimits
from gateway.keys.store import KeyUsage, StateStore, StateStoreError, seconds_to_full
from plugins.contract.errors import PermissionDenied

USAGE_PATH = "/switchyard/keys/usage"


def keys_with_limits(config: Config) -> list[KeyLimits]:
    return [limits for entry in config.server.keys if (limits := KeyLimits.from_config(entry)) is not None]


async def usage_report(store: StateStore, keys: list[KeyLimits], now: float) -> dict[str, Any]:
    """The JSON body of the endpoint: where the counts are kept, and each key's state now."""
    entries = []
    for limits in keys:
        period = BudgetPeriod.at(limits.budget_period, now) if limits.budget_tokens else None
        entries.append(_entry(limits, await store.usage(limits, period)))
    return {"store": store.describe(), "keys": entries}


def _entry(limits: KeyLimits, usage: KeyUsage) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": limits.name}
    for field, limit, level in (("rpm", limits.rpm, usage.requests), ("tpm", limits.tpm, usage.tokens)):
        if limit is not None and level is not None:
            entry[field] = {"limit": limit, "remaining": max(0, math.floor(level)), "reset": go_duration(seconds_to_full(limit, level))}
    if limits.max_parallel is not None:
        entry["max_parallel"] = {"limit": limits.max_parallel, "in_flight": usage.in_flight}
    if limits.budget_tokens is not None:
        entry["budget"] = {"limit": limits.budget_tokens, "used": usage.budget_used, "period": usage.budget_period}
    return entry


def format_report(body: dict[str, Any]) -> str:
    lines = [f"usage from {body['store']}"]
    if not body["keys"]:
        lines.append("no key has limits ([[server.keys]] rpm, tpm, max_parallel, budget_tokens)")
    for entry in body["keys"]:
        parts = []
        for field in ("rpm", "tpm"):
            if field in entry:
                e = entry[field]
                parts.append(f"{field} {e['remaining']}/{e['limit']} left (full in {e['reset']})")
        if "max_parallel" in entry:
            parts.append(f"in flight {entry['max_parallel']['in_flight']}/{entry['max_parallel']['limit']}")
        if "budget" in entry:
            b = entry["budget"]
            parts.append(f"budget {b['used']}/{b['limit']} tokens in {b['period']}")
        lines.append(f"{entry['name']}: " + ", ".join(parts))
    return "\n".join(lines)


def is_loopback(host: str | None) -> bool:
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@get(USAGE_PATH, summary="Each client key's usage of its limits (callers on the loopback interface only).", include_in_schema=False)
async def keys_usage(request: Request) -> Response:
    if not is_loopback(request.client.host if request.client else None):
        raise PermissionDenied("Key usage is served to callers on the loopback interface only.", code="loopback_only")
    gateway = request.app.state.gateway
    keys = [key.limits for key in request.app.state.keyring.keys if key.limits is not None]
    try:
        body = await usage_report(gateway.key_limiter.store, keys, gateway.key_limiter.clock())
    except StateStoreError as exc:
        raise StateUnavailable(f"The limits' state store cannot be read: {exc}", code="state_unavailable") from None
    return Response(content=msgspec.json.encode(body), media_type="application/json")


def read_report(config: Config, url: str | None) -> dict[str, Any]:
    """The report `switchyard keys usage` prints: from Redis when the config names it, else from
    the running gateway at `url`. Raises `StateStoreError` / `httpx.HTTPError` when neither answers."""
    import asyncio
    import time

    if config.server.state is not None:
        from gateway.keys import build_store

        async def from_store() -> dict[str, Any]:
            store = build_store(config)
            await store.start()
            try:
                return await usage_report(store, keys_with_limits(config), time.time())
            finally:
                await store.close()

        return asyncio.run(from_store())
    import httpx

    base = (url or f"http://{config.server.host}:{config.server.port}").rstrip("/")
    token = _any_client_key(config)
    headers = {"authorization": f"Bearer {token}"} if token else {}
    response = httpx.get(base + USAGE_PATH, headers=headers, timeout=10)
    if response.status_code != 200:
        raise httpx.HTTPError(f"{base}{USAGE_PATH} answered {response.status_code}: {response.text[:300]}")
    body = response.json()
    body["store"] = f"the gateway at {base}, {body['store']}"
    return body


def _any_client_key(config: Config) -> str | None:
    """A key the config knows, to authenticate the request (the endpoint shows every key's usage
    to a loopback caller holding any of them)."""
    import os

    for entry in config.server.keys:
        secret = entry.key if entry.key is not None else os.environ.get(entry.key_env or "", "").strip()
        if secret:
            return secret
    return config.server.api_keys[0] if config.server.api_keys else None

"""Client API keys and secret hygiene.

- `KeyRing`: the keys clients may present as `Authorization: Bearer <key>` (or Anthropic's
  `x-api-key: <key>`: `authorization_of`) (`server.api_keys`, `$SWITCHYARD_API_KEYS`,
  `[[server.keys]]`), each with the routes it may use and its limits. A presented token
  is checked against every key in constant time: both sides are SHA-256 digests, so neither a
  key's length nor its content shows in the timing, and the loop never stops early.
- `Redactor`: every secret the gateway knows — client keys, each backend's upstream `api_key`
  or the value of its `api_key_env`, the password in `server.state` — replaced by `[redacted]`.
  Error messages sent to clients (an upstream may echo the key it was sent) and log records pass
  through it.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from gateway.config import Config, ServerConfig
from gateway.keys.limits import KeyLimits

REDACTED = "[redacted]"
MIN_SECRET_CHARS = 6  # shorter strings are not redacted: they would mangle ordinary words


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


@dataclass(frozen=True)
class ClientKey:
    name: str  # what logs may show
    digest: bytes
    routes: frozenset[str] | None  # None: every route
    limits: KeyLimits | None = None  # None: not limited (gateway/keys)
    weight: float = 1.0  # its share of a full backend (`[server.flow_control]`)
    priority: int | None = None  # the `priority` of its requests that send none

    def may_use(self, route: str) -> bool:
        return self.routes is None or route in self.routes


class KeyRing:
    def __init__(self, keys: Iterable[ClientKey]) -> None:
        self.keys = tuple(keys)

    @classmethod
    def from_config(cls, server: ServerConfig) -> KeyRing:
        keys = [ClientKey(name=f"api_keys[{i}]", digest=_digest(k), routes=None) for i, k in enumerate(server.api_keys)]
        for i, entry in enumerate(server.keys):
            secret = entry.key if entry.key is not None else os.environ.get(entry.key_env or "", "").strip()
            routes = None if entry.routes is None else frozenset(entry.routes)
            limits = KeyLimits.from_config(entry)
            keys.append(ClientKey(name=entry.name or f"keys[{i}]", digest=_digest(secret), routes=routes, limits=limits,
                                  weight=entry.weight, priority=entry.priority))
        return cls(keys)

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    def authenticate(self, authorization: str) -> ClientKey | None:
        """The key an `Authorization` header value presents; None when it presents none we know."""
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        presented = _digest(token)
        found: ClientKey | None = None
        for key in self.keys:  # every key, whatever matched: the time says nothing about which
            if hmac.compare_digest(presented, key.digest) and found is None:
                found = key
        if scheme.lower() != "bearer" or not token:
            return None
        return found


def authorization_of(headers: Any) -> str:
    """The `Authorization` header, or Anthropic's `x-api-key` as a bearer token."""
    authorization = headers.get("authorization", "")
    if not authorization and headers.get("x-api-key"):
        authorization = "Bearer " + headers["x-api-key"]
    return authorization


class Redactor:
    def __init__(self, secrets: Iterable[str]) -> None:
        # longest first, so a key that contains another is replaced whole
        self.secrets = tuple(sorted({s for s in secrets if len(s) >= MIN_SECRET_CHARS}, key=len, reverse=True))

    @classmethod
    def from_config(cls, config: Config) -> Redactor:
        return cls(secrets_of(config))

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text


def secrets_of(config: Config) -> list[str]:
    """Client keys and upstream keys, as far as the configuration names them."""
    server = config.server
    found = list(server.api_keys)
    for entry in server.keys:
        found.append(entry.key if entry.key is not None else os.environ.get(entry.key_env or "", "").strip())
    if server.state and urlsplit(server.state).password:
        found.append(unquote(urlsplit(server.state).password or ""))
    for backend in config.backends:
        key = backend.options.get("api_key")
        if isinstance(key, str):
            found.append(key)
        env = backend.options.get("api_key_env")
        if isinstance(env, str) and os.environ.get(env):
            found.append(os.environ[env])
    return [s for s in found if s]


class RedactingFilter(logging.Filter):
    """Scrubs secrets from a record's message and traceback before any handler writes it."""

    def __init__(self, redact: Redactor) -> None:
        super().__init__()
        self.redact = redact

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = self.redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        return True


def install_log_redaction(redact: Redactor) -> None:
    """Put a `RedactingFilter` on every handler configured now (the root logger's and
    uvicorn's): a filter on a handler sees the records of every logger that reaches it."""
    if not redact.secrets:
        return
    loggers = [logging.getLogger(), *(logging.getLogger(name) for name in list(logging.root.manager.loggerDict))]
    seen: set[int] = set()
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):
            if id(handler) not in seen:
                seen.add(id(handler))
                handler.addFilter(RedactingFilter(redact))

"""Where a backend's replicas come from: a fixed list, a DNS name, or a file.

Each source answers `resolve()` with the base URLs of the replicas it lists now (sorted, so
that the same answer gives the same fleet), or raises `DiscoveryError` saying why it could not
tell — then the fleet keeps the replicas it has. An answer with no replica (a DNS name without
records, an empty file) is an answer: the fleet drains everything it had.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import socket
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from plugins.contract.errors import ConfigError
from plugins.fleet.options import DiscoveryOptions


class DiscoveryError(Exception):
    """The source could not say which replicas exist; the message says why."""


class Discovery(Protocol):
    interval_s: float | None  # how often to ask again; None: never (a fixed list)

    def describe(self) -> str: ...

    async def resolve(self) -> list[str]: ...


def normalize_url(url: str) -> str:
    """A base URL without trailing slash; ValueError when it is not http(s)://host[:port]."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) base URL: {url!r}")
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        raise ValueError(f"bad port in {url!r}") from None
    return url.strip().rstrip("/")


def _url(scheme: str, address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"{scheme}://{host}:{port}"


class StaticDiscovery:
    interval_s = None

    def __init__(self, urls: list[str]) -> None:
        self.urls = sorted(dict.fromkeys(normalize_url(u) for u in urls))

    def describe(self) -> str:
        return "endpoints"

    async def resolve(self) -> list[str]:
        return list(self.urls)


class DnsDiscovery:
    """Every A and AAAA record of `name`. With `resolver`, that DNS server is asked directly
    (dnspython); without, the system's resolver (`getaddrinfo`: /etc/hosts, resolv.conf)."""

    def __init__(self, options: DiscoveryOptions) -> None:
        assert options.port is not None
        self.name = options.name
        self.port = options.port
        self.scheme = options.scheme
        self.interval_s = options.interval_s
        self.timeout_s = options.timeout_s
        self.resolver = _resolver_address(options.resolver) if options.resolver else None

    def describe(self) -> str:
        via = f" via {self.resolver[0]}:{self.resolver[1]}" if self.resolver else ""
        return f"dns name `{self.name}`{via}"

    async def resolve(self) -> list[str]:
        addresses = await (self._ask_server() if self.resolver else self._ask_system())
        return sorted(_url(self.scheme, a, self.port) for a in set(addresses))

    async def _ask_system(self) -> list[str]:
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(loop.getaddrinfo(self.name, self.port, type=socket.SOCK_STREAM), self.timeout_s)
        except socket.gaierror as exc:
            if exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
                return []
            raise DiscoveryError(f"{self.describe()} did not resolve: {exc.strerror}") from None
        except TimeoutError:
            raise DiscoveryError(f"{self.describe()} did not resolve within {self.timeout_s:g} s") from None
        return [info[4][0] for info in infos]

    async def _ask_server(self) -> list[str]:
        import dns.asyncresolver
        import dns.exception
        import dns.resolver

        assert self.resolver is not None
        resolver = dns.asyncresolver.Resolver(configure=False)
        resolver.nameservers = [self.resolver[0]]
        resolver.port = self.resolver[1]
        resolver.lifetime = self.timeout_s
        found: list[str] = []
        for rdtype in ("A", "AAAA"):
            try:
                answer = await resolver.resolve(self.name, rdtype, search=False)
            except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
                continue
            except dns.exception.DNSException as exc:
                raise DiscoveryError(f"{self.describe()} did not resolve: {type(exc).__name__}: {exc}") from None
            found += [record.address for record in answer]
        return found


def _resolver_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if sep and host and port.isdigit() and not host.endswith(":"):
        return host.strip("[]"), int(port)
    return text.strip("[]"), 53


class FileDiscovery:
    """A JSON list of base URLs (or `{"endpoints": [...]}`), or TOML `endpoints = [...]`; read
    again whenever its modification time or size changes (off the event loop)."""

    def __init__(self, options: DiscoveryOptions) -> None:
        self.path = Path(options.path).expanduser()
        self.interval_s = options.interval_s
        self._seen: tuple[int, int] | None = None
        self._urls: list[str] = []

    def describe(self) -> str:
        return f"file `{self.path}`"

    async def resolve(self) -> list[str]:
        return await asyncio.to_thread(self._read)

    def _read(self) -> list[str]:
        try:
            stat = os.stat(self.path)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                raise DiscoveryError(f"{self.describe()} does not exist") from None
            raise DiscoveryError(f"{self.describe()}: {exc.strerror}") from None
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._seen:
            return list(self._urls)
        try:
            text = self.path.read_text(encoding="utf-8")
        except OSError as exc:
            raise DiscoveryError(f"{self.describe()}: {exc.strerror}") from None
        urls = self._parse(text)
        self._seen, self._urls = stamp, urls
        return list(urls)

    def _parse(self, text: str) -> list[str]:
        data: Any
        try:
            data = tomllib.loads(text) if self.path.suffix == ".toml" else json.loads(text)
        except ValueError as exc:
            raise DiscoveryError(f"{self.describe()} is not valid {'TOML' if self.path.suffix == '.toml' else 'JSON'}: {exc}") from None
        if isinstance(data, dict):
            data = data.get("endpoints")
        if not isinstance(data, list) or not all(isinstance(u, str) for u in data):
            raise DiscoveryError(f"{self.describe()} holds no list of base URLs (a list, or `endpoints = [...]`)")
        try:
            return sorted(dict.fromkeys(normalize_url(u) for u in data))
        except ValueError as exc:
            raise DiscoveryError(f"{self.describe()}: {exc}") from None


DISCOVERY: dict[str, Callable[[DiscoveryOptions], Discovery]] = {"dns": DnsDiscovery, "file": FileDiscovery}


def _check(options: DiscoveryOptions) -> str | None:
    """What is wrong with a discovery table (the key and why), or None."""
    if options.type == "dns":
        if not options.name:
            return "`discovery.name` is required for type dns"
        if options.port is None:
            return "`discovery.port` is required for type dns"
    if options.type == "file" and not options.path:
        return "`discovery.path` is required for type file"
    return None


def discovery_for(backend: str, *, base_url: str, endpoints: list[str] | None, discovery: DiscoveryOptions | None,
                  launch: bool | None) -> Discovery:
    """The replica source a backend's options name (`launch`: whether a `launch` table is set;
    None when the backend type has none). A `ConfigError` names a bad or conflicting key."""
    given = [key for key, value in (("base_url", bool(base_url)), ("endpoints", endpoints is not None),
                                    ("discovery", discovery is not None), ("launch", bool(launch))) if value]
    if not given:
        also = " or a `launch` table" if launch is not None else ""
        raise ConfigError(f"backend `{backend}`: `options.base_url` is required (or `options.endpoints`, "
                          f"a `discovery` table{also})")
    if len(given) > 1:
        raise ConfigError(f"backend `{backend}`: set one of `options.base_url`, `options.endpoints`, "
                          f"`options.discovery` or `options.launch`, not both ({' and '.join(given)} are set)")
    if discovery is not None:
        problem = _check(discovery)
        if problem:
            raise ConfigError(f"backend `{backend}`: {problem} (`options.discovery`)")
        return DISCOVERY[discovery.type](discovery)
    if endpoints is not None and not endpoints:
        raise ConfigError(f"backend `{backend}`: `options.endpoints` is empty (list each replica's base URL)")
    urls = endpoints if endpoints is not None else [base_url] if base_url else []
    for i, url in enumerate(urls):
        try:
            normalize_url(url)
        except ValueError as exc:
            where = f"options.endpoints[{i}]" if endpoints is not None else "options.base_url"
            raise ConfigError(f"backend `{backend}`: `{where}`: {exc}") from None
    return StaticDiscovery(urls)

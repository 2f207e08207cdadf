"""Who a request counts against in the fair order (`[server.flow_control] tenant`).

- `key`: the client key's `name` (one tenant per key).
- `user`: the request's `user` field (OpenAI's; Anthropic's `metadata.user_id`).
- `session`: the agent session the request belongs to (the caller's `session`, else the
  request's `x-session-id` header).
- `header:<name>`: any header the gateway is told to read (e.g. a tenant id set by an outer proxy).

A request that carries no value for its source counts against its key, and without keys against
`ANONYMOUS`. A tenant's weight is always its key's `weight`: a key cannot gain share by spreading
its requests over many users.
"""

from __future__ import annotations

from collections.abc import Mapping

ANONYMOUS = "anonymous"
SESSION_HEADER = "x-session-id"
HEADER_PREFIX = "header:"


def header_of(tenant_source: str) -> str | None:
    """The header a `header:<name>` source names (lower case), or None."""
    return tenant_source[len(HEADER_PREFIX):].lower() if tenant_source.startswith(HEADER_PREFIX) else None


class TenantSource:
    def __init__(self, source: str = "key") -> None:
        self.source = source
        self.header = header_of(source)

    def tenant_of(self, key_name: str | None, *, user: str | None = None, session: str | None = None,
                  headers: Mapping[str, str] | None = None) -> str:
        """The tenant of one request: `key_name` its client key's name (None: no key), `session`
        its agent session, `headers` the client's headers (lower-case names)."""
        value: str | None = None
        if self.header is not None:
            value = headers.get(self.header) if headers is not None else None
        elif self.source == "user":
            value = user
        elif self.source == "session":
            value = session or (headers.get(SESSION_HEADER) if headers is not None else None)
        if value:
            return f"{self.source}={value}"  # tagged: a user named like a key is not that key
        return key_name or ANONYMOUS

    @property
    def bounded(self) -> bool:
        """Whether tenants are few (one per key): only then may metrics label by tenant."""
        return self.source == "key"

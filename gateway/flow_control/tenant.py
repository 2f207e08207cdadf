"""Who a request counts against in the fair order (`[server.flow_control] tenant`).

- `key`: the client key's `name` (one tenant per key).
- `user`: the request's `user` field (OpenAI's; Anthropic's `metadata.user_id`).
- `session`: the request's `x-session-id` header.
- `header:<name>`: any header the gateway is told to read (e.g. a tenant id set by an outer proxy).

A request that carries no value for its source counts against its key, and without keys against
`ANONYMOUS`. A tenant's weight is always its key's `weight`: a key cannot gain share by spreading
its requests over many users.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.flow_control.config import header_of

ANONYMOUS = "anonymous"
SESSION_HEADER = "x-session-id"


class TenantSource:
    def __init__(self, source: str = "key") -> None:
        self.source = source
        self.header = SESSION_HEADER if source == "session" else header_of(source)

    def tenant_of(self, key_name: str | None, user: str | None, headers: Mapping[str, str]) -> str:
        """The tenant of one request: `key_name` its client key's name (None: no key),
        `headers` the client's headers (lower-case names)."""
        value: str | None = None
        if self.header is not None:
            value = headers.get(self.header)
        elif self.source == "user":
            value = user
        if value:
            return f"{self.source}={value}"  # tagged: a user named like a key is not that key
        return key_name or ANONYMOUS

    @property
    def bounded(self) -> bool:
        """Whether tenants are few (one per key): only then may metrics label by tenant."""
        return self.source == "key"

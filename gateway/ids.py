"""Random ids in the formats the wire shows, from `os.urandom` as before, without the layers
above it: a request id as `uuid.uuid4().hex` writes it (no `UUID` object: a quarter of the
time), a response id's `secrets.token_hex` (no `SystemRandom` method calls)."""

from __future__ import annotations

import os
from collections.abc import Mapping


def uuid4_hex() -> str:
    """32 lower-case hex digits of a random (version 4, RFC 4122 variant) UUID."""
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40  # version 4
    raw[8] = raw[8] & 0x3F | 0x80  # variant 10xx
    return raw.hex()


def token_hex(nbytes: int) -> str:
    """`nbytes` random bytes as 2 * `nbytes` lower-case hex digits."""
    return os.urandom(nbytes).hex()


def request_id_from(headers: Mapping[str, str]) -> str:
    """A request's id: the client's `x-request-id`, else a new one."""
    return headers.get("x-request-id") or uuid4_hex()

"""Random ids in the formats the wire shows, from `os.urandom` as before, without the layers
above it: a request id as `uuid.uuid4().hex` writes it (no `UUID` object: a quarter of the
time), a response id's `secrets.token_hex` (no `SystemRandom` method calls).

The bytes come from one `os.urandom` read per `RANDOM_BATCH` bytes (a hundred-odd ids), not
one system call per id: each byte is handed out once, and a forked child starts a batch of
its own, so no two processes or ids share bytes."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping

RANDOM_BATCH = 4096  # bytes read from the kernel at a time


class _RandomBytes:
    __slots__ = ("_batch", "_at", "_lock")

    def __init__(self) -> None:
        self._batch = b""
        self._at = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bytes:
        with self._lock:
            at = self._at
            if at + n > len(self._batch):
                self._batch, at = os.urandom(max(RANDOM_BATCH, n)), 0
            self._at = at + n
            return self._batch[at:at + n]

    def forget(self) -> None:
        """In a forked child: the parent's unused bytes are the parent's."""
        self._batch, self._at, self._lock = b"", 0, threading.Lock()


_random = _RandomBytes()
os.register_at_fork(after_in_child=_random.forget)


def uuid4_hex() -> str:
    """32 lower-case hex digits of a random (version 4, RFC 4122 variant) UUID."""
    raw = bytearray(_random.take(16))
    raw[6] = raw[6] & 0x0F | 0x40  # version 4
    raw[8] = raw[8] & 0x3F | 0x80  # variant 10xx
    return raw.hex()


def token_hex(nbytes: int) -> str:
    """`nbytes` random bytes as 2 * `nbytes` lower-case hex digits."""
    return _random.take(nbytes).hex()


def request_id_from(headers: Mapping[str, str]) -> str:
    """A request's id: the client's `x-request-id`, else a new one."""
    return headers.get("x-request-id") or uuid4_hex()

"""The `encrypted_content` of reasoning items: the reasoning text sealed with this gateway's key,
so that a client that keeps no state on the server (`store: false`, as Codex does) and resends
the item later gives the gateway its text back — and an item sealed elsewhere (OpenAI, another
gateway's key, an edited one) is recognised as foreign and left out.

A seal is `sy1.<text>.<mac>`: the UTF-8 text zlib-compressed and base64url-encoded, then the
first 16 bytes of its HMAC-SHA256 under the key. It is authenticated, not secret: the same text
is in the item's `content` the client was sent. Clients treat it as opaque.

The key is 32 random bytes in a file (`[responses] reasoning_key_file`), made on first start
and read by every worker process; replicas that should read each other's seals share the file
(a mounted secret). Without it a seal made before a restart would still be read, but one made
by a sibling replica would not.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
import zlib
from pathlib import Path

from plugins.contract.errors import ConfigError

PREFIX = "sy1."
KEY_BYTES = 32
MAC_BYTES = 16
KEY_PARAM = "responses.reasoning_key_file"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class ReasoningSeal:
    def __init__(self, key: bytes) -> None:
        if len(key) < KEY_BYTES:
            raise ValueError(f"a reasoning seal key has at least {KEY_BYTES} bytes")
        self._key = key

    def _mac(self, body: str) -> str:
        return _b64(hmac.new(self._key, (PREFIX + body).encode(), hashlib.sha256).digest()[:MAC_BYTES])

    def seal(self, text: str) -> str:
        body = _b64(zlib.compress(text.encode(), 6))
        return f"{PREFIX}{body}.{self._mac(body)}"

    def unseal(self, sealed: str) -> str | None:
        """The text, or None when `sealed` is not a seal of this key."""
        if not sealed.startswith(PREFIX):
            return None
        body, _, mac = sealed[len(PREFIX):].partition(".")
        if not hmac.compare_digest(mac, self._mac(body)):
            return None
        try:
            return zlib.decompress(_unb64(body)).decode()
        except (binascii.Error, ValueError, zlib.error, UnicodeDecodeError):
            return None


def load_seal(path: str) -> ReasoningSeal:
    """The seal of the key in `path`, the file made (mode 0600, with a fresh random key) when
    there is none: written aside and linked into place, so workers starting together all read
    one complete key. A file that cannot be read or made, or a key too short, is a ConfigError
    naming `responses.reasoning_key_file`."""
    file = Path(path).expanduser()
    try:
        if not file.exists():
            _create(file)
        key = file.read_bytes().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read or make the reasoning key file {str(file)!r} at `{KEY_PARAM}`: {exc}",
                          param=KEY_PARAM) from None
    if len(key) < KEY_BYTES:
        raise ConfigError(f"the reasoning key file {str(file)!r} at `{KEY_PARAM}` holds {len(key)} bytes; it needs at least "
                          f"{KEY_BYTES}", param=KEY_PARAM)
    return ReasoningSeal(key)


def _create(file: Path) -> None:
    file.parent.mkdir(parents=True, exist_ok=True)
    aside = file.with_name(f".{file.name}.{os.getpid()}.{secrets.token_hex(4)}")
    descriptor = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as out:
            out.write(secrets.token_hex(KEY_BYTES).encode() + b"\n")
        try:
            os.link(aside, file)  # fails when another process made it first: theirs is the key
        except FileExistsError:
            pass
    finally:
        aside.unlink(missing_ok=True)

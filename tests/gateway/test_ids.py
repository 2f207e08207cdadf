"""The ids the gateway makes up keep their wire formats: a request id is `uuid.uuid4().hex`'s
(32 hex digits, version 4, RFC 4122 variant), a response id `chatcmpl-` / `cmpl-` and
`secrets.token_hex(12)`'s 24 hex digits; every random bit stays random."""

from __future__ import annotations

import os
import re
import uuid

import httpx

from gateway.ids import token_hex, uuid4_hex
from tests.gateway.helpers import chat_body

UUID4_HEX = re.compile(r"[0-9a-f]{12}4[0-9a-f]{3}[89ab][0-9a-f]{15}")


def _free_bits(ids: list[str]) -> int:
    """The bits that are not the same in every one of `ids` (hex strings of one length)."""
    values = [int(i, 16) for i in ids]
    ones = zeros = 0
    for v in values:
        ones |= v
        zeros |= ~v
    width = len(ids[0]) * 4
    return bin(ones & zeros & ((1 << width) - 1)).count("1")


def test_a_request_id_is_what_uuid4_hex_writes() -> None:
    ids = [uuid4_hex() for _ in range(2000)]
    for i in ids:
        assert UUID4_HEX.fullmatch(i), i
        parsed = uuid.UUID(hex=i)
        assert parsed.hex == i and parsed.version == 4 and parsed.variant == uuid.RFC_4122
    assert len(set(ids)) == len(ids)
    assert _free_bits(ids) == 128 - 6  # only the version and variant bits are fixed


def test_a_token_is_what_secrets_token_hex_writes() -> None:
    tokens = [token_hex(12) for _ in range(2000)]
    assert all(re.fullmatch(r"[0-9a-f]{24}", t) for t in tokens)
    assert len(set(tokens)) == len(tokens)
    assert _free_bits(tokens) == 96


def test_ids_on_the_wire(http: httpx.Client) -> None:
    """Generated request ids (streamed chat front and Litestar routes) and the answers' ids."""
    streamed = http.post("/v1/chat/completions", json=chat_body(stream=True))
    plain = http.post("/v1/chat/completions", json=chat_body())
    legacy = http.post("/v1/completions", json={"model": "echo-1", "prompt": "hi"})
    for resp in (streamed, plain, legacy):
        assert resp.status_code == 200
        assert UUID4_HEX.fullmatch(resp.headers["x-request-id"]), resp.headers["x-request-id"]
    chunk_ids = set(re.findall(r'"id":"([^"]+)"', streamed.text))
    assert len(chunk_ids) == 1 and re.fullmatch(r"chatcmpl-[0-9a-f]{24}", chunk_ids.pop())
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{24}", plain.json()["id"])
    assert re.fullmatch(r"cmpl-[0-9a-f]{24}", legacy.json()["id"])


def test_a_forked_child_makes_ids_of_its_own() -> None:
    """The ids come from a batch of random bytes read at once: a forked child (a worker started
    by fork) must not hand out the bytes its parent still holds."""
    uuid4_hex()  # the parent holds a batch with unused bytes
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        os.close(read_end)
        os.write(write_end, " ".join(uuid4_hex() for _ in range(50)).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        child = pipe.read().decode().split()
    os.waitpid(pid, 0)
    parent = [uuid4_hex() for _ in range(50)]
    assert len(child) == 50 and not set(child) & set(parent)

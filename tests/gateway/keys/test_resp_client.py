"""The small Redis client against a real redis-server: pipelining, scripts, AUTH and SELECT,
and the failures it must turn into `RedisUnavailable` (refused, silent, dropped)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from gateway.keys.resp import RedisReplyError, RedisUnavailable, RespClient, Script, _Incomplete, encode_command, parse_reply
from tests.support.redis_server import RedisServer
from tests.support.server import free_port

pytestmark = pytest.mark.anyio


def test_replies_parse_whole_or_not_at_all() -> None:
    reply = b"*4\r\n$0\r\n\r\n$4\r\n1.25\r\n:-3\r\n*2\r\n+OK\r\n$-1\r\n"
    assert parse_reply(reply) == ([b"", b"1.25", -3, ["OK", None]], len(reply))
    for cut in range(len(reply)):
        with pytest.raises(_Incomplete):
            parse_reply(reply[:cut])
    error, _ = parse_reply(b"-NOSCRIPT No matching script\r\n")
    assert isinstance(error, RedisReplyError) and str(error).startswith("NOSCRIPT")
    assert encode_command(("SET", "k", 1.5)) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\n1.5\r\n"


async def test_pipelined_calls_get_their_own_replies(redis: RedisServer) -> None:
    client = RespClient(redis.url, timeout_s=5)
    try:
        replies = await asyncio.gather(*(client.call("INCRBY", f"n{i % 3}", i) for i in range(30)))
        assert sorted(replies)[-1] == sum(range(2, 30, 3))
        assert await client.call("GET", "missing") is None
        with pytest.raises(RedisReplyError):
            await client.call("NOSUCHCOMMAND")
        assert await client.call("PING") == "PONG"  # an error reply leaves the connection usable
    finally:
        await client.close()


async def test_scripts_are_sent_once_and_again_after_a_flush(redis: RedisServer) -> None:
    script = Script("return {KEYS[1], ARGV[1] + 1}")
    client = RespClient(redis.url, timeout_s=5)
    try:
        assert await client.evalsha(script, ["k"], [41]) == [b"k", 42]
        assert await client.call("SCRIPT", "EXISTS", script.sha) == [1]
        await client.call("SCRIPT", "FLUSH")  # what a Redis restart does
        assert await client.evalsha(script, ["k"], [1]) == [b"k", 2]
    finally:
        await client.close()


async def test_auth_and_database_from_the_url(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)
    server.start()
    try:
        server.command("CONFIG", "SET", "requirepass", "s3cret")
        base = f"127.0.0.1:{server.port}"
        good = RespClient(f"redis://:s3cret@{base}/2", timeout_s=5)
        await good.call("SET", "where", "db2")
        assert b" db=2 " in await good.call("CLIENT", "INFO")
        await good.close()
        other = RespClient(f"redis://default:s3cret@{base}/0", timeout_s=5)
        assert await other.call("GET", "where") is None  # another database
        await other.close()
        bad = RespClient(f"redis://:wrong@{base}/0", timeout_s=5)
        with pytest.raises(RedisUnavailable, match="refused AUTH"):
            await bad.call("PING")
    finally:
        server.stop()


async def test_nothing_listening_is_unavailable() -> None:
    client = RespClient(f"redis://127.0.0.1:{free_port()}", timeout_s=2)
    with pytest.raises(RedisUnavailable, match="cannot connect"):
        await client.call("PING")


async def test_a_silent_server_times_out_and_the_connection_is_dropped() -> None:
    with socket.socket() as listener:  # accepts connections, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        client = RespClient(f"redis://127.0.0.1:{listener.getsockname()[1]}", timeout_s=0.2)
        with pytest.raises(RedisUnavailable, match="did not answer within 0.2 s"):
            await client.call("PING")
        assert client._conn is None
        await client.close()


async def test_a_restarted_server_is_reconnected(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)
    server.start()
    client = RespClient(server.url, timeout_s=2)
    try:
        assert await client.call("PING") == "PONG"
        server.stop()
        with pytest.raises(RedisUnavailable):
            await client.call("PING")
        server.start()
        assert await client.call("PING") == "PONG"
    finally:
        await client.close()
        server.stop()

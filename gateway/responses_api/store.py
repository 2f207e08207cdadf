"""Where stored responses live (`store: true`, `previous_response_id`, GET / DELETE).

A stored response is its response object and the conversation it ended (chat-shaped messages:
the earlier turns, this turn's input and its output), so that a follow-up request with
`previous_response_id` continues it without the client sending it again.

- `sqlite` (default): one file (`[responses] sqlite_path`), WAL mode, so several worker
  processes of one gateway on one machine share it. Every call runs on one thread of its own,
  never on the event loop.
- `redis`: a Redis server (`[responses] redis_url`) that several gateway replicas share;
  keys `<redis_prefix><id>`, with `ttl_s` as their expiry.
- `none`: nothing is stored; `store: true` is accepted and answered as stored = false.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import msgspec

from gateway.config import StoreConfig
from gateway.responses_api.response_schemas import Response
from plugins.contract.errors import ConfigError, UpstreamError


class StoredResponse(msgspec.Struct, kw_only=True):
    response: Response
    conversation: list[dict[str, Any]]  # chat messages, instructions left out (they do not carry over)


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(StoredResponse).decode


class ResponseStore(Protocol):
    async def put(self, stored: StoredResponse) -> None: ...

    async def get(self, response_id: str) -> StoredResponse | None: ...

    async def delete(self, response_id: str) -> bool: ...

    async def close(self) -> None: ...


async def open_store(config: StoreConfig) -> ResponseStore | None:
    if config.store == "none":
        return None
    if config.store == "redis":
        return await RedisStore.open(config)
    return await SQLiteStore.open(config)


class SQLiteStore:
    def __init__(self, path: Path, ttl_s: float | None) -> None:
        self.path = path
        self.ttl_s = ttl_s
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="responses-sqlite")
        self._db: sqlite3.Connection | None = None

    @classmethod
    async def open(cls, config: StoreConfig) -> SQLiteStore:
        store = cls(Path(config.sqlite_path).expanduser(), config.ttl_s)
        try:
            await store._run(store._connect)
        except (OSError, sqlite3.Error) as exc:
            store._thread.shutdown(wait=False)
            raise ConfigError(f"cannot open the response store {str(store.path)!r} at `responses.sqlite_path`: {exc}",
                              param="responses.sqlite_path") from None
        return store

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def _connect(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, timeout=10.0)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, created REAL NOT NULL, body BLOB NOT NULL)")
        db.execute("CREATE INDEX IF NOT EXISTS responses_created ON responses (created)")
        db.commit()
        self._db = db

    def _put(self, response_id: str, body: bytes) -> None:
        assert self._db is not None
        now = time.time()
        self._db.execute("INSERT OR REPLACE INTO responses (id, created, body) VALUES (?, ?, ?)", (response_id, now, body))
        if self.ttl_s is not None:
            self._db.execute("DELETE FROM responses WHERE created < ?", (now - self.ttl_s,))
        self._db.commit()

    def _get(self, response_id: str) -> bytes | None:
        assert self._db is not None
        oldest = 0.0 if self.ttl_s is None else time.time() - self.ttl_s
        row = self._db.execute("SELECT body FROM responses WHERE id = ? AND created >= ?", (response_id, oldest)).fetchone()
        return None if row is None else row[0]

    def _delete(self, response_id: str) -> bool:
        assert self._db is not None
        deleted = self._db.execute("DELETE FROM responses WHERE id = ?", (response_id,)).rowcount
        self._db.commit()
        return deleted > 0

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    async def put(self, stored: StoredResponse) -> None:
        await self._run(self._put, stored.response.id, _encode(stored))

    async def get(self, response_id: str) -> StoredResponse | None:
        body = await self._run(self._get, response_id)
        return None if body is None else _decode(body)

    async def delete(self, response_id: str) -> bool:
        return await self._run(self._delete, response_id)

    async def close(self) -> None:
        await self._run(self._close)
        self._thread.shutdown(wait=True)


class RedisStore:
    def __init__(self, client: Any, prefix: str, ttl_s: float | None) -> None:
        self.client = client
        self.prefix = prefix
        self.ttl_s = ttl_s

    @classmethod
    async def open(cls, config: StoreConfig) -> RedisStore:
        try:
            import redis.asyncio as redis
        except ImportError:
            raise ConfigError("`responses.store = \"redis\"` needs the `redis` package (pip install redis)",
                              param="responses.store") from None
        client = redis.from_url(config.redis_url)
        try:
            await client.ping()
        except (redis.RedisError, OSError) as exc:
            await client.aclose()
            raise ConfigError(f"cannot reach the response store at `responses.redis_url`: {exc}",
                              param="responses.redis_url") from None
        return cls(client, config.redis_prefix, config.ttl_s)

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """A Redis command; the server gone is a 503, never a 500."""
        import redis.asyncio as redis

        try:
            return await getattr(self.client, method)(*args, **kwargs)
        except (redis.RedisError, OSError) as exc:
            raise UpstreamError(f"The response store is unavailable: {exc}", kind="unavailable") from None

    async def put(self, stored: StoredResponse) -> None:
        ttl = None if self.ttl_s is None else max(1, round(self.ttl_s))
        await self._call("set", self.prefix + stored.response.id, _encode(stored), ex=ttl)

    async def get(self, response_id: str) -> StoredResponse | None:
        body = await self._call("get", self.prefix + response_id)
        return None if body is None else _decode(body)

    async def delete(self, response_id: str) -> bool:
        return bool(await self._call("delete", self.prefix + response_id))

    async def close(self) -> None:
        await self.client.aclose()

"""The ledger in Redis, shared by every worker and replica (`[server] state = "redis://..."`).

Each step is one Lua script (through the project's RESP client, `gateway/keys/resp.py`), so the
fair order is one order however many gateways share it: the algorithm of `fair_order`, in the
same floating-point steps as `MemoryLedger` (tags and times written with 17 significant digits,
which read back exactly). Times are Redis's own clock (`TIME`), so gateways whose clocks differ
agree on how long an entry has waited.

Keys, per backend B (one hash tag, so a Redis Cluster keeps them on one shard), prefix
`switchyard:flow:{B}:` —
`vclock` (string); `running` (sorted set: id -> lease end); `tag:<band>` and `entered:<band>`
(sorted sets: id -> start tag, id -> when it came into the band); `cost` (hash: id -> tokens);
`band_cost` (hash: band -> tokens waiting); `expires` (sorted set: id -> when a waiting entry is
dropped, in case its worker died); `granted` (sorted set: id -> when granted, until its worker
collects it); `finish:<tenant>` (string, expires after `TENANT_IDLE_S`).

Grants travel by `granted`: a step that serves another worker's entry gives it a short lease
(`claim_s`) and lists it there; that worker's next step (at the latest its poll, every
`poll_interval_s` while it has waiters) collects it, extending the lease to `lease_s`. A worker
that dies leaves nothing for long: its grants lapse after `claim_s`, its running leases after
`lease_s`, its waiting entries once they expire.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from gateway.flow_control.ledger.base import Arrival, Entry, LedgerError
from gateway.keys.resp import RedisReplyError, RedisUnavailable, RespClient, Script

TENANT_IDLE_S = 3600  # a tenant's finish tag is forgotten after this long without a request
CLAIM_S = 5.0  # how long a grant to another worker's entry holds its slot before it is collected
EXPIRY_MARGIN_S = 10.0  # a waiting entry outlives its queue timeout by this, then it is dropped

# ARGV: now (< 0: Redis's own), bands, aging_s (0: none), capacity, lease_s, claim_s, owner,
# then the script's own. KEYS: vclock, running, cost, band_cost, expires, granted, tag:0..K-1,
# entered:0..K-1, then the script's own.
_PRELUDE = """
local now = tonumber(ARGV[1])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local K, aging, capacity = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local lease, claim, owner = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
local VCLOCK, RUNNING, COST, BAND_COST, EXPIRES, GRANTED = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local function fmt(x) return string.format('%.17g', x) end
local function tag_key(b) return KEYS[7 + b] end
local function entered_key(b) return KEYS[7 + K + b] end
local function owner_of(id) return string.match(id, '^[^.]*%.(.*)$') end
local function vclock() return tonumber(redis.call('GET', VCLOCK) or '0') end
local function num_waiting()
  local n = 0
  for b = 0, K - 1 do n = n + redis.call('ZCARD', tag_key(b)) end
  return n
end
local function band_of(id)
  for b = 0, K - 1 do
    if redis.call('ZSCORE', tag_key(b), id) then return b end
  end
  return nil
end
local function remove_waiting(id, b)
  redis.call('ZREM', tag_key(b), id)
  redis.call('ZREM', entered_key(b), id)
  redis.call('ZREM', EXPIRES, id)
  local c = tonumber(redis.call('HGET', COST, id) or '0')
  redis.call('HDEL', COST, id)
  redis.call('HINCRBY', BAND_COST, b, -c)
end
local function expire()
  redis.call('ZREMRANGEBYSCORE', RUNNING, '-inf', fmt(now))
  redis.call('ZREMRANGEBYSCORE', GRANTED, '-inf', fmt(now - claim))
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', EXPIRES, '-inf', fmt(now))) do
    local b = band_of(id)
    if b then remove_waiting(id, b) else redis.call('ZREM', EXPIRES, id) end
  end
end
local function age()
  if aging <= 0 then return end
  for b = K - 1, 1, -1 do
    local due = redis.call('ZRANGEBYSCORE', entered_key(b), '-inf', fmt(now - aging), 'WITHSCORES')
    for i = 1, #due, 2 do
      local id, entered = due[i], tonumber(due[i + 1])
      local tag = redis.call('ZSCORE', tag_key(b), id)
      local c = tonumber(redis.call('HGET', COST, id) or '0')
      redis.call('ZREM', tag_key(b), id)
      redis.call('ZREM', entered_key(b), id)
      redis.call('ZADD', tag_key(b - 1), tag, id)
      redis.call('ZADD', entered_key(b - 1), fmt(entered + aging), id)
      redis.call('HINCRBY', BAND_COST, b, -c)
      redis.call('HINCRBY', BAND_COST, b - 1, c)
    end
  end
end
local woken = {}
local function dispatch()
  if num_waiting() == 0 then return end
  age()
  local running = redis.call('ZCARD', RUNNING)
  while running < capacity do
    local head = nil
    for b = 0, K - 1 do
      local first = redis.call('ZRANGE', tag_key(b), 0, 0, 'WITHSCORES')
      if #first > 0 then head = {first[1], tonumber(first[2]), b}; break end
    end
    if not head then break end
    local id, tag = head[1], head[2]
    remove_waiting(id, head[3])
    if tag > vclock() then redis.call('SET', VCLOCK, fmt(tag)) end
    running = running + 1
    if owner_of(id) == owner then
      redis.call('ZADD', RUNNING, fmt(now + lease), id)
      woken[#woken + 1] = id
    else
      redis.call('ZADD', RUNNING, fmt(now + claim), id)
      redis.call('ZADD', GRANTED, fmt(now), id)
    end
  end
end
local function collect()
  for _, id in ipairs(redis.call('ZRANGE', GRANTED, 0, -1)) do
    if owner_of(id) == owner then
      redis.call('ZREM', GRANTED, id)
      if redis.call('ZSCORE', RUNNING, id) then
        redis.call('ZADD', RUNNING, fmt(now + lease), id)
        woken[#woken + 1] = id
      end
    end
  end
end
"""

# + KEYS: finish:<tenant>. ARGV[8..]: id, band, cost, weight, max_queue, max_ahead (< 0: none), expiry_s.
# Returns {outcome, ahead, woken...}.
_ARRIVE = Script(_PRELUDE + """
local FINISH = KEYS[7 + 2 * K]
local id, band, cost, weight = ARGV[8], tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
local max_queue, max_ahead, expiry = tonumber(ARGV[12]), tonumber(ARGV[13]), tonumber(ARGV[14])
expire()
dispatch()
collect()
local v = vclock()
local start = v
local f = tonumber(redis.call('GET', FINISH) or '')
if f and f > v then start = f end
local function remember()
  redis.call('SET', FINISH, fmt(start + cost / weight), 'EX', %(tenant_idle)d)
end
local waiting = num_waiting()
if waiting == 0 and redis.call('ZCARD', RUNNING) < capacity then
  remember()
  redis.call('SET', VCLOCK, fmt(start))
  redis.call('ZADD', RUNNING, fmt(now + lease), id)
  return {'granted', 0, unpack(woken)}
end
if waiting >= max_queue then
  local backlog = 0
  for b = 0, K - 1 do backlog = backlog + tonumber(redis.call('HGET', BAND_COST, b) or '0') end
  return {'queue_full', backlog, unpack(woken)}
end
local ahead = 0
for b = 0, band - 1 do ahead = ahead + tonumber(redis.call('HGET', BAND_COST, b) or '0') end
local same = redis.call('ZRANGEBYSCORE', tag_key(band), '-inf', fmt(start), 'WITHSCORES')
for i = 1, #same, 2 do
  local s = tonumber(same[i + 1])
  if s < start or same[i] < id then ahead = ahead + tonumber(redis.call('HGET', COST, same[i]) or '0') end
end
if max_ahead >= 0 and ahead > max_ahead then return {'slo', ahead, unpack(woken)} end
remember()
redis.call('ZADD', tag_key(band), fmt(start), id)
redis.call('ZADD', entered_key(band), fmt(now), id)
redis.call('ZADD', EXPIRES, fmt(now + expiry), id)
redis.call('HSET', COST, id, cost)
redis.call('HINCRBY', BAND_COST, band, cost)
return {'queued', ahead, unpack(woken)}
""" % {"tenant_idle": TENANT_IDLE_S})

_DISPATCH = Script(_PRELUDE + """
expire()
dispatch()
collect()
return woken
""")

# ARGV[8]: id. Releasing an entry that is not running does nothing.
_RELEASE = Script(_PRELUDE + """
expire()
redis.call('ZREM', RUNNING, ARGV[8])
redis.call('ZREM', GRANTED, ARGV[8])
dispatch()
collect()
return woken
""")

# ARGV[8]: id. Out of the queue if it waits, released if it was granted.
_WITHDRAW = Script(_PRELUDE + """
expire()
local id = ARGV[8]
local b = band_of(id)
if b then remove_waiting(id, b) end
redis.call('ZREM', RUNNING, id)
redis.call('ZREM', GRANTED, id)
dispatch()
collect()
return woken
""")

_WAITING = Script(_PRELUDE + """
return num_waiting()
""")


def _fmt(value: float) -> str:
    return repr(float(value))  # the shortest text that reads back as the same double


class RedisLedger:
    def __init__(self, client: RespClient, backend: str, *, num_bands: int, aging_s: float | None, owner: str,
                 lease_s: float, expiry_s: float, claim_s: float = CLAIM_S, clock: object = None) -> None:
        """`client`: one RESP client, shared by the backends' ledgers. `lease_s`: how long a
        grant holds its slot if its worker dies (the longest request deadline); `expiry_s`: how
        long an entry may wait (the queue timeout) before Redis drops it on its own. `clock`: a
        callable giving the time to use instead of Redis's own (tests only)."""
        self.client = client
        self.backend = backend
        self.owner = owner
        self.num_bands = num_bands
        self.aging_s = aging_s
        self.lease_s = lease_s
        self.expiry_s = expiry_s + EXPIRY_MARGIN_S
        self.claim_s = claim_s
        self.clock = clock
        prefix = "switchyard:flow:{" + backend + "}:"
        self.prefix = prefix
        self._keys = [prefix + name for name in ("vclock", "running", "cost", "band_cost", "expires", "granted")]
        self._keys += [f"{prefix}tag:{b}" for b in range(num_bands)] + [f"{prefix}entered:{b}" for b in range(num_bands)]

    def describe(self) -> str:
        return f"Redis ({self.prefix}*)"

    async def close(self) -> None:
        pass  # the client is the caller's to close: several ledgers share it

    def _args(self, capacity: int) -> list[Any]:
        now = self.clock() if callable(self.clock) else -1.0
        return [_fmt(now), self.num_bands, _fmt(self.aging_s or 0.0), capacity, _fmt(self.lease_s), _fmt(self.claim_s), self.owner]

    async def _call(self, awaitable: Awaitable[Any]) -> Any:
        try:
            return await awaitable
        except (RedisUnavailable, RedisReplyError) as exc:
            raise LedgerError(str(exc)) from None

    async def arrive(self, entry: Entry, *, capacity: int, max_queue: int, max_ahead: int | None) -> Arrival:
        keys = [*self._keys, f"{self.prefix}finish:{entry.tenant}"]
        args = [*self._args(capacity), entry.id, entry.band, entry.cost, _fmt(entry.weight), max_queue,
                -1 if max_ahead is None else max_ahead, _fmt(self.expiry_s)]
        reply = await self._call(self.client.evalsha(_ARRIVE, keys, args))
        return Arrival(reply[0].decode(), int(reply[1]), _ids(reply[2:]))  # type: ignore[arg-type]

    async def dispatch(self, capacity: int) -> tuple[str, ...]:
        return _ids(await self._call(self.client.evalsha(_DISPATCH, self._keys, self._args(capacity))))

    async def release(self, entry_id: str, capacity: int) -> tuple[str, ...]:
        return _ids(await self._call(self.client.evalsha(_RELEASE, self._keys, [*self._args(capacity), entry_id])))

    async def withdraw(self, entry_id: str, capacity: int) -> tuple[str, ...]:
        return _ids(await self._call(self.client.evalsha(_WITHDRAW, self._keys, [*self._args(capacity), entry_id])))

    async def waiting(self) -> int:
        return int(await self._call(self.client.evalsha(_WAITING, self._keys, self._args(0))))


def _ids(items: list[bytes]) -> tuple[str, ...]:
    return tuple(item.decode() for item in items)


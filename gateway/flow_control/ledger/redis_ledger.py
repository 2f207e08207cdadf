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
collects it) and `granted_headroom` (the same, for those granted into the top band's headroom);
`running_top` (sorted set: the entries of `running` sent in the top band, with the same
leases); `sent_top` (sorted set: id -> start tag, the waiting entries sent in the top band —
the band an entry was sent in is known by it where a grant is decided, since aging moves the
entry itself); `finish:<tenant>` (string, expires after `TENANT_IDLE_S`).

Grants travel by `granted`: a step that serves another worker's entry gives it a short lease
(`claim_s`) and lists it there; that worker's next step (at the latest its poll, every
`poll_interval_s` while it has waiters) collects it, extending the lease to `lease_s`. A worker
that dies leaves nothing for long: its grants lapse after `claim_s`, its running leases after
`lease_s`, its waiting entries once they expire.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from gateway.flow_control.ledger.base import Arrival, Entry, Grant, LedgerError
from gateway.keys.resp import RedisReplyError, RedisUnavailable, RespClient, Script

TENANT_IDLE_S = 3600  # a tenant's finish tag is forgotten after this long without a request
CLAIM_S = 5.0  # how long a grant to another worker's entry holds its slot before it is collected
EXPIRY_MARGIN_S = 10.0  # a waiting entry outlives its queue timeout by this, then it is dropped

# ARGV: now (< 0: Redis's own), bands, aging_s (0: none), capacity, top capacity, lease_s,
# claim_s, owner, then the script's own. KEYS: vclock, running, cost, band_cost, expires,
# granted, granted_headroom, running_top, sent_top, tag:0..K-1, entered:0..K-1, then the script's own.
_PRELUDE = """
local now = tonumber(ARGV[1])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local K, aging, capacity, top = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
if top < capacity then top = capacity end
local lease, claim, owner = tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8]
local VCLOCK, RUNNING, COST, BAND_COST, EXPIRES, GRANTED = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local GRANTED_HEADROOM, RUNNING_TOP, SENT_TOP = KEYS[7], KEYS[8], KEYS[9]
local function fmt(x) return string.format('%.17g', x) end
local function tag_key(b) return KEYS[10 + b] end
local function entered_key(b) return KEYS[10 + K + b] end
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
  redis.call('ZREM', SENT_TOP, id)
  local c = tonumber(redis.call('HGET', COST, id) or '0')
  redis.call('HDEL', COST, id)
  redis.call('HINCRBY', BAND_COST, b, -c)
end
local function expire()
  redis.call('ZREMRANGEBYSCORE', RUNNING, '-inf', fmt(now))
  redis.call('ZREMRANGEBYSCORE', RUNNING_TOP, '-inf', fmt(now))
  redis.call('ZREMRANGEBYSCORE', GRANTED, '-inf', fmt(now - claim))
  redis.call('ZREMRANGEBYSCORE', GRANTED_HEADROOM, '-inf', fmt(now - claim))
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
-- fair_order's room: fewer than `top` run, and for an entry not sent in the top band (a lower
-- band's, or one aged into the top band) fewer than `capacity` of those
local function fits(sent_top)
  local running = redis.call('ZCARD', RUNNING)
  if running >= top then return false end
  return sent_top or running - redis.call('ZCARD', RUNNING_TOP) < capacity
end
local function into_headroom(sent_top)
  if sent_top and redis.call('ZCARD', RUNNING) >= capacity then return 1 end
  return 0
end
local function run(id, sent_top, till)
  redis.call('ZADD', RUNNING, fmt(till), id)
  if sent_top then redis.call('ZADD', RUNNING_TOP, fmt(till), id) end
end
local function stop(id)
  redis.call('ZREM', RUNNING, id)
  redis.call('ZREM', RUNNING_TOP, id)
end
local woken = {}  -- id, then 1 when granted into headroom else 0, for each grant
local function dispatch()
  if num_waiting() == 0 then return end
  age()
  while true do
    local head = nil
    for b = 0, K - 1 do
      local first = redis.call('ZRANGE', tag_key(b), 0, 0, 'WITHSCORES')
      if #first > 0 then head = {first[1], tonumber(first[2]), b}; break end
    end
    if not head then break end
    local id, tag, band = head[1], head[2], head[3]
    local sent_top = band == 0 and redis.call('ZSCORE', SENT_TOP, id) ~= false
    if not fits(sent_top) then
      -- no entry like the head can go; only one sent in the top band may, into the headroom,
      -- past a head that aged into it and waits for the lower bands' room
      if sent_top or not fits(true) then break end
      local first = redis.call('ZRANGE', SENT_TOP, 0, 0, 'WITHSCORES')
      if #first == 0 then break end
      id, tag, band, sent_top = first[1], tonumber(first[2]), 0, true
    end
    local headroom = into_headroom(sent_top)
    remove_waiting(id, band)
    if tag > vclock() then redis.call('SET', VCLOCK, fmt(tag)) end
    if owner_of(id) == owner then
      run(id, sent_top, now + lease)
      woken[#woken + 1] = id
      woken[#woken + 1] = headroom
    else
      run(id, sent_top, now + claim)
      redis.call('ZADD', GRANTED, fmt(now), id)
      if headroom == 1 then redis.call('ZADD', GRANTED_HEADROOM, fmt(now), id) end
    end
  end
end
local function forget_grant(id)
  redis.call('ZREM', GRANTED, id)
  redis.call('ZREM', GRANTED_HEADROOM, id)
end
local function collect()
  for _, id in ipairs(redis.call('ZRANGE', GRANTED, 0, -1)) do
    if owner_of(id) == owner then
      local headroom = 0
      if redis.call('ZSCORE', GRANTED_HEADROOM, id) then headroom = 1 end
      forget_grant(id)
      if redis.call('ZSCORE', RUNNING, id) then
        redis.call('ZADD', RUNNING, fmt(now + lease), id)
        if redis.call('ZSCORE', RUNNING_TOP, id) then redis.call('ZADD', RUNNING_TOP, fmt(now + lease), id) end
        woken[#woken + 1] = id
        woken[#woken + 1] = headroom
      end
    end
  end
end
"""

# + KEYS: finish:<tenant>. ARGV[9..]: id, band, cost, weight, max_queue, max_ahead (< 0: none), expiry_s.
# Returns {outcome, ahead, into headroom (1/0), woken...}.
_ARRIVE = Script(_PRELUDE + """
local FINISH = KEYS[10 + 2 * K]
local id, band, cost, weight = ARGV[9], tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
local max_queue, max_ahead, expiry = tonumber(ARGV[13]), tonumber(ARGV[14]), tonumber(ARGV[15])
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
local sent_top = band == 0
-- after dispatch() none sent in the top band waits while there is room for it (one aged into it
-- may, for the lower bands' room): only a lower band's arrival waits its turn behind those waiting
if (sent_top or waiting == 0) and fits(sent_top) then
  local headroom = into_headroom(sent_top)
  remember()
  redis.call('SET', VCLOCK, fmt(start))
  run(id, sent_top, now + lease)
  return {'granted', 0, headroom, unpack(woken)}
end
if waiting >= max_queue then
  local backlog = 0
  for b = 0, K - 1 do backlog = backlog + tonumber(redis.call('HGET', BAND_COST, b) or '0') end
  return {'queue_full', backlog, 0, unpack(woken)}
end
local ahead = 0
for b = 0, band - 1 do ahead = ahead + tonumber(redis.call('HGET', BAND_COST, b) or '0') end
local same = redis.call('ZRANGEBYSCORE', tag_key(band), '-inf', fmt(start), 'WITHSCORES')
for i = 1, #same, 2 do
  local s = tonumber(same[i + 1])
  if s < start or same[i] < id then ahead = ahead + tonumber(redis.call('HGET', COST, same[i]) or '0') end
end
if max_ahead >= 0 and ahead > max_ahead then return {'slo', ahead, 0, unpack(woken)} end
remember()
redis.call('ZADD', tag_key(band), fmt(start), id)
redis.call('ZADD', entered_key(band), fmt(now), id)
if sent_top then redis.call('ZADD', SENT_TOP, fmt(start), id) end
redis.call('ZADD', EXPIRES, fmt(now + expiry), id)
redis.call('HSET', COST, id, cost)
redis.call('HINCRBY', BAND_COST, band, cost)
return {'queued', ahead, 0, unpack(woken)}
""" % {"tenant_idle": TENANT_IDLE_S})

_DISPATCH = Script(_PRELUDE + """
expire()
dispatch()
collect()
return woken
""")

# ARGV[9]: id. Releasing an entry that is not running does nothing.
_RELEASE = Script(_PRELUDE + """
expire()
stop(ARGV[9])
forget_grant(ARGV[9])
dispatch()
collect()
return woken
""")

# ARGV[9]: id. Out of the queue if it waits, released if it was granted.
_WITHDRAW = Script(_PRELUDE + """
expire()
local id = ARGV[9]
local b = band_of(id)
if b then remove_waiting(id, b) end
stop(id)
forget_grant(id)
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
        self._keys = [prefix + name for name in ("vclock", "running", "cost", "band_cost", "expires", "granted", "granted_headroom",
                                                    "running_top", "sent_top")]
        self._keys += [f"{prefix}tag:{b}" for b in range(num_bands)] + [f"{prefix}entered:{b}" for b in range(num_bands)]

    def describe(self) -> str:
        return f"Redis ({self.prefix}*)"

    async def close(self) -> None:
        pass  # the client is the caller's to close: several ledgers share it

    def _args(self, capacity: int, top_capacity: int | None) -> list[Any]:
        now = self.clock() if callable(self.clock) else -1.0
        top = capacity if top_capacity is None else top_capacity
        return [_fmt(now), self.num_bands, _fmt(self.aging_s or 0.0), capacity, top, _fmt(self.lease_s), _fmt(self.claim_s),
                self.owner]

    async def _call(self, awaitable: Awaitable[Any]) -> Any:
        try:
            return await awaitable
        except (RedisUnavailable, RedisReplyError) as exc:
            raise LedgerError(str(exc)) from None

    async def arrive(self, entry: Entry, *, capacity: int, max_queue: int, max_ahead: int | None,
                     top_capacity: int | None = None) -> Arrival:
        keys = [*self._keys, f"{self.prefix}finish:{entry.tenant}"]
        args = [*self._args(capacity, top_capacity), entry.id, entry.band, entry.cost, _fmt(entry.weight), max_queue,
                -1 if max_ahead is None else max_ahead, _fmt(self.expiry_s)]
        reply = await self._call(self.client.evalsha(_ARRIVE, keys, args))
        return Arrival(reply[0].decode(), int(reply[1]), _grants(reply[3:]), int(reply[2]) == 1)  # type: ignore[arg-type]

    async def dispatch(self, capacity: int, top_capacity: int | None = None) -> tuple[Grant, ...]:
        return _grants(await self._call(self.client.evalsha(_DISPATCH, self._keys, self._args(capacity, top_capacity))))

    async def release(self, entry_id: str, capacity: int, top_capacity: int | None = None) -> tuple[Grant, ...]:
        args = [*self._args(capacity, top_capacity), entry_id]
        return _grants(await self._call(self.client.evalsha(_RELEASE, self._keys, args)))

    async def withdraw(self, entry_id: str, capacity: int, top_capacity: int | None = None) -> tuple[Grant, ...]:
        args = [*self._args(capacity, top_capacity), entry_id]
        return _grants(await self._call(self.client.evalsha(_WITHDRAW, self._keys, args)))

    async def waiting(self) -> int:
        return int(await self._call(self.client.evalsha(_WAITING, self._keys, self._args(0, None))))


def _grants(items: list[Any]) -> tuple[Grant, ...]:
    """The scripts' flat `woken` (id, 1 or 0 for into headroom, ...) as grants."""
    return tuple(Grant(items[i].decode(), int(items[i + 1]) == 1) for i in range(0, len(items), 2))


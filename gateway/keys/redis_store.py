"""Per-key counts in Redis, shared by every worker and replica (`[server] state = "redis://..."`).

Each step is one Lua script (EVALSHA; reloaded by the client after a Redis restart), so checking
and counting are one atomic operation on the server: two gateways can never both take the last
request of a minute. The scripts run the algorithm `gateway/keys/store.py` describes, on Redis's
own clock (`TIME`), so replicas whose clocks differ still agree.

Keys, per client key name N (one hash tag, so a Redis Cluster keeps them on one shard):
`switchyard:{N}:buckets` (hash: r, rt, t, tt — the requests and tokens buckets' levels and
when they were set; expires once the buckets would be full again), `switchyard:{N}:in_flight`
(sorted set: reservation id -> lease end), `switchyard:{N}:budget:<period>` (counter; expires
an hour after its period ends).

The client is gateway/keys/resp.py (asyncio, one pipelined connection): no call blocks the
event loop; every call is bounded by `state_timeout_s` (connecting included) and never retried
here — the limiter decides what a failure means (`on_state_error`).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from gateway.keys.limits import BudgetPeriod, KeyLimits
from gateway.keys.resp import RedisReplyError, RedisUnavailable, RespClient, Script
from gateway.keys.store import PARALLEL_RETRY_S, WINDOW_S, Admission, KeyUsage, StateStoreError

BUDGET_GRACE_S = 3600  # a budget counter outlives its period by this, for late settlements

# Shared by the three scripts: the clock (ARGV[1] < 0: Redis's own) and the bucket refill.
_PRELUDE = """
local now = tonumber(ARGV[1])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local window = %(window)s
local function refill(cap, level, at)
  if cap <= 0 then return 0 end
  if not level then return cap end
  local v = level + math.max(0, now - tonumber(at)) * cap / window
  if v > cap then return cap end
  return v
end
local function to_full(cap, level)
  if cap <= 0 then return 0 end
  return math.max(0, (cap - level) * window / cap)
end
""" % {"window": WINDOW_S}

# KEYS: buckets, in_flight, budget. ARGV: now, rpm, tpm, max_parallel, budget, cost, id, lease_s,
# period_end, budget_expire_at (0 = not limited in that way).
# Returns {refused ('' = admitted), retry_after_s, requests level, tokens level, budget used}.
_ADMIT = Script(_PRELUDE + """
local rpm, tpm, par, budget = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local cost, lease = tonumber(ARGV[6]), tonumber(ARGV[8])
local h = redis.call('HMGET', KEYS[1], 'r', 'rt', 't', 'tt')
local r = refill(rpm, tonumber(h[1]), h[2])
local tk = refill(tpm, tonumber(h[3]), h[4])
local used = 0
if budget > 0 then used = tonumber(redis.call('GET', KEYS[3]) or '0') end
local refused, wait = '', 0
if rpm > 0 and r < 1 then
  refused, wait = 'requests', (1 - r) * window / rpm
elseif tpm > 0 and tk < cost then
  refused, wait = 'tokens', (cost - tk) * window / tpm
elseif par > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  if redis.call('ZCARD', KEYS[2]) >= par then refused, wait = 'parallel', %(parallel_retry)s end
end
if refused == '' and budget > 0 and used + cost > budget then
  refused, wait = 'budget', math.max(0, tonumber(ARGV[9]) - now)
end
if refused == '' then
  if rpm > 0 then
    r = r - 1
    redis.call('HSET', KEYS[1], 'r', r, 'rt', now)
  end
  if tpm > 0 then
    tk = tk - cost
    redis.call('HSET', KEYS[1], 't', tk, 'tt', now)
  end
  if rpm > 0 or tpm > 0 then
    redis.call('EXPIRE', KEYS[1], math.ceil(math.max(to_full(rpm, r), to_full(tpm, tk))) + 1)
  end
  if par > 0 then
    redis.call('ZADD', KEYS[2], now + lease, ARGV[7])
    redis.call('EXPIRE', KEYS[2], math.ceil(lease) + 1)
  end
  if budget > 0 then
    used = redis.call('INCRBY', KEYS[3], cost)
    redis.call('EXPIREAT', KEYS[3], ARGV[10])
  end
end
return {refused, tostring(wait), tostring(r), tostring(tk), used}
""" % {"parallel_retry": PARALLEL_RETRY_S})

# KEYS: buckets, in_flight, budget. ARGV: now, rpm, tpm, id, reserved, used.
_SETTLE = Script(_PRELUDE + """
local rpm, tpm = tonumber(ARGV[2]), tonumber(ARGV[3])
local refund = tonumber(ARGV[5]) - tonumber(ARGV[6])
if tpm > 0 and refund ~= 0 then
  local h = redis.call('HMGET', KEYS[1], 'r', 'rt', 't', 'tt')
  local tk = math.min(tpm, refill(tpm, tonumber(h[3]), h[4]) + refund)
  redis.call('HSET', KEYS[1], 't', tk, 'tt', now)
  local r = refill(rpm, tonumber(h[1]), h[2])
  redis.call('EXPIRE', KEYS[1], math.ceil(math.max(to_full(rpm, r), to_full(tpm, tk))) + 1)
end
redis.call('ZREM', KEYS[2], ARGV[4])
if refund ~= 0 and redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('INCRBY', KEYS[3], -refund)
end
return 1
""")

# KEYS: buckets, in_flight, budget. ARGV: now, rpm, tpm. Reads only.
_USAGE = Script(_PRELUDE + """
local rpm, tpm = tonumber(ARGV[2]), tonumber(ARGV[3])
local h = redis.call('HMGET', KEYS[1], 'r', 'rt', 't', 'tt')
local in_flight = redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')
local used = tonumber(redis.call('GET', KEYS[3]) or '0')
return {tostring(refill(rpm, tonumber(h[1]), h[2])), tostring(refill(tpm, tonumber(h[3]), h[4])), in_flight, used}
""")


def redis_keys(name: str, period: BudgetPeriod | None) -> list[str]:
    tag = "switchyard:{" + name + "}"
    return [f"{tag}:buckets", f"{tag}:in_flight", f"{tag}:budget:{period.id if period else '-'}"]


class RedisStore:
    def __init__(self, url: str, *, timeout_s: float, clock: object = None) -> None:
        """`clock`: a callable giving the time to use instead of Redis's own (tests only)."""
        self.url = url
        self.timeout_s = timeout_s
        self.clock = clock
        self._client = RespClient(url, timeout_s=timeout_s)

    def describe(self) -> str:
        return f"Redis at {_without_password(self.url)}"

    async def start(self) -> None:
        pass  # connects on first use: a Redis that is down at start-up is an outage like any other

    async def close(self) -> None:
        await self._client.close()

    def _now(self) -> float:
        return self.clock() if callable(self.clock) else -1.0

    async def _call(self, awaitable: Awaitable[Any]) -> Any:
        try:
            return await awaitable
        except (RedisUnavailable, RedisReplyError) as exc:
            raise StateStoreError(str(exc)) from None

    async def admit(
        self, limits: KeyLimits, cost: int, reservation_id: str, lease_s: float, period: BudgetPeriod | None
    ) -> Admission:
        budget = limits.budget_tokens or 0
        args = [
            self._now(), limits.rpm or 0, limits.tpm or 0, limits.max_parallel or 0, budget, cost, reservation_id, lease_s,
            period.ends_at if period else 0, int(period.ends_at) + BUDGET_GRACE_S if period else 0,
        ]
        refused, wait, requests, tokens, used = await self._call(self._client.evalsha(_ADMIT, redis_keys(limits.name, period), args))
        return Admission(refused=refused.decode() or None, retry_after_s=float(wait), requests=float(requests), tokens=float(tokens),
                         budget_used=int(used))

    async def settle(self, limits: KeyLimits, reservation_id: str, reserved: int, used: int, period: BudgetPeriod | None) -> None:
        args = [self._now(), limits.rpm or 0, limits.tpm or 0, reservation_id, reserved, used]
        await self._call(self._client.evalsha(_SETTLE, redis_keys(limits.name, period), args))

    async def usage(self, limits: KeyLimits, period: BudgetPeriod | None) -> KeyUsage:
        args = [self._now(), limits.rpm or 0, limits.tpm or 0]
        requests, tokens, in_flight, used = await self._call(self._client.evalsha(_USAGE, redis_keys(limits.name, period), args))
        return KeyUsage(
            name=limits.name,
            requests=float(requests) if limits.rpm else None,
            tokens=float(tokens) if limits.tpm else None,
            in_flight=int(in_flight),
            budget_used=int(used) if period is not None else None,
            budget_period=period.id if period is not None else None,
        )


def _without_password(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@")
    return f"{scheme}{sep}{'***@' if at else ''}{host}"

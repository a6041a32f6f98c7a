"""Per-key rate limits in Redis (:class:`RedisRateLimiter`), shared by every
gateway replica of every region of a zone (the region keys them under
``llmmesh:<zone>:rl:``); the algorithm and its error bound are
:mod:`region.admission.ratelimit`'s.

When Redis cannot be reached a reservation raises the client's
``RedisError`` and counts nothing. The gateway (:mod:`region.admission.control`)
then counts the key in its own process, and tries Redis again 5 s later.
So while Redis is down, in any window a key gets at most its limit once
per gateway process of the zone (R regions of one replica each: R times
the limit), plus what Redis counted in that window before it went away:
(R + 1) times the limit over an outage, (R + 2) times if Redis comes back
empty within the window (the embedded one keeps nothing across a restart).
Edges count nothing: every turn is counted by the region that admits it.
A settle that cannot reach Redis leaves the reservation counted in full,
which only limits sooner.
"""

from __future__ import annotations

from collections.abc import Callable

from redis.asyncio import Redis

from llmmesh.region.admission.ratelimit import _US, RateLimiter, RateLimits, _Outcome

# Both scripts take ARGV[1] = now in microseconds, or '' for Redis's own clock.
_NOW_LUA = """
local now_us = tonumber(ARGV[1])
if not now_us then
  local t = redis.call('TIME')
  now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
"""

# KEYS[1]: the key's hash. ARGV: now_us, bucket_us, buckets, rpm, tpm, tokens, ttl_ms.
# Returns {refused, bucket, used_requests, used_tokens, wait_us, reset_requests_us, reset_tokens_us}:
# counts and resets after the admission, or as found on a refusal.
_RESERVE_LUA = (
    _NOW_LUA
    + """
local bucket_us, n = tonumber(ARGV[2]), tonumber(ARGV[3])
local rpm, tpm, tokens = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local current = math.floor(now_us / bucket_us)
local oldest = current - n
local req, tok, stale = {}, {}, {}
local used_r, used_t = 0, 0
local flat = redis.call('HGETALL', KEYS[1])
for i = 1, #flat, 2 do
  local bucket, count = tonumber(string.sub(flat[i], 3)), tonumber(flat[i + 1])
  if bucket < oldest then
    stale[#stale + 1] = flat[i]
  elseif string.sub(flat[i], 1, 1) == 'r' then
    req[bucket] = count
    used_r = used_r + count
  else
    tok[bucket] = count
    used_t = used_t + count
  end
end
if #stale > 0 then
  redis.call('HDEL', KEYS[1], unpack(stale))
end
local function free_in(counts, need)
  local freed = 0
  for bucket = oldest, current do
    freed = freed + (counts[bucket] or 0)
    if freed >= need then
      return (bucket + n + 1) * bucket_us - now_us
    end
  end
  return (current + n + 1) * bucket_us - now_us
end
local function empty_in(counts)
  for bucket = current, oldest, -1 do
    if (counts[bucket] or 0) > 0 then
      return (bucket + n + 1) * bucket_us - now_us
    end
  end
  return 0
end
local wait_r, wait_t = 0, 0
if rpm > 0 and used_r + 1 > rpm then
  wait_r = free_in(req, used_r + 1 - rpm)
end
if tpm > 0 and used_t + tokens > tpm then
  wait_t = free_in(tok, used_t + tokens - tpm)
end
if wait_r > 0 or wait_t > 0 then
  local refused = 'tokens'
  if wait_r >= wait_t then
    refused = 'requests'
  end
  return {refused, current, used_r, used_t, math.max(wait_r, wait_t), empty_in(req), empty_in(tok)}
end
req[current] = (req[current] or 0) + 1
redis.call('HINCRBY', KEYS[1], 'r:' .. current, 1)
if tokens > 0 then
  tok[current] = (tok[current] or 0) + tokens
  redis.call('HINCRBY', KEYS[1], 't:' .. current, tokens)
end
redis.call('PEXPIRE', KEYS[1], ARGV[7])
return {'', current, used_r + 1, used_t + tokens, 0, empty_in(req), empty_in(tok)}
"""
)

# KEYS[1]: the key's hash. ARGV: now_us, bucket_us, buckets, bucket, delta, ttl_ms.
_SETTLE_LUA = (
    _NOW_LUA
    + """
local bucket = tonumber(ARGV[4])
if bucket < math.floor(now_us / tonumber(ARGV[2])) - tonumber(ARGV[3]) then
  return 0
end
local field = 't:' .. bucket
local left = tonumber(redis.call('HGET', KEYS[1], field) or '0') + tonumber(ARGV[5])
if left > 0 then
  redis.call('HSET', KEYS[1], field, left)
  redis.call('PEXPIRE', KEYS[1], ARGV[6])
else
  redis.call('HDEL', KEYS[1], field)
end
return 1
"""
)


class RedisRateLimiter(RateLimiter):
    """The rate limiter shared by every gateway replica of a zone's regions.

    ``clock`` (seconds) replaces Redis's clock, for tests only: key expiry
    still runs on Redis's clock.
    """

    def __init__(
        self,
        redis: Redis,
        prefix: str = "llmmesh:rl:",
        *,
        window_s: float = 60.0,
        buckets: int = 60,
        clock: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(window_s=window_s, buckets=buckets)
        self._prefix = prefix
        self._clock = clock
        self._reserve_script = redis.register_script(_RESERVE_LUA)
        self._settle_script = redis.register_script(_SETTLE_LUA)

    def _now_arg(self) -> str:
        return "" if self._clock is None else str(round(self._clock() * _US))

    async def _reserve(self, key_id: str, limits: RateLimits, tokens: int) -> _Outcome:
        w = self._window
        raw = await self._reserve_script(
            keys=[self._prefix + key_id],
            args=[self._now_arg(), w.bucket_us, w.buckets, limits.rpm, limits.tpm, tokens, w.ttl_ms],
        )
        refused = raw[0].decode() if isinstance(raw[0], bytes) else str(raw[0])
        bucket, used_r, used_t, wait_us, reset_r, reset_t = (int(x) for x in raw[1:7])
        return _Outcome(refused, bucket, used_r, used_t, wait_us, reset_r, reset_t)

    async def _settle(self, key_id: str, bucket: int, delta: int) -> None:
        w = self._window
        await self._settle_script(
            keys=[self._prefix + key_id],
            args=[self._now_arg(), w.bucket_us, w.buckets, bucket, delta, w.ttl_ms],
        )

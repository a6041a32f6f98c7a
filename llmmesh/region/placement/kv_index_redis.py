"""The prefix index in Redis (:class:`RedisPrefixIndex`), shared by router
replicas; the plan it applies is :mod:`region.placement.kv_index`'s."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio
import redis.exceptions

from llmmesh.region.placement.kv_index import (
    ApplyOutcome,
    PodCursor,
    PrefixIndex,
    PrefixIndexError,
    _plan,
    _Remove,
    _Store,
    prefix_block_hashes,
)
from llmmesh.v1 import engine_service_pb2 as pb

# Applies a plan atomically if the pod's cursor is still the one the plan was
# made against (optimistic concurrency: several router replicas may feed the
# same pod). Returns 0 on a conflict; the caller re-plans.
# KEYS: cursor, blocks (pod hash -> router hex), refs (router hex -> count),
# block sizes (pod -> size). ARGV: holders key prefix, pod id, expected
# instance, expected sequence ('' for none), wipe first (0/1), new instance,
# new sequence, block size (0 unchanged), then ops: S pod_hash hex | R pod_hash | C.
_APPLY_LUA = """
local cursor, blocks, refs, sizes = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local holders, pod = ARGV[1], ARGV[2]
local instance = redis.call('HGET', cursor, 'instance_id') or ''
local sequence = redis.call('HGET', cursor, 'last_sequence') or ''
if instance ~= ARGV[3] or sequence ~= ARGV[4] then return 0 end
local function wipe()
  for _, h in ipairs(redis.call('HKEYS', refs)) do redis.call('SREM', holders .. h, pod) end
  redis.call('DEL', blocks, refs)
end
local function unref(h)
  if redis.call('HINCRBY', refs, h, -1) <= 0 then
    redis.call('HDEL', refs, h)
    redis.call('SREM', holders .. h, pod)
  end
end
if ARGV[5] == '1' then wipe() end
local i = 9
while i <= #ARGV do
  local kind = ARGV[i]
  if kind == 'S' then
    local old = redis.call('HGET', blocks, ARGV[i + 1])
    if old ~= ARGV[i + 2] then
      if old then unref(old) end
      redis.call('HSET', blocks, ARGV[i + 1], ARGV[i + 2])
      if redis.call('HINCRBY', refs, ARGV[i + 2], 1) == 1 then
        redis.call('SADD', holders .. ARGV[i + 2], pod)
      end
    end
    i = i + 3
  elseif kind == 'R' then
    local old = redis.call('HGET', blocks, ARGV[i + 1])
    if old then
      redis.call('HDEL', blocks, ARGV[i + 1])
      unref(old)
    end
    i = i + 2
  else
    wipe()
    i = i + 1
  end
end
redis.call('HSET', cursor, 'instance_id', ARGV[6], 'last_sequence', ARGV[7])
if ARGV[8] ~= '0' then redis.call('HSET', sizes, pod, ARGV[8]) end
return 1
"""

# Drops a pod: its blocks from every holder set, its maps and its cursor.
_FORGET_LUA = """
for _, h in ipairs(redis.call('HKEYS', KEYS[3])) do redis.call('SREM', ARGV[1] .. h, ARGV[2]) end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
redis.call('HDEL', KEYS[4], ARGV[2])
return 1
"""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisPrefixIndex(PrefixIndex):
    """The index in Redis, shared by router replicas.

    Keys under ``key_prefix``: ``holders:<hex>`` (a set of the pods holding a
    block), and per pod ``pod:<id>:cursor``, ``pod:<id>:blocks`` (pod hash →
    router hash) and ``pod:<id>:refs`` (router hash → count, for cleanup);
    ``block_sizes`` maps pods to their block size. A batch is applied by one
    Lua script, atomically and only if the pod's cursor is still the one it
    was planned against, so replicas that all follow a pod apply each event
    once, in order. Consistency: eventual, as fresh as the fastest replica's
    feed; reads (:meth:`match`) take two pipelined round trips. The keys are
    not hash-tagged: a Redis Cluster deployment needs one slot per region.
    """

    def __init__(
        self, client: redis.asyncio.Redis, key_prefix: str = "llmmesh:kv", max_attempts: int = 5
    ) -> None:
        self._client = client
        self._prefix = key_prefix
        self._max_attempts = max_attempts
        self._apply_script = client.register_script(_APPLY_LUA)
        self._forget_script = client.register_script(_FORGET_LUA)

    def _pod_keys(self, pod_id: str) -> list[str]:
        base = f"{self._prefix}:pod:{pod_id}"
        return [f"{base}:cursor", f"{base}:blocks", f"{base}:refs", f"{self._prefix}:block_sizes"]

    async def _pipelined(self, build: Callable[[Any], None]) -> list[Any]:
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                build(pipe)
                return await pipe.execute()
        except redis.exceptions.RedisError as err:
            raise PrefixIndexError(f"the prefix index in Redis failed: {err}") from err

    async def apply(self, pod_id: str, batch: pb.StreamKvEventsResponse) -> ApplyOutcome:
        keys = self._pod_keys(pod_id)
        parents = sorted(
            {
                event.block_stored.parent_block_hash
                for event in batch.events
                if event.WhichOneof("kind") == "block_stored" and event.block_stored.parent_block_hash
            }
        )
        for _ in range(self._max_attempts):

            def read(pipe: Any, parents: list[bytes] = parents) -> None:
                pipe.hgetall(keys[0])
                if parents:
                    pipe.hmget(keys[1], parents)

            replies = await self._pipelined(read)
            raw = {_text(k): _text(v) for k, v in replies[0].items()}
            current = PodCursor(raw["instance_id"], int(raw["last_sequence"])) if raw else None
            known = {
                parent: bytes.fromhex(_text(value))
                for parent, value in zip(parents, replies[1] if parents else [], strict=True)
                if value is not None
            }
            plan = _plan(batch, current, known)
            if plan.changes_nothing:
                return plan.outcome
            args: list[bytes | str | int] = [
                f"{self._prefix}:holders:",
                pod_id,
                current.instance_id if current else "",
                str(current.last_sequence) if current else "",
                1 if plan.wipe_first else 0,
                plan.outcome.cursor.instance_id,
                plan.outcome.cursor.last_sequence,
                plan.block_size,
            ]
            for op in plan.ops:
                if isinstance(op, _Store):
                    args += ["S", op.pod_hash, op.block_hash.hex()]
                elif isinstance(op, _Remove):
                    args += ["R", op.pod_hash]
                else:
                    args.append("C")
            try:
                done = await self._apply_script(keys=keys, args=args)
            except redis.exceptions.RedisError as err:
                raise PrefixIndexError(f"the prefix index in Redis failed: {err}") from err
            if int(done) == 1:
                return plan.outcome
        raise PrefixIndexError(f"pod {pod_id}: the shared cursor kept moving; batch not applied")

    async def match(self, token_ids: Sequence[int]) -> dict[str, int]:
        sizes_reply = await self._pipelined(lambda pipe: pipe.hgetall(f"{self._prefix}:block_sizes"))
        by_size: dict[int, set[str]] = {}
        for pod, size in sizes_reply[0].items():
            by_size.setdefault(int(_text(size)), set()).add(_text(pod))
        resident: dict[str, int] = {}
        for size, pods in by_size.items():
            hashes = prefix_block_hashes(token_ids, size)
            alive = pods
            for start in range(0, len(hashes), 32):
                chunk = hashes[start : start + 32]

                def read(pipe: Any, chunk: list[bytes] = chunk) -> None:
                    for block_hash in chunk:
                        pipe.smembers(f"{self._prefix}:holders:{block_hash.hex()}")

                for offset, members in enumerate(await self._pipelined(read)):
                    alive = alive & {_text(member) for member in members}
                    if not alive:
                        break
                    for pod_id in alive:
                        resident[pod_id] = (start + offset + 1) * size
                if not alive:
                    break
        return resident

    async def cursor(self, pod_id: str) -> PodCursor | None:
        reply = await self._pipelined(lambda pipe: pipe.hgetall(self._pod_keys(pod_id)[0]))
        raw = {_text(k): _text(v) for k, v in reply[0].items()}
        return PodCursor(raw["instance_id"], int(raw["last_sequence"])) if raw else None

    async def forget_pod(self, pod_id: str) -> None:
        try:
            await self._forget_script(keys=self._pod_keys(pod_id), args=[f"{self._prefix}:holders:", pod_id])
        except redis.exceptions.RedisError as err:
            raise PrefixIndexError(f"the prefix index in Redis failed: {err}") from err

    async def block_count(self, pod_id: str) -> int:
        reply = await self._pipelined(lambda pipe: pipe.hlen(self._pod_keys(pod_id)[1]))
        return int(reply[0])

    async def drop_all(self) -> None:
        """Delete every key under the prefix (tests, and retiring a region)."""
        try:
            keys = [key async for key in self._client.scan_iter(match=f"{self._prefix}:*", count=500)]
            for start in range(0, len(keys), 500):
                await self._client.delete(*keys[start : start + 500])
        except redis.exceptions.RedisError as err:
            raise PrefixIndexError(f"the prefix index in Redis failed: {err}") from err

"""Which engine pod holds which prefix blocks: the KV-affinity router's index.

Block identity is the router's own, not the pod's: a chained hash of each
block's token ids with its parent block's identity
(:func:`prefix_block_hashes`). It depends only on the tokens and the block
size, so it is the same for the simulator (block 16) and vLLM (block 128),
across pods and across pod restarts, and a prompt's blocks can be computed
without asking any pod. ``BlockStored`` events carry the token ids, so the
index computes the identities itself; ``BlockRemoved`` names only the pod's
own hashes, so the index keeps, per pod, a map pod hash → router hash to
translate removals.

Per pod the index also keeps a cursor (the pod process's ``instance_id`` and
the last event sequence applied). A batch from another process, or one that
does not continue the cursor (a ``gap``, or missed events), drops everything
of the pod first; a batch whose events the index already holds is skipped, so
replays and several subscribers feeding one shared index are harmless.

Two stores: :class:`InMemoryPrefixIndex` (one router process) and
:class:`RedisPrefixIndex` (router replicas share one view). Both apply the
same plan (:func:`_plan`); :class:`RecentPrefixes` is the event-free,
approximate variant: which pod the router itself last sent a prefix to.
"""

from __future__ import annotations

import hashlib
import struct
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import redis.asyncio
import redis.exceptions

from llmmesh.v1 import engine_service_pb2 as pb

ROOT_HASH = b""
_DIGEST_BYTES = 16
_PERSON = b"llmmesh-kv-v1"


def chain_block_hash(parent_hash: bytes, block_token_ids: Sequence[int]) -> bytes:
    """The router's identity of one full block given its parent's (empty for
    the first block of a prompt)."""
    digest = hashlib.blake2b(parent_hash, digest_size=_DIGEST_BYTES, person=_PERSON)
    digest.update(struct.pack(f"<{len(block_token_ids)}I", *block_token_ids))
    return digest.digest()


def iter_prefix_block_hashes(token_ids: Sequence[int], block_size: int) -> Iterator[bytes]:
    """Identities of the full blocks of ``token_ids``, in prefix order, lazily
    (a lookup usually stops at the first block no pod holds)."""
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    parent = ROOT_HASH
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = chain_block_hash(parent, token_ids[start : start + block_size])
        yield parent


def prefix_block_hashes(token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """Identities of every full block of ``token_ids``, in prefix order."""
    return list(iter_prefix_block_hashes(token_ids, block_size))


class PrefixIndexError(Exception):
    """The index's store failed; the batch was not applied (replay it)."""


@dataclass(frozen=True)
class PodCursor:
    """How far the index has followed one pod's event feed."""

    instance_id: str
    last_sequence: int


class ResetReason(StrEnum):
    """Why a pod's blocks were dropped before a batch was applied."""

    INSTANCE_CHANGED = "instance_changed"
    GAP = "gap"
    MISSED_EVENTS = "missed_events"


@dataclass(frozen=True)
class ApplyOutcome:
    """What applying one batch did. ``unresolved`` counts ``BlockStored``
    events skipped because their parent block was unknown (its event was
    lost in a gap): their blocks cannot be placed in a prefix."""

    cursor: PodCursor
    applied: int
    duplicates: int
    reset: ResetReason | None
    unresolved: int


@dataclass(frozen=True)
class _Store:
    pod_hash: bytes
    block_hash: bytes


@dataclass(frozen=True)
class _Remove:
    pod_hash: bytes


@dataclass(frozen=True)
class _Clear:
    pass


_Op = _Store | _Remove | _Clear
_MISSING = object()


@dataclass(frozen=True)
class _Plan:
    """A batch turned into store operations against the pod's state as read."""

    expected: PodCursor | None
    wipe_first: bool
    ops: tuple[_Op, ...]
    block_size: int
    outcome: ApplyOutcome

    @property
    def changes_nothing(self) -> bool:
        return not self.wipe_first and not self.ops and self.outcome.cursor == self.expected


def _plan(batch: pb.StreamKvEventsResponse, current: PodCursor | None, known: Mapping[bytes, bytes]) -> _Plan:
    """Plan a batch against the pod's cursor and its pod-hash → router-hash
    map ``known`` (only parents of stored blocks are looked up in it)."""
    reason: ResetReason | None = None
    if current is not None and current.instance_id != batch.instance_id:
        reason = ResetReason.INSTANCE_CHANGED
    last = current.last_sequence if current is not None and reason is None else 0
    fresh = [event for event in batch.events if event.sequence > last]
    if current is not None and reason is None:
        if fresh and fresh[0].sequence > last + 1:
            reason = ResetReason.GAP if batch.gap else ResetReason.MISSED_EVENTS
        elif batch.gap and not batch.events:
            reason = ResetReason.GAP
    wipe_first = current is None or reason is not None
    use_known = not wipe_first
    overlay: dict[bytes, object] = {}
    ops: list[_Op] = []
    block_size = unresolved = 0
    for event in fresh:
        kind = event.WhichOneof("kind")
        if kind == "block_stored":
            stored = event.block_stored
            size = stored.block_size
            parent: object = ROOT_HASH
            if stored.parent_block_hash:
                parent = overlay.get(stored.parent_block_hash, _MISSING)
                if parent is _MISSING and use_known:
                    parent = known.get(stored.parent_block_hash)
            if (
                not isinstance(parent, bytes)
                or size <= 0
                or len(stored.token_ids) < size * len(stored.block_hashes)
            ):
                unresolved += 1
                continue
            block_size = size
            for position, pod_hash in enumerate(stored.block_hashes):
                parent = chain_block_hash(parent, stored.token_ids[position * size : (position + 1) * size])
                overlay[pod_hash] = parent
                ops.append(_Store(pod_hash, parent))
        elif kind == "block_removed":
            for pod_hash in event.block_removed.block_hashes:
                overlay[pod_hash] = None
                ops.append(_Remove(pod_hash))
        elif kind == "all_blocks_cleared":
            overlay.clear()
            use_known = False
            ops.append(_Clear())
    cursor = PodCursor(batch.instance_id, fresh[-1].sequence if fresh else last)
    outcome = ApplyOutcome(cursor, len(fresh), len(batch.events) - len(fresh), reason, unresolved)
    return _Plan(current, wipe_first, tuple(ops), block_size, outcome)


class PrefixIndex(ABC):
    """Pods' resident prefix blocks, built from their KV-cache event feeds.

    Consistency: eventual. The view of a pod lags its cache by event delivery
    (the feed's batching plus one network hop); a pod that goes silent keeps
    its last view until its feed resumes, resets or the pod is forgotten.
    """

    @abstractmethod
    async def apply(self, pod_id: str, batch: pb.StreamKvEventsResponse) -> ApplyOutcome:
        """Apply one ``StreamKvEvents`` batch of ``pod_id`` (see the module
        docstring for resets and duplicates). Raises PrefixIndexError when the
        store fails; nothing of the batch is applied then."""

    @abstractmethod
    async def match(self, token_ids: Sequence[int]) -> dict[str, int]:
        """Per pod, the tokens of the longest run of leading full blocks of
        ``token_ids`` it holds; pods holding none are left out."""

    @abstractmethod
    async def cursor(self, pod_id: str) -> PodCursor | None:
        """How far the index has followed ``pod_id``; None if never."""

    @abstractmethod
    async def forget_pod(self, pod_id: str) -> None:
        """Drop every block and the cursor of ``pod_id``."""

    @abstractmethod
    async def block_count(self, pod_id: str) -> int:
        """Blocks of ``pod_id`` in the index (its distinct pod hashes)."""


@dataclass
class _PodBlocks:
    cursor: PodCursor
    block_size: int = 0
    router_hash_of: dict[bytes, bytes] = field(default_factory=dict)
    refs: dict[bytes, int] = field(default_factory=dict)


class InMemoryPrefixIndex(PrefixIndex):
    """The index in this process's memory."""

    def __init__(self) -> None:
        self._pods: dict[str, _PodBlocks] = {}
        self._holders: dict[bytes, set[str]] = {}

    async def apply(self, pod_id: str, batch: pb.StreamKvEventsResponse) -> ApplyOutcome:
        state = self._pods.get(pod_id)
        plan = _plan(batch, state.cursor if state else None, state.router_hash_of if state else {})
        if state is None:
            state = self._pods[pod_id] = _PodBlocks(plan.outcome.cursor)
        if plan.wipe_first:
            self._wipe(pod_id, state)
        for op in plan.ops:
            if isinstance(op, _Store):
                old = state.router_hash_of.get(op.pod_hash)
                if old == op.block_hash:
                    continue
                if old is not None:
                    self._unref(pod_id, state, old)
                state.router_hash_of[op.pod_hash] = op.block_hash
                state.refs[op.block_hash] = state.refs.get(op.block_hash, 0) + 1
                self._holders.setdefault(op.block_hash, set()).add(pod_id)
            elif isinstance(op, _Remove):
                removed = state.router_hash_of.pop(op.pod_hash, None)
                if removed is not None:
                    self._unref(pod_id, state, removed)
            else:
                self._wipe(pod_id, state)
        state.cursor = plan.outcome.cursor
        state.block_size = plan.block_size or state.block_size
        return plan.outcome

    def _unref(self, pod_id: str, state: _PodBlocks, block_hash: bytes) -> None:
        count = state.refs[block_hash] - 1
        if count > 0:
            state.refs[block_hash] = count
            return
        del state.refs[block_hash]
        holders = self._holders[block_hash]
        holders.discard(pod_id)
        if not holders:
            del self._holders[block_hash]

    def _wipe(self, pod_id: str, state: _PodBlocks) -> None:
        for block_hash in state.refs:
            holders = self._holders[block_hash]
            holders.discard(pod_id)
            if not holders:
                del self._holders[block_hash]
        state.refs.clear()
        state.router_hash_of.clear()

    async def match(self, token_ids: Sequence[int]) -> dict[str, int]:
        by_size: dict[int, set[str]] = {}
        for pod_id, state in self._pods.items():
            if state.refs and state.block_size:
                by_size.setdefault(state.block_size, set()).add(pod_id)
        resident: dict[str, int] = {}
        for size, pods in by_size.items():
            alive = pods
            for blocks, block_hash in enumerate(iter_prefix_block_hashes(token_ids, size), start=1):
                alive = alive & self._holders.get(block_hash, set())
                if not alive:
                    break
                for pod_id in alive:
                    resident[pod_id] = blocks * size
        return resident

    async def cursor(self, pod_id: str) -> PodCursor | None:
        state = self._pods.get(pod_id)
        return state.cursor if state else None

    async def forget_pod(self, pod_id: str) -> None:
        state = self._pods.pop(pod_id, None)
        if state is not None:
            self._wipe(pod_id, state)

    async def block_count(self, pod_id: str) -> int:
        state = self._pods.get(pod_id)
        return len(state.router_hash_of) if state else 0


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


class RecentPrefixes:
    """Where the router itself sent each prefix recently: the event-free,
    approximate index (llm-d's approximate prefix scorer, vllm-router's
    ``cache_aware``). An LRU of prefix-block identities → pods, each entry
    trusted for ``ttl_s`` after the last turn that used it, at most
    ``capacity`` blocks. It guesses: a pod may have evicted a block since."""

    def __init__(
        self,
        block_size: int = 16,
        capacity: int = 100_000,
        ttl_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if block_size <= 0 or capacity <= 0 or ttl_s <= 0:
            raise ValueError("block_size, capacity and ttl_s must be positive")
        self.block_size = block_size
        self._capacity = capacity
        self._ttl_s = ttl_s
        self._clock = clock
        self._blocks: OrderedDict[bytes, dict[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def record(self, token_ids: Sequence[int], pod_id: str) -> None:
        """Remember that the prompt ``token_ids`` was sent to ``pod_id``."""
        expires = self._clock() + self._ttl_s
        for block_hash in iter_prefix_block_hashes(token_ids, self.block_size):
            pods = self._blocks.pop(block_hash, {})
            pods[pod_id] = expires
            self._blocks[block_hash] = pods
        while len(self._blocks) > self._capacity:
            self._blocks.popitem(last=False)

    def match(self, token_ids: Sequence[int]) -> dict[str, int]:
        """Per pod, the tokens of the longest leading run of ``token_ids``'s
        blocks recently sent to it (same contract as :meth:`PrefixIndex.match`)."""
        now = self._clock()
        resident: dict[str, int] = {}
        alive: set[str] | None = None
        for blocks, block_hash in enumerate(iter_prefix_block_hashes(token_ids, self.block_size), start=1):
            pods = self._blocks.get(block_hash, {})
            fresh = {pod for pod, expires in pods.items() if expires > now}
            alive = fresh if alive is None else alive & fresh
            if not alive:
                break
            for pod_id in alive:
                resident[pod_id] = blocks * self.block_size
        return resident

    def forget_pod(self, pod_id: str) -> None:
        """Drop a pod that restarted or left."""
        for pods in self._blocks.values():
            pods.pop(pod_id, None)

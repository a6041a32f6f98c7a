"""Paged KV-cache blocks with prefix caching, as vLLM's block pool keeps them.

A sequence's tokens fill ``block_size`` blocks, taken as it goes (vLLM's
``allocate_slots``): at admission for its prefix-cache hits and the chunk it
computes first (:meth:`KvBlockPool.allocate`), then one more whenever a step
carries it past a block boundary (:meth:`KvBlockPool.grow`). A full block gets
a chained hash (SHA-256 of its parent's hash and its token ids) when the step
that computes it is scheduled, enters the prefix cache and is announced with
``BlockStored``. A later sequence whose leading full blocks hash the same
reuses them (a prefix-cache hit). Released blocks keep their content: with
refcount 0 they wait in an LRU list and are only evicted (``BlockRemoved``)
when a sequence needs room.

The hashes are this simulator's own, not vLLM's; subscribers index blocks by
the token ids that ``BlockStored`` carries, or compare hashes within one pod.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from llmmesh.engine.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvEventLog

ROOT_PARENT_HASH = b""


def chain_hash(parent_hash: bytes, block_token_ids: Sequence[int]) -> bytes:
    """The hash of a full block given its parent's hash (empty for the first)."""
    digest = hashlib.sha256(parent_hash)
    digest.update(struct.pack(f"<{len(block_token_ids)}I", *block_token_ids))
    return digest.digest()


def full_block_hashes(token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """Chained hashes of every full block of ``token_ids``, in order."""
    hashes: list[bytes] = []
    parent = ROOT_PARENT_HASH
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = chain_hash(parent, token_ids[start : start + block_size])
        hashes.append(parent)
    return hashes


@dataclass
class KvBlock:
    """One physical block. ``block_hash`` is set while it is in the prefix cache."""

    block_id: int
    ref_count: int = 0
    block_hash: bytes | None = None


@dataclass
class KvAllocation:
    """The blocks one sequence holds, in token order."""

    blocks: list[KvBlock]
    cached_tokens: int
    # Hashes of the sequence's leading full blocks seen so far.
    hashes: list[bytes] = field(default_factory=list)


class KvBlockPool:
    """A fixed pool of blocks, its prefix cache and its event feed."""

    def __init__(self, num_blocks: int, block_size: int, events: KvEventLog) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.block_size = block_size
        self._events = events
        self._blocks = [KvBlock(block_id) for block_id in range(num_blocks)]
        self._empty: deque[int] = deque(range(num_blocks))
        # Cached blocks with refcount 0, least recently used first.
        self._evictable: OrderedDict[bytes, int] = OrderedDict()
        self._cached: dict[bytes, int] = {}
        self._in_use = 0
        self.query_tokens = 0
        self.hit_tokens = 0

    @property
    def total_blocks(self) -> int:
        return len(self._blocks)

    @property
    def used_blocks(self) -> int:
        """Blocks some sequence holds."""
        return self._in_use

    @property
    def free_blocks(self) -> int:
        """Blocks a new request could take: empty ones and evictable cached ones."""
        return len(self._empty) + len(self._evictable)

    def resident_hashes(self) -> frozenset[bytes]:
        """Hashes in the prefix cache; a subscriber that applied every event
        since the start holds exactly this set."""
        return frozenset(self._cached)

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks that ``num_tokens`` tokens occupy."""
        return math.ceil(num_tokens / self.block_size)

    def block(self, block_id: int) -> KvBlock:
        return self._blocks[block_id]

    def empty_block_ids(self) -> frozenset[int]:
        """Blocks that hold nothing (neither in use nor cached)."""
        return frozenset(self._empty)

    def allocate(
        self, token_ids: Sequence[int], max_new_tokens: int, *, counted: bool = True
    ) -> KvAllocation | None:
        """Admit a sequence whose tokens so far are ``token_ids``: reuse the
        cached blocks of its leading full blocks and take fresh blocks for the
        chunk it computes first, at most ``max_new_tokens`` tokens. None, with
        nothing changed, when the pool cannot hold them now.

        The last token is never served from cache: the engine must compute it
        to produce the next output token (vLLM does the same). ``counted``
        False keeps the lookup out of the prefix-cache statistics (a decode
        phase hitting the blocks it received is no cache hit).
        """
        if max_new_tokens <= 0:
            raise ValueError("max_new_tokens must be positive")
        hashes = full_block_hashes(token_ids, self.block_size)
        hits: list[KvBlock] = []
        for block_hash in hashes[: (len(token_ids) - 1) // self.block_size]:
            block_id = self._cached.get(block_hash)
            if block_id is None:
                break
            hits.append(self._blocks[block_id])
        cached_tokens = len(hits) * self.block_size
        scheduled_tokens = cached_tokens + min(len(token_ids) - cached_tokens, max_new_tokens)
        needed = self.blocks_for(scheduled_tokens) - len(hits)
        reusable_idle = sum(1 for block in hits if block.ref_count == 0)
        if needed > self.free_blocks - reusable_idle:
            return None
        for block in hits:
            self._acquire(block)
        fresh = self._take_empty(needed)
        for block in fresh:
            self._acquire(block)
        allocation = KvAllocation(hits + fresh, cached_tokens=cached_tokens, hashes=hashes[: len(hits)])
        if counted:
            self.query_tokens += len(token_ids)
            self.hit_tokens += cached_tokens
        self._cache_full_blocks(allocation, token_ids[:scheduled_tokens])
        return allocation

    def receive(self, token_ids: Sequence[int]) -> int:
        """Hold the full blocks of ``token_ids`` in the prefix cache as if
        computed here: KV blocks a prefill pod transferred (disaggregated
        serving). They are announced like any stored block and left
        evictable for the generation that follows to hit. Returns the
        blocks held; 0 when the pool has no room now (the generation then
        computes its prompt itself). Prefix-cache statistics are untouched:
        receiving is not a lookup."""
        full = len(token_ids) // self.block_size * self.block_size
        if full == 0:
            return 0
        allocation = self.allocate(token_ids[:full], full, counted=False)
        if allocation is None:
            return 0
        held = len(allocation.hashes)
        self.free(allocation)
        return held

    def grow(self, allocation: KvAllocation, token_ids: Sequence[int], num_tokens: int) -> bool:
        """Make ``allocation`` hold the first ``num_tokens`` of ``token_ids``
        (the tokens computed by the end of the step being scheduled), taking
        fresh blocks and caching the blocks those tokens fill. False, with
        nothing changed, when the pool has too few free blocks: the scheduler
        then preempts."""
        needed = max(0, self.blocks_for(num_tokens) - len(allocation.blocks))
        if needed > self.free_blocks:
            return False
        for block in self._take_empty(needed):
            self._acquire(block)
            allocation.blocks.append(block)
        # The tokens up to num_tokens, without copying the whole sequence each step.
        self._cache_full_blocks(allocation, token_ids, min(num_tokens, len(token_ids)))
        return True

    def _cache_full_blocks(
        self, allocation: KvAllocation, token_ids: Sequence[int], num_tokens: int | None = None
    ) -> None:
        """Hash the blocks of ``allocation`` that the first ``num_tokens`` of
        ``token_ids`` (all when None) have filled since the last call, cache
        them and announce them. A block whose hash is already cached
        elsewhere stays private (uncached)."""
        filled = len(token_ids) if num_tokens is None else num_tokens
        parent = allocation.hashes[-1] if allocation.hashes else ROOT_PARENT_HASH
        run_parent = parent
        run_hashes: list[bytes] = []
        run_tokens: list[int] = []
        for index in range(len(allocation.hashes), filled // self.block_size):
            start = index * self.block_size
            block_tokens = token_ids[start : start + self.block_size]
            block_hash = chain_hash(parent, block_tokens)
            allocation.hashes.append(block_hash)
            if block_hash in self._cached:
                self._announce(run_parent, run_hashes, run_tokens)
                run_parent, run_hashes, run_tokens = block_hash, [], []
            else:
                block = allocation.blocks[index]
                block.block_hash = block_hash
                self._cached[block_hash] = block.block_id
                run_hashes.append(block_hash)
                run_tokens.extend(block_tokens)
            parent = block_hash
        self._announce(run_parent, run_hashes, run_tokens)

    def _announce(self, parent_hash: bytes, block_hashes: list[bytes], token_ids: list[int]) -> None:
        if block_hashes:
            self._events.append(
                BlockStored(
                    block_hashes=tuple(block_hashes),
                    parent_block_hash=parent_hash,
                    token_ids=tuple(token_ids),
                    block_size=self.block_size,
                )
            )

    def free(self, allocation: KvAllocation) -> None:
        """Release a sequence's blocks (it finished or was preempted). Cached
        blocks stay cached, evictable; tail blocks go to the LRU first, so
        they are evicted before the shared prefix (vLLM's order)."""
        for block in reversed(allocation.blocks):
            if block.ref_count <= 0:
                raise RuntimeError(f"block {block.block_id} freed more often than taken")
            block.ref_count -= 1
            if block.ref_count == 0:
                self._in_use -= 1
                if block.block_hash is not None:
                    self._evictable[block.block_hash] = block.block_id
                else:
                    self._empty.append(block.block_id)
        allocation.blocks = []

    def reset(self) -> bool:
        """Drop the whole prefix cache (``AllBlocksCleared``); refused (False)
        while any block is in use, as vLLM refuses."""
        if self._in_use:
            return False
        for block_id in self._evictable.values():
            self._blocks[block_id].block_hash = None
            self._empty.append(block_id)
        self._evictable.clear()
        self._cached.clear()
        self._events.append(AllBlocksCleared())
        return True

    def _acquire(self, block: KvBlock) -> None:
        if block.ref_count == 0:
            self._in_use += 1
            if block.block_hash is not None:
                del self._evictable[block.block_hash]
        block.ref_count += 1

    def _take_empty(self, count: int) -> list[KvBlock]:
        """``count`` blocks without content, evicting LRU cached ones if needed."""
        taken: list[KvBlock] = []
        evicted: list[bytes] = []
        for _ in range(count):
            if self._empty:
                taken.append(self._blocks[self._empty.popleft()])
                continue
            block_hash, block_id = self._evictable.popitem(last=False)
            del self._cached[block_hash]
            block = self._blocks[block_id]
            block.block_hash = None
            evicted.append(block_hash)
            taken.append(block)
        if evicted:
            self._events.append(BlockRemoved(block_hashes=tuple(evicted)))
        return taken

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
:class:`region.placement.kv_index_redis.RedisPrefixIndex` (router replicas share one
view). Both apply the same plan (:func:`_plan`);
:class:`region.placement.recent_prefixes.RecentPrefixes` is the event-free,
approximate variant: which pod the router itself last sent a prefix to.
"""

from __future__ import annotations

import hashlib
import struct
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

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

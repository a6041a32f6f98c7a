"""The paged KV pool: accounting under incremental allocation and preemption,
prefix hits, eviction and its events."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from llmmesh.engine.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvEventLog
from llmmesh.engine.sim.kv_blocks import KvAllocation, KvBlockPool, full_block_hashes

BLOCK = 4


def resident_from_events(log: KvEventLog) -> set[bytes]:
    """The cache a subscriber rebuilds from the whole feed."""
    resident: set[bytes] = set()
    for event in log.read_after(0).events:
        payload = event.payload
        if isinstance(payload, BlockStored):
            assert not resident & set(payload.block_hashes), "a resident block was stored twice"
            assert len(payload.token_ids) == BLOCK * len(payload.block_hashes)
            resident |= set(payload.block_hashes)
        elif isinstance(payload, BlockRemoved):
            assert set(payload.block_hashes) <= resident, "an unknown block was removed"
            resident -= set(payload.block_hashes)
        else:
            resident.clear()
    return resident


@dataclass
class HeldSequence:
    """A sequence as the scheduler drives the pool: its tokens so far and
    how many of them are computed (covered by its allocation)."""

    tokens: list[int]
    allocation: KvAllocation
    computed: int


def check_invariants(pool: KvBlockPool, log: KvEventLog, held: list[HeldSequence]) -> None:
    blocks = [pool.block(block_id) for block_id in range(pool.total_blocks)]
    assert all(block.ref_count >= 0 for block in blocks)
    assert pool.used_blocks + pool.free_blocks == pool.total_blocks
    assert pool.used_blocks == sum(1 for block in blocks if block.ref_count > 0)
    assert sum(block.ref_count for block in blocks) == sum(len(s.allocation.blocks) for s in held)
    cached = {block.block_id: block.block_hash for block in blocks if block.block_hash is not None}
    assert len(set(cached.values())) == len(cached), "a hash names two blocks"
    assert set(cached.values()) == set(pool.resident_hashes())
    assert not pool.empty_block_ids() & set(cached), "a block is both empty and cached"
    assert all(blocks[block_id].ref_count == 0 for block_id in pool.empty_block_ids())
    # Only prefix-cache hits are shared, and they are cached by definition.
    assert all(block.block_hash is not None for block in blocks if block.ref_count > 1)
    for sequence in held:
        assert len(sequence.allocation.blocks) == pool.blocks_for(sequence.computed), "blocks != tokens"
        assert sequence.allocation.hashes == full_block_hashes(sequence.tokens[: sequence.computed], BLOCK)
    assert resident_from_events(log) == set(pool.resident_hashes())


# Prompts over a two-token alphabet share prefixes often, so hits, evictions
# and refused blocks all happen in a pool of 8 blocks.
prompts = st.lists(st.integers(0, 1), min_size=1, max_size=20)
submits = st.tuples(st.just("submit"), prompts, st.integers(1, 12))
advances = st.tuples(st.just("advance"), st.integers(0, 10), st.integers(1, 16))
# Submits and decode growth are listed twice, so the pool fills up and
# refuses blocks in most examples, not only in rare ones.
operations = st.lists(
    st.one_of(
        submits,
        submits,
        advances,
        advances,
        st.tuples(st.just("preempt"), st.integers(0, 10), st.just(0)),
        st.tuples(st.just("readmit"), st.integers(0, 10), st.integers(1, 12)),
        st.tuples(st.sampled_from(["abort", "finish"]), st.integers(0, 10), st.just(0)),
        st.tuples(st.just("reset"), st.just([0]), st.just(0)),
    ),
    min_size=5,
    max_size=60,
)


def admit(pool: KvBlockPool, tokens: list[int], max_new_tokens: int) -> HeldSequence | None:
    allocation = pool.allocate(tokens, max_new_tokens)
    if allocation is None:
        return None
    assert allocation.cached_tokens % BLOCK == 0 and allocation.cached_tokens < len(tokens)
    computed = allocation.cached_tokens + min(len(tokens) - allocation.cached_tokens, max_new_tokens)
    return HeldSequence(tokens, allocation, computed)


def advance(pool: KvBlockPool, sequence: HeldSequence, num_tokens: int) -> None:
    """Compute ``num_tokens`` more tokens, sampling new ones (decode growth)
    once the prompt is computed; a refused block changes nothing."""
    target = sequence.computed + num_tokens
    grown = sequence.tokens + [target % 2] * max(0, target - len(sequence.tokens))
    blocks_before = list(sequence.allocation.blocks)
    if pool.grow(sequence.allocation, grown, target):
        sequence.tokens, sequence.computed = grown, target
    else:
        assert sequence.allocation.blocks == blocks_before
        assert pool.free_blocks < pool.blocks_for(target) - len(blocks_before)


@settings(max_examples=300, deadline=None)
@given(operations)
def test_accounting_holds_under_any_interleaving(ops: list[tuple[str, object, int]]) -> None:
    log = KvEventLog(retention=10_000)
    pool = KvBlockPool(8, BLOCK, log)
    held: list[HeldSequence] = []
    preempted: list[list[int]] = []
    for kind, arg, extra in ops:
        if kind == "submit":
            assert isinstance(arg, list)
            if (admitted := admit(pool, list(arg), extra)) is not None:
                held.append(admitted)
        elif kind == "readmit" and preempted:
            assert isinstance(arg, int)
            tokens = preempted[arg % len(preempted)]
            if (admitted := admit(pool, tokens, extra)) is not None:
                preempted.remove(tokens)
                held.append(admitted)
        elif kind == "advance" and held:
            assert isinstance(arg, int)
            advance(pool, held[arg % len(held)], extra)
        elif kind in ("preempt", "abort", "finish") and held:
            assert isinstance(arg, int)
            sequence = held.pop(arg % len(held))
            pool.free(sequence.allocation)
            if kind == "preempt":
                preempted.append(sequence.tokens)
        elif kind == "reset":
            assert pool.reset() == (not held)
        check_invariants(pool, log, held)


def test_a_preempted_sequence_hits_its_own_blocks_on_readmission() -> None:
    pool = KvBlockPool(8, BLOCK, KvEventLog(retention=100))
    tokens = list(range(10))
    first = pool.allocate(tokens, 16)
    assert first is not None and len(first.blocks) == 3
    pool.free(first)
    assert pool.used_blocks == 0 and len(pool.resident_hashes()) == 2
    again = pool.allocate(tokens, 16)
    assert again is not None and again.cached_tokens == 8


def test_blocks_are_taken_one_chunk_and_one_boundary_at_a_time() -> None:
    pool = KvBlockPool(4, BLOCK, KvEventLog(retention=100))
    tokens = list(range(10))
    allocation = pool.allocate(tokens, 6)
    assert allocation is not None and len(allocation.blocks) == 2  # the first 6-token chunk
    assert pool.grow(allocation, tokens, 10) and len(allocation.blocks) == 3
    assert pool.grow(allocation, [*tokens, 10, 11], 12) and len(allocation.blocks) == 3
    assert pool.grow(allocation, [*tokens, 10, 11, 12], 13) and len(allocation.blocks) == 4
    assert not pool.grow(allocation, [*tokens, *range(10, 17)], 17), "the pool is full"
    assert len(allocation.blocks) == 4


def test_shared_prefix_hits_and_the_last_token_is_always_computed() -> None:
    log = KvEventLog(retention=100)
    pool = KvBlockPool(16, BLOCK, log)
    prompt = list(range(12))
    first = pool.allocate(prompt, 12)
    assert first is not None and first.cached_tokens == 0
    pool.free(first)
    # The same 12-token prompt: its third block holds the last token, which
    # must be recomputed, so two blocks hit.
    again = pool.allocate(prompt, 12)
    assert again is not None and again.cached_tokens == 8
    assert (pool.query_tokens, pool.hit_tokens) == (24, 8)
    longer = pool.allocate([*prompt, 99], 1)
    assert longer is not None and longer.cached_tokens == 12


def test_eviction_is_lru_and_announced() -> None:
    log = KvEventLog(retention=100)
    pool = KvBlockPool(4, BLOCK, log)
    old = pool.allocate([1] * 8, 8)
    assert old is not None
    pool.free(old)
    new = pool.allocate([2] * 8, 8)
    assert new is not None and pool.grow(new, [2] * 16, 16)
    removed = [e.payload for e in log.read_after(0).events if isinstance(e.payload, BlockRemoved)]
    assert [set(r.block_hashes) for r in removed] == [set(full_block_hashes([1] * 8, BLOCK))]
    assert pool.allocate([3] * 4, 4) is None, "every block is in use"


def test_stored_events_chain_parent_hashes() -> None:
    log = KvEventLog(retention=100)
    pool = KvBlockPool(8, BLOCK, log)
    allocation = pool.allocate(list(range(9)), 16)
    assert allocation is not None
    assert pool.grow(allocation, list(range(12)), 12)
    stored = [e.payload for e in log.read_after(0).events if isinstance(e.payload, BlockStored)]
    hashes = full_block_hashes(list(range(12)), BLOCK)
    assert stored[0].parent_block_hash == b"" and list(stored[0].block_hashes) == hashes[:2]
    assert stored[1].parent_block_hash == hashes[1] and list(stored[1].block_hashes) == hashes[2:]
    assert stored[1].token_ids == (8, 9, 10, 11) and stored[1].medium == "gpu"


def test_reset_clears_the_cache_only_when_idle() -> None:
    log = KvEventLog(retention=100)
    pool = KvBlockPool(4, BLOCK, log)
    allocation = pool.allocate([5] * 8, 8)
    assert allocation is not None
    assert not pool.reset()
    pool.free(allocation)
    assert pool.reset()
    assert isinstance(log.read_after(0).events[-1].payload, AllBlocksCleared)
    assert pool.resident_hashes() == frozenset()

"""The paged KV pool: accounting, prefix hits, eviction and its events."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvEventLog
from engine.sim.kv_blocks import KvAllocation, KvBlockPool, full_block_hashes

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


def check_invariants(pool: KvBlockPool, log: KvEventLog, held: list[KvAllocation]) -> None:
    blocks = [pool.block(block_id) for block_id in range(pool.total_blocks)]
    assert all(block.ref_count >= 0 for block in blocks)
    assert pool.used_blocks + pool.free_blocks == pool.total_blocks
    assert pool.used_blocks == sum(1 for block in blocks if block.ref_count > 0)
    assert sum(block.ref_count for block in blocks) == sum(len(a.blocks) for a in held)
    assert resident_from_events(log) == set(pool.resident_hashes())


# Prompts over a two-token alphabet share prefixes often, so hits and
# evictions both happen in a pool of 12 blocks.
prompts = st.lists(st.integers(0, 1), min_size=1, max_size=20)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("allocate"), prompts, st.integers(0, 8)),
        st.tuples(st.just("grow"), st.integers(0, 10), st.integers(1, 8)),
        st.tuples(st.just("free"), st.integers(0, 10), st.just(0)),
        st.tuples(st.just("reset"), st.just([0]), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(operations)
def test_accounting_holds_under_any_sequence_of_operations(ops: list[tuple[str, object, int]]) -> None:
    log = KvEventLog(retention=10_000)
    pool = KvBlockPool(12, BLOCK, log)
    held: list[tuple[KvAllocation, list[int], int]] = []
    for kind, arg, extra in ops:
        if kind == "allocate":
            assert isinstance(arg, list)
            allocation = pool.allocate(arg, len(arg) + extra)
            if allocation is not None:
                held.append((allocation, list(arg), len(arg) + extra))
        elif kind == "grow" and held:
            assert isinstance(arg, int)
            allocation, tokens, reserved = held[arg % len(held)]
            tokens.extend([1] * min(extra, reserved - len(tokens)))
            pool.cache_full_blocks(allocation, tokens)
        elif kind == "free" and held:
            assert isinstance(arg, int)
            allocation, _, _ = held.pop(arg % len(held))
            pool.free(allocation)
        elif kind == "reset":
            assert pool.reset() == (not held)
        check_invariants(pool, log, [allocation for allocation, _, _ in held])


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
    longer = pool.allocate([*prompt, 99], 13)
    assert longer is not None and longer.cached_tokens == 12


def test_eviction_is_lru_and_announced() -> None:
    log = KvEventLog(retention=100)
    pool = KvBlockPool(4, BLOCK, log)
    old = pool.allocate([1] * 8, 8)
    assert old is not None
    pool.free(old)
    new = pool.allocate([2] * 8, 16)
    assert new is not None
    removed = [e.payload for e in log.read_after(0).events if isinstance(e.payload, BlockRemoved)]
    assert [set(r.block_hashes) for r in removed] == [set(full_block_hashes([1] * 8, BLOCK))]
    assert pool.allocate([3] * 4, 4) is None, "every block is in use"


def test_stored_events_chain_parent_hashes() -> None:
    log = KvEventLog(retention=100)
    pool = KvBlockPool(8, BLOCK, log)
    allocation = pool.allocate(list(range(9)), 16)
    assert allocation is not None
    pool.cache_full_blocks(allocation, list(range(12)))
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

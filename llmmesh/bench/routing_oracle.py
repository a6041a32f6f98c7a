"""Offline reference hit rates of a routing trace: what placement could
have reached, against which a policy's prefix-cache hit rate is read.

The trace is every prompt the router placed, in the order it placed them
(warm-up first, not counted). Hits and queries are counted as the
simulator's pods count them: a prompt queries all its tokens and hits the
tokens of its longest run of leading full blocks found cached, never its
last token (the engine must compute it). Two references:

- ``infinite``: every block any earlier prompt computed is still cached,
  wherever it is needed. No placement and no cache size can do better:
  this is the trace's own reuse, an upper bound.
- ``pooled_lru``: the fleet's whole KV capacity (pods x blocks per pod,
  over every region: tenants are pinned to a region and never share a
  block, so pooling across regions only makes the reference kinder)
  as one cache, managed LRU by block: each prompt hits its longest cached
  prefix, then all its full blocks become the most recently used, the
  least recently used ones evicted beyond capacity. This is perfect
  placement (every turn finds its prefix wherever it was computed, and
  nothing is cached twice) with the pods' own eviction order. It is the
  ORACLE the report divides a policy's hit rate by
  (``hit_rate_share_of_oracle``). It is not a strict bound: it ignores the
  blocks that running generations pin and their replies' blocks (both make
  real pods hit less), and LRU is not the optimal eviction (a placement
  that keeps a tenant's prefix on two pods may outlive LRU's choice, so a
  share slightly above 1 is possible).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class OracleHitRates:
    """The two references of the module docstring, over measured prompts."""

    infinite: float
    pooled_lru: float

    def as_dict(self) -> dict[str, float]:
        return {
            "oracle_infinite_hit_rate": round(self.infinite, 4),
            "oracle_hit_rate": round(self.pooled_lru, 4),
        }


class OracleTrace:
    """A routing trace as the oracle reads it, taken prompt by prompt in
    routing order: each prompt kept as its tokens' count and its full
    blocks' ids, a block's id naming its whole prefix (it follows from its
    parent's id and its own tokens), so equal prefixes get equal ids."""

    def __init__(self, block_size: int) -> None:
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        self.block_size = block_size
        self._ids: dict[tuple[int, tuple[int, ...]], int] = {}
        self._prompts: list[tuple[int, list[int], bool]] = []

    def add(self, prompt: Sequence[int], measured: bool) -> None:
        """The next prompt placed; ``measured`` says whether it counts."""
        blocks: list[int] = []
        parent = -1
        size = self.block_size
        for start in range(0, len(prompt) - size + 1, size):
            key = (parent, tuple(prompt[start : start + size]))
            parent = self._ids.setdefault(key, len(self._ids))
            blocks.append(parent)
        self._prompts.append((len(prompt), blocks, measured))

    def hit_rates(self, capacity_blocks: int) -> OracleHitRates:
        """The references for the trace with ``capacity_blocks`` KV blocks
        in the cluster."""
        if capacity_blocks <= 0:
            raise ValueError("capacity_blocks must be positive")
        size = self.block_size
        seen: set[int] = set()
        lru: OrderedDict[int, None] = OrderedDict()
        queries = infinite_hits = lru_hits = 0
        for tokens, blocks, counted in self._prompts:
            usable = blocks[: (tokens - 1) // size] if tokens else []
            infinite = lru_run = 0
            for block in usable:
                if block not in seen:
                    break
                infinite += 1
            for block in usable:
                if block not in lru:
                    break
                lru_run += 1
            if counted:
                queries += tokens
                infinite_hits += infinite * size
                lru_hits += lru_run * size
            seen.update(blocks)
            for block in blocks:
                lru[block] = None
                lru.move_to_end(block)
            while len(lru) > capacity_blocks:
                lru.popitem(last=False)
        if not queries:
            return OracleHitRates(0.0, 0.0)
        return OracleHitRates(infinite_hits / queries, lru_hits / queries)


def oracle_hit_rates(
    prompts: Sequence[Sequence[int]], measured: Sequence[bool], capacity_blocks: int, block_size: int
) -> OracleHitRates:
    """The references for ``prompts`` in order; ``measured[i]`` says whether
    prompt i counts. ``capacity_blocks`` is the cluster's KV blocks."""
    trace = OracleTrace(block_size)
    for prompt, counted in zip(prompts, measured, strict=True):
        trace.add(prompt, counted)
    return trace.hit_rates(capacity_blocks)

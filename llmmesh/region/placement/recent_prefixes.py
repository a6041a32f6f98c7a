"""The approximate, event-free prefix index: where the router itself sent
each prefix recently."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from llmmesh.region.placement.kv_index import iter_prefix_block_hashes


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

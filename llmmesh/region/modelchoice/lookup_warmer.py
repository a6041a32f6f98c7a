"""Keeping a region's model lookups answered from memory.

Every turn resolves model names through the registry
(:class:`~llmmesh.model_resolver.ModelResolver`: its ``auto``, the model it
names, each model of the region's pods for ``auto``'s candidates). Answers
are remembered, but only once some turn has asked: the first turn of a tier
after a start, or a failover continuation landing on a region that has not
served that tier lately, waited on ``ResolveModel``. The warmer asks ahead,
outside any turn's context, after the pool's health rounds: at
once when the region's models or its zone's tenant tiers change, and every
``period_s`` otherwise. Each pass meets remembered answers past half their
TTL and so refreshes them in the background, so a registry change (a model
retired, registered or re-priced) reaches the region within about
``period_s`` plus the registry's answer time even when no turn comes.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Callable, Collection

from llmmesh.core.errors import MeshError
from llmmesh.core.model_resolver import ModelResolver
from llmmesh.core.tasks import cancel_and_wait
from llmmesh.region.engine_pool import EnginePool
from llmmesh.v1 import common_pb2

log = logging.getLogger(__name__)


class LookupWarmer:
    """Resolves the region's model names for its zone's tiers ahead of the
    turns that need them.

    The pods' tokenizers stay the first turn's to learn (``GetTokenizer``,
    once per model for good): a turn arriving while every pod is down fails
    ENGINE_UNAVAILABLE at tokenization only while the tokenizer is unknown;
    once known, it waits in admission for a slot no pod will free. Learning
    tokenizers ahead would make every such turn wait, so it waits for the
    gateway to refuse a turn with no healthy pod before admission."""

    def __init__(
        self,
        models: ModelResolver,
        pool: EnginePool,
        tiers: Callable[[], Collection[common_pb2.Tier.ValueType]],
        embedding_models: Callable[[], Collection[str]] = tuple,
        period_s: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not period_s > 0:
            raise ValueError("period_s must be positive")
        self._models = models
        self._pool = pool
        self._tiers = tiers
        self._embedding_models = embedding_models
        self._period_s = period_s
        self._clock = clock
        self._task: asyncio.Task[None] | None = None
        self._warmed: tuple[frozenset[str], frozenset[common_pb2.Tier.ValueType]] | None = None
        self._next_at = 0.0
        self._closed = False
        self.passes = 0
        """Passes finished (tests wait for the first)."""

    @property
    def warmed(self) -> tuple[frozenset[str], frozenset[common_pb2.Tier.ValueType]]:
        """The model names and tiers the last finished pass covered."""
        return self._warmed or (frozenset(), frozenset())

    def checked(self) -> None:
        """After a health round: start a pass when one is due (a pool listener)."""
        if self._closed or (self._task is not None and not self._task.done()):
            return
        names = frozenset(self._pool.models) | frozenset(self._embedding_models())
        wanted = (names, frozenset(self._tiers()))
        if not names or (wanted == self._warmed and self._clock() < self._next_at):
            return  # no pod has said what it serves yet, or nothing new and not due
        self._next_at = self._clock() + self._period_s
        # An empty context: the pass belongs to no turn's trace or request id.
        self._task = contextvars.Context().run(asyncio.create_task, self._warm(wanted), name="lookup-warmer")

    async def _warm(self, wanted: tuple[frozenset[str], frozenset[common_pb2.Tier.ValueType]]) -> None:
        names, tiers = wanted
        for tier in sorted(tiers):
            for name in ("auto", *sorted(names)):
                try:
                    await self._models.resolve(name, tier)
                except MeshError as err:  # remembered as a refusal, or the registry is away
                    log.debug("warming model %s for tier %d: %s", name, tier, err.message)
        self._warmed = wanted
        self.passes += 1

    async def close(self) -> None:
        """Stop a pass still running; start no more."""
        self._closed = True
        await cancel_and_wait(self._task)

"""The region's own model calls for a tenant: conversation summaries and memory facts.

Both ask one model in the zone (a setting names it, else the region's chat
model of the smallest size class) through the region's own engine pods, at
the priority behind every tenant's turn (housekeeping waits for paying
work), greedily. Each call is made for one tenant and billed to it within
its limits (:mod:`region.lifecycle.background_usage`): a call its limits
leave no room for is skipped (None). The text sent and written never
leaves the zone.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from llmmesh.core.errors import MeshError, Reason, Unavailable
from llmmesh.core.model_resolver import ModelResolver
from llmmesh.region.admission.fair_queue import UNKNOWN_TIER_PRIORITY
from llmmesh.region.engine_complete import engine_generator
from llmmesh.region.engine_pool import EnginePool
from llmmesh.region.lifecycle.background_usage import BackgroundUsage
from llmmesh.v1 import common_pb2


async def smallest_chat_model(pool: EnginePool, models: ModelResolver, embedding: Collection[str]) -> str:
    """The region's chat model of the smallest size class (then window, then name)."""
    found = []
    for name in pool.models:
        if name in embedding:
            continue
        try:
            model = await models.resolve(name, common_pb2.TIER_ENTERPRISE)
        except MeshError:
            continue
        found.append((model.tier, model.context_window, model.name))
    if not found:
        raise Unavailable(Reason.ENGINE_UNAVAILABLE, "no chat model in the region for its own calls")
    return min(found)[2]


class HousekeepingModel:
    """One of the region's own model calls: which model, how it is asked, and what for."""

    def __init__(
        self,
        pool: EnginePool,
        models: ModelResolver,
        embedding_models: Callable[[], Collection[str]],
        named: str = "",
        *,
        usage: BackgroundUsage | None = None,
        purpose: str = "",
    ) -> None:
        """``named``: the model to use; empty: the smallest chat model.
        ``usage`` bills each call to its tenant as ``purpose``
        (``summary``, ``memory``)."""
        self._pool = pool
        self._models = models
        self._embedding_models = embedding_models
        self._named = named
        self._usage = usage
        self._purpose = purpose

    async def model(self) -> str:
        return self._named or await smallest_chat_model(self._pool, self._models, self._embedding_models())

    async def complete(
        self,
        tenant_id: str,
        model: str,
        turns: list[tuple[str, str]],
        max_tokens: int,
        response_format: common_pb2.ResponseFormat | None = None,
    ) -> str | None:
        """``model``'s greedy reply to (role, text) ``turns`` for the tenant,
        guided by ``response_format`` when given; None when the tenant's
        limits leave no room for it."""
        generate = engine_generator(
            self._pool, model, priority=UNKNOWN_TIER_PRIORITY, response_format=response_format
        )
        if self._usage is None:
            return (await generate(turns, max_tokens)).text
        return await self._usage.run(tenant_id, self._purpose, model, generate, turns, max_tokens)

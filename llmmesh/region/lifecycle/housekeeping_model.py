"""The region's own model calls: conversation summaries and memory facts.

Both ask one model in the zone (a setting names it, else the region's chat
model of the smallest size class) through the region's own engine pods, at
the priority behind every tenant's turn (housekeeping waits for paying
work), greedily. Neither is billed to the tenant: like a safety judgement,
it is the region's own work, and no usage record is written for it. The
text sent and written never leaves the zone.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from llmmesh.core.errors import MeshError, Reason, Unavailable
from llmmesh.core.model_resolver import ModelResolver
from llmmesh.v1 import common_pb2
from llmmesh.region.engine_complete import engine_completer
from llmmesh.region.engine_pool import EnginePool
from llmmesh.region.admission.fair_queue import UNKNOWN_TIER_PRIORITY


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
    """One of the region's own model calls: which model, and how it is asked."""

    def __init__(
        self,
        pool: EnginePool,
        models: ModelResolver,
        embedding_models: Callable[[], Collection[str]],
        named: str = "",
    ) -> None:
        """``named``: the model to use; empty: the smallest chat model."""
        self._pool = pool
        self._models = models
        self._embedding_models = embedding_models
        self._named = named

    async def model(self) -> str:
        return self._named or await smallest_chat_model(self._pool, self._models, self._embedding_models())

    async def complete(
        self,
        model: str,
        turns: list[tuple[str, str]],
        max_tokens: int,
        response_format: common_pb2.ResponseFormat | None = None,
    ) -> str:
        """``model``'s greedy reply to (role, text) ``turns``, guided by ``response_format`` when given."""
        ask = engine_completer(
            self._pool, model, priority=UNKNOWN_TIER_PRIORITY, response_format=response_format
        )
        return await ask(turns, max_tokens)

"""LookupWarmer: the region's model names are resolved for its zone's tiers
ahead of any turn, outside any turn's context; again at once when the
models or tiers change, and every period otherwise, which also refreshes
remembered answers with no turn coming."""

from __future__ import annotations

import asyncio
import contextvars
from dataclasses import dataclass

import grpc
import pytest

from llmmesh.core.model_resolver import ModelResolver
from llmmesh.region.modelchoice.lookup_warmer import LookupWarmer
from llmmesh.v1 import common_pb2, model_registry_service_pb2
from tests.common.test_model_resolver import CountingRegistry
from tests.stack import wait_until

pytestmark = pytest.mark.asyncio

TURN = contextvars.ContextVar("turn", default="")


@dataclass
class Pool:
    models: list[str]


class Registry(CountingRegistry):
    def __init__(self) -> None:
        super().__init__()
        self.asked: list[tuple[str, int]] = []
        self.contexts: list[str] = []

    async def ResolveModel(
        self, request: model_registry_service_pb2.ResolveModelRequest, **options: float
    ) -> model_registry_service_pb2.ResolveModelResponse:
        self.asked.append((request.name, request.tenant_tier))
        self.contexts.append(TURN.get())
        return await super().ResolveModel(request, **options)


async def test_names_and_tokenizers_are_known_before_any_turn_and_kept_fresh() -> None:
    now = [0.0]
    registry = Registry()
    resolver = ModelResolver(registry, ttl_s=30, clock=lambda: now[0])  # type: ignore[arg-type]
    pool = Pool(["m"])
    tiers = {common_pb2.TIER_PRO}
    warmer = LookupWarmer(
        resolver,
        pool,  # type: ignore[arg-type]
        tiers=lambda: tiers,
        embedding_models=lambda: ["e"],
        period_s=15,
        clock=lambda: now[0],
    )
    try:
        token = TURN.set("some turn")
        try:
            warmer.checked()  # from a health round that happens to run in a turn's context
        finally:
            TURN.reset(token)
        await wait_until(lambda: warmer.passes == 1, 5.0, "the first pass")
        pro = common_pb2.TIER_PRO
        assert sorted(registry.asked) == [("auto", pro), ("e", pro), ("m", pro)]
        assert registry.contexts == ["", "", ""]  # outside the turn's context
        # What a turn then asks is answered from memory.
        assert (await resolver.resolve("m", pro)).name == "m-v3"  # auto, e, then m
        assert registry.calls == 3

        warmer.checked()  # nothing changed, not yet due
        await asyncio.sleep(0.05)
        assert warmer.passes == 1

        tiers.add(common_pb2.TIER_FREE)  # a tenant of a new tier: at once
        warmer.checked()
        await wait_until(lambda: warmer.passes == 2, 5.0, "the pass for the new tier")
        assert registry.calls == 6

        now[0] = 16.0  # due: the pass finds every answer past half its TTL and refreshes it
        warmer.checked()
        await wait_until(lambda: warmer.passes == 3 and registry.calls == 12, 5.0, "the refreshes")
    finally:
        await warmer.close()
        await resolver.close()
    warmer.checked()  # closed: starts nothing
    assert warmer.passes == 3


async def test_a_refused_name_does_not_stop_the_pass() -> None:
    registry = Registry()
    resolver = ModelResolver(registry)  # type: ignore[arg-type]
    warmer = LookupWarmer(
        resolver,
        Pool(["m", "n"]),  # type: ignore[arg-type]
        tiers=lambda: {common_pb2.TIER_FREE},
    )
    registry.error = grpc.StatusCode.NOT_FOUND
    try:
        warmer.checked()
        await wait_until(lambda: warmer.passes == 1, 5.0, "the pass")
        assert sorted(name for name, _ in registry.asked) == ["auto", "m", "n"]
    finally:
        await warmer.close()
        await resolver.close()
    with pytest.raises(ValueError, match="period_s"):
        LookupWarmer(resolver, Pool([]), tiers=set, period_s=0)  # type: ignore[arg-type]

"""A change to the model catalog reaches a region at its next heartbeat:
the answer carries the catalog's version, and a region that sees it change
forgets the registry answers it cached, so a retired model is refused from
the next turn on instead of after the cache's TTL."""

from __future__ import annotations

import asyncio
import dataclasses
from decimal import Decimal
from typing import cast

import grpc
import pytest

from llmmesh.core.errors import MeshError
from llmmesh.core.model_resolver import ModelResolver
from llmmesh.globalplane.model_catalog import Model, ModelTier
from llmmesh.region.heartbeat import Heartbeater
from llmmesh.v1 import common_pb2, geo_routing_service_pb2, geo_routing_service_pb2_grpc
from llmmesh.v1 import model_registry_service_pb2_grpc as registry_grpc
from tests.common.test_model_resolver import CountingRegistry
from tests.stack import running_stack

pytestmark = pytest.mark.asyncio

PRO = common_pb2.TIER_PRO


class Directory:
    """Answers heartbeats with the catalog versions given, one per beat."""

    def __init__(self, *versions: str) -> None:
        self.versions = list(versions)

    async def Heartbeat(
        self, request: geo_routing_service_pb2.HeartbeatRequest, **options: float
    ) -> geo_routing_service_pb2.HeartbeatResponse:
        return geo_routing_service_pb2.HeartbeatResponse(
            interval_ms=1000, model_catalog_version=self.versions.pop(0)
        )


async def test_a_changed_catalog_version_is_reported_once_and_the_first_is_only_noted() -> None:
    changes: list[str] = []
    beater = Heartbeater(
        cast(geo_routing_service_pb2_grpc.GeoRoutingServiceStub, Directory("v1", "v1", "", "v2", "v2")),
        geo_routing_service_pb2.RegionReport,
        1.0,
        on_catalog_change=lambda: changes.append("changed"),
    )
    for _ in range(5):
        assert await beater.beat()
    # "" (a plane that does not say) changes nothing; v1 -> v2 is one change.
    assert changes == ["changed"]
    assert beater.catalog_version == "v2"


async def test_forget_all_drops_answers_and_keeps_none_asked_for_before_it() -> None:
    registry = CountingRegistry()
    resolver = ModelResolver(
        cast(registry_grpc.ModelRegistryServiceStub, registry), ttl_s=30, clock=lambda: 0.0
    )
    assert (await resolver.resolve("m", PRO)).name == "m-v1"
    resolver.forget_all()
    assert (await resolver.resolve("m", PRO)).name == "m-v2"
    # An answer in flight when the catalog changed is used by its caller but not kept.
    registry.latency_s = 0.05
    asking = asyncio.create_task(resolver.resolve("n", PRO))
    await asyncio.sleep(0.01)
    resolver.forget_all()
    assert (await asking).name == "n-v3"
    registry.latency_s = 0.0
    assert (await resolver.resolve("n", PRO)).name == "n-v4"
    assert (await resolver.resolve("n", PRO)).name == "n-v4"


async def test_a_repriced_or_retired_model_is_seen_at_the_region_s_next_heartbeat() -> None:
    async with running_stack() as stack:
        catalog = stack.global_plane.catalog
        extra = Model("m-extra", ModelTier.SMALL, 4096, Decimal("0.001"), Decimal("0.002"))
        await catalog.upsert_model(extra)
        before = await catalog.version()
        assert await catalog.version() == before
        assert await stack.region.heartbeat.beat()
        assert stack.region.heartbeat.catalog_version == before
        resolver = stack.region.models
        assert (await resolver.resolve("m-extra", PRO)).name == "m-extra"

        # A new price is a change of the catalog too.
        await catalog.upsert_model(dataclasses.replace(extra, output_per_1k_usd=Decimal("0.003")))
        repriced = await catalog.version()
        assert repriced != before
        assert await stack.region.heartbeat.beat()
        assert (await resolver.resolve("m-extra", PRO)).pricing.output_per_1k_usd == "0.003"

        await catalog.upsert_model(dataclasses.replace(extra, retired=True))
        assert await catalog.version() not in (before, repriced)
        # Within the TTL the cached answer still stands; the heartbeat's answer ends it.
        assert (await resolver.resolve("m-extra", PRO)).name == "m-extra"
        assert await stack.region.heartbeat.beat()
        with pytest.raises(MeshError) as refused:
            await resolver.resolve("m-extra", PRO)
        assert (refused.value.code, refused.value.reason) == (
            grpc.StatusCode.FAILED_PRECONDITION,
            "MODEL_RETIRED",
        )

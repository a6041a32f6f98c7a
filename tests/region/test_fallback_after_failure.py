"""A turn whose chosen model fails on every pod after the choice (before
its first event) falls back to another model of the same region when it
may; otherwise it meets the 503 it always met. In process, on real gRPC
servers: a global plane, one simulator pod per model, one region whose
health checks are too slow to notice a pod stopped under it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from decimal import Decimal

import grpc
import pytest
import pytest_asyncio

from llmmesh.core.model_family import LARGE, SMALL, FamilyModel
from llmmesh.engine.server import EnginePod
from llmmesh.globalplane.model_catalog import Model as CatalogModel
from llmmesh.globalplane.model_catalog import ModelTier
from llmmesh.globalplane.server import GlobalPlane
from llmmesh.globalplane.tiers import TenantTier
from llmmesh.region.modelchoice.difficulty_route import FALLBACK, ROUTE_DECISIONS, FleetPolicy
from llmmesh.region.server import RegionPlane
from llmmesh.region.tokenizer_client import TokenizerClient
from llmmesh.v1 import chat_service_pb2, common_pb2
from tests.region.test_region_turns import Outcome, turn
from tests.stack import DEV_KEY, MeshBuilder, region_settings, wait_until

pytestmark = pytest.mark.asyncio

HARD = (
    "Implement a Python function that solves A x = b and prove that it converges, step by step.\n"
    "```python\ndef solve(a, b):\n    return None\n```\n"
)


@dataclass
class Fleet:
    glob: GlobalPlane
    pods: dict[str, EnginePod]
    region: RegionPlane


def catalog_model(member: FamilyModel) -> CatalogModel:
    return CatalogModel(
        name=member.name,
        tier=ModelTier(member.tier),
        context_window=4096,
        input_per_1k_usd=Decimal(member.input_per_1k_usd),
        output_per_1k_usd=Decimal(member.output_per_1k_usd),
    )


@asynccontextmanager
async def running_fleet(*, warm: bool) -> AsyncIterator[Fleet]:
    """The fleet; ``warm``: after a turn on each model (the region has learnt both tokenizers)."""
    async with MeshBuilder() as build:
        glob = await build.global_plane()
        for member in (SMALL, LARGE):
            await glob.catalog.upsert_model(catalog_model(member))
        pods = {
            member.name: await build.pod(f"us-east-pod-{n}", model=member.name)
            for n, member in enumerate((SMALL, LARGE))
        }
        # Health checks a minute apart: a pod stopped now is still thought healthy at the next turn.
        settings = region_settings(glob.address, list(pods.values()), engine_health_interval_ms=60_000)
        region = await build.region(settings)
        await wait_until(lambda: len(region.pool.healthy_pods) == 2, what="the region knows both pods")
        for member in (SMALL, LARGE) if warm else ():
            done = await turn(region.address, DEV_KEY, request("Hello there.", model=member.name))
            assert done.error is None, done.error
        yield Fleet(glob, pods, region)


@pytest_asyncio.fixture
async def fleet() -> AsyncIterator[Fleet]:
    async with running_fleet(warm=True) as running:
        yield running


def request(text: str, model: str = "auto") -> chat_service_pb2.ChatRequest:
    return chat_service_pb2.ChatRequest(
        start=chat_service_pb2.ChatStart(
            request_id=f"req-{uuid.uuid4().hex[:12]}",
            model=model,
            messages=[common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_USER, content=text)],
            sampling=common_pb2.SamplingParams(max_tokens=6),
        )
    )


async def secret_of(fleet: Fleet, tier: TenantTier) -> str:
    book = fleet.glob.tenants
    tenant = await book.create_tenant(f"t-{uuid.uuid4().hex[:10]}", "us", tier)
    _, secret = await book.create_api_key(tenant.id)
    await fleet.region.policy.refresh()
    return secret


async def stop_large_pod_unnoticed(fleet: Fleet) -> None:
    await fleet.pods[LARGE.name].stop(0)
    assert len(fleet.region.pool.healthy_pods) == 2, "the region must still think the large pod up"


async def test_auto_falls_back_when_every_pod_of_its_model_fails_before_output(fleet: Fleet) -> None:
    before = ROUTE_DECISIONS.labels(SMALL.name, FALLBACK)._value.get()
    await stop_large_pod_unnoticed(fleet)
    outcome: Outcome = await turn(fleet.region.address, DEV_KEY, request(HARD))
    assert outcome.error is None, outcome.error
    started = outcome.events[0].started
    assert (started.model, started.region, started.zone) == (SMALL.name, "us-east", "us")
    assert started.route.reason == FALLBACK
    assert f"{LARGE.name} failed on every pod in the region before output" in started.route.detail
    assert f"{SMALL.name} serves" in started.route.detail
    assert outcome.finished.reason == common_pb2.FINISH_REASON_LENGTH
    assert outcome.usage.output_tokens == 6
    assert ROUTE_DECISIONS.labels(SMALL.name, FALLBACK)._value.get() == before + 1
    # The failed pod is out of placement; the next hard turn falls back at choice time.
    again = await turn(fleet.region.address, DEV_KEY, request(HARD))
    assert again.error is None and again.events[0].started.model == SMALL.name


async def test_a_named_model_falls_back_only_where_the_tier_allows(fleet: Fleet) -> None:
    await stop_large_pod_unnoticed(fleet)
    outcome = await turn(fleet.region.address, DEV_KEY, request(HARD, model=LARGE.name))
    assert outcome.error is not None and not outcome.events
    assert outcome.error.code == grpc.StatusCode.UNAVAILABLE


async def test_a_named_model_of_a_tier_the_policy_names_falls_back(fleet: Fleet) -> None:
    fleet.region.gateway.model_router.policy = FleetPolicy.of(2.0, "enterprise")
    secret = await secret_of(fleet, TenantTier.ENTERPRISE)
    await stop_large_pod_unnoticed(fleet)
    outcome = await turn(fleet.region.address, secret, request(HARD, model=LARGE.name))
    assert outcome.error is None, outcome.error
    started = outcome.events[0].started
    assert (started.model, started.route.reason) == (SMALL.name, FALLBACK)
    assert started.route.requested_model == LARGE.name


async def test_with_no_other_model_up_the_turn_is_unavailable(fleet: Fleet) -> None:
    await fleet.pods[SMALL.name].stop(0)
    await stop_large_pod_unnoticed(fleet)
    outcome = await turn(fleet.region.address, DEV_KEY, request(HARD))
    assert outcome.error is not None and not outcome.events
    assert outcome.error.code == grpc.StatusCode.UNAVAILABLE


async def test_a_turn_whose_model_cannot_tokenize_its_prompt_falls_back_too() -> None:
    async with running_fleet(warm=False) as fleet:
        # A region that asks its pods to tokenize (it knows no tokenizer of its own).
        fleet.region.gateway.preparation.prompts._tokenizer = TokenizerClient(fleet.region.pool, local=False)
        await stop_large_pod_unnoticed(fleet)
        outcome = await turn(fleet.region.address, DEV_KEY, request(HARD))
        assert outcome.error is None, outcome.error
        started = outcome.events[0].started
        assert (started.model, started.route.reason) == (SMALL.name, FALLBACK)
        assert f"{LARGE.name} failed on every pod in the region before output" in started.route.detail

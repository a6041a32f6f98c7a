"""ModelRouter: which of the region's models serves a turn, and why.

The pods are handles the router reads (health, model, batch size, turns in
flight); the registry is a table of models. No network."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import cast

import pytest
import pytest_asyncio

from llmmesh.core.errors import FailedPrecondition, NotFound, Reason
from llmmesh.core.model_resolver import ModelResolver
from llmmesh.region.engine_pool import EnginePool
from llmmesh.region.metrics import REGISTRY
from llmmesh.region.modelchoice.difficulty_route import FleetPolicy, ModelRouter
from llmmesh.region.placement.router import LoadBoard
from llmmesh.region.policy_cache import Caller
from llmmesh.v1 import chat_service_pb2, common_pb2, policy_service_pb2
from llmmesh.v1 import model_registry_service_pb2 as mpb

HARD = "Implement a Python function and prove that it solves the equation 2 * x = 6, step by step."


def model(name: str, tier: mpb.ModelTier.ValueType, price: str, **fields: object) -> mpb.Model:
    return mpb.Model(
        name=name,
        tier=tier,
        context_window=4096,
        pricing=mpb.ModelPricing(input_per_1k_usd=price, output_per_1k_usd=price),
        **fields,  # type: ignore[arg-type]
    )


SMALL = model("m-small", mpb.MODEL_TIER_SMALL, "0.001")
LARGE = model("m-large", mpb.MODEL_TIER_LARGE, "0.01")
TINY_DEFAULT = model("m-default", mpb.MODEL_TIER_SMALL, "0.001")


@dataclass
class Registry:
    """What ResolveModel answers: by name, and "auto" as the tier default."""

    models: dict[str, mpb.Model] = field(default_factory=dict)
    default: str = "m-default"

    async def resolve(self, name: str, tier: common_pb2.Tier.ValueType) -> mpb.Model:
        wanted = self.default if name in ("", "auto") else name
        if wanted not in self.models:
            raise NotFound(Reason.UNKNOWN_MODEL, f"unknown model {wanted!r}")
        found = self.models[wanted]
        if found.retired:
            raise FailedPrecondition(Reason.MODEL_RETIRED, f"model {wanted!r} is retired")
        return found


@dataclass
class Region:
    pool: EnginePool
    registry: Registry
    budget: list[float | None]

    def router(self, policy: FleetPolicy | None = None) -> ModelRouter:
        async def budget_left(_caller: Caller) -> float | None:
            return self.budget[0]

        return ModelRouter(
            cast(ModelResolver, self.registry), self.pool, LoadBoard(self.pool), budget_left, policy=policy
        )


@pytest_asyncio.fixture
async def region() -> AsyncIterator[Region]:
    names = ["m-small", "m-large", "m-large-v2"]
    pool = EnginePool([f"127.0.0.1:{9 + n}" for n in range(len(names))])
    for n, (pod, name) in enumerate(zip(pool.pods, names, strict=True)):
        pod.pod_id, pod.model, pod.healthy = f"pod-{n}", name, True
        pod.info.max_num_seqs = 2
    registry = Registry({m.name: m for m in (SMALL, LARGE, TINY_DEFAULT)})
    try:
        yield Region(pool, registry, [None])
    finally:
        await pool.close()


def caller(tier: common_pb2.Tier.ValueType = common_pb2.TIER_PRO) -> Caller:
    return Caller(policy_service_pb2.Tenant(id="t1", tier=tier), "key-1")


def start(text: str, name: str = "auto", request_id: str = "req-1") -> chat_service_pb2.ChatStart:
    message = common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_USER, content=text)
    return chat_service_pb2.ChatStart(model=name, messages=[message], request_id=request_id)


def decisions(name: str, reason: str) -> float:
    value = REGISTRY.get_sample_value(
        "llmmesh_region_route_decisions_total", {"model": name, "reason": reason}
    )
    return value or 0.0


@pytest.mark.asyncio
async def test_auto_picks_the_cheapest_model_of_the_wanted_tier(region: Region) -> None:
    router = region.router()
    before = decisions("m-large", "difficulty")
    chosen, route = await router.choose(start("Hello, how are you?"), caller())
    assert (chosen.name, route.reason, route.requested_model) == ("m-small", "difficulty", "auto")
    chosen, route = await router.choose(start(HARD), caller())
    assert (chosen.name, route.reason) == ("m-large", "difficulty")
    assert route.difficulty >= 0.3 and "code" in route.detail and "maths" in route.detail
    assert decisions("m-large", "difficulty") == before + 1


@pytest.mark.asyncio
async def test_an_overloaded_model_falls_back_to_another_of_the_region(region: Region) -> None:
    for pod in region.pool.pods:
        if pod.model == "m-large":
            pod.in_flight = 4  # two batches deep
    chosen, route = await region.router().choose(start(HARD), caller())
    assert (chosen.name, route.reason) == ("m-small", "fallback")
    assert "m-large overloaded or down" in route.detail
    # Below the factor it is not overloaded.
    chosen, _ = await region.router(FleetPolicy(fallback_queue_factor=3.0)).choose(start(HARD), caller())
    assert chosen.name == "m-large"


@pytest.mark.asyncio
async def test_a_named_model_falls_back_only_for_tiers_the_policy_names(region: Region) -> None:
    for pod in region.pool.pods:
        if pod.model == "m-large":
            pod.healthy = False
    chosen, route = await region.router().choose(start("hi", "m-large"), caller())
    assert (chosen.name, route.reason) == ("m-large", "requested")
    policy = FleetPolicy(named_fallback_tiers=frozenset({common_pb2.TIER_ENTERPRISE}))
    chosen, route = await region.router(policy).choose(
        start("hi", "m-large"), caller(common_pb2.TIER_ENTERPRISE)
    )
    assert (chosen.name, route.reason) == ("m-small", "fallback")


@pytest.mark.asyncio
async def test_a_spent_budget_keeps_auto_on_the_small_tier(region: Region) -> None:
    region.budget[0] = 0.01
    chosen, route = await region.router().choose(start(HARD), caller())
    assert (chosen.name, route.reason) == ("m-small", "budget")


@pytest.mark.asyncio
async def test_a_canary_takes_its_share_where_it_is_deployed(region: Region) -> None:
    region.registry.models["m-large-v2"] = model(
        "m-large-v2", mpb.MODEL_TIER_LARGE, "0.01", canary_of="m-large"
    )
    region.registry.models["m-large"] = model(
        "m-large", mpb.MODEL_TIER_LARGE, "0.01", canaries=[mpb.ModelCanary(name="m-large-v2", percent=50)]
    )
    served = {
        (await region.router().choose(start(HARD, request_id=f"r{n}"), caller()))[0].name for n in range(40)
    }
    # Some turns of each; the canary is never a difficulty candidate of its own.
    assert served == {"m-large", "m-large-v2"}


@pytest.mark.asyncio
async def test_with_one_model_auto_keeps_the_default_or_the_region_s_model(region: Region) -> None:
    region.registry.models["m-large"] = model("m-large", mpb.MODEL_TIER_LARGE, "0.01", retired=True)
    chosen, route = await region.router().choose(start(HARD), caller())
    # The tier's default is not deployed here; the region's one usable model serves.
    assert (chosen.name, route.reason) == ("m-small", "default")


def test_the_policy_reads_the_region_settings() -> None:
    policy = FleetPolicy.of(1.5, "Pro, enterprise")
    assert policy.fallback_queue_factor == 1.5
    assert policy.named_fallback_tiers == {common_pb2.TIER_PRO, common_pb2.TIER_ENTERPRISE}
    assert FleetPolicy.of(2.0, "").named_fallback_tiers == frozenset()
    with pytest.raises(ValueError, match="unknown tier 'gold'"):
        FleetPolicy.of(2.0, "gold")
    with pytest.raises(ValueError, match="fallback_queue_factor"):
        FleetPolicy.of(0.0, "")

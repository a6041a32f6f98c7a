"""Background work billed: conversation summaries and model-extracted facts
run on the region's pods for a tenant are billed to it as lines of their
own (the tokens its pods counted for them), within its daily background
cap and monthly quota; work they leave no room for is skipped."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from llmmesh.core.grpcserver import open_channel
from llmmesh.region import metrics as region_metrics
from llmmesh.region.engine_complete import Completion, engine_generator
from llmmesh.region.lifecycle import housekeeping_model
from llmmesh.v1 import (
    billing_service_pb2,
    billing_service_pb2_grpc,
    chat_service_pb2,
    chat_service_pb2_grpc,
    common_pb2,
    policy_service_pb2,
    policy_service_pb2_grpc,
)
from tests.stack import Stack, running_stack

pytestmark = pytest.mark.asyncio

SAYS = "My name is Greta and I live in Oslo. Fact {n}: the number {n} is " + "very " * 12 + "important."


@pytest.fixture
def pods_counted(monkeypatch: pytest.MonkeyPatch) -> list[Completion]:
    """The completions of the region's background calls, in order, as their pods counted them."""
    made: list[Completion] = []

    def recording(pool: Any, model: str, **options: Any) -> Any:
        generate = engine_generator(pool, model, **options)

        async def complete(turns: list[tuple[str, str]], max_tokens: int) -> Completion:
            done = await generate(turns, max_tokens)
            made.append(done)
            return done

        return complete

    monkeypatch.setattr(housekeeping_model, "engine_generator", recording)
    return made


async def tenant_key(stack: Stack, name: str, **policy: Any) -> tuple[str, str]:
    """A new tenant with ``policy`` and memory on: its id and a key."""
    async with open_channel(stack.global_plane.address) as channel:
        stub = policy_service_pb2_grpc.PolicyServiceStub(channel)
        spec = policy_service_pb2.Tenant(
            name=name, zone="us", tier=common_pb2.TIER_PRO, memory_enabled=True, **policy
        )
        tenant = (await stub.CreateTenant(policy_service_pb2.CreateTenantRequest(tenant=spec))).tenant
        made = await stub.CreateApiKey(policy_service_pb2.CreateApiKeyRequest(tenant=tenant.id))
    assert await stack.region.policy.refresh()
    return tenant.id, str(made.secret)


async def turns(stack: Stack, key: str, count: int) -> None:
    """``count`` turns of one end user in one conversation, each waited for with its background work."""
    metadata = (("authorization", f"Bearer {key}"),)
    async with open_channel(stack.region.address) as channel:
        chat = chat_service_pb2_grpc.ChatServiceStub(channel)
        request = chat_service_pb2.CreateConversationRequest()
        conv = (await chat.CreateConversation(request, metadata=metadata)).conversation
        for n in range(count):
            call = chat.Chat(metadata=metadata)
            start = chat_service_pb2.ChatStart(
                model="auto",
                conversation_id=conv.id,
                user="greta",
                messages=[common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_USER, content=SAYS.format(n=n))],
                sampling=common_pb2.SamplingParams(max_tokens=4),
            )
            await call.write(chat_service_pb2.ChatRequest(start=start))
            await call.done_writing()
            events = [event async for event in call]
            assert events[-1].HasField("finished"), events[-1]
            await settled(stack)


async def settled(stack: Stack) -> None:
    """Wait for the background work running and the usage it recorded to reach billing."""
    memory = stack.region.gateway.memory
    assert memory is not None
    await memory.drain()
    summaries = stack.region.lifecycle.summaries
    for _ in range(200):
        if summaries is None or not summaries._running:
            break
        await asyncio.sleep(0.02)
    await stack.region.gateway.drain()
    assert await stack.region.shipper.flush(timeout_s=10)


async def usage(stack: Stack, tenant_id: str) -> billing_service_pb2.GetUsageResponse:
    async with open_channel(stack.global_plane.address) as channel:
        billing = billing_service_pb2_grpc.BillingServiceStub(channel)
        answer: billing_service_pb2.GetUsageResponse = await billing.GetUsage(
            billing_service_pb2.GetUsageRequest(tenant_id=tenant_id)
        )
        return answer


def background(
    answer: billing_service_pb2.GetUsageResponse, purpose: int
) -> list[billing_service_pb2.ModelUsage]:
    return [line for line in answer.models if line.purpose == purpose]


def skipped(reason: str) -> float:
    value = region_metrics.REGISTRY.get_sample_value(
        "llmmesh_region_background_skipped_total", {"purpose": "memory", "reason": reason}
    )
    return value or 0.0


async def test_summaries_and_facts_are_billed_as_their_own_lines_with_the_tokens_the_pods_counted(
    pods_counted: list[Completion],
) -> None:
    overrides = {"memory_extractor": "model"}
    async with running_stack(context_window=256, region_overrides=overrides) as stack:
        tenant_id, key = await tenant_key(stack, "billed-background")
        await turns(stack, key, 10)
        answer = await usage(stack, tenant_id)
    made = pods_counted
    summary = background(answer, billing_service_pb2.USAGE_PURPOSE_SUMMARY)
    memory = background(answer, billing_service_pb2.USAGE_PURPOSE_MEMORY)
    turn = background(answer, billing_service_pb2.USAGE_PURPOSE_TURN)
    assert summary and memory and turn
    # Every background call is billed, in full, as background: the turns' lines hold the turns alone.
    billed = sum(line.input_tokens + line.output_tokens for line in summary + memory)
    assert billed == sum(done.input_tokens + done.output_tokens for done in made) > 0
    assert sum(line.requests for line in summary + memory) == 0
    assert sum(line.requests for line in turn) == answer.requests == 10
    assert answer.input_tokens == sum(line.input_tokens for line in answer.models)


async def test_background_work_stays_within_the_daily_cap_and_is_skipped_at_the_quota(
    pods_counted: list[Completion],
) -> None:
    overrides = {"memory_extractor": "model", "summaries_enabled": False}
    async with running_stack(region_overrides=overrides) as stack:
        # A cap with room for an extraction or two of these turns, not for all six.
        capped, key = await tenant_key(stack, "capped-background", background_tokens_per_day=900)
        before = skipped("daily_cap")
        await turns(stack, key, 6)
        answer = await usage(stack, capped)
        lines = background(answer, billing_service_pb2.USAGE_PURPOSE_MEMORY)
        billed = sum(line.input_tokens + line.output_tokens for line in lines)
        assert 0 < billed <= 900
        assert billed == sum(done.input_tokens + done.output_tokens for done in pods_counted)
        assert skipped("daily_cap") > before

        # A quota with room for the turns but not for an extraction: none runs, none is billed.
        pods_counted.clear()
        at_quota, key = await tenant_key(stack, "quota-background", monthly_token_quota=400)
        before = skipped("quota")
        await turns(stack, key, 2)
        answer = await usage(stack, at_quota)
        assert answer.requests == 2
        assert background(answer, billing_service_pb2.USAGE_PURPOSE_MEMORY) == []
        assert pods_counted == []
        assert skipped("quota") == before + 2

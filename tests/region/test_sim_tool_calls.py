"""The simulator's own tool calls (a named tool choice, guided by the
function's parameters) through a real region: the caller gets them with the
region's call ids and logprobs, the output filter reads their arguments,
and a turn continued in the middle of a call goes on with the same call, its
arguments one valid JSON object."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio

from llmmesh.region.turn.tool_calls import tool_call_id
from llmmesh.region.zone_store import ToolCallRow
from llmmesh.v1 import chat_service_pb2, common_pb2
from tests.region.test_continuation import began_and_died, deltas, new_tenant, run, usage
from tests.region.test_tool_turns import arguments, refusal, start, tool_stack
from tests.stack import Stack

pytestmark = pytest.mark.asyncio

FORECAST = common_pb2.ToolDefinition(
    name="get_forecast",
    description="The forecast for a city.",
    parameters_json=json.dumps(
        {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        }
    ),
)


def named(*, logprobs: bool = True) -> common_pb2.SamplingParams:
    params = common_pb2.SamplingParams(max_tokens=80, temperature=1.0, seed=11, logprobs=logprobs)
    params.tools.append(FORECAST)
    params.tool_choice.mode = common_pb2.TOOL_CHOICE_MODE_NAMED
    params.tool_choice.name = FORECAST.name
    return params


@pytest_asyncio.fixture
async def stack() -> AsyncIterator[Stack]:
    async with tool_stack() as running:
        yield running


def check_call(text: str) -> dict[str, object]:
    value = json.loads(text)
    assert isinstance(value, dict) and isinstance(value["city"], str) and isinstance(value["days"], int)
    return value


async def test_the_simulators_call_reaches_the_caller_under_the_regions_id(stack: Stack) -> None:
    tenant_id, secret = await new_tenant(stack)
    events = await run(stack.region.address, secret, start(request_id="req-sim", params=named()))
    parts = deltas(events)
    calls = [p for d in parts for p in d.tool_calls]
    assert (calls[0].index, calls[0].id, calls[0].name) == (
        0,
        tool_call_id(tenant_id, "req-sim", 0),
        FORECAST.name,
    )
    assert all(p.index == 0 and not p.id and not p.name for p in calls[1:])
    check_call(arguments(parts))
    assert not "".join(d.text for d in parts)
    assert [lp.token_id for d in parts for lp in d.logprobs] == [t for d in parts for t in d.token_ids]
    assert events[-1].finished.reason == common_pb2.FINISH_REASON_TOOL_CALLS
    assert usage(events).output_tokens == sum(len(d.token_ids) for d in parts)


async def test_the_filters_read_tool_definitions_and_the_simulators_call_arguments() -> None:
    async with tool_stack() as probe:
        _, secret = await new_tenant(probe)
        value = json.loads(arguments(deltas(await run(probe.region.address, secret, start(params=named())))))
    word = max(str(value["city"]).split(), key=len)
    assert word not in FORECAST.SerializeToString().decode()
    async with tool_stack(safety_backends="rules", safety_deny_terms=f"violence={word}") as filtered:
        _, secret = await new_tenant(filtered)
        events = await run(filtered.region.address, secret, start(params=named()))
        # The same word in a tool's description is the caller's input: refused before any work.
        offered = named()
        offered.tools[0].description += f" Not for {word}."
        refused = await refusal(filtered, secret, start(params=offered))
    assert events[-1].finished.reason == common_pb2.FINISH_REASON_CONTENT_FILTER
    assert word not in arguments(deltas(events))
    assert (refused.code, refused.reason) == (grpc.StatusCode.PERMISSION_DENIED, "CONTENT_FILTERED")


async def test_a_turn_continued_mid_call_goes_on_with_the_simulators_call(stack: Stack) -> None:
    tenant_id, secret = await new_tenant(stack)
    reference = await run(stack.region.address, secret, start(params=named()))
    whole = deltas(reference)
    whole_text = arguments(whole)
    check_call(whole_text)
    # Cut inside the arguments, after the city's value began.
    cut = next(i for i in range(1, len(whole)) if '"city": "' in arguments(whole[:i])) + 1
    assert cut < len(whole) - 2
    delivered = whole[:cut]
    original = f"req-{uuid.uuid4().hex[:8]}"
    await began_and_died(stack.region.store, tenant_id, original, usage(reference).input_tokens)
    conversation = await stack.region.store.create_conversation(tenant_id, "llmmesh-tiny")
    so_far = arguments(delivered)
    continuation = chat_service_pb2.Continuation(
        original_request_id=original,
        original_region="us-west",
        emitted_token_ids=[t for d in delivered for t in d.token_ids],
        last_sequence=delivered[-1].sequence,
        emitted_tool_calls=[common_pb2.ToolCall(name=FORECAST.name, arguments=so_far)],
    )
    message = start(
        request_id=f"{original}-r2",
        conversation_id=conversation.id,
        params=named(),
        continuation=continuation,
    )
    events = await run(stack.region.address, secret, message)
    rest = deltas(events)
    parts = [p for d in rest for p in d.tool_calls]
    assert parts and all(p.index == 0 and not p.id and not p.name for p in parts)
    check_call(so_far + arguments(rest))
    # The same seed and prompt: the continued call is the one the reference made.
    assert so_far + arguments(rest) == whole_text
    assert [lp.token_id for d in rest for lp in d.logprobs] == [t for d in rest for t in d.token_ids]
    assert len([lp for d in rest for lp in d.logprobs]) == sum(len(d.token_ids) for d in whole[cut:])
    assert events[-1].finished.reason == common_pb2.FINISH_REASON_TOOL_CALLS
    assert usage(events).output_tokens == usage(reference).output_tokens
    stored = await stack.region.store.messages(tenant_id, conversation.id)
    assert stored[-1].tool_calls == (
        ToolCallRow(tool_call_id(tenant_id, original, 0), FORECAST.name, whole_text),
    )

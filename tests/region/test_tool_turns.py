"""Turns with tools through a real in-process region and simulator pod: tool
calls and logprobs reach the caller (Chat and ChatSession) with the region's
call ids, tools are prompt tokens, the output filter reads call arguments,
conversations keep calls and tool messages, a turn continued mid-call stays
one valid call, and a cancelled call is billed what it delivered.

The pod's tool-call output comes from :mod:`tests.region.tool_pod`."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager

import grpc
import grpc.aio
import pytest
import pytest_asyncio

from llmmesh.core.chat_tokenizer import PieceTokenizer, chat_role_name
from llmmesh.core.errors import MeshError, from_rpc_error
from llmmesh.core.grpcserver import open_channel
from llmmesh.region.turn.prompt_render import plain_turns
from llmmesh.region.turn.tool_calls import tool_call_id
from llmmesh.region.zone_store import Role, ToolCallRow
from llmmesh.v1 import chat_service_pb2, chat_service_pb2_grpc, common_pb2
from tests.region.test_continuation import (
    UNFILTERED_FAST,
    began_and_died,
    deltas,
    new_tenant,
    run,
    settle,
    usage,
)
from tests.region.tool_pod import LOGPROB, make_tool_calling
from tests.stack import Stack, running_stack

pytestmark = pytest.mark.asyncio

USER, ASSISTANT, TOOL = common_pb2.CHAT_ROLE_USER, common_pb2.CHAT_ROLE_ASSISTANT, common_pb2.CHAT_ROLE_TOOL
WEATHER = common_pb2.ToolDefinition(
    name="get_weather",
    description="The weather in a city now.",
    parameters_json='{"type": "object", "properties": {"city": {"type": "string"}}}',
)
QUESTION = "What is the weather in Oslo?"


def sampling(
    *,
    tools: bool = True,
    logprobs: bool = False,
    max_tokens: int = 24,
    ignore_eos: bool = False,
    # "auto", and a question that does not name the function: the simulator answers in
    # text, which the tool pod makes a call of (see tests.region.tool_pod).
    choice: common_pb2.ToolChoiceMode.ValueType = common_pb2.TOOL_CHOICE_MODE_AUTO,
) -> common_pb2.SamplingParams:
    params = common_pb2.SamplingParams(
        max_tokens=max_tokens, temperature=1.0, seed=5, logprobs=logprobs, ignore_eos=ignore_eos
    )
    if tools:
        params.tools.append(WEATHER)
        params.tool_choice.mode = choice
        if choice == common_pb2.TOOL_CHOICE_MODE_NAMED:
            params.tool_choice.name = WEATHER.name
    return params


def start(
    messages: list[common_pb2.ChatMessage] | None = None,
    *,
    request_id: str = "",
    conversation_id: str = "",
    params: common_pb2.SamplingParams | None = None,
    continuation: chat_service_pb2.Continuation | None = None,
) -> chat_service_pb2.ChatStart:
    message = chat_service_pb2.ChatStart(
        request_id=request_id,
        model="auto",
        messages=messages or [common_pb2.ChatMessage(role=USER, content=QUESTION)],
        sampling=params or sampling(),
        conversation_id=conversation_id,
    )
    if continuation is not None:
        message.continuation.CopyFrom(continuation)
    return message


def arguments(parts: list[chat_service_pb2.ChatDelta]) -> str:
    return "".join(p.arguments for d in parts for p in d.tool_calls)


def tool_stack(**region: object) -> AbstractAsyncContextManager[Stack]:
    return running_stack(region_overrides={"safety_backends": "none", **region}, **UNFILTERED_FAST)


@pytest_asyncio.fixture
async def stack() -> AsyncIterator[Stack]:
    async with tool_stack() as running:
        make_tool_calling(running.engine.backend)  # type: ignore[arg-type]
        yield running


async def refusal(stack: Stack, secret: str, message: chat_service_pb2.ChatStart) -> MeshError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await run(stack.region.address, secret, message)
    return from_rpc_error(info.value)


async def test_a_tool_call_reaches_the_caller_with_the_regions_id_and_finish_reason(stack: Stack) -> None:
    tenant_id, secret = await new_tenant(stack)
    events = await run(
        stack.region.address, secret, start(request_id="req-tools", params=sampling(logprobs=True))
    )
    parts = deltas(events)
    calls = [p for d in parts for p in d.tool_calls]
    assert calls and all(p.index == 0 for p in calls)
    # The first part names the call with the region's id, never the pod's; later parts carry arguments only.
    assert (calls[0].id, calls[0].name) == (tool_call_id(tenant_id, "req-tools", 0), WEATHER.name)
    assert all(not p.id and not p.name for p in calls[1:])
    call_text = arguments(parts)
    assert isinstance(json.loads(call_text), dict)
    assert all(not d.text for d in parts)
    # Logprobs: one per delivered token, in order.
    assert [lp.token_id for d in parts for lp in d.logprobs] == [t for d in parts for t in d.token_ids]
    assert {lp.logprob for d in parts for lp in d.logprobs} == {LOGPROB}
    assert events[-1].finished.reason == common_pb2.FINISH_REASON_TOOL_CALLS
    # Tool-call tokens are output tokens, billed as such.
    streamed = sum(len(d.token_ids) for d in parts)
    assert usage(events).output_tokens == streamed > 0
    await settle(stack)
    billed = await stack.global_plane.ledger.usage(tenant_id, "")
    assert billed.output_tokens == streamed

    # The same turn on ChatSession, by another tenant under the same request id: a call id of its own.
    _, other = await new_tenant(stack)
    session_events = await session_turn(stack, other, start(request_id="req-tools"))
    session_calls = [p for e in session_events if e.HasField("delta") for p in e.delta.tool_calls]
    assert session_calls[0].name == WEATHER.name
    assert session_calls[0].id != calls[0].id  # ids are each tenant's own, as request ids are
    assert session_events[-1].finished.reason == common_pb2.FINISH_REASON_TOOL_CALLS


async def session_turn(
    stack: Stack, secret: str, message: chat_service_pb2.ChatStart
) -> list[chat_service_pb2.ChatResponse]:
    async with open_channel(stack.region.address) as channel:
        call = chat_service_pb2_grpc.ChatServiceStub(channel).ChatSession()
        await call.write(
            chat_service_pb2.ChatSessionRequest(
                start=chat_service_pb2.SessionTurnStart(start=message, api_key=secret)
            )
        )
        events: list[chat_service_pb2.ChatResponse] = []
        while not events or events[-1].WhichOneof("event") not in ("finished", "error"):
            response = await call.read()
            assert response is not grpc.aio.EOF
            events += [e.response for e in response.events]
        call.cancel()
    return events


async def test_tool_definitions_are_prompt_tokens(stack: Stack) -> None:
    _, secret = await new_tenant(stack)
    plain = await run(stack.region.address, secret, start(params=sampling(tools=False)))
    with_tools = await run(stack.region.address, secret, start())
    spec = stack.engine.backend.tokenizer_spec()
    assert spec is not None
    tokenizer = PieceTokenizer(spec)  # type: ignore[arg-type]
    messages = [common_pb2.ChatMessage(role=USER, content=QUESTION)]
    expected = len(tokenizer.render_chat(plain_turns(messages, [WEATHER]), True))
    assert usage(with_tools).input_tokens == expected
    assert usage(plain).input_tokens == len(tokenizer.render_chat([(chat_role_name(USER), QUESTION)], True))
    assert expected > usage(plain).input_tokens + len(tokenizer.encode(WEATHER.description))


async def test_bad_tool_messages_are_refused_naming_the_field(stack: Stack) -> None:
    _, secret = await new_tenant(stack)
    asked = common_pb2.ChatMessage(role=USER, content=QUESTION)
    called = common_pb2.ChatMessage(
        role=ASSISTANT, tool_calls=[common_pb2.ToolCall(id="call_a", name="get_weather", arguments="{}")]
    )
    cases = {
        "messages[2].tool_call_id": [asked, called, common_pb2.ChatMessage(role=TOOL, content="12 C")],
        "messages[1].tool_call_id": [
            asked,
            common_pb2.ChatMessage(role=TOOL, content="x", tool_call_id="call_a"),
        ],
        "messages[3].tool_call_id": [
            asked,
            called,
            common_pb2.ChatMessage(role=TOOL, content="12 C", tool_call_id="call_a"),
            common_pb2.ChatMessage(role=TOOL, content="again", tool_call_id="call_a"),
        ],
        "messages[0].tool_calls": [
            common_pb2.ChatMessage(
                role=USER, content="hi", tool_calls=[common_pb2.ToolCall(id="c", name="f")]
            )
        ],
    }
    for param, messages in cases.items():
        error = await refusal(stack, secret, start(messages, params=sampling(tools=False)))
        assert (error.code, error.metadata.get("param")) == (grpc.StatusCode.INVALID_ARGUMENT, param), param
    named_unknown = sampling(choice=common_pb2.TOOL_CHOICE_MODE_NAMED)
    named_unknown.tool_choice.name = "get_time"
    error = await refusal(stack, secret, start(params=named_unknown))
    assert error.metadata.get("param") == "tool_choice"
    # A well-formed answer to the call is accepted.
    answered = [asked, called, common_pb2.ChatMessage(role=TOOL, content="12 C", tool_call_id="call_a")]
    events = await run(stack.region.address, secret, start(answered, params=sampling(tools=False)))
    assert events[-1].HasField("finished")


async def test_a_flagged_phrase_inside_tool_arguments_is_caught() -> None:
    # The tool pod's arguments always name their key, "note".
    async with tool_stack(safety_backends="rules", safety_deny_terms="violence=note") as filtered:
        make_tool_calling(filtered.engine.backend)  # type: ignore[arg-type]
        _, secret = await new_tenant(filtered)
        events = await run(filtered.region.address, secret, start())
        plain = await run(filtered.region.address, secret, start(params=sampling(tools=False)))
    assert events[-1].finished.reason == common_pb2.FINISH_REASON_CONTENT_FILTER
    verdicts = [e.safety for e in events if e.HasField("safety")]
    assert verdicts and verdicts[0].blocked and list(verdicts[0].categories) == ["violence"]
    assert "note" not in arguments(deltas(events))
    assert plain[-1].finished.reason != common_pb2.FINISH_REASON_CONTENT_FILTER


async def test_a_conversation_keeps_tool_calls_and_tool_messages(stack: Stack) -> None:
    tenant_id, secret = await new_tenant(stack)
    conversation = await stack.region.store.create_conversation(tenant_id, "llmmesh-tiny")
    first = await run(
        stack.region.address, secret, start(request_id="req-c1", conversation_id=conversation.id)
    )
    call_id = tool_call_id(tenant_id, "req-c1", 0)
    call_text = arguments(deltas(first))
    stored = await stack.region.store.messages(tenant_id, conversation.id)
    assert [(m.role, m.content, m.tool_calls) for m in stored] == [
        (Role.USER, QUESTION, ()),
        (Role.ASSISTANT, "", (ToolCallRow(call_id, WEATHER.name, call_text),)),
    ]
    assert stored[1].finish_reason == "FINISH_REASON_TOOL_CALLS"

    # An answer to a call the conversation never made is refused; the real one is taken.
    wrong = [common_pb2.ChatMessage(role=TOOL, content="12 C", tool_call_id="call_other")]
    error = await refusal(stack, secret, start(wrong, conversation_id=conversation.id))
    assert error.metadata.get("param") == "messages[0].tool_call_id"
    answer = [common_pb2.ChatMessage(role=TOOL, content="12 C and sunny", tool_call_id=call_id)]
    second = await run(
        stack.region.address,
        secret,
        start(answer, request_id="req-c2", conversation_id=conversation.id, params=sampling(tools=False)),
    )
    assert second[-1].finished.reason in (common_pb2.FINISH_REASON_STOP, common_pb2.FINISH_REASON_LENGTH)
    stored = await stack.region.store.messages(tenant_id, conversation.id)
    assert [(m.role, m.tool_call_id, m.request_id) for m in stored[2:]] == [
        (Role.TOOL, call_id, "req-c2"),
        (Role.ASSISTANT, "", "req-c2"),
    ]
    assert stored[2].content == "12 C and sunny"
    # The history the second turn ran on rendered the call and the answer.
    spec = stack.engine.backend.tokenizer_spec()
    history = [
        common_pb2.ChatMessage(role=USER, content=QUESTION),
        common_pb2.ChatMessage(
            role=ASSISTANT,
            tool_calls=[common_pb2.ToolCall(id=call_id, name=WEATHER.name, arguments=call_text)],
        ),
        *answer,
    ]
    expected = PieceTokenizer(spec).render_chat(plain_turns(history), True)  # type: ignore[arg-type]
    assert usage(second).input_tokens == len(expected)
    # ListMessages shows them too.
    async with open_channel(stack.region.address) as channel:
        listed = await chat_service_pb2_grpc.ChatServiceStub(channel).ListMessages(
            chat_service_pb2.ListMessagesRequest(conversation_id=conversation.id),
            metadata=(("authorization", f"Bearer {secret}"),),
        )
    shown = listed.messages
    assert [c.id for c in shown[1].tool_calls] == [call_id] and shown[1].tool_calls[0].arguments == call_text
    assert (shown[2].role, shown[2].tool_call_id) == (TOOL, call_id)


async def test_a_turn_continued_mid_call_goes_on_with_the_same_call(stack: Stack) -> None:
    tenant_id, secret = await new_tenant(stack)
    long_reply = sampling(logprobs=True, ignore_eos=True)
    whole = deltas(await run(stack.region.address, secret, start(params=long_reply)))
    assert len(whole) > 6
    conversation = await stack.region.store.create_conversation(tenant_id, "llmmesh-tiny")
    original = f"req-{uuid.uuid4().hex[:8]}"
    prompt = usage(await run(stack.region.address, secret, start(params=long_reply))).input_tokens
    await began_and_died(stack.region.store, tenant_id, original, prompt)
    delivered = whole[:3]
    so_far = arguments(delivered)
    continuation = chat_service_pb2.Continuation(
        original_request_id=original,
        original_region="us-west",
        emitted_token_ids=[t for d in delivered for t in d.token_ids],
        emitted_text="",
        last_sequence=delivered[-1].sequence,
        # The id is the region's to give: whatever the caller says, the call keeps the one it had.
        emitted_tool_calls=[
            common_pb2.ToolCall(id="call_said_by_the_edge", name=WEATHER.name, arguments=so_far)
        ],
    )
    message = start(
        request_id=f"{original}-r2",
        conversation_id=conversation.id,
        params=long_reply,
        continuation=continuation,
    )
    too_long = chat_service_pb2.ChatStart()
    too_long.CopyFrom(message)
    too_long.continuation.emitted_tool_calls[0].arguments = "x" * 256 * len(continuation.emitted_token_ids)
    error = await refusal(stack, secret, too_long)
    assert error.metadata.get("param") == "continuation.emitted_tool_calls"
    rest_events = await run(stack.region.address, secret, message)
    rest = deltas(rest_events)
    parts = [p for d in rest for p in d.tool_calls]
    # The call goes on: same index, no second opening, and the whole is one valid JSON object.
    assert parts and all(p.index == 0 and not p.id and not p.name for p in parts)
    assert so_far + arguments(rest) == arguments(whole)
    assert isinstance(json.loads(so_far + arguments(rest)), dict)
    assert rest[0].sequence == delivered[-1].sequence + 1
    # Only the new tokens' logprobs.
    assert [lp.token_id for d in rest for lp in d.logprobs] == [t for d in rest for t in d.token_ids]
    assert rest_events[-1].finished.reason == common_pb2.FINISH_REASON_TOOL_CALLS
    stored = await stack.region.store.messages(tenant_id, conversation.id)
    assert stored[-1].tool_calls == (
        ToolCallRow(tool_call_id(tenant_id, original, 0), WEATHER.name, arguments(whole)),
    )


async def test_a_cancelled_call_ends_cancelled_and_is_billed_what_it_delivered(stack: Stack) -> None:
    tenant_id, secret = await new_tenant(stack)
    events = await run(
        stack.region.address, secret, start(params=sampling(max_tokens=300, ignore_eos=True)), cancel_after=2
    )
    assert events[-1].finished.reason == common_pb2.FINISH_REASON_CANCELLED
    streamed = sum(len(d.token_ids) for d in deltas(events))
    assert usage(events).output_tokens == streamed > 0
    await settle(stack)
    billed = await stack.global_plane.ledger.usage(tenant_id, "")
    assert (billed.input_tokens, billed.output_tokens) == (usage(events).input_tokens, streamed)

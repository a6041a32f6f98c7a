"""ChatService on a real in-process region, engine pod and global plane."""

from __future__ import annotations

import asyncio
from decimal import Decimal

import grpc
import grpc.aio
import pytest
import sqlalchemy as sa

from llmmesh.core.errors import MeshError, from_rpc_error, from_stream_error
from llmmesh.core.grpcserver import open_channel
from llmmesh.region import metrics as region_metrics
from llmmesh.v1 import (
    billing_service_pb2,
    chat_service_pb2,
    chat_service_pb2_grpc,
    common_pb2,
    engine_service_pb2,
    engine_service_pb2_grpc,
)
from tests.stack import DEV_KEY, Stack, running_stack, wait_until

pytestmark = pytest.mark.asyncio

USER = common_pb2.CHAT_ROLE_USER


def start(text: str = "Tell me about the mesh.", **sampling: object) -> chat_service_pb2.ChatRequest:
    return chat_service_pb2.ChatRequest(
        start=chat_service_pb2.ChatStart(
            model="auto",
            messages=[common_pb2.ChatMessage(role=USER, content=text)],
            sampling=common_pb2.SamplingParams(**sampling),  # type: ignore[arg-type]
        )
    )


def auth(key: str = DEV_KEY) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {key}"),)


async def run_turn(
    stack: Stack, request: chat_service_pb2.ChatRequest, key: str = DEV_KEY
) -> list[chat_service_pb2.ChatResponse]:
    async with open_channel(stack.region.address) as channel:
        call = chat_service_pb2_grpc.ChatServiceStub(channel).Chat(metadata=auth(key))
        await call.write(request)
        await call.done_writing()
        return [event async for event in call]


async def turn_error(stack: Stack, request: chat_service_pb2.ChatRequest, key: str = DEV_KEY) -> MeshError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await run_turn(stack, request, key)
    return from_rpc_error(info.value)


async def billed(stack: Stack, request_id: str) -> bool:
    """Whether billing holds the turn's usage once the region's outbox is empty."""
    await stack.region.gateway.drain()
    assert await stack.region.shipper.flush(timeout_s=10), "usage not delivered"
    return not await stack.global_plane.ledger.reconcile([request_id])


async def test_a_turn_streams_started_deltas_usage_finished(stack: Stack) -> None:
    events = await run_turn(stack, start(max_tokens=16))
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[0] == "started"
    assert kinds[-2:] == ["usage", "finished"]
    assert set(kinds[1:-2]) == {"delta"}
    started = events[0].started
    assert (started.region, started.zone, started.pod_id) == ("us-east", "us", "us-east-pod-0")
    deltas = [e.delta for e in events if e.HasField("delta")]
    assert [d.sequence for d in deltas] == list(range(1, len(deltas) + 1))
    streamed = sum(len(d.token_ids) for d in deltas)
    usage = events[-2].usage
    assert usage.usage.output_tokens == streamed <= 16
    assert usage.usage.input_tokens > 0
    assert events[-1].finished.reason in (common_pb2.FINISH_REASON_STOP, common_pb2.FINISH_REASON_LENGTH)


async def test_billed_usage_equals_streamed_tokens(stack: Stack) -> None:
    tenant = await stack.global_plane.tenants.get_tenant("dev")
    before = await stack.global_plane.ledger.usage(tenant.id, "")
    events = await run_turn(stack, start(max_tokens=12))
    streamed = sum(len(e.delta.token_ids) for e in events if e.HasField("delta"))
    request_id = events[0].started.request_id
    assert await billed(stack, request_id)
    after = await stack.global_plane.ledger.usage(tenant.id, "")
    assert after.output_tokens - before.output_tokens == streamed
    assert after.requests - before.requests == 1
    streamed_cost = next(e.usage.cost_usd for e in events if e.HasField("usage"))
    assert after.cost_usd - before.cost_usd == Decimal(streamed_cost) > 0


async def test_the_end_user_of_a_turn_reaches_its_usage_record_and_billing(stack: Stack) -> None:
    """OpenAI's ``user`` rides in the zone's usage outbox as given and lands in billing as its
    zone's pseudonym, which finds the turn there."""
    request = start(max_tokens=6)
    request.start.user = "user-5e1d"
    events = await run_turn(stack, request)
    request_id = events[0].started.request_id
    await run_turn(stack, start(max_tokens=2))  # another turn, naming no end user
    assert await billed(stack, request_id)
    outbox = sa.table("usage_outbox", sa.column("request_id"), sa.column("usage"))
    query = sa.select(outbox.c.usage).where(outbox.c.request_id == request_id)
    payload = stack.region.store.run_transaction(lambda conn: conn.execute(query).scalar_one())
    assert billing_service_pb2.UsageRecord.FromString(payload).end_user == "user-5e1d"
    tenant = stack.region.policy.authenticate(DEV_KEY).tenant_id
    pseudonym = await stack.region.shipper.pseudonyms.of(tenant, "user-5e1d")
    theirs = await stack.global_plane.ledger.usage(tenant, "", end_user=pseudonym)
    streamed = sum(len(e.delta.token_ids) for e in events if e.HasField("delta"))
    assert (theirs.requests, theirs.output_tokens) == (1, streamed)


async def test_a_continued_turns_records_keep_its_end_user(stack: Stack) -> None:
    whole = await run_turn(stack, start("Continue me.", max_tokens=40, seed=3))
    original = whole[0].started.request_id
    tokens = [t for e in whole if e.HasField("delta") for t in e.delta.token_ids]
    request = start("Continue me.", max_tokens=40, seed=3)
    request.start.user = "user-c0"
    request.start.continuation.CopyFrom(
        chat_service_pb2.Continuation(
            original_request_id=original, emitted_token_ids=tokens[:1], last_sequence=1
        )
    )
    await run_turn(stack, request)
    await stack.region.gateway.drain()
    payloads = stack.region.store.run_transaction(
        lambda conn: conn.execute(sa.text("SELECT usage FROM usage_outbox")).scalars().all()
    )
    records = [billing_service_pb2.UsageRecord.FromString(p) for p in payloads]
    continued = [r for r in records if r.continues_request_id == original]
    assert continued and all(r.end_user == "user-c0" for r in continued)


@pytest.mark.parametrize("user", ["u" * 257, "user\r\nforged: line", "nul\x00"])
async def test_an_end_user_that_cannot_be_kept_is_refused_naming_user(stack: Stack, user: str) -> None:
    request = start(max_tokens=2)
    request.start.user = user
    error = await turn_error(stack, request)
    assert (error.code, error.reason, error.metadata["param"]) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_REQUEST",
        "user",
    )
    kept = start(max_tokens=2)
    kept.start.user = "u" * 256
    assert (await run_turn(stack, kept))[-1].HasField("finished")


async def test_continuation_goes_on_from_the_delivered_tokens(stack: Stack) -> None:
    whole = await run_turn(stack, start("Continue me.", max_tokens=40, seed=7))
    deltas = [e.delta for e in whole if e.HasField("delta")]
    tokens = [t for d in deltas for t in d.token_ids]
    assert len(deltas) > 1 and len(tokens) > 6
    # Cut after the first delta (the output filter merges held tokens into one).
    cut = len(deltas[0].token_ids)
    request = start("Continue me.", max_tokens=40, seed=7)
    request.start.continuation.CopyFrom(
        chat_service_pb2.Continuation(
            original_request_id=whole[0].started.request_id, emitted_token_ids=tokens[:cut], last_sequence=1
        )
    )
    rest = await run_turn(stack, request)
    rest_deltas = [e.delta for e in rest if e.HasField("delta")]
    assert rest_deltas[0].sequence == 2
    assert [t for d in rest_deltas for t in d.token_ids] == tokens[cut:]
    assert "".join(d.text for d in deltas[1:]) == "".join(d.text for d in rest_deltas)


@pytest.mark.parametrize(("key", "reason"), [("", "API_KEY_MISSING"), ("sk-not-a-key", "API_KEY_INVALID")])
async def test_bad_keys_are_unauthenticated(stack: Stack, key: str, reason: str) -> None:
    async with open_channel(stack.region.address) as channel:
        metadata = auth(key) if key else ()
        call = chat_service_pb2_grpc.ChatServiceStub(channel).Chat(metadata=metadata)
        await call.write(start())
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call.read()
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert from_rpc_error(info.value).reason == reason


async def test_a_revoked_key_stops_working_after_a_refresh(stack: Stack) -> None:
    key, secret = await stack.global_plane.tenants.create_api_key("dev")
    await stack.region.policy.refresh()
    assert (await run_turn(stack, start(max_tokens=2), key=secret))[0].HasField("started")
    await stack.global_plane.tenants.revoke_api_key(key.id)
    await stack.region.policy.refresh()
    error = await turn_error(stack, start(), key=secret)
    assert error.reason == "API_KEY_REVOKED"


def _with_message(role: common_pb2.ChatRole.ValueType, content: str) -> chat_service_pb2.ChatRequest:
    message = common_pb2.ChatMessage(role=role, content=content)
    return chat_service_pb2.ChatRequest(start=chat_service_pb2.ChatStart(model="auto", messages=[message]))


@pytest.mark.parametrize(
    ("request_factory", "code", "reason"),
    [
        (lambda: chat_service_pb2.ChatRequest(start=chat_service_pb2.ChatStart(model="auto")),
         grpc.StatusCode.INVALID_ARGUMENT, "EMPTY_PROMPT"),
        (lambda: _with_message(common_pb2.CHAT_ROLE_UNSPECIFIED, "hi"),
         grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST"),
        (lambda: _with_message(USER, "   "), grpc.StatusCode.INVALID_ARGUMENT, "EMPTY_PROMPT"),
        (lambda: start(max_tokens=0), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_SAMPLING"),
        (lambda: start(temperature=-0.5), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_SAMPLING"),
        (lambda: chat_service_pb2.ChatRequest(cancel=chat_service_pb2.ChatCancel()),
         grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST"),
        (lambda: _with_message(USER, "x" * 1_000_001), grpc.StatusCode.INVALID_ARGUMENT, "PROMPT_TOO_LONG"),
        (lambda: _with_message(USER, "word " * 5000), grpc.StatusCode.INVALID_ARGUMENT, "PROMPT_TOO_LONG"),
    ],
)  # fmt: skip
async def test_bad_turns_get_invalid_argument_and_the_region_keeps_serving(
    stack: Stack, request_factory: object, code: grpc.StatusCode, reason: str
) -> None:
    assert callable(request_factory)
    error = await turn_error(stack, request_factory())
    assert (error.code, error.reason) == (code, reason)
    assert (await run_turn(stack, start(max_tokens=2)))[-1].HasField("finished")


async def test_too_many_messages_are_refused(stack: Stack) -> None:
    request = start()
    request.start.messages.extend([common_pb2.ChatMessage(role=USER, content="hi")] * 2048)
    error = await turn_error(stack, request)
    assert error.reason == "INVALID_REQUEST"
    assert error.metadata["param"] == "messages"


async def test_unknown_model_is_not_found(stack: Stack) -> None:
    request = start()
    request.start.model = "no-such-model"
    error = await turn_error(stack, request)
    assert (error.code, error.reason) == (grpc.StatusCode.NOT_FOUND, "UNKNOWN_MODEL")


async def test_cancel_message_ends_the_turn_and_bills_it(stack: Stack) -> None:
    async with open_channel(stack.region.address) as channel:
        call = chat_service_pb2_grpc.ChatServiceStub(channel).Chat(metadata=auth())
        await call.write(start(max_tokens=2000))
        events = [await call.read(), await call.read()]
        await call.write(chat_service_pb2.ChatRequest(cancel=chat_service_pb2.ChatCancel(reason="test")))
        while (event := await call.read()) is not grpc.aio.EOF:
            events.append(event)
    assert events[-1].finished.reason == common_pb2.FINISH_REASON_CANCELLED
    streamed = sum(len(e.delta.token_ids) for e in events if e.HasField("delta"))
    assert events[-2].usage.usage.output_tokens >= streamed
    assert await billed(stack, events[0].started.request_id)


@pytest.mark.parametrize(
    ("second", "param"),
    [(start("And another thing."), "start"), (chat_service_pb2.ChatRequest(), "action")],
    ids=["start", "empty"],
)
async def test_a_second_start_or_an_empty_message_stops_the_turn_bills_it_and_is_refused(
    stack: Stack, second: chat_service_pb2.ChatRequest, param: str
) -> None:
    async with open_channel(stack.region.address) as channel:
        call = chat_service_pb2_grpc.ChatServiceStub(channel).Chat(metadata=auth())
        await call.write(start(max_tokens=2000))
        events = [await call.read(), await call.read()]
        await call.write(second)
        while (event := await call.read()) is not grpc.aio.EOF:
            events.append(event)
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[-3:] == ["usage", "finished", "error"]
    assert events[-2].finished.reason == common_pb2.FINISH_REASON_CANCELLED
    error = events[-1].error
    assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT.value[0], "INVALID_REQUEST")
    assert error.metadata["param"] == param
    assert kinds.count("started") == 1, "the second start ran a turn"
    assert await billed(stack, events[0].started.request_id)


async def test_two_starts_at_once_are_refused(stack: Stack) -> None:
    async with open_channel(stack.region.address) as channel:
        call = chat_service_pb2_grpc.ChatServiceStub(channel).Chat(metadata=auth())
        await call.write(start(max_tokens=2000))
        await call.write(start("And another thing."))
        await call.done_writing()
        events: list[chat_service_pb2.ChatResponse] = []
        try:
            events += [event async for event in call]
            error = from_stream_error(events[-1].error)
        except grpc.aio.AioRpcError as err:
            # Refused before the turn sent anything: the call's own status.
            error = from_rpc_error(err)
    assert (error.code, error.reason, error.metadata["param"]) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_REQUEST",
        "start",
    )
    assert [e.WhichOneof("event") for e in events].count("started") <= 1


async def test_client_cancellation_aborts_the_engine_request(stack: Stack) -> None:
    async with open_channel(stack.engine.address) as engine_channel:
        engine = engine_service_pb2_grpc.EngineServiceStub(engine_channel)
        async with open_channel(stack.region.address) as channel:
            call = chat_service_pb2_grpc.ChatServiceStub(channel).Chat(metadata=auth())
            await call.write(start(max_tokens=2000))
            first = await call.read()
            await call.read()
            load = await engine.GetLoad(engine_service_pb2.GetLoadRequest())
            assert load.report.running == 1
            call.cancel()
        async with asyncio.timeout(10):
            while (await engine.GetLoad(engine_service_pb2.GetLoadRequest())).report.running:
                await asyncio.sleep(0.02)
    assert await billed(stack, first.started.request_id)


async def test_region_reports_to_geo_routing(stack: Stack) -> None:
    await wait_until(lambda: stack.global_plane.directory.status("us-east") is not None, what="heartbeat")
    status = stack.global_plane.directory.status("us-east")
    assert status is not None
    assert status.report.zone == "us"
    info = stack.region.info()
    assert info.healthy_engine_pods == 1
    assert info.models == ["llmmesh-tiny", "llmmesh-tiny-embed"]


async def test_keeps_serving_on_cached_policy_while_global_is_down(stack: Stack) -> None:
    await run_turn(stack, start(max_tokens=2))  # warms the model cache
    await stack.global_plane.stop(0)
    events = await run_turn(stack, start(max_tokens=4))
    assert events[-1].HasField("finished")
    await stack.region.gateway.drain()
    assert await stack.region.shipper.pending() >= 1


async def test_no_serving_pod_is_unavailable_with_retry_info(stack: Stack) -> None:
    await stack.engine.stop(0)
    await wait_until(lambda: not stack.region.pool.healthy_pods, what="engine marked down")
    error = await turn_error(stack, start())
    assert (error.code, error.reason) == (grpc.StatusCode.UNAVAILABLE, "ENGINE_UNAVAILABLE")
    assert error.retry_after_s is not None and error.retry_after_s > 0


async def _cut_mid_turn(
    stack: Stack, request: chat_service_pb2.ChatRequest, after_deltas: int
) -> tuple[chat_service_pb2.ChatStarted, list[chat_service_pb2.ChatResponse]]:
    """Run ``request``, stop its pod at once after ``after_deltas`` deltas;
    the started event and every event after it."""
    async with open_channel(stack.region.address) as channel:
        call = chat_service_pb2_grpc.ChatServiceStub(channel).Chat(metadata=auth())
        await call.write(request)
        await call.done_writing()
        started = (await call.read()).started
        events = [await call.read() for _ in range(after_deltas)]
        assert all(event.HasField("delta") for event in events), events
        dying = next(pod for pod in stack.engines if pod.backend.info().pod_id == started.pod_id)
        await dying.stop(0)
        while (event := await call.read()) is not grpc.aio.EOF:
            events.append(event)
    return started, events


async def test_a_pod_dying_mid_turn_hands_the_turn_to_another_pod_with_no_token_lost() -> None:
    async with running_stack(pods=2, sim_inter_token_s=0.01) as stack:
        await wait_until(lambda: len(stack.region.pool.healthy_pods) == 2, what="both pods up")
        moved = region_metrics.TURNS_MOVED.labels("llmmesh-tiny")
        moved_before = moved._value.get()
        request = start("Tell me a long story about the mesh.", max_tokens=60, ignore_eos=True)
        started, events = await _cut_mid_turn(stack, request, after_deltas=5)
        deltas = [event.delta for event in events if event.HasField("delta")]
        kinds = [event.WhichOneof("event") for event in events]
        assert "error" not in kinds and kinds[-2:] == ["usage", "finished"], kinds
        # One unbroken stream: numbered on, every token once, the whole turn's usage.
        assert [delta.sequence for delta in deltas] == list(range(1, len(deltas) + 1))
        received = [token for delta in deltas for token in delta.token_ids]
        assert len(received) == 60
        usage = next(event.usage.usage for event in events if event.HasField("usage"))
        assert usage.output_tokens == 60
        # The same turn, unbroken, on the pod that is left: the same tokens and prompt.
        whole = await run_turn(
            stack, start("Tell me a long story about the mesh.", max_tokens=60, ignore_eos=True)
        )
        assert [t for e in whole if e.HasField("delta") for t in e.delta.token_ids] == received
        whole_usage = next(event.usage.usage for event in whole if event.HasField("usage"))
        assert usage.input_tokens == whole_usage.input_tokens
        assert moved._value.get() == moved_before + 1
        assert await billed(stack, started.request_id)
        stored = await stack.global_plane.ledger.usage(
            stack.region.policy.authenticate(DEV_KEY).tenant_id, ""
        )
        assert stored.output_tokens == 120  # each turn billed once, whole


async def test_a_pod_dying_mid_turn_with_no_other_pod_of_its_model_ends_the_turn_with_engine_failed() -> None:
    async with running_stack(pods=1) as stack:
        request = start(max_tokens=2000)
        started, events = await _cut_mid_turn(stack, request, after_deltas=1)
        assert events[-1].HasField("error"), "the turn did not end with an error event"
        error = events[-1].error
        assert (error.code, error.reason) == (grpc.StatusCode.UNAVAILABLE.value[0], "ENGINE_FAILED")
        # What was delivered is billed; the edge goes on with the rest in another region.
        assert await billed(stack, started.request_id)


async def test_two_running_turns_with_one_request_id_refuse_the_second(stack: Stack) -> None:
    request = start(max_tokens=2000)
    request.start.request_id = "req-same"
    async with open_channel(stack.region.address) as channel:
        first = chat_service_pb2_grpc.ChatServiceStub(channel).Chat(metadata=auth())
        await first.write(request)
        assert (await first.read()).HasField("started")
        error = await turn_error(stack, request)
        assert (error.code, error.reason) == (grpc.StatusCode.ALREADY_EXISTS, "DUPLICATE_REQUEST")
        first.cancel()

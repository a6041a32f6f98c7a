"""Recording a turn continued in another region after its own failed
mid-stream: billed once (input once, all the output delivered) and stored
once (one user message, one whole assistant message), whichever region
records first; and the continuing region's output filter sees the text
delivered before the break.

The store's rules run on two stores of one zone (two regions of it), on
SQLite and PostgreSQL; the gateway's on a real in-process region.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import grpc
import grpc.aio
import pytest
import pytest_asyncio
import sqlalchemy as sa

from llmmesh.core.grpcserver import open_channel
from llmmesh.globalplane.tiers import TenantTier
from llmmesh.region.turn.settle import RecordCodec
from llmmesh.region.zone_store import AssistantMessage, Role, ZoneStore
from llmmesh.region.zone_store import schema as zs
from llmmesh.region.zone_store.rows import ContinuedTurn, TurnStart
from llmmesh.v1 import billing_service_pb2, chat_service_pb2, chat_service_pb2_grpc, common_pb2
from tests.stack import Stack, running_stack

pytestmark = pytest.mark.asyncio

T = "tenant-a"
PROMPT, DELIVERED, REST = 12, 5, 8
USER_TEXT = "Where do rivers go?"
BEFORE, AFTER = "Rivers run down to", " the sea, mostly."


def encoder(region: str) -> Callable[[str, int, int, str], bytes]:
    """Usage rows as ``region`` writes them: in its own name, the only one billing takes from it."""

    def encode(request_id: str, input_tokens: int, output_tokens: int, continues: str) -> bytes:
        return billing_service_pb2.UsageRecord(
            request_id=request_id,
            tenant_id=T,
            model="m",
            region=region,
            usage=common_pb2.TokenUsage(input_tokens=input_tokens, output_tokens=output_tokens),
            continues_request_id=continues,
        ).SerializeToString()

    return encode


def reply(content: str, output_tokens: int) -> AssistantMessage:
    return AssistantMessage(
        content=content,
        model="m",
        finish_reason="FINISH_REASON_STOP",
        input_tokens=PROMPT,
        output_tokens=output_tokens,
        cost_usd=Decimal("0.001"),
    )


def usage_rows(store: ZoneStore) -> dict[str, tuple[str, int, int, str]]:
    """request id -> (home region, input, output, billed region) of every usage row."""
    with store.engine.connect() as conn:
        rows = conn.execute(sa.select(zs.usage_outbox)).all()
    out = {}
    for row in rows:
        record = billing_service_pb2.UsageRecord.FromString(row.usage)
        assert row.tokens == record.usage.input_tokens + record.usage.output_tokens
        out[row.request_id] = (
            row.home_region,
            record.usage.input_tokens,
            record.usage.output_tokens,
            record.region,
        )
    return out


def continued_of(store: ZoneStore, request_id: str) -> str:
    """The failed-over turn a usage row says its tokens belong to."""
    o = zs.usage_outbox
    with store.engine.connect() as conn:
        usage = conn.execute(sa.select(o.c.usage).where(o.c.request_id == request_id)).scalar_one()
    return billing_service_pb2.UsageRecord.FromString(usage).continues_request_id


@pytest.mark.parametrize("first", ["failed region", "continuing region"])
async def test_a_continued_turn_is_billed_and_stored_once_in_either_order(
    regions: tuple[ZoneStore, ZoneStore], first: str
) -> None:
    east, west = regions
    conversation = await east.create_conversation(T, "m")
    # The failed region had generated one token more than its client got.
    partial = reply(BEFORE + " the", DELIVERED + 1)

    async def failed_region_records() -> bool:
        turn = await east.record_turn(
            T,
            conversation.id,
            "req-x",
            USER_TEXT,
            partial,
            encoder("us-east")("req-x", PROMPT, DELIVERED + 1, ""),
            tokens=PROMPT + DELIVERED + 1,
        )
        return turn.duplicate

    async def continuing_region_records() -> bool:
        turn = await west.record_continuation(
            T,
            conversation.id,
            "req-x-r2",
            USER_TEXT,
            ContinuedTurn("req-x", PROMPT, DELIVERED, BEFORE),
            reply(BEFORE + AFTER, DELIVERED + REST),
            REST,
            encoder("us-west"),
        )
        assert [m.role for m in turn.messages] == [Role.USER, Role.ASSISTANT]
        return turn.duplicate

    if first == "failed region":
        assert not await failed_region_records()
        assert not await continuing_region_records()
    else:
        assert not await continuing_region_records()
        assert await failed_region_records()  # late: a no-op
    # A repeated continuation changes nothing either.
    assert await continuing_region_records()

    rows = usage_rows(west)
    assert set(rows) == {"req-x", "req-x-r2"}
    assert sum(i + o for _, i, o, _ in rows.values()) == PROMPT + DELIVERED + REST
    assert sum(i for _, i, _, _ in rows.values()) == PROMPT
    assert rows["req-x-r2"][:2] == ("us-west", 0)
    if first == "continuing region":
        # The failed region never recorded: the continuing one bills the whole
        # turn under its original id, one request; its own row ships nothing.
        assert rows["req-x"] == ("us-west", PROMPT, DELIVERED + REST, "us-west")
        assert rows["req-x-r2"] == ("us-west", 0, 0, "us-west")
        assert [row.request_id for row in await west.pending_usage()] == ["req-x"]
    else:
        # What the failed region billed beyond the client's tokens is not billed again.
        assert rows["req-x"] == ("us-east", PROMPT, DELIVERED + 1, "us-east")
        assert rows["req-x-r2"] == ("us-west", 0, REST - 1, "us-west")
        # Both rows ship; billing counts the continuation's tokens, not a second request.
        assert continued_of(west, "req-x-r2") == "req-x"
        assert continued_of(west, "req-x") == ""
    assert await west.tenant_tokens(T, since=conversation.created_at) == PROMPT + DELIVERED + REST

    stored = await west.messages(T, conversation.id)
    assert [(m.role, m.content) for m in stored] == [(Role.USER, USER_TEXT), (Role.ASSISTANT, BEFORE + AFTER)]
    assert [m.request_id for m in stored] == ["req-x", "req-x"]
    assert (stored[1].input_tokens, stored[1].output_tokens) == (PROMPT, DELIVERED + REST)


async def test_a_continuation_leaves_another_tenants_turn_of_the_same_id_alone(
    regions: tuple[ZoneStore, ZoneStore],
) -> None:
    east, west = regions
    b = "tenant-b"
    theirs = await east.create_conversation(b, "m")
    other = billing_service_pb2.UsageRecord(request_id="req-y", tenant_id=b).SerializeToString()
    await east.record_turn(b, theirs.id, "req-y", "b asks", reply("x", 1), other, tokens=13)
    before = await east.messages(b, theirs.id)
    mine = await west.create_conversation(T, "m")
    turn = await west.record_continuation(
        T,
        mine.id,
        "req-y-r2",
        USER_TEXT,
        ContinuedTurn("req-y", PROMPT, 1, "x"),
        reply("xy", 2),
        1,
        encoder("us-west"),
    )
    # The tenant's own request id: its turn is recorded whole, in its own conversation.
    assert not turn.duplicate
    assert [(m.role, m.conversation_id) for m in turn.messages] == [
        (Role.USER, mine.id),
        (Role.ASSISTANT, mine.id),
    ]
    o = zs.usage_outbox
    with west.engine.connect() as conn:
        rows = conn.execute(sa.select(o.c.tenant_id, o.c.request_id, o.c.tokens, o.c.usage)).all()
    assert sorted((r.tenant_id, r.request_id, r.tokens) for r in rows) == [
        (T, "req-y", PROMPT + 2),
        (T, "req-y-r2", 0),
        (b, "req-y", 13),
    ]
    assert next(r.usage for r in rows if r.tenant_id == b) == other
    assert await east.messages(b, theirs.id) == before


async def accepted_and_started(store: ZoneStore, request_id: str, carried: int = 0) -> None:
    """``request_id`` of T accepted and streaming in ``store``'s region; a
    continuation of ``req-z`` when it carries tokens."""
    holder = uuid.uuid4().hex
    continues = "req-z" if carried else None
    await store.accept_turn(TurnStart(request_id, T, "m", PROMPT, 40, holder, continues, carried))
    assert await store.mark_started(T, request_id, holder)


async def test_a_turn_continued_twice_is_settled_to_what_its_client_received(
    regions: tuple[ZoneStore, ZoneStore],
) -> None:
    east, west = regions
    # req-z went slow in us-east after 3 tokens, its continuation r2 slow in
    # us-west after 6 more, and r3 (us-east again) ended it: 16 in all.
    await accepted_and_started(east, "req-z")
    await accepted_and_started(west, "req-z-r2", carried=3)
    await accepted_and_started(east, "req-z-r3", carried=6)
    whole = await east.record_continuation(
        T,
        None,
        "req-z-r3",
        None,
        ContinuedTurn("req-z", PROMPT, 6, ""),
        reply("", 16),
        10,
        encoder("us-east"),
    )
    assert not whole.duplicate
    # us-west's r2 had generated on, 20 tokens past its 3, before it noticed its client had left.
    late = await west.record_continuation(
        T,
        None,
        "req-z-r2",
        None,
        ContinuedTurn("req-z", PROMPT, 3, ""),
        reply("", 23),
        20,
        encoder("us-west"),
    )
    assert not late.duplicate
    assert sum(o for _, _, o, _ in usage_rows(west).values()) == 23  # 7 more than delivered

    settled = await west.settle_turn(T, "req-z", 16, RecordCodec(T, "us-west"))
    assert (settled.billed_output_tokens, settled.over_billed_output_tokens) == (16, 0)
    rows = usage_rows(west)
    assert {rid: (i, o) for rid, (_, i, o, _) in rows.items()} == {
        "req-z": (PROMPT, 16),
        "req-z-r2": (0, 0),
        "req-z-r3": (0, 0),
    }
    # us-east's own write of the turn, coming last, adds nothing.
    assert (await east.record_turn(T, None, "req-z", None, reply("", 30), b"", tokens=PROMPT + 30)).duplicate
    assert await west.tenant_tokens(T, since=datetime(2000, 1, 1, tzinfo=UTC)) == PROMPT + 16


async def test_a_continuation_not_recorded_yet_bills_what_the_turn_rows_leave(
    regions: tuple[ZoneStore, ZoneStore],
) -> None:
    east, west = regions
    await accepted_and_started(east, "req-z")
    await accepted_and_started(west, "req-z-r2", carried=3)
    # us-east recorded the 4 tokens it generated; us-west's record of r2 still waits in its spool.
    await east.record_turn(
        T, None, "req-z", None, reply("", 4), encoder("us-east")("req-z", PROMPT, 4, ""), tokens=PROMPT + 4
    )
    settled = await west.settle_turn(T, "req-z", 16, RecordCodec(T, "us-west"))
    assert (settled.billed_output_tokens, settled.over_billed_output_tokens) == (16, 0)
    rows = usage_rows(west)
    assert {rid: (i, o) for rid, (_, i, o, _) in rows.items()} == {"req-z": (PROMPT, 4), "req-z-r2": (0, 12)}
    # Billed as the turn's tokens, not a request of its own, and shipped by the settling region.
    assert continued_of(west, "req-z-r2") == "req-z"
    assert rows["req-z-r2"][0] == "us-west"
    late = await west.record_continuation(
        T,
        None,
        "req-z-r2",
        None,
        ContinuedTurn("req-z", PROMPT, 3, ""),
        reply("", 16),
        13,
        encoder("us-west"),
    )
    assert late.duplicate
    assert await west.tenant_tokens(T, since=datetime(2000, 1, 1, tzinfo=UTC)) == PROMPT + 16


# ---------------------------------------------------------------- through the gateway

UNFILTERED_FAST: dict[str, Any] = {
    "context_window": 512,
    "sim_inter_token_s": 0.0005,
    "sim_prefill_per_token_s": 0.000001,
    "sim_prefill_overhead_s": 0.0001,
}
USER = common_pb2.CHAT_ROLE_USER
SAMPLING = common_pb2.SamplingParams(max_tokens=40, temperature=1.0, seed=5)


def start(
    request_id: str = "", conversation_id: str = "", continuation: chat_service_pb2.Continuation | None = None
) -> chat_service_pb2.ChatStart:
    message = chat_service_pb2.ChatStart(
        request_id=request_id,
        model="auto",
        messages=[common_pb2.ChatMessage(role=USER, content=USER_TEXT)],
        sampling=SAMPLING,
        conversation_id=conversation_id,
    )
    if continuation is not None:
        message.continuation.CopyFrom(continuation)
    return message


async def run(
    address: str, secret: str, message: chat_service_pb2.ChatStart, *, cancel_after: int | None = None
) -> list[chat_service_pb2.ChatResponse]:
    """The turn's events; with ``cancel_after``, cancelled after that many deltas."""
    async with open_channel(address) as channel:
        call = chat_service_pb2_grpc.ChatServiceStub(channel).Chat(
            metadata=(("authorization", f"Bearer {secret}"),)
        )
        await call.write(chat_service_pb2.ChatRequest(start=message))
        events: list[chat_service_pb2.ChatResponse] = []
        deltas = 0
        while (event := await call.read()) is not grpc.aio.EOF:
            assert isinstance(event, chat_service_pb2.ChatResponse)
            events.append(event)
            deltas += event.HasField("delta")
            if deltas == cancel_after and event.HasField("delta"):
                await call.write(
                    chat_service_pb2.ChatRequest(cancel=chat_service_pb2.ChatCancel(reason="cut"))
                )
        return events


def deltas(events: list[chat_service_pb2.ChatResponse]) -> list[chat_service_pb2.ChatDelta]:
    return [e.delta for e in events if e.HasField("delta")]


def usage(events: list[chat_service_pb2.ChatResponse]) -> common_pb2.TokenUsage:
    return next(e.usage.usage for e in events if e.HasField("usage"))


@pytest_asyncio.fixture
async def stack() -> AsyncIterator[Stack]:
    async with running_stack(region_overrides={"safety_backends": "none"}, **UNFILTERED_FAST) as running:
        yield running


async def new_tenant(stack: Stack) -> tuple[str, str]:
    book = stack.global_plane.tenants
    tenant = await book.create_tenant(f"t-{uuid.uuid4().hex[:10]}", "us", TenantTier.PRO)
    _, secret = await book.create_api_key(tenant.id)
    await stack.region.policy.refresh()
    return tenant.id, secret


async def began_and_died(store: ZoneStore, tenant_id: str, request_id: str, prompt_tokens: int) -> None:
    """What a region that started ``request_id`` and died before recording it left in the zone store."""
    holder = uuid.uuid4().hex
    await store.accept_turn(
        TurnStart(request_id, tenant_id, "llmmesh-tiny", prompt_tokens, SAMPLING.max_tokens, holder)
    )
    assert await store.mark_started(tenant_id, request_id, holder)


async def settle(stack: Stack) -> None:
    await stack.region.gateway.drain()
    assert await stack.region.shipper.flush(timeout_s=10), "usage not delivered"


@pytest.mark.parametrize("failed_region_recorded", [False, True])
async def test_a_conversation_turn_continued_by_the_gateway_is_whole_and_billed_once(
    stack: Stack, failed_region_recorded: bool
) -> None:
    tenant_id, secret = await new_tenant(stack)
    address = stack.region.address
    whole = await run(address, secret, start())
    text = "".join(d.text for d in deltas(whole))
    prompt, output = usage(whole).input_tokens, usage(whole).output_tokens
    assert output > 6
    conversation = await stack.region.store.create_conversation(tenant_id, "llmmesh-tiny")

    if failed_region_recorded:
        # The original turn ran here, was cut after two deltas, and recorded what it delivered.
        cut = await run(address, secret, start("req-x", conversation.id), cancel_after=2)
        delivered = deltas(cut)
        await stack.region.gateway.drain()
    else:
        delivered = deltas(whole)[:2]
        await began_and_died(stack.region.store, tenant_id, "req-x", prompt)
    token_ids = [t for d in delivered for t in d.token_ids]
    continuation = chat_service_pb2.Continuation(
        original_request_id="req-x",
        original_region="us-west",
        emitted_token_ids=token_ids,
        emitted_text="".join(d.text for d in delivered),
        last_sequence=delivered[-1].sequence,
    )
    rest = await run(address, secret, start("req-x-r2", conversation.id, continuation))
    rest_deltas = deltas(rest)
    assert rest_deltas[0].sequence == delivered[-1].sequence + 1
    assert continuation.emitted_text + "".join(d.text for d in rest_deltas) == text
    # The usage reported is the whole turn's: the prompt once, all the output.
    assert (usage(rest).input_tokens, usage(rest).output_tokens) == (prompt, output)

    stored = await stack.region.store.messages(tenant_id, conversation.id)
    assert [(m.role, m.content) for m in stored] == [(Role.USER, USER_TEXT), (Role.ASSISTANT, text)]
    assert stored[1].id == rest[-1].finished.message_id
    assert (stored[1].input_tokens, stored[1].output_tokens) == (prompt, output)

    await settle(stack)
    billed = await stack.global_plane.ledger.usage(tenant_id, "")
    # The reference turn, plus the continued one once.
    assert (billed.input_tokens, billed.output_tokens) == (2 * prompt, 2 * output)


async def test_a_flagged_phrase_spanning_the_break_is_caught() -> None:
    async with running_stack(region_overrides={"safety_backends": "none"}, **UNFILTERED_FAST) as probe:
        _, secret = await new_tenant(probe)
        whole = deltas(await run(probe.region.address, secret, start()))
    # Unfiltered, each delta is one token: find two words in a row that occur once.
    texts = [d.text for d in whole]
    reply_text = "".join(texts).lower()
    cut = next(
        i
        for i in range(2, len(texts) - 1)
        if all(t.startswith(" ") and t.strip().isalpha() and len(t.strip()) > 3 for t in texts[i - 1 : i + 1])
        and reply_text.count((texts[i - 1] + texts[i]).lower()) == 1
    )
    phrase = (texts[cut - 1] + texts[cut]).strip()
    overrides = {"safety_backends": "rules", "safety_deny_terms": f"violence={phrase}"}
    async with running_stack(region_overrides=overrides, **UNFILTERED_FAST) as stack:
        tenant_id, secret = await new_tenant(stack)
        delivered = whole[:cut]
        original = f"req-{uuid.uuid4().hex[:8]}"
        await began_and_died(stack.region.store, tenant_id, original, 20)
        continuation = chat_service_pb2.Continuation(
            original_request_id=original,
            original_region="us-west",
            emitted_token_ids=[t for d in delivered for t in d.token_ids],
            emitted_text="".join(texts[:cut]),
            last_sequence=delivered[-1].sequence,
        )
        events = await run(stack.region.address, secret, start(continuation=continuation))
    assert events[-1].finished.reason == common_pb2.FINISH_REASON_CONTENT_FILTER
    verdicts = [e.safety for e in events if e.HasField("safety")]
    assert verdicts and verdicts[0].blocked and list(verdicts[0].categories) == ["violence"]
    assert texts[cut].strip() not in "".join(d.text for d in deltas(events)).split()

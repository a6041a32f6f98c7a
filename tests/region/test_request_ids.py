"""Request ids at a region, as an attacker with a valid key sends them
straight to ``ChatService``: the region checks each id before any engine
work (a malformed one is INVALID_ARGUMENT, one its tenant used before
ALREADY_EXISTS), so no turn streams that its usage row would not bill; a
request id is each tenant's own, so another tenant's turn of the same id is
a turn of its own, billed to that tenant, and no tenant can take ids
another will use; and a malformed model name never reaches the global plane.

The store's rules run on SQLite and PostgreSQL (concurrent acceptances
included); the gateway's on a real in-process region.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any, cast

import grpc
import grpc.aio
import pytest
import pytest_asyncio
import sqlalchemy as sa

from llmmesh.core.errors import AlreadyExists, MeshError, Reason
from llmmesh.core.grpcserver import open_channel
from llmmesh.core.sqlstore import create_store_engine
from llmmesh.engine.sim.backend import SimBackend
from llmmesh.globalplane.tiers import TenantTier
from llmmesh.region.zone_store import AcceptedTurn, AssistantMessage, TurnStart, ZoneStore
from llmmesh.region.zone_store import schema as zs
from llmmesh.v1 import billing_service_pb2, chat_service_pb2, chat_service_pb2_grpc, common_pb2
from tests.region.test_region_turns import FAST_POD, Outcome, auth, new_tenant, turn
from tests.stack import Stack, running_stack

pytestmark = pytest.mark.asyncio

A, B = "tenant-a", "tenant-b"


# ---------------------------------------------------------------- the store


def marker(request_id: str, tenant_id: str = A, holder: str = "") -> TurnStart:
    return TurnStart(request_id, tenant_id, "m", 12, 40, holder or uuid.uuid4().hex)


async def test_a_request_id_is_taken_once_per_tenant_across_the_zones_regions(
    regions: tuple[ZoneStore, ZoneStore],
) -> None:
    east, west = regions
    first = marker("req-1")
    await east.accept_turn(first)
    assert await east.mark_started(A, "req-1", first.holder)
    for store in (east, west):
        with pytest.raises(AlreadyExists, match="already used") as info:
            await store.accept_turn(marker("req-1", A))
        assert info.value.reason == Reason.DUPLICATE_REQUEST
    # Tenant B's "req-1" is B's own: a turn of its own, taken once too.
    theirs = marker("req-1", B)
    await west.accept_turn(theirs)
    assert await west.mark_started(B, "req-1", theirs.holder)
    with pytest.raises(AlreadyExists):
        await east.accept_turn(marker("req-1", B))
    # Each acceptance's marker is untouched by the other's.
    with east.engine.connect() as conn:
        rows = conn.execute(sa.select(zs.turn_starts).order_by(zs.turn_starts.c.tenant_id)).all()
    assert [(r.request_id, r.tenant_id, r.home_region, r.holder, r.state) for r in rows] == [
        ("req-1", A, "us-east", first.holder, "started"),
        ("req-1", B, "us-west", theirs.holder, "started"),
    ]


async def test_an_id_recorded_before_markers_existed_is_taken_for_its_tenant(
    regions: tuple[ZoneStore, ZoneStore],
) -> None:
    east, _ = regions
    usage = billing_service_pb2.UsageRecord(request_id="req-old", tenant_id=B).SerializeToString()
    await east.record_turn(B, None, "req-old", None, AssistantMessage("x", "m", "FINISH_REASON_STOP"), usage)
    with pytest.raises(AlreadyExists):
        await east.accept_turn(marker("req-old", B))
    await east.accept_turn(marker("req-old", A))


async def test_a_turn_that_streamed_nothing_may_be_retried_by_its_tenant_only(
    regions: tuple[ZoneStore, ZoneStore],
) -> None:
    east, west = regions
    # us-east accepted the turn and went silent before it streamed anything.
    stalled = marker("req-2")
    await east.accept_turn(stalled)
    # Another tenant's turn of the same id takes nothing from it.
    theirs = marker("req-2", B)
    await west.accept_turn(theirs)
    assert await west.mark_started(B, "req-2", theirs.holder)
    retry = marker("req-2")
    await west.accept_turn(retry)
    # us-east comes back: it has lost the id and must not stream.
    assert not await east.mark_started(A, "req-2", stalled.holder)
    assert not await east.mark_started(B, "req-2", stalled.holder)
    assert await west.mark_started(A, "req-2", retry.holder)
    with pytest.raises(AlreadyExists):
        await east.accept_turn(marker("req-2"))


@pytest.mark.services
async def test_concurrent_acceptances_of_one_id_on_postgresql_take_it_once_per_tenant(
    postgres_schema_url: str,
) -> None:
    stores = [ZoneStore(create_store_engine(postgres_schema_url), "us", f"us-r{n}") for n in range(6)]
    stores[0].create_schema()
    try:
        for _ in range(5):
            request_id = f"req-{uuid.uuid4().hex[:8]}"
            starts = [marker(request_id, A if n % 2 else B) for n in range(len(stores))]
            outcomes = await asyncio.gather(
                *(store.accept_turn(start) for store, start in zip(stores, starts, strict=True)),
                return_exceptions=True,
            )
            # Every acceptance of a tenant may take over its accepted turn: what matters
            # is that once one is marked started, exactly one holder per tenant streams.
            accepted = [
                (store, start)
                for store, start, outcome in zip(stores, starts, outcomes, strict=True)
                if not isinstance(outcome, BaseException)
            ]
            started = await asyncio.gather(
                *(store.mark_started(start.tenant_id, request_id, start.holder) for store, start in accepted)
            )
            held = zip(accepted, started, strict=True)
            streaming = sorted(start.tenant_id for (_, start), ok in held if ok)
            assert streaming == [A, B], (outcomes, started)
            for outcome in outcomes:
                assert not isinstance(outcome, BaseException) or isinstance(outcome, AlreadyExists)
    finally:
        for store in stores:
            store.dispose()


# ---------------------------------------------------------------- through the region


def start(
    request_id: str = "", *, model: str = "auto", max_tokens: int = 12, text: str = "Tell me about ids."
) -> chat_service_pb2.ChatRequest:
    return chat_service_pb2.ChatRequest(
        start=chat_service_pb2.ChatStart(
            request_id=request_id,
            model=model,
            messages=[common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_USER, content=text)],
            sampling=common_pb2.SamplingParams(max_tokens=max_tokens),
        )
    )


@pytest_asyncio.fixture
async def stack() -> AsyncIterator[Stack]:
    # Two pods: a pod refuses a second running generation of one id, its peer would not.
    async with running_stack(region_overrides={"safety_backends": "none"}, pods=2, **FAST_POD) as running:
        yield running


async def read_all(call: Any) -> list[chat_service_pb2.ChatResponse]:
    events = []
    while (event := await call.read()) is not grpc.aio.EOF:
        events.append(event)
    return events


def engine_steps(stack: Stack) -> int:
    return sum(cast(SimBackend, pod.backend).scheduler.steps for pod in stack.engines)


async def outbox_rows(stack: Stack) -> list[Any]:
    query = sa.select(zs.usage_outbox.c.request_id, zs.usage_outbox.c.tenant_id)
    return list(await stack.region.store.transaction(lambda conn: conn.execute(query).all()))


def assert_refused(
    outcome: Outcome, code: grpc.StatusCode, reason: Reason, param: str | None = None
) -> MeshError:
    assert outcome.error is not None, "the turn ran"
    assert not outcome.events, "the turn streamed"
    assert (outcome.error.code, outcome.error.reason) == (code, reason), outcome.error
    if param is not None:
        assert outcome.error.metadata.get("param") == param
    return outcome.error


@pytest.mark.parametrize("request_id", ["r" * 129, "r" * 300, "has space", "new\nline", "-leading", "ü" * 8])
async def test_a_malformed_request_id_is_refused_before_any_engine_work(
    stack: Stack, request_id: str
) -> None:
    secret = await new_tenant(stack, TenantTier.PRO)
    steps = engine_steps(stack)
    outcome = await turn(stack.region.address, secret, start(request_id))
    error = assert_refused(outcome, grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_REQUEST, "request_id")
    assert len(error.message) < 300
    assert engine_steps(stack) == steps
    assert await outbox_rows(stack) == []


async def test_the_longest_request_id_runs_and_is_billed(stack: Stack) -> None:
    secret = await new_tenant(stack, TenantTier.PRO)
    request_id = "r" * 128
    outcome = await turn(stack.region.address, secret, start(request_id))
    assert outcome.error is None and outcome.finished.reason
    await stack.region.gateway.drain()
    assert await stack.region.shipper.flush(timeout_s=10)
    assert not await stack.global_plane.ledger.reconcile([request_id])


@pytest.mark.parametrize("running", [False, True], ids=["finished", "running"])
async def test_a_request_id_reused_by_its_tenant_streams_nothing(stack: Stack, running: bool) -> None:
    tenant_a = await new_tenant(stack, TenantTier.PRO)
    request_id = f"req-{uuid.uuid4().hex[:8]}"
    async with open_channel(stack.region.address) as channel:
        call = chat_service_pb2_grpc.ChatServiceStub(channel).Chat(metadata=auth(tenant_a))
        await call.write(start(request_id, max_tokens=200 if running else 12))
        await call.done_writing()
        first = [await call.read()]
        assert first[0].HasField("started")
        if not running:
            first += await read_all(call)
        steps = engine_steps(stack)
        again = await turn(stack.region.address, tenant_a, start(request_id, text="Something else."))
        assert_refused(again, grpc.StatusCode.ALREADY_EXISTS, Reason.DUPLICATE_REQUEST)
        if not running:
            assert engine_steps(stack) == steps
        else:
            assert sum(cast(SimBackend, pod.backend).scheduler.running for pod in stack.engines) == 1
            first += await read_all(call)
    outcome = Outcome(first)
    assert outcome.finished.reason
    await stack.region.gateway.drain()
    assert await stack.region.shipper.flush(timeout_s=10)
    # The first turn is billed, once, to its own tenant.
    tenant_id = stack.region.policy.authenticate(tenant_a).tenant_id
    assert [(r.request_id, r.tenant_id) for r in await outbox_rows(stack)] == [(request_id, tenant_id)]
    billed = await stack.global_plane.ledger.usage(tenant_id, "")
    assert billed.requests == 1
    assert (billed.input_tokens, billed.output_tokens) == (
        outcome.usage.input_tokens,
        outcome.usage.output_tokens,
    )


@pytest.mark.parametrize("running", [False, True], ids=["after", "while running"])
async def test_two_tenants_turns_of_one_request_id_both_stream_and_each_is_billed_to_its_tenant(
    running: bool,
) -> None:
    # One pod: both turns run on it, at once in the second case.
    async with running_stack(region_overrides={"safety_backends": "none"}, **FAST_POD) as stack:
        secret_a = await new_tenant(stack, TenantTier.PRO)
        secret_b = await new_tenant(stack, TenantTier.PRO)
        tenant_a = stack.region.policy.authenticate(secret_a).tenant_id
        tenant_b = stack.region.policy.authenticate(secret_b).tenant_id
        async with open_channel(stack.region.address) as channel:
            call = chat_service_pb2_grpc.ChatServiceStub(channel).Chat(metadata=auth(secret_a))
            await call.write(start("req-1", max_tokens=200 if running else 12))
            await call.done_writing()
            events_a = [await call.read()]
            assert events_a[0].HasField("started"), events_a
            if not running:
                events_a += await read_all(call)
            theirs = await turn(stack.region.address, secret_b, start("req-1", text="Something else."))
            events_a += await read_all(call)
        mine = Outcome(events_a)
        for outcome in (mine, theirs):
            assert outcome.error is None and outcome.finished.reason, outcome
            assert outcome.events[0].started.request_id == "req-1"
            assert outcome.usage.output_tokens > 0
        # Each tenant's reuse of its own id is still refused.
        for secret in (secret_a, secret_b):
            again = await turn(stack.region.address, secret, start("req-1"))
            assert_refused(again, grpc.StatusCode.ALREADY_EXISTS, Reason.DUPLICATE_REQUEST)
        await stack.region.gateway.drain()
        assert await stack.region.shipper.flush(timeout_s=10)
        assert sorted((r.request_id, r.tenant_id) for r in await outbox_rows(stack)) == sorted(
            [("req-1", tenant_a), ("req-1", tenant_b)]
        )
        ledger = stack.global_plane.ledger
        for tenant_id, outcome in ((tenant_a, mine), (tenant_b, theirs)):
            assert await ledger.reconcile(["req-1"], tenant_id) == []
            billed = await ledger.usage(tenant_id, "")
            assert (billed.requests, billed.input_tokens, billed.output_tokens) == (
                1,
                outcome.usage.input_tokens,
                outcome.usage.output_tokens,
            )


async def test_a_turn_whose_region_went_silent_before_streaming_runs_under_its_id(stack: Stack) -> None:
    secret = await new_tenant(stack, TenantTier.PRO)
    tenant_id = stack.region.policy.authenticate(secret).tenant_id
    request_id = f"req-{uuid.uuid4().hex[:8]}"
    # Another region of the zone accepted it and died before its first event.
    await stack.region.store.accept_turn(marker(request_id, tenant_id))
    outcome = await turn(stack.region.address, secret, start(request_id))
    assert outcome.error is None and outcome.finished.reason
    assert outcome.events[0].started.request_id == request_id


async def test_a_huge_model_name_is_refused_before_any_global_plane_call(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = await new_tenant(stack, TenantTier.PRO)
    asked: list[str] = []
    resolve = stack.region.models.resolve

    async def counted(name: str, tier: common_pb2.Tier.ValueType) -> Any:
        asked.append(name)
        return await resolve(name, tier)

    monkeypatch.setattr(stack.region.models, "resolve", counted)
    outcome = await turn(stack.region.address, secret, start(model="m" * 20_000))
    error = assert_refused(outcome, grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_REQUEST, "model")
    assert len(error.message) < 300
    # The lookup warmer may resolve the region's names meanwhile; the huge one never reaches the registry.
    assert not [name for name in asked if name.startswith("mmm")]
    # A well-formed name still goes to the registry (auto, and the models it weighs).
    assert (await turn(stack.region.address, secret, start())).error is None
    assert "auto" in asked


@pytest.mark.parametrize("quota", [0, 1_000_000], ids=["no quota", "quota"])
async def test_an_id_another_region_took_streams_nothing_and_bills_nothing(stack: Stack, quota: int) -> None:
    # This region never saw the id: the zone store refuses it. A tenant
    # without a quota has it taken while the pod works on the first token;
    # one with a quota is accepted, zone-wide, before any engine work.
    secret = await new_tenant(stack, TenantTier.PRO, monthly_token_quota=quota)
    tenant_id = stack.region.policy.authenticate(secret).tenant_id
    request_id = f"req-{uuid.uuid4().hex[:8]}"
    elsewhere = TurnStart(request_id, tenant_id, "llmmesh-tiny", 10, 12, uuid.uuid4().hex)
    await stack.region.store.accept_turn(elsewhere)
    assert await stack.region.store.mark_started(tenant_id, request_id, elsewhere.holder)
    steps = engine_steps(stack)
    outcome = await turn(stack.region.address, secret, start(request_id))
    assert_refused(outcome, grpc.StatusCode.ALREADY_EXISTS, Reason.DUPLICATE_REQUEST)
    if quota:
        assert engine_steps(stack) == steps
    await stack.region.gateway.drain()
    assert [r.request_id for r in await outbox_rows(stack) if r.tenant_id == tenant_id] == []
    # The store still holds the id for the turn that started elsewhere.
    again = await turn(stack.region.address, secret, start(request_id))
    assert_refused(again, grpc.StatusCode.ALREADY_EXISTS, Reason.DUPLICATE_REQUEST)


async def test_a_retry_of_a_turn_that_has_not_started_takes_its_id_over_in_the_same_region(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The edge retries a turn whose first event is overdue (a frozen pod)
    # under the same id, in the same region when it is the only one: the
    # retry runs, and the turn it replaced stops at its first event.
    secret = await new_tenant(stack, TenantTier.PRO)
    tenant_id = stack.region.policy.authenticate(secret).tenant_id
    request_id = f"req-{uuid.uuid4().hex[:8]}"
    store = stack.region.store
    real_mark = store.mark_started
    stalled_at_first_event, thaw = asyncio.Event(), asyncio.Event()
    holders: list[str] = []

    async def first_one_stalls(tenant: str, request: str, holder: str) -> bool:
        holders.append(holder)
        if len(holders) == 1:
            stalled_at_first_event.set()
            await thaw.wait()
        return await real_mark(tenant, request, holder)

    monkeypatch.setattr(store, "mark_started", first_one_stalls)
    stalled = asyncio.create_task(turn(stack.region.address, secret, start(request_id)))
    await asyncio.wait_for(stalled_at_first_event.wait(), 10)
    retry = await turn(stack.region.address, secret, start(request_id))
    assert retry.error is None and retry.finished.reason, retry
    thaw.set()
    replaced = await asyncio.wait_for(stalled, 10)
    assert_refused(replaced, grpc.StatusCode.ALREADY_EXISTS, Reason.DUPLICATE_REQUEST)
    assert len(set(holders)) == 2
    await stack.region.gateway.drain()
    assert [r.request_id for r in await outbox_rows(stack) if r.tenant_id == tenant_id] == [request_id]


async def test_a_turn_whose_acceptance_fails_is_refused_clearly_and_its_id_given_back(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = await new_tenant(stack, TenantTier.PRO)
    request_id = f"req-{uuid.uuid4().hex[:8]}"
    store = stack.region.store
    real_accept = store.accept_turn
    calls = 0

    async def down_once(marker: TurnStart) -> AcceptedTurn:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise sa.exc.OperationalError("INSERT", {}, Exception("the database is gone"))
        return await real_accept(marker)

    monkeypatch.setattr(store, "accept_turn", down_once)
    outcome = await turn(stack.region.address, secret, start(request_id))
    error = assert_refused(outcome, grpc.StatusCode.UNAVAILABLE, Reason.REGION_UNAVAILABLE)
    assert "zone store" in error.message
    # The caller retries under the same id, in the same region: it runs.
    again = await turn(stack.region.address, secret, start(request_id))
    assert again.error is None and again.finished.reason

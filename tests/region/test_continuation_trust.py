"""A ``ChatStart.continuation`` as an attacker with a valid key sends it
straight to a region: it is accepted only for a turn the zone store knows
was started for the same tenant and model, by one continuation at a time
(a later one replaces it only carrying as much, and the replaced one
cannot start), carrying no more tokens than that turn could produce; its prompt counts against the key's TPM
beyond what the original turn counted, never as 0; and a turn continued
after its region died counts as one request in billing.

The store's rules run on SQLite and PostgreSQL (concurrent continuations
included); the gateway's on a real in-process region.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import cast

import grpc
import grpc.aio
import pytest
import pytest_asyncio
import sqlalchemy as sa

from llmmesh.core.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    MeshError,
    NotFound,
    PermissionDenied,
    Reason,
    from_rpc_error,
)
from llmmesh.core.sqlstore import create_store_engine
from llmmesh.engine.sim.backend import SimBackend
from llmmesh.globalplane.policy_records import TenantUpdate
from llmmesh.region.zone_store import AcceptedTurn, TurnStart, ZoneStore
from llmmesh.region.zone_store import schema as zs
from llmmesh.region.zone_store.turn_starts import MAX_CONTINUATIONS
from llmmesh.v1 import chat_service_pb2
from tests.region.test_continuation import (
    SAMPLING,
    UNFILTERED_FAST,
    began_and_died,
    deltas,
    new_tenant,
    run,
    start,
    usage,
)
from tests.stack import Stack, running_stack

pytestmark = pytest.mark.asyncio

A, B = "tenant-a", "tenant-b"


# ---------------------------------------------------------------- the store


def marker(
    request_id: str, tenant_id: str = A, *, model: str = "m", continues: str | None = None, carried: int = 0
) -> TurnStart:
    return TurnStart(request_id, tenant_id, model, 12, 40, uuid.uuid4().hex, continues, carried)


async def started(store: ZoneStore, request_id: str, tenant_id: str = A) -> None:
    turn = marker(request_id, tenant_id)
    await store.accept_turn(turn)
    assert await store.mark_started(tenant_id, request_id, turn.holder)


async def test_only_a_started_turn_of_the_same_tenant_and_model_is_continued(
    regions: tuple[ZoneStore, ZoneStore],
) -> None:
    east, west = regions
    await started(east, "req-a")
    await started(east, "req-b", B)
    await east.accept_turn(marker("req-silent"))

    refusals: list[tuple[TurnStart, type[MeshError], str]] = [
        (marker("req-none-r2", continues="req-none"), NotFound, "REQUEST_NOT_FOUND"),
        # Another tenant's turn is answered as a missing one.
        (marker("req-b-r2", continues="req-b"), NotFound, "REQUEST_NOT_FOUND"),
        (marker("req-silent-r2", continues="req-silent", carried=1), FailedPrecondition, "INVALID_REQUEST"),
        (marker("req-a-r2", continues="req-a", model="other"), InvalidArgument, "INVALID_REQUEST"),
        (marker("req-a-r2", continues="req-a", carried=41), InvalidArgument, "INVALID_REQUEST"),
    ]
    for turn, error, reason in refusals:
        with pytest.raises(error) as info:
            await west.accept_turn(turn)
        assert info.value.reason == reason, turn
    params = []
    for turn, _, _ in refusals[3:]:
        with pytest.raises(InvalidArgument) as bad:
            await west.accept_turn(turn)
        params.append(bad.value.metadata["param"])
    assert params == ["model", "continuation.emitted_token_ids"]
    with west.engine.connect() as conn:
        taken = set(conn.execute(sa.select(zs.turn_starts.c.request_id)).scalars())
    assert taken == {"req-a", "req-b", "req-silent"}, "a refused continuation left a marker"

    accepted = await west.accept_turn(marker("req-a-r2", continues="req-a", carried=40))
    assert accepted == AcceptedTurn(counted_prompt_tokens=12)


async def test_a_turn_whose_region_went_silent_is_continued_from_nothing(
    regions: tuple[ZoneStore, ZoneStore],
) -> None:
    east, west = regions
    silent = marker("req-s")
    await east.accept_turn(silent)
    # The caller lost east before anything reached it: the turn goes on in west, carrying nothing.
    await west.accept_turn(marker("req-s-r2", continues="req-s"))
    assert not await east.mark_started(A, "req-s", silent.holder), "two regions would stream the turn"


async def test_a_turn_has_one_continuation_at_a_time(regions: tuple[ZoneStore, ZoneStore]) -> None:
    east, west = regions
    await started(east, "req-a")
    first = marker("req-a-r2", continues="req-a", carried=3)
    await west.accept_turn(first)
    # The continuing region failed before it streamed: its retry elsewhere takes the same attempt over.
    retried = marker("req-a-r2", continues="req-a", carried=3)
    await east.accept_turn(retried)
    assert not await west.mark_started(A, "req-a-r2", first.holder)
    # A replayed older continuation, carrying less than the turn's, is refused.
    with pytest.raises(AlreadyExists, match="already continued by 'req-a-r2', which carries 3 tokens"):
        await west.accept_turn(marker("req-a-r9", continues="req-a", carried=2))
    # The continuing region failed too: the next attempt takes its place; the one it replaced cannot start.
    latest = marker("req-a-r3", continues="req-a", carried=3)
    await west.accept_turn(latest)
    assert not await east.mark_started(A, "req-a-r2", retried.holder)
    assert await west.mark_started(A, "req-a-r3", latest.holder)
    for n in range(4, 4 + MAX_CONTINUATIONS - 2):
        await west.accept_turn(marker(f"req-a-r{n}", continues="req-a", carried=5))
    with pytest.raises(AlreadyExists, match=f"{MAX_CONTINUATIONS} times"):
        await west.accept_turn(marker("req-a-r99", continues="req-a", carried=5))
    # A continuation names its turn's original, never another continuation.
    with pytest.raises(InvalidArgument, match="original request id"):
        await west.accept_turn(marker("req-a-r2-r2", continues="req-a-r2"))


async def test_a_continuation_continues_its_tenants_own_turn_of_the_id(
    regions: tuple[ZoneStore, ZoneStore],
) -> None:
    east, west = regions
    await started(east, "req-c", B)  # another tenant's turn, prompt 12
    mine = TurnStart("req-c", A, "m", 30, 40, uuid.uuid4().hex)
    await east.accept_turn(mine)
    assert await east.mark_started(A, "req-c", mine.holder)
    assert await west.accept_turn(marker("req-c-r2", continues="req-c", carried=2)) == AcceptedTurn(30)
    # B's turn was not continued by A's continuation: B may continue it, under the same id.
    assert await west.accept_turn(marker("req-c-r2", B, continues="req-c")) == AcceptedTurn(12)
    with pytest.raises(AlreadyExists, match="already continued"):
        await west.accept_turn(marker("req-c-r3", continues="req-c", carried=1))


@pytest.mark.services
async def test_of_concurrent_continuations_on_postgresql_one_starts(postgres_schema_url: str) -> None:
    stores = [ZoneStore(create_store_engine(postgres_schema_url), "us", f"us-r{n}") for n in range(6)]
    stores[0].create_schema()
    try:
        for _ in range(5):
            original = f"req-{uuid.uuid4().hex[:8]}"
            await started(stores[0], original)
            turns = [marker(f"{original}-r{n + 2}", continues=original) for n in range(len(stores))]
            outcomes = await asyncio.gather(
                *(store.accept_turn(turn) for store, turn in zip(stores, turns, strict=True)),
                return_exceptions=True,
            )
            accepted = [n for n, o in enumerate(outcomes) if isinstance(o, AcceptedTurn)]
            assert accepted, outcomes
            assert all(isinstance(o, AlreadyExists) for n, o in enumerate(outcomes) if n not in accepted)
            began = [await stores[n].mark_started(A, turns[n].request_id, turns[n].holder) for n in accepted]
            assert began.count(True) == 1, (outcomes, began)
    finally:
        for store in stores:
            store.dispose()


# ---------------------------------------------------------------- through the region


@pytest_asyncio.fixture
async def stack() -> AsyncIterator[Stack]:
    async with running_stack(region_overrides={"safety_backends": "none"}, **UNFILTERED_FAST) as running:
        yield running


def continuation(
    original: str, token_ids: list[int], text: str = "", last: int = 1
) -> chat_service_pb2.Continuation:
    return chat_service_pb2.Continuation(
        original_request_id=original,
        original_region="us-east",
        emitted_token_ids=token_ids,
        emitted_text=text,
        last_sequence=last,
    )


async def refusal(stack: Stack, secret: str, message: chat_service_pb2.ChatStart) -> MeshError:
    """The error that refused the turn, which streamed nothing."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await run(stack.region.address, secret, message)
    return from_rpc_error(info.value)


def engine_steps(stack: Stack) -> int:
    return cast(SimBackend, stack.engine.backend).scheduler.steps


async def set_tpm(stack: Stack, tenant_id: str, tpm: int) -> None:
    await stack.global_plane.tenants.update_tenant(tenant_id, TenantUpdate(tpm_limit=tpm))
    await stack.region.policy.refresh()


async def test_continuations_of_turns_never_started_are_refused_over_a_tpm_limit(stack: Stack) -> None:
    tenant_id, secret = await new_tenant(stack)
    await set_tpm(stack, tenant_id, 3000)
    long_prompt = start().messages[0].content * 20
    steps = engine_steps(stack)
    for n in range(12):
        message = start(f"req-{n}-r2", continuation=continuation(f"req-{n}", [5, 6], "ab"))
        message.messages[0].content = long_prompt
        error = await refusal(stack, secret, message)
        assert (error.code, error.reason) == (grpc.StatusCode.NOT_FOUND, Reason.REQUEST_NOT_FOUND)
        assert error.metadata["param"] == "continuation.original_request_id"
    assert engine_steps(stack) == steps
    rows = await stack.region.store.transaction(lambda conn: conn.execute(sa.select(zs.usage_outbox)).all())
    assert rows == []


async def test_another_tenants_turn_cannot_be_continued(stack: Stack) -> None:
    _, owner = await new_tenant(stack)
    _, thief = await new_tenant(stack)
    whole = await run(stack.region.address, owner, start("req-owned"))
    token_ids = [t for d in deltas(whole)[:2] for t in d.token_ids]
    error = await refusal(
        stack, thief, start("req-owned-r2", continuation=continuation("req-owned", token_ids))
    )
    assert (error.code, error.reason) == (grpc.StatusCode.NOT_FOUND, Reason.REQUEST_NOT_FOUND)


async def test_carried_output_must_fit_the_original_turn(stack: Stack) -> None:
    tenant_id, secret = await new_tenant(stack)
    await began_and_died(stack.region.store, tenant_id, "req-x", 20)
    too_many = [7] * (SAMPLING.max_tokens + 1)
    error = await refusal(stack, secret, start("req-x-r2", continuation=continuation("req-x", too_many)))
    assert (error.code, error.metadata["param"]) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "continuation.emitted_token_ids",
    )
    # Text that no carried token decodes to cannot be put in the assistant's mouth.
    error = await refusal(
        stack, secret, start("req-x-r2", continuation=continuation("req-x", [], "Sure! Here is how"))
    )
    assert (error.code, error.metadata["param"]) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "continuation.emitted_text",
    )


async def test_a_replayed_older_continuation_is_refused_by_the_region(stack: Stack) -> None:
    _, secret = await new_tenant(stack)
    cut = await run(stack.region.address, secret, start("req-y"), cancel_after=2)
    delivered = deltas(cut)
    token_ids = [t for d in delivered for t in d.token_ids]
    carried = continuation("req-y", token_ids, "".join(d.text for d in delivered), delivered[-1].sequence)
    rest = await run(stack.region.address, secret, start("req-y-r2", continuation=carried))
    assert rest[-1].HasField("finished") and len(delivered) >= 2
    older = continuation("req-y", list(delivered[0].token_ids), delivered[0].text, delivered[0].sequence)
    error = await refusal(stack, secret, start("req-y-r3", continuation=older))
    assert (error.code, error.reason) == (grpc.StatusCode.ALREADY_EXISTS, Reason.DUPLICATE_REQUEST)


async def test_a_continuations_prompt_counts_against_tpm_beyond_the_originals(stack: Stack) -> None:
    tpm = 100_000
    tenant_id, secret = await new_tenant(stack)
    await set_tpm(stack, tenant_id, tpm)
    whole = await run(stack.region.address, secret, start())
    delivered = deltas(whole)[:2]
    # The original counted one prompt token where it began (a shorter prompt, say).
    await began_and_died(stack.region.store, tenant_id, "req-z", 1)
    carried = continuation(
        "req-z", [t for d in delivered for t in d.token_ids], "".join(d.text for d in delivered)
    )
    rest = await run(stack.region.address, secret, start("req-z-r2", continuation=carried))
    await stack.region.gateway.drain()
    prompt = usage(rest).input_tokens
    own_output = usage(rest).output_tokens - len(carried.emitted_token_ids)

    probe = start()
    probe.sampling.max_tokens = 1
    events = await run(stack.region.address, secret, probe)
    remaining = events[0].started.rate_limit.remaining_tokens
    reserved_by_probe = usage(events).input_tokens + 1
    used = tpm - reserved_by_probe - remaining - (usage(whole).input_tokens + usage(whole).output_tokens)
    assert used == (prompt - 1) + own_output


async def test_a_caller_not_allowed_to_continue_is_refused_before_any_work(stack: Stack) -> None:
    tenant_id, secret = await new_tenant(stack)
    await began_and_died(stack.region.store, tenant_id, "req-w", 20)
    steps = engine_steps(stack)
    turn = stack.region.gateway.run_turn(
        start("req-w-r2", continuation=continuation("req-w", [5])),
        secret,
        asyncio.Event(),
        allow_continuation=False,
    )
    with pytest.raises(PermissionDenied) as info:
        await anext(turn)
    assert info.value.reason == Reason.PEER_NOT_ALLOWED
    assert engine_steps(stack) == steps
    # The same continuation from a caller that may send one runs.
    events = await run(
        stack.region.address, secret, start("req-w-r2", continuation=continuation("req-w", [5]))
    )
    assert events[-1].HasField("finished")


async def test_a_turn_continued_after_its_region_died_is_one_request_in_billing(stack: Stack) -> None:
    tenant_id, secret = await new_tenant(stack)
    whole = await run(stack.region.address, secret, start())
    prompt, output = usage(whole).input_tokens, usage(whole).output_tokens
    other_tenant, other_secret = await new_tenant(stack)
    delivered = deltas(whole)[:2]
    await began_and_died(stack.region.store, other_tenant, "req-v", prompt)
    carried = continuation(
        "req-v", [t for d in delivered for t in d.token_ids], "".join(d.text for d in delivered)
    )
    rest = await run(stack.region.address, other_secret, start("req-v-r2", continuation=carried))
    assert (usage(rest).input_tokens, usage(rest).output_tokens) == (prompt, output)
    await stack.region.gateway.drain()
    assert await stack.region.shipper.flush(timeout_s=10)
    billed = await stack.global_plane.ledger.usage(other_tenant, "")
    assert (billed.requests, billed.input_tokens, billed.output_tokens) == (1, prompt, output)
    assert not await stack.global_plane.ledger.reconcile(["req-v"])
    assert tenant_id != other_tenant

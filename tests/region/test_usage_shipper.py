"""The usage shipper against a fake BillingService on a real in-process gRPC server.

The fake ingests by tenant and request id as billing does, and can be down,
lose its replies after ingesting, or reject a tenant's records.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from decimal import Decimal
from pathlib import Path

import grpc
import grpc.aio
import pytest
import sqlalchemy as sa

from llmmesh.core.grpcserver import GrpcServer, open_channel
from llmmesh.region.usage_shipper import Shipment, UsageShipper
from llmmesh.region.zone_store import AssistantMessage, UsageKey, ZoneStore
from llmmesh.region.zone_store import schema as zs
from llmmesh.v1 import billing_service_pb2, billing_service_pb2_grpc, common_pb2

pytestmark = pytest.mark.asyncio

REPLY = AssistantMessage("ok", "m", "FINISH_REASON_STOP", 3, 2, 0, Decimal("0.001"))


class FakeBilling(billing_service_pb2_grpc.BillingServiceServicer):
    """Ingests idempotently by tenant and request id, like the global plane's UsageLedger."""

    def __init__(self, failures: int = 0, lost_replies: int = 0) -> None:
        self.failures = failures
        self.lost_replies = lost_replies
        self.down = False
        self.rejected_tenants: set[str] = set()
        self.calls = 0
        self.received: Counter[UsageKey] = Counter()
        """Each record in each call that reached ingestion."""
        self.billed: Counter[UsageKey] = Counter()
        """Each record counted (the first time it arrived)."""

    async def RecordUsage(
        self, request: billing_service_pb2.RecordUsageRequest, context: grpc.aio.ServicerContext
    ) -> billing_service_pb2.RecordUsageResponse:
        self.calls += 1
        if self.down:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "global plane down")
        if self.failures > 0:
            self.failures -= 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "global plane down")
        if any(r.tenant_id in self.rejected_tenants for r in request.records):
            await context.abort(grpc.StatusCode.NOT_FOUND, "unknown tenant")
        accepted = 0
        for record in request.records:
            key = UsageKey(record.tenant_id, record.request_id)
            self.received[key] += 1
            if key not in self.billed:
                self.billed[key] += 1
                accepted += 1
        if self.lost_replies > 0:
            self.lost_replies -= 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "connection reset after ingestion")
        return billing_service_pb2.RecordUsageResponse(
            accepted=accepted, duplicates=len(request.records) - accepted
        )

    async def GetUsage(
        self, request: billing_service_pb2.GetUsageRequest, context: grpc.aio.ServicerContext
    ) -> billing_service_pb2.GetUsageResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "not faked")
        raise AssertionError("abort returned")

    async def ReconcileUsage(
        self, request: billing_service_pb2.ReconcileUsageRequest, context: grpc.aio.ServicerContext
    ) -> billing_service_pb2.ReconcileUsageResponse:
        billed = {rid for tenant, rid in self.billed if request.tenant_id in ("", tenant)}
        missing = [rid for rid in request.request_ids if rid not in billed]
        return billing_service_pb2.ReconcileUsageResponse(missing_request_ids=missing)


@asynccontextmanager
async def billing_stub(fake: FakeBilling) -> AsyncIterator[billing_service_pb2_grpc.BillingServiceStub]:
    server = GrpcServer(
        lambda s: billing_service_pb2_grpc.add_BillingServiceServicer_to_server(fake, s),
        ["llmmesh.v1.BillingService"],
    )
    address = await server.start()
    try:
        async with open_channel(address) as channel:
            yield billing_service_pb2_grpc.BillingServiceStub(channel)
    finally:
        await server.stop(0)


async def open_store(path: Path) -> ZoneStore:
    return await ZoneStore.open(f"sqlite:///{path / 'eu.db'}", "eu", "eu-west")


async def record_turns(
    store: ZoneStore, n: int, tenant_id: str = "tenant-a", prefix: str = "req"
) -> list[UsageKey]:
    ids = [f"{prefix}-{i:03d}" for i in range(n)]
    for rid in ids:
        record = billing_service_pb2.UsageRecord(
            request_id=rid, tenant_id=tenant_id, model="m", region="eu-west", usage=common_pb2.TokenUsage()
        )
        await store.record_turn(tenant_id, None, rid, None, REPLY, record.SerializeToString())
    return [UsageKey(tenant_id, rid) for rid in ids]


def shipper(
    store: ZoneStore, stub: billing_service_pb2_grpc.BillingServiceStub, batch: int = 10
) -> UsageShipper:
    return UsageShipper(store, stub, batch, min_backoff_s=0.01, max_backoff_s=0.05, idle_poll_s=0.05)


async def eventually(predicate: Callable[[], bool], what: str) -> None:
    for _ in range(500):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


def unshipped(store: ZoneStore) -> int:
    with store.engine.connect() as conn:
        query = (
            sa.select(sa.func.count())
            .select_from(zs.usage_outbox)
            .where(zs.usage_outbox.c.shipped_at.is_(None))
        )
        return int(conn.execute(query).scalar_one())


async def test_every_row_is_delivered_once_after_billing_recovers(tmp_path: Path) -> None:
    fake = FakeBilling(failures=3)
    store = await open_store(tmp_path)
    try:
        ids = await record_turns(store, 25)
        async with billing_stub(fake) as stub:
            ships = shipper(store, stub)
            ships.start()
            ships.notify()
            assert await ships.flush(timeout_s=30)
            await ships.close()
        assert fake.billed == Counter(ids)
        assert fake.received == Counter(ids)  # nothing was sent again once billing had it
        assert fake.calls == 3 + 3  # three refusals, then batches of 10, 10 and 5
        assert (await ships.pending(), unshipped(store), ships.delivered) == (0, 0, 25)
    finally:
        store.dispose()


async def test_a_reply_lost_after_ingestion_is_resent_and_billed_once(tmp_path: Path) -> None:
    fake = FakeBilling(lost_replies=1)
    store = await open_store(tmp_path)
    try:
        ids = await record_turns(store, 5)
        async with billing_stub(fake) as stub:
            ships = shipper(store, stub)
            assert await ships.ship_batch() is Shipment.FAILED
            assert await ships.pending() == 5  # not marked: the shipper never saw billing succeed
            assert await ships.flush(timeout_s=30)
        assert fake.received == Counter(dict.fromkeys(ids, 2))
        assert fake.billed == Counter(ids)
    finally:
        store.dispose()


async def test_a_restarted_region_ships_what_the_last_process_left(tmp_path: Path) -> None:
    fake = FakeBilling()
    async with billing_stub(fake) as stub:
        store = await open_store(tmp_path)
        ids = await record_turns(store, 10)
        first = shipper(store, stub, batch=4)
        assert await first.ship_batch() is Shipment.SHIPPED
        fake.down = True
        first.start()
        await eventually(lambda: fake.calls >= 3, "the shipper keeps retrying")
        await first.close(drain_timeout_s=0.05)
        store.dispose()

        fake.down = False
        store = await open_store(tmp_path)
        try:
            second = shipper(store, stub, batch=4)
            assert await second.pending() == 6
            second.start()
            assert await second.flush(timeout_s=30)
            await second.close()
        finally:
            store.dispose()
    assert fake.billed == Counter(ids)
    assert fake.received == Counter(ids)


async def test_shipped_rows_and_repeated_turns_are_never_sent_again(tmp_path: Path) -> None:
    fake = FakeBilling()
    store = await open_store(tmp_path)
    try:
        ids = await record_turns(store, 3)
        async with billing_stub(fake) as stub:
            ships = shipper(store, stub)
            assert await ships.flush(timeout_s=30)
            calls = fake.calls
            await record_turns(store, 3)  # the same request ids: no-ops in the store
            assert await ships.ship_batch() is Shipment.IDLE
            assert await ships.flush(timeout_s=30)
            assert fake.calls == calls
        assert fake.received == Counter(ids)
    finally:
        store.dispose()


async def test_a_rejected_record_does_not_hold_back_the_others(tmp_path: Path) -> None:
    fake = FakeBilling()
    fake.rejected_tenants = {"tenant-gone"}
    store = await open_store(tmp_path)
    try:
        good = await record_turns(store, 4)
        # The same request ids as the good ones: another tenant's are other turns.
        bad = await record_turns(store, 2, tenant_id="tenant-gone")
        async with billing_stub(fake) as stub:
            ships = shipper(store, stub)
            assert await ships.ship_batch() is Shipment.FAILED
            assert fake.billed == Counter(good)
            assert [row.key for row in await store.pending_usage()] == bad
            fake.rejected_tenants.clear()  # say the tenant is restored
            assert await ships.flush(timeout_s=30)
        assert fake.billed == Counter(good + bad)
    finally:
        store.dispose()


async def test_the_background_task_ships_rows_recorded_while_it_runs(tmp_path: Path) -> None:
    fake = FakeBilling()
    store = await open_store(tmp_path)
    try:
        async with billing_stub(fake) as stub:
            ships = shipper(store, stub)
            ships.start()
            ids = await record_turns(store, 3)
            ships.notify()
            await eventually(lambda: len(fake.billed) == 3, "rows shipped without a flush")
            await ships.close()
        assert fake.billed == Counter(ids)
        assert await ships.pending() == 0
    finally:
        store.dispose()


async def test_turns_ending_together_ship_in_one_batch(tmp_path: Path) -> None:
    fake = FakeBilling()
    store = await open_store(tmp_path)
    try:
        async with billing_stub(fake) as stub:
            ids = await record_turns(store, 1, prefix="earlier")
            ships = UsageShipper(store, stub, 4, idle_poll_s=60.0, linger_s=60.0)
            ships.start()  # ships what was left at once
            await eventually(lambda: fake.calls == 1, "the leftover row shipped")
            ids += await record_turns(store, 3)
            for _ in range(3):
                ships.notify()
            for _ in range(5):
                await asyncio.sleep(0.01)
            assert fake.calls == 1  # lingering for more rows
            ids += await record_turns(store, 1, prefix="last")
            ships.notify()  # a full batch ships without waiting out the linger
            await eventually(lambda: len(fake.billed) == 5, "the full batch shipped")
            assert fake.calls == 2
            await ships.close()
        assert fake.billed == Counter(ids)
    finally:
        store.dispose()


async def test_a_negative_linger_is_refused(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    try:
        async with billing_stub(FakeBilling()) as stub:
            with pytest.raises(ValueError, match="linger_s"):
                UsageShipper(store, stub, linger_s=-1)
    finally:
        store.dispose()

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime
from decimal import Decimal

import pytest
import pytest_asyncio

from llmmesh.core.end_user import end_user_pseudonym
from llmmesh.core.errors import InvalidArgument, NotFound, Reason
from llmmesh.core.pricing import format_usd
from llmmesh.globalplane.model_catalog import Model, ModelCatalog, ModelTier
from llmmesh.globalplane.store import GlobalStore
from llmmesh.globalplane.tenant_book import TenantBook
from llmmesh.globalplane.tiers import TenantTier
from llmmesh.globalplane.usage_ledger import UsageLedger, UsageRecord
from tests.globalplane.manual_clock import ManualClock

MODEL = Model("m", ModelTier.SMALL, 4096, Decimal("0.0005"), Decimal("0.0015"))


def _pseudonym(end_user: str) -> str:
    """A pseudonym as a zone ships it (the key and tenant here are the test's)."""
    return end_user_pseudonym(b"k" * 32, "ten_test", end_user)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(datetime(2031, 5, 17, 12, 0, tzinfo=UTC))


@pytest.fixture
def tenants(store: GlobalStore, clock: ManualClock) -> TenantBook:
    return TenantBook(store, clock)


@pytest_asyncio.fixture
async def ledger(store: GlobalStore, clock: ManualClock) -> UsageLedger:
    await ModelCatalog(store, clock=clock).add_missing([MODEL])
    return UsageLedger(store, clock)


async def _tenant_id(tenants: TenantBook) -> str:
    return (await tenants.create_tenant("acme", "eu", TenantTier.PRO)).id


def _record(
    tenant_id: str, request_id: str, inp: int = 1000, out: int = 2000, end_time: datetime | None = None
) -> UsageRecord:
    return UsageRecord(request_id, tenant_id, "m", "eu-west", inp, out, end_time=end_time)


@pytest.mark.asyncio
async def test_cost_is_exact_decimal(tenants: TenantBook, ledger: UsageLedger) -> None:
    tid = await _tenant_id(tenants)
    await ledger.record([_record(tid, "r1", 1000, 2000), _record(tid, "r2", 1, 1)])
    totals = await ledger.usage(tid)
    # 1000*0.0005/1000 + 2000*0.0015/1000 + 1*0.0005/1000 + 1*0.0015/1000
    assert totals.cost_usd == Decimal("0.0035") + Decimal("0.000002")
    assert format_usd(totals.cost_usd) == "0.003502"
    assert (totals.input_tokens, totals.output_tokens, totals.requests) == (1001, 2001, 2)
    assert totals.period == "2031-05"


@pytest.mark.asyncio
async def test_huge_counts_stay_exact(tenants: TenantBook, ledger: UsageLedger) -> None:
    tid = await _tenant_id(tenants)
    big = 2**62
    await ledger.record([_record(tid, "r1", big, big)])
    expected = Decimal(big) * Decimal("0.0005") / 1000 + Decimal(big) * Decimal("0.0015") / 1000
    assert (await ledger.usage(tid)).cost_usd == Decimal(big) * Decimal("0.000002")
    assert expected == Decimal(big) * Decimal("0.000002")


@pytest.mark.asyncio
async def test_duplicates_are_counted_not_billed(tenants: TenantBook, ledger: UsageLedger) -> None:
    tid = await _tenant_id(tenants)
    first = await ledger.record([_record(tid, "r1"), _record(tid, "r1")])
    again = await ledger.record([_record(tid, "r1", 99, 99)])
    assert (first.accepted, first.duplicates) == (1, 1)
    assert (again.accepted, again.duplicates) == (0, 1)
    assert (await ledger.usage(tid)).requests == 1


@pytest.mark.asyncio
async def test_concurrent_delivery_bills_once(tenants: TenantBook, ledger: UsageLedger) -> None:
    tid = await _tenant_id(tenants)
    batch = [_record(tid, f"r{i}") for i in range(10)]
    outcomes = await asyncio.gather(*(ledger.record(batch) for _ in range(25)))
    assert sum(o.accepted for o in outcomes) == 10
    assert sum(o.duplicates for o in outcomes) == 24 * 10
    totals = await ledger.usage(tid)
    assert totals.requests == 10
    assert totals.cost_usd == 10 * Decimal("0.0035")


@pytest.mark.asyncio
async def test_period_comes_from_end_time_in_utc(tenants: TenantBook, ledger: UsageLedger) -> None:
    tid = await _tenant_id(tenants)
    april = datetime(2031, 4, 30, 23, 59, tzinfo=UTC)
    await ledger.record([_record(tid, "r1", end_time=april), _record(tid, "r2")])
    assert (await ledger.usage(tid, "2031-04")).requests == 1
    assert (await ledger.usage(tid, "2031-05")).requests == 1
    empty = await ledger.usage(tid, "2030-01")
    assert (empty.requests, empty.cost_usd) == (0, Decimal(0))


@pytest.mark.asyncio
@pytest.mark.parametrize("period", ["2031-13", "2031-5", "31-05", "May", "2031-00"])
async def test_malformed_period_is_invalid(tenants: TenantBook, ledger: UsageLedger, period: str) -> None:
    tid = await _tenant_id(tenants)
    with pytest.raises(InvalidArgument) as info:
        await ledger.usage(tid, period)
    assert info.value.metadata["param"] == "period"


@pytest.mark.asyncio
async def test_invalid_batches_store_nothing(tenants: TenantBook, ledger: UsageLedger) -> None:
    tid = await _tenant_id(tenants)
    with pytest.raises(InvalidArgument):
        await ledger.record([_record(tid, "ok"), _record(tid, "")])
    with pytest.raises(InvalidArgument):
        await ledger.record([_record(tid, "ok"), _record(tid, "neg", -1, 0)])
    with pytest.raises(NotFound) as tenant:
        await ledger.record([_record(tid, "ok"), _record("ten_missing", "x")])
    assert tenant.value.reason == Reason.TENANT_NOT_FOUND
    with pytest.raises(NotFound) as model:
        await ledger.record([UsageRecord("x", tid, "nope", "eu-west", 1, 1)])
    assert model.value.reason == Reason.UNKNOWN_MODEL
    assert await ledger.reconcile(["ok"]) == ["ok"]


@pytest.mark.asyncio
async def test_reconcile_names_what_never_arrived(tenants: TenantBook, ledger: UsageLedger) -> None:
    tid = await _tenant_id(tenants)
    await ledger.record([_record(tid, "r1"), _record(tid, "r3")])
    assert await ledger.reconcile(["r1", "r2", "r3", "r4", "r2"]) == ["r2", "r4"]


@pytest.mark.asyncio
async def test_a_continuations_tokens_are_billed_without_a_second_request(
    tenants: TenantBook, ledger: UsageLedger
) -> None:
    """A failed-over turn is one request, whichever regions ship parts of it."""
    tid = await _tenant_id(tenants)
    original = _record(tid, "req-turn", 10, 4)
    continued = dataclasses.replace(
        original, request_id="req-turn-r2", input_tokens=0, output_tokens=6, continues_request_id="req-turn"
    )
    await ledger.record([original, continued])
    totals = await ledger.usage(tid)
    assert (totals.requests, totals.input_tokens, totals.output_tokens) == (1, 10, 10)


@pytest.mark.asyncio
async def test_one_request_id_of_two_tenants_bills_both(tenants: TenantBook, ledger: UsageLedger) -> None:
    """Tenants choose their request ids: one tenant's id never hides another's turn."""
    first = await _tenant_id(tenants)
    second = (await tenants.create_tenant("globex", "us", TenantTier.PRO)).id
    outcome = await ledger.record([_record(first, "req-1", 5, 5), _record(second, "req-1", 7, 7)])
    assert (outcome.accepted, outcome.duplicates) == (2, 0)
    assert (await ledger.usage(second)).output_tokens == 7
    again = await ledger.record([_record(second, "req-1", 7, 7)])
    assert (again.accepted, again.duplicates) == (0, 1)
    assert await ledger.reconcile(["req-1", "req-2"], second) == ["req-2"]


@pytest.mark.asyncio
async def test_an_end_users_usage_is_kept_and_found(tenants: TenantBook, ledger: UsageLedger) -> None:
    """An operator finds what one end user of a tenant cost (by the pseudonym its zone
    shipped), turns continued elsewhere counted once; another tenant's end user of the
    same pseudonym is not theirs."""
    tid = await _tenant_id(tenants)
    other = (await tenants.create_tenant("globex", "us", TenantTier.PRO)).id
    seven, zero = _pseudonym("user-7f3a"), _pseudonym("user-0000")
    abuser = dataclasses.replace(_record(tid, "r1", 10, 4), end_user=seven)
    continued = dataclasses.replace(
        abuser, request_id="r1-r2", input_tokens=0, output_tokens=6, continues_request_id="r1"
    )
    april = dataclasses.replace(abuser, request_id="r0", end_time=datetime(2031, 4, 2, tzinfo=UTC))
    await ledger.record(
        [
            abuser,
            continued,
            april,
            dataclasses.replace(_record(tid, "r2", 1000, 1000), end_user=zero),
            _record(tid, "r3", 50, 50),
            dataclasses.replace(_record(other, "r1", 99, 99), end_user=seven),
        ]
    )
    mine = await ledger.usage(tid, "", end_user=seven)
    assert (mine.period, mine.requests, mine.input_tokens, mine.output_tokens) == ("2031-05", 1, 10, 10)
    assert mine.cost_usd == Decimal("0.0005") * 10 / 1000 + Decimal("0.0015") * 10 / 1000
    assert (await ledger.usage(tid, "2031-04", end_user=seven)).requests == 1
    assert (await ledger.usage(tid, "", end_user=_pseudonym("nobody"))).requests == 0
    everyone = await ledger.usage(tid)
    assert (everyone.requests, everyone.input_tokens) == (3, 1060)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "end_user",
    [
        "user-7f3a",  # a raw id: it never leaves its zone
        "x" * 257,
        "user\nforged log line",
        "eup1_" + "A" * 26,
        "eup1_" + "a" * 25,
        "eup1_" + "a" * 26 + "\n",
    ],
)
async def test_an_end_user_that_is_no_pseudonym_is_invalid(
    tenants: TenantBook, ledger: UsageLedger, end_user: str
) -> None:
    tid = await _tenant_id(tenants)
    with pytest.raises(InvalidArgument) as recorded:
        await ledger.record([_record(tid, "ok"), dataclasses.replace(_record(tid, "bad"), end_user=end_user)])
    assert recorded.value.metadata["param"] == "end_user"
    assert recorded.value.reason == Reason.END_USER_NOT_PSEUDONYMOUS
    assert await ledger.reconcile(["ok"]) == ["ok"]
    with pytest.raises(InvalidArgument) as asked:
        await ledger.usage(tid, "", end_user=end_user)
    assert asked.value.metadata["param"] == "end_user"
    assert "pseudonymous outside their zone" in asked.value.message
    with pytest.raises(InvalidArgument):
        await ledger.usage_by_model(tid, "", end_user=end_user)
    await ledger.record([dataclasses.replace(_record(tid, "ok"), end_user=_pseudonym("x"))])
    assert (await ledger.usage(tid, "", end_user=_pseudonym("x"))).requests == 1

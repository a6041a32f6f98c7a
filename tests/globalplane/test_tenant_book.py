from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy.engine import Connection

from llmmesh.core import apikeys
from llmmesh.core.errors import AlreadyExists, InvalidArgument, NotFound, Reason, Unauthenticated
from llmmesh.globalplane.policy_records import TenantUpdate
from llmmesh.globalplane.store import GlobalStore
from llmmesh.globalplane.tenant_book import TenantBook
from llmmesh.globalplane.tiers import TenantTier
from tests.globalplane.manual_clock import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def book(store: GlobalStore, clock: ManualClock) -> TenantBook:
    return TenantBook(store, clock)


@pytest.mark.asyncio
async def test_create_and_get_by_id_or_name(book: TenantBook) -> None:
    tenant = await book.create_tenant("acme", "eu", TenantTier.PRO, rpm_limit=60)
    assert tenant.id.startswith("ten_")
    assert await book.get_tenant(tenant.id) == tenant
    assert await book.get_tenant("acme") == tenant


@pytest.mark.asyncio
async def test_duplicate_name_is_already_exists(book: TenantBook) -> None:
    await book.create_tenant("acme", "eu", TenantTier.PRO)
    with pytest.raises(AlreadyExists) as info:
        await book.create_tenant("acme", "us", TenantTier.FREE)
    assert info.value.reason == Reason.TENANT_EXISTS


@pytest.mark.asyncio
@pytest.mark.parametrize("zone", ["", "EU", "eu-west", "1eu", "e u"])
async def test_bad_zone_is_invalid(book: TenantBook, zone: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        await book.create_tenant("acme", zone, TenantTier.PRO)
    assert info.value.metadata["param"] == "zone"


@pytest.mark.asyncio
@pytest.mark.parametrize("field", ["rpm_limit", "tpm_limit", "monthly_token_quota"])
async def test_negative_limit_names_the_field(book: TenantBook, field: str) -> None:
    limits = {"rpm_limit": 0, "tpm_limit": 0, "monthly_token_quota": 0} | {field: -1}
    with pytest.raises(InvalidArgument) as info:
        await book.create_tenant(
            "acme",
            "eu",
            TenantTier.PRO,
            rpm_limit=limits["rpm_limit"],
            tpm_limit=limits["tpm_limit"],
            monthly_token_quota=limits["monthly_token_quota"],
        )
    assert info.value.metadata == {"param": field}


@pytest.mark.asyncio
async def test_missing_tier_and_empty_name_are_invalid(book: TenantBook) -> None:
    with pytest.raises(InvalidArgument) as tier:
        await book.create_tenant("acme", "eu", None)
    assert tier.value.metadata["param"] == "tier"
    with pytest.raises(InvalidArgument) as name:
        await book.create_tenant(" ", "eu", TenantTier.PRO)
    assert name.value.metadata["param"] == "name"


@pytest.mark.asyncio
async def test_unknown_tenant_is_not_found(book: TenantBook) -> None:
    with pytest.raises(NotFound) as info:
        await book.get_tenant("ten_missing")
    assert info.value.reason == Reason.TENANT_NOT_FOUND


@pytest.mark.asyncio
async def test_list_pages_by_name_and_filters_zone(book: TenantBook) -> None:
    for name, zone in [("c", "eu"), ("a", "eu"), ("b", "us"), ("d", "eu")]:
        await book.create_tenant(name, zone, TenantTier.FREE)
    first = await book.list_tenants(page_size=2, zone="eu")
    assert [t.name for t in first.items] == ["a", "c"]
    second = await book.list_tenants(page_size=2, page_token=first.next_page_token, zone="eu")
    assert [t.name for t in second.items] == ["d"]
    assert second.next_page_token == ""


@pytest.mark.asyncio
async def test_update_changes_named_fields_but_never_the_zone(book: TenantBook) -> None:
    tenant = await book.create_tenant("acme", "eu", TenantTier.FREE)
    updated = await book.update_tenant(tenant.id, TenantUpdate(tier=TenantTier.ENTERPRISE, tpm_limit=5000))
    assert (updated.tier, updated.tpm_limit, updated.zone) == (TenantTier.ENTERPRISE, 5000, "eu")
    with pytest.raises(InvalidArgument) as info:
        await book.update_tenant(tenant.id, TenantUpdate(zone="us"))
    assert info.value.reason == Reason.WRONG_ZONE
    with pytest.raises(InvalidArgument):
        await book.update_tenant(tenant.id, TenantUpdate(rpm_limit=-5))
    assert (await book.get_tenant(tenant.id)).zone == "eu"


@pytest.mark.asyncio
async def test_keys_store_only_hashes_and_authenticate(book: TenantBook) -> None:
    tenant = await book.create_tenant("acme", "eu", TenantTier.PRO)
    key, secret = await book.create_api_key("acme")
    assert secret.startswith(apikeys.SECRET_PREFIX)
    assert key.secret_sha256 == apikeys.hash_secret(secret)
    assert secret not in repr(key)
    assert await book.authenticate(secret) == (tenant, key.id)
    chosen, given = await book.create_api_key(tenant.id, secret="sk-llmmesh-chosen")
    assert given == "sk-llmmesh-chosen"
    assert (await book.authenticate(given))[1] == chosen.id
    page = await book.list_api_keys("acme")
    assert {k.id for k in page.items} == {key.id, chosen.id}


@pytest.mark.asyncio
async def test_unknown_and_revoked_keys_fail(book: TenantBook) -> None:
    await book.create_tenant("acme", "eu", TenantTier.PRO)
    key, secret = await book.create_api_key("acme")
    with pytest.raises(Unauthenticated) as unknown:
        await book.authenticate("sk-llmmesh-nope")
    assert unknown.value.reason == Reason.API_KEY_INVALID
    revoked = await book.revoke_api_key(key.id)
    assert revoked.revoke_time is not None
    with pytest.raises(Unauthenticated) as info:
        await book.authenticate(secret)
    assert info.value.reason == Reason.API_KEY_REVOKED
    with pytest.raises(NotFound) as missing:
        await book.revoke_api_key("key_missing")
    assert missing.value.reason == Reason.KEY_NOT_FOUND


@pytest.mark.asyncio
async def test_key_expires_by_the_injected_clock(book: TenantBook, clock: ManualClock) -> None:
    await book.create_tenant("acme", "eu", TenantTier.PRO)
    _, secret = await book.create_api_key("acme", expire_time=clock.now + timedelta(hours=1))
    await book.authenticate(secret)
    clock.advance(hours=1)
    with pytest.raises(Unauthenticated) as info:
        await book.authenticate(secret)
    assert info.value.reason == Reason.API_KEY_EXPIRED
    with pytest.raises(InvalidArgument):
        await book.create_api_key("acme", expire_time=clock.now)


@pytest.mark.asyncio
async def test_snapshot_covers_one_zone_and_versions_every_change(book: TenantBook) -> None:
    eu = await book.create_tenant("acme", "eu", TenantTier.PRO)
    await book.create_tenant("globex", "us", TenantTier.PRO)
    key, _ = await book.create_api_key("acme")
    first = await book.snapshot("eu")
    assert [t.id for t in first.tenants] == [eu.id]
    assert [k.id for k in first.keys] == [key.id]
    assert (await book.snapshot("eu")).version == first.version
    await book.revoke_api_key(key.id)
    second = await book.snapshot("eu")
    assert second.version > first.version
    assert second.keys[0].revoke_time is not None
    await book.update_tenant(eu.id, TenantUpdate(rpm_limit=10))
    assert (await book.snapshot("eu")).version > second.version


@pytest.mark.asyncio
async def test_zone_of_an_id_is_looked_up_once(
    book: TenantBook, store: GlobalStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenant = await book.create_tenant("acme", "eu", TenantTier.PRO)
    calls = 0
    transaction = store.transaction

    async def counting(work: Callable[[Connection], Any]) -> Any:
        nonlocal calls
        calls += 1
        return await transaction(work)

    monkeypatch.setattr(store, "transaction", counting)
    assert [await book.zone_of(tenant.id) for _ in range(3)] == ["eu"] * 3
    assert calls == 1
    # A name may come to mean another tenant, so it is asked every time.
    assert await book.zone_of("acme") == "eu"
    await book.update_tenant(tenant.id, TenantUpdate(name="acme-old"))
    other = await book.create_tenant("acme", "us", TenantTier.PRO)
    assert await book.zone_of("acme") == "us" == await book.zone_of(other.id)
    assert await book.zone_of(tenant.id) == "eu"


@pytest.mark.asyncio
async def test_zone_of_an_unknown_tenant_is_not_found_every_time(book: TenantBook) -> None:
    for _ in range(2):
        with pytest.raises(NotFound) as info:
            await book.zone_of("ten_nobody")
        assert info.value.reason == Reason.TENANT_NOT_FOUND

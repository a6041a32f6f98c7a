"""A revoked key stops working at the region by the next policy refresh
(with the global plane on real PostgreSQL); a new key works at once."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import grpc
import pytest

from llmmesh.core.errors import MeshError
from llmmesh.region.policy_cache import FORCED_REFRESH_GAP_S, UNKNOWN_KEY_RECHECK_S, PolicyCache
from llmmesh.v1 import policy_service_pb2 as ppb
from tests.region.test_chat_servicer import run_turn, start, turn_error
from tests.stack import running_stack, wait_until

pytestmark = pytest.mark.asyncio


@pytest.mark.services
async def test_revocation_reaches_the_region_by_its_next_refresh(postgres_schema_url: str) -> None:
    async with running_stack(database_url=postgres_schema_url) as stack:
        policy = stack.region.policy

        def accepted(secret: str) -> bool:
            try:
                policy.authenticate(secret)
            except MeshError:
                return False
            return True

        key, secret = await stack.global_plane.tenants.create_api_key("dev")
        # The snapshot learns of new keys and revocations from its refresh loop.
        await wait_until(lambda: accepted(secret), timeout_s=10, what="new key reaches the region")
        version = policy.version
        await stack.global_plane.tenants.revoke_api_key(key.id)
        await wait_until(lambda: not accepted(secret), timeout_s=10, what="revocation reaches the region")
        assert policy.version > version
        with pytest.raises(MeshError) as info:
            policy.authenticate(secret)
        assert info.value.reason == "API_KEY_REVOKED"


async def test_a_key_made_a_moment_ago_works_on_its_first_turn_at_the_region() -> None:
    """The region's periodic refresh is a minute away: an unknown key makes
    it fetch a newer snapshot before refusing, at the region's gRPC port."""
    async with running_stack(region_overrides={"policy_refresh_ms": 60_000}) as stack:
        _, secret = await stack.global_plane.tenants.create_api_key("dev")
        events = await run_turn(stack, start(max_tokens=2), secret)
        assert events[0].HasField("started") and events[-1].HasField("finished")
        error = await turn_error(stack, start(max_tokens=2), "sk-llmmesh-" + "0" * 40)
        assert (error.code, error.reason) == (grpc.StatusCode.UNAUTHENTICATED, "API_KEY_INVALID")


class CountingStub:
    """A global plane that answers every snapshot fetch 'not modified', counting them."""

    def __init__(self) -> None:
        self.fetches = 0

    async def GetPolicySnapshot(self, request: object, **options: float) -> ppb.GetPolicySnapshotResponse:
        self.fetches += 1
        await asyncio.sleep(0.01)
        return ppb.GetPolicySnapshotResponse(not_modified=True)


async def test_unknown_keys_ask_the_global_plane_boundedly() -> None:
    stub = CountingStub()
    now = [0.0]
    policy = PolicyCache(cast(Any, stub), "us", refresh_s=60, max_staleness_s=600, clock=lambda: now[0])
    policy._install(ppb.PolicySnapshot(version=1))
    await policy.refresh()
    stub.fetches = 0

    async def refused(secret: str) -> str:
        with pytest.raises(MeshError) as info:
            await policy.authenticate_fresh(secret)
        return info.value.reason

    # Many requests with unknown keys at once share one fetch...
    reasons = await asyncio.gather(*(refused(f"sk-unknown-{n}") for n in range(20)))
    assert set(reasons) == {"API_KEY_INVALID"} and stub.fetches == 1
    # ...a key just found unknown is refused without asking again for a while...
    now[0] += FORCED_REFRESH_GAP_S * 2
    await refused("sk-unknown-0")
    assert stub.fetches == 1
    # ...another unknown key asks again once the gap has passed, and the first after its recheck.
    await refused("sk-unknown-new")
    assert stub.fetches == 2
    now[0] += UNKNOWN_KEY_RECHECK_S
    await refused("sk-unknown-0")
    assert stub.fetches == 3

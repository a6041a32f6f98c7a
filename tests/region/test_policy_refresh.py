"""A revoked key stops working at the region by the next policy refresh,
with the global plane on real PostgreSQL."""

from __future__ import annotations

import pytest

from llmmesh.core.errors import MeshError
from tests.stack import running_stack, wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.services]


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
        # The region learns of new keys and revocations only from its refresh loop.
        await wait_until(lambda: accepted(secret), timeout_s=10, what="new key reaches the region")
        version = policy.version
        await stack.global_plane.tenants.revoke_api_key(key.id)
        await wait_until(lambda: not accepted(secret), timeout_s=10, what="revocation reaches the region")
        assert policy.version > version
        with pytest.raises(MeshError) as info:
            policy.authenticate(secret)
        assert info.value.reason == "API_KEY_REVOKED"

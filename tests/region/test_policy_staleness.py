"""The region's readiness of the global plane is its policy snapshot's age:
it serves on the cached snapshot through an outage and counts the global
plane as down only once the snapshot is older than ``max_staleness_s``."""

from __future__ import annotations

from typing import Any, cast

import pytest

from llmmesh.region.policy_cache import PolicyCache
from llmmesh.v1 import policy_service_pb2 as ppb


class _Answering:
    """A global plane that answers every snapshot fetch."""

    async def GetPolicySnapshot(self, request: object, **options: float) -> ppb.GetPolicySnapshotResponse:
        return ppb.GetPolicySnapshotResponse(snapshot=ppb.PolicySnapshot(version=1))


@pytest.mark.asyncio
async def test_the_global_plane_counts_as_down_only_past_the_snapshot_s_staleness() -> None:
    now = [0.0]
    policy = PolicyCache(cast(Any, _Answering()), "us", refresh_s=1, max_staleness_s=60, clock=lambda: now[0])
    assert policy.staleness().startswith("no policy snapshot yet")
    assert await policy.refresh()
    assert policy.staleness() == ""
    now[0] += 60
    assert policy.staleness() == ""
    now[0] += 1
    assert policy.staleness() == (
        "unreachable: the policy snapshot is 61 s old, past the 60 s the region serves on it"
    )

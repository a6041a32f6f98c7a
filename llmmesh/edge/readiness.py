"""The edge's readiness (``/readyz``): the global plane has not been
unreachable for longer than the edge serves without it
(``global_outage_grace_s``: cached keys and routes). Its stream logs' Redis
(each zone's), when it has any, is reported but not required: without it streams go on,
unresumable (:mod:`edge.streams.hub`). Rules and reporting are
:mod:`llmmesh.core.readiness`'s."""

from __future__ import annotations

from llmmesh.core.readiness import DependencyCheck, OutageGrace, ReadinessWatch
from llmmesh.edge.mesh_client import MeshClient
from llmmesh.edge.settings import EdgeSettings
from llmmesh.edge.streams.log import StreamLogError
from llmmesh.edge.streams.zones import ZoneStreamLogs


def edge_readiness(settings: EdgeSettings, mesh: MeshClient, logs: ZoneStreamLogs) -> ReadinessWatch:
    """The edge's watch over the stream logs' Redis and the global plane."""
    checks: list[DependencyCheck] = []
    if logs.shared():

        async def redis() -> str:
            down = []
            for zones, log in logs.named():
                try:
                    await log.ping()
                except StreamLogError as err:
                    down.append(f"zones {zones}: {err}" if zones != "*" else str(err))
            return "; ".join(down)

        checks.append(DependencyCheck("redis", redis, required=False))
    grace = OutageGrace(settings.global_outage_grace_s)

    async def global_plane() -> str:
        return grace.reason(await mesh.global_serving())

    # Longer than the health call's own deadline: a silent global plane is
    # an outage that the grace judges, not a probe that hung.
    checks.append(DependencyCheck("global_plane", global_plane, timeout_s=5.0))
    return ReadinessWatch("edge", checks)

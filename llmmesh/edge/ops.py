"""The operator API behind the operator page (``/ops``): the regions the
global plane's directory holds, each asked live for its pods (its
``GetRegionInfo``), with the queue depth and capacity of its last heartbeat;
and a tenant's billed usage from the global plane.

It holds no conversation content, and it answers only the edge's operator
key (``ops_key``, ``Authorization: Bearer ...``): a tenant's API key opens
nothing here. An edge without an operator key refuses every request with
403 ``operator_api_disabled`` rather than serve it to anyone.
"""

from __future__ import annotations

import asyncio
import hmac
import re
import time

import grpc.aio
from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from llmmesh.edge.errors import OpenAIError
from llmmesh.edge.mesh_client import MeshClient
from llmmesh.edge.settings import EdgeSettings
from llmmesh.v1 import chat_service_pb2, common_pb2, geo_routing_service_pb2

_INFO_TIMEOUT_S = 2.0
PERIOD_PATTERN = r"^[0-9]{4}-(0[1-9]|1[0-2])$"
TENANT_ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"
PERIOD = re.compile(PERIOD_PATTERN)
"""A billing month, ``YYYY-MM``."""
_TENANT_ID = re.compile(TENANT_ID_PATTERN)


class RegionLive(BaseModel):
    """What a region answered when asked just now (``GetRegionInfo``)."""

    reachable: bool
    error: str | None = Field(default=None, description="The gRPC status name when it did not answer.")
    health: str | None = None
    engine_pods: int | None = None
    healthy_engine_pods: int | None = None
    models: list[str] = Field(default_factory=list)


class RegionView(BaseModel):
    """One region as the directory holds it, with its live answer."""

    region: str
    zone: str
    chat_address: str
    directory_health: str = Field(description="DOWN after missed heartbeats.")
    reported_health: str
    capacity: int = Field(description="Generations it can run at once.")
    queue_depth: int = Field(description="Requests waiting in its gateway and engines.")
    engine_pods: int
    healthy_engine_pods: int
    models: list[str]
    heartbeat_age_s: float | None
    live: RegionLive


class RegionsView(BaseModel):
    """``GET /ops/api/regions``."""

    object: str = "ops.regions"
    global_plane: bool
    data: list[RegionView]


class UsageView(BaseModel):
    """``GET /ops/api/usage``: a tenant's billed usage in one month."""

    object: str = "ops.usage"
    tenant_id: str
    period: str
    input_tokens: int
    output_tokens: int
    cost_usd: str = Field(description="An exact decimal string.")
    requests: int
    models: dict[str, int] = Field(description="Output tokens by the model that served them.")


class OpsRoutes:
    """The operator API over the edge's mesh client."""

    def __init__(self, settings: EdgeSettings, mesh: MeshClient) -> None:
        self._key = settings.ops_key.encode()
        self._mesh = mesh

    def routes(self) -> list[Route]:
        return [
            Route("/ops/api/regions", self.regions, methods=["GET"]),
            Route("/ops/api/usage", self.usage, methods=["GET"]),
        ]

    def authorize(self, request: Request) -> None:
        """Let the request through only with the edge's operator key."""
        if not self._key:
            raise OpenAIError(
                403,
                "this edge has no operator key (LLMMESH_OPS_KEY): the operator API is off",
                type="permission_error",
                code="operator_api_disabled",
            )
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise OpenAIError(
                401,
                "the operator API needs the edge's operator key as 'Authorization: Bearer <key>'",
                code="missing_operator_key",
            )
        if not hmac.compare_digest(token.strip().encode(), self._key):
            raise OpenAIError(401, "that is not this edge's operator key", code="invalid_operator_key")

    async def regions(self, request: Request) -> Response:
        self.authorize(request)
        _no_params(request, set())
        global_ok = await self._mesh.global_serving()
        statuses = await self._mesh.list_regions()
        views = await asyncio.gather(*(self._region(s) for s in statuses))
        body = RegionsView(global_plane=global_ok, data=sorted(views, key=lambda v: (v.zone, v.region)))
        return JSONResponse(body.model_dump(mode="json"))

    async def usage(self, request: Request) -> Response:
        self.authorize(request)
        _no_params(request, {"tenant_id", "period"})
        tenant_id = request.query_params.get("tenant_id", "")
        if not _TENANT_ID.match(tenant_id):
            raise OpenAIError(
                400, "tenant_id must name a tenant (its id)", param="tenant_id", code="invalid_value"
            )
        period = request.query_params.get("period", "")
        if period and not PERIOD.match(period):
            raise OpenAIError(400, "period must be a month, 'YYYY-MM'", param="period", code="invalid_value")
        totals = await self._mesh.usage(tenant_id, period)
        body = UsageView(
            tenant_id=tenant_id,
            period=totals.period,
            input_tokens=totals.input_tokens,
            output_tokens=totals.output_tokens,
            cost_usd=totals.cost_usd,
            requests=totals.requests,
            models={m.model: m.output_tokens for m in totals.models},
        )
        return JSONResponse(body.model_dump(mode="json"))

    async def _region(self, status: geo_routing_service_pb2.RegionStatus) -> RegionView:
        report = status.report
        age = (
            max(0.0, time.time() - status.last_heartbeat_time.ToNanoseconds() / 1e9)
            if status.HasField("last_heartbeat_time")
            else None
        )
        return RegionView(
            region=report.region,
            zone=report.zone,
            chat_address=report.chat_address,
            directory_health=_health(status.effective_health),
            reported_health=_health(report.health),
            capacity=report.capacity,
            queue_depth=report.queue_depth,
            engine_pods=report.engine_pods,
            healthy_engine_pods=report.healthy_engine_pods,
            models=list(report.models),
            heartbeat_age_s=None if age is None else round(age, 3),
            live=await self._live(report.chat_address),
        )

    async def _live(self, address: str) -> RegionLive:
        try:
            info = await self._mesh.chat(address).GetRegionInfo(
                chat_service_pb2.GetRegionInfoRequest(), timeout=_INFO_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as err:
            return RegionLive(reachable=False, error=err.code().name)
        return RegionLive(
            reachable=True,
            health=_health(info.health),
            engine_pods=info.engine_pods,
            healthy_engine_pods=info.healthy_engine_pods,
            models=list(info.models),
        )


def _health(state: common_pb2.HealthState.ValueType) -> str:
    name = common_pb2.HealthState.Name(state) if state in common_pb2.HealthState.values() else "UNKNOWN"
    return name.removeprefix("HEALTH_STATE_")


def _no_params(request: Request, allowed: set[str]) -> None:
    """Refuse a query parameter the operation does not know, by name."""
    for name in request.query_params:
        if name not in allowed:
            raise OpenAIError(400, f"unknown query parameter {name!r}", param=name, code="unknown_parameter")

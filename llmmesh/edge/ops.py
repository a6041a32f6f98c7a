"""The operator API behind the operator page (``/ops``): the regions the
global plane's directory holds, each asked live for its pods (its
``GetRegionInfo``), with the queue depth and capacity of its last heartbeat;
a tenant's billed usage from the global plane; and this edge's traffic over
the last hour (:mod:`edge.traffic_series`), with every region's reported
load sampled from the directory while the operator API is on.

A tenant's API keys are listed, created and revoked here only when the
operator gave the edge an admin identity (``ops_admin_cert_file``): the
global plane lets only an admin change them, and by default the edge, facing
the internet, holds none (``llmmesh admin`` does that). With one, whoever
holds the operator key can manage every tenant's keys; without one those
routes answer 403 ``ops_admin_not_configured``.

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
from typing import Literal

import grpc.aio
from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from llmmesh.edge.errors import OpenAIError
from llmmesh.edge.mesh_client import MeshClient, global_error
from llmmesh.edge.settings import EdgeSettings
from llmmesh.edge.traffic_series import POINTS, TRAFFIC, RegionLoadSampler, TimeSeriesView
from llmmesh.v1 import chat_service_pb2, common_pb2, geo_routing_service_pb2, policy_service_pb2
from llmmesh.v1 import policy_service_pb2_grpc as policy_grpc

_INFO_TIMEOUT_S = 2.0
PERIOD_PATTERN = r"^[0-9]{4}-(0[1-9]|1[0-2])$"
TENANT_ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"
PERIOD = re.compile(PERIOD_PATTERN)
"""A billing month, ``YYYY-MM``."""
_TENANT_ID = re.compile(TENANT_ID_PATTERN)
KEY_ID_PATTERN = r"^[A-Za-z0-9_-]{1,128}$"
_KEY_ID = re.compile(KEY_ID_PATTERN)
_ADMIN_TIMEOUT_S = 5.0
MAX_WINDOW_S = POINTS * TRAFFIC.interval_s
"""The longest window of ``/ops/api/timeseries``, in seconds."""


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


class KeyView(BaseModel):
    """One API key of a tenant, without its secret."""

    id: str
    tenant_id: str
    prefix: str = Field(description="The first characters of the secret, for telling keys apart.")
    created: int | None = Field(description="Unix seconds.")
    expires: int | None = Field(description="Unix seconds; null: never.")
    revoked: int | None = Field(description="Unix seconds; null while active.")


class KeysView(BaseModel):
    """``GET /ops/api/tenants/{tenant}/keys``."""

    object: str = "list"
    tenant_id: str
    data: list[KeyView]


class CreatedKeyView(BaseModel):
    """``POST /ops/api/tenants/{tenant}/keys``: the new key, with its secret, shown this once."""

    object: str = "ops.api_key"
    key: KeyView
    secret: str = Field(description="The key itself; the mesh keeps only its hash.")


class OpsRoutes:
    """The operator API over the edge's mesh client."""

    def __init__(self, settings: EdgeSettings, mesh: MeshClient) -> None:
        self._key = settings.ops_key.encode()
        self._mesh = mesh
        self._sampler = RegionLoadSampler(mesh.list_regions)

    def start(self) -> None:
        """Sample the regions' load, when the operator API is on."""
        if self._key:
            self._sampler.start()

    async def close(self) -> None:
        await self._sampler.close()

    def routes(self) -> list[Route]:
        return [
            Route("/ops/api/regions", self.regions, methods=["GET"]),
            Route("/ops/api/usage", self.usage, methods=["GET"]),
            Route("/ops/api/timeseries", self.timeseries, methods=["GET"]),
            Route("/ops/api/tenants/{tenant}/keys", self.list_keys, methods=["GET"]),
            Route("/ops/api/tenants/{tenant}/keys", self.create_key, methods=["POST"]),
            Route("/ops/api/keys/{key_id}/revoke", self.revoke_key, methods=["POST"]),
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

    async def timeseries(self, request: Request) -> Response:
        self.authorize(request)
        _no_params(request, {"window"})
        text = request.query_params.get("window", str(MAX_WINDOW_S))
        window = int(text) if text.isdigit() else 0
        if not TRAFFIC.interval_s <= window <= MAX_WINDOW_S:
            raise OpenAIError(
                400,
                f"window must be whole seconds from {TRAFFIC.interval_s} to {MAX_WINDOW_S}",
                param="window",
                code="invalid_value",
            )
        body: TimeSeriesView = TRAFFIC.window(window)
        return JSONResponse(body.model_dump(mode="json"))

    def _admin(self, request: Request) -> policy_grpc.PolicyServiceStub:
        """The operator key's check, then the edge's admin access to keys."""
        self.authorize(request)
        _no_params(request, set())
        stub = self._mesh.admin_policy
        if stub is None:
            raise OpenAIError(
                403,
                "this edge holds no admin identity (ops_admin_cert_file / LLMMESH_OPS_ADMIN_CERT_FILE): "
                "manage API keys with `llmmesh admin key`",
                type="permission_error",
                code="ops_admin_not_configured",
            )
        return stub

    async def list_keys(self, request: Request) -> Response:
        stub = self._admin(request)
        tenant = _tenant(request)
        keys: list[KeyView] = []
        token = ""
        try:
            while True:
                page = await stub.ListApiKeys(
                    policy_service_pb2.ListApiKeysRequest(tenant=tenant, page_size=500, page_token=token),
                    timeout=_ADMIN_TIMEOUT_S,
                )
                keys += (_key(k) for k in page.api_keys)
                token = page.next_page_token
                if not token:
                    break
        except grpc.aio.AioRpcError as err:
            raise global_error(err) from err
        return JSONResponse(KeysView(tenant_id=tenant, data=keys).model_dump(mode="json"))

    async def create_key(self, request: Request) -> Response:
        stub = self._admin(request)
        tenant = _tenant(request)
        if await request.body():
            raise OpenAIError(400, "creating a key takes no request body", code="invalid_request_error")
        try:
            created = await stub.CreateApiKey(
                policy_service_pb2.CreateApiKeyRequest(tenant=tenant), timeout=_ADMIN_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as err:
            raise global_error(err) from err
        body = CreatedKeyView(key=_key(created.api_key), secret=created.secret)
        return JSONResponse(
            body.model_dump(mode="json"), status_code=201, headers={"cache-control": "no-store"}
        )

    async def revoke_key(self, request: Request) -> Response:
        stub = self._admin(request)
        key_id = request.path_params["key_id"]
        if not _KEY_ID.match(key_id):
            raise OpenAIError(
                400, "key_id must name an API key (its id)", param="key_id", code="invalid_value"
            )
        if await request.body():
            raise OpenAIError(400, "revoking a key takes no request body", code="invalid_request_error")
        try:
            revoked = await stub.RevokeApiKey(
                policy_service_pb2.RevokeApiKeyRequest(key_id=key_id), timeout=_ADMIN_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as err:
            raise global_error(err) from err
        return JSONResponse(_key(revoked.api_key).model_dump(mode="json"))

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


def _tenant(request: Request) -> str:
    tenant: str = request.path_params["tenant"]
    if not _TENANT_ID.match(tenant):
        raise OpenAIError(400, "tenant must name a tenant (its id)", param="tenant", code="invalid_value")
    return tenant


def _seconds(
    key: policy_service_pb2.ApiKey, name: Literal["create_time", "expire_time", "revoke_time"]
) -> int | None:
    return getattr(key, name).seconds if key.HasField(name) else None


def _key(key: policy_service_pb2.ApiKey) -> KeyView:
    return KeyView(
        id=key.id,
        tenant_id=key.tenant_id,
        prefix=key.display_prefix,
        created=_seconds(key, "create_time"),
        expires=_seconds(key, "expire_time"),
        revoked=_seconds(key, "revoke_time"),
    )


def _no_params(request: Request, allowed: set[str]) -> None:
    """Refuse a query parameter the operation does not know, by name."""
    for name in request.query_params:
        if name not in allowed:
            raise OpenAIError(400, f"unknown query parameter {name!r}", param=name, code="unknown_parameter")

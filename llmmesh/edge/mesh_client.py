"""The edge's gRPC clients: the global plane (keys, routing, models) and a
channel per region.

Region channels ping every ``region_keepalive_ms`` and give up on a peer that
does not answer within as long (gRPC's ping timeout, not only its keepalive
timeout, or an unanswered ping waits a minute), so a token stream over a cut
link fails (UNAVAILABLE) within about twice that and can fail over; a killed
region's reset connection fails at once. They also retry connecting at least every
second, so a region that comes back is reached as soon as it is routed to.

Keys and routes are remembered: a key for ``auth_cache_s``, a tenant's route
for ``route_cache_s`` and used while refreshed until ``route_stale_s``
(:class:`edge.route_cache.RouteCache`), so a turn does not ask the global
plane twice. Both are refreshed in the background once
past half their time (:mod:`llmmesh.core.refresh`): steady traffic never waits on
the global plane, and requests that find one unknown or expired together
(the first burst after an idle spell) wait for one call, not one each.
While the global plane is unreachable, the last answers younger than
``outage_grace_s`` are still used (bounded staleness, as the regions serve
on their cached policy snapshot): the mesh
keeps serving known keys through a global-plane outage, and a key revoked
during one stays usable at the edge for at most that long.

A region that geo-routing stops listing (it missed its heartbeats) while
this edge still finds it serving stays in the routes that listed it
(:mod:`edge.region_checks`): a region cut off from the global plane alone
keeps serving its zone through this edge. A turn that fails on a region
(:meth:`MeshClient.forget_region`) is the edge's own word against it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeAlias, TypeVar

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from llmmesh.core.errors import MeshError, Reason, Unavailable, from_rpc_error
from llmmesh.core.grpc_tracing import client_interceptors
from llmmesh.core.grpcserver import CHANNEL_OPTIONS, open_channel
from llmmesh.core.identity import Role, role_name
from llmmesh.core.model_resolver import ModelResolver
from llmmesh.core.mtls import MeshSecurity, open_secure_channel
from llmmesh.core.outage import PROBE_TIMEOUT_S, OutageGate
from llmmesh.core.pages import collect_pages
from llmmesh.core.refresh import SingleFlight, refresh_due
from llmmesh.edge.region_checks import RegionChecks
from llmmesh.edge.region_session import RegionSession, region_session
from llmmesh.edge.route_cache import RouteCache
from llmmesh.v1 import (
    billing_service_pb2,
    billing_service_pb2_grpc,
    chat_service_pb2,
    chat_service_pb2_grpc,
    geo_routing_service_pb2,
    geo_routing_service_pb2_grpc,
    model_registry_service_pb2,
    model_registry_service_pb2_grpc,
    policy_service_pb2,
    policy_service_pb2_grpc,
)

T = TypeVar("T")
Metadata: TypeAlias = tuple[tuple[str, str], ...]
"""gRPC call metadata."""


@dataclass(frozen=True)
class Principal:
    """The tenant behind an API key."""

    secret: str
    tenant: policy_service_pb2.Tenant
    key_id: str


def region_channel_options(keepalive_ms: int) -> list[tuple[str, int]]:
    """The mesh's channel options with a fast keepalive and reconnect."""
    overrides = {
        "grpc.keepalive_time_ms": keepalive_ms,
        "grpc.keepalive_timeout_ms": keepalive_ms,
        "grpc.http2.ping_timeout_ms": keepalive_ms,
        "grpc.initial_reconnect_backoff_ms": 100,
        "grpc.max_reconnect_backoff_ms": 1_000,
    }
    kept = [(name, value) for name, value in CHANNEL_OPTIONS if name not in overrides]
    return kept + list(overrides.items())


_Regions: TypeAlias = list[geo_routing_service_pb2.RegionStatus]


def global_error(err: grpc.aio.AioRpcError) -> MeshError:
    if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return Unavailable(
            Reason.GLOBAL_PLANE_UNAVAILABLE, "the global control plane is unreachable", retry_after_s=1.0
        )
    return from_rpc_error(err)


@dataclass(frozen=True)
class RouteOptions:
    """How the edge asks geo-routing for a tenant's regions: how long an
    answer is reused (``cache_s``), how long an older one still serves while
    a fresh one is fetched behind it (``stale_s``), and where this edge's
    clients are (``location``: a region name or "lat,lon", sent as the
    client location hint, so the zone's regions come nearest first; empty
    for no preference)."""

    cache_s: float = 1.0
    stale_s: float = 30.0
    location: str = ""


class MeshClient:
    """Talks to the global plane and opens region channels on demand."""

    def __init__(
        self,
        global_address: str,
        auth_cache_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        *,
        region_keepalive_ms: int = 1_000,
        routes: RouteOptions = RouteOptions(),
        outage_grace_s: float = 300.0,
        security: MeshSecurity | None = None,
        admin_security: MeshSecurity | None = None,
    ) -> None:
        # mTLS with the edge's certificate, expecting the global plane's and
        # regions' identities, unless ``security`` is None or insecure.
        self._security = security
        self._global = open_channel(global_address, security, role_name(Role.GLOBAL))
        self.policy = policy_service_pb2_grpc.PolicyServiceStub(self._global)
        # The operator API's admin identity, when the operator gave the edge one.
        self._admin = (
            None
            if admin_security is None
            else open_channel(global_address, admin_security, role_name(Role.GLOBAL))
        )
        self.admin_policy = (
            None if self._admin is None else policy_service_pb2_grpc.PolicyServiceStub(self._admin)
        )
        self.geo = geo_routing_service_pb2_grpc.GeoRoutingServiceStub(self._global)
        self.registry = model_registry_service_pb2_grpc.ModelRegistryServiceStub(self._global)
        self.billing = billing_service_pb2_grpc.BillingServiceStub(self._global)
        # What model names mean, shared by every route that resolves one.
        self.models = ModelResolver(self.registry)
        self._global_health = health_pb2_grpc.HealthStub(self._global)
        self._regions: dict[str, grpc.aio.Channel] = {}
        self._chat_stubs: dict[str, chat_service_pb2_grpc.ChatServiceStub] = {}
        self._sessions: dict[str, RegionSession] = {}
        self._auth_cache: dict[str, tuple[float, Principal]] = {}
        self._auth_cache_s = auth_cache_s
        self._clock = clock
        self._region_options = region_channel_options(region_keepalive_ms)
        self._routes = RouteCache(ttl_s=routes.cache_s, clock=clock, stale_s=routes.stale_s)
        self._location = routes.location
        self._outage_grace_s = outage_grace_s
        # The last answer of each route call, kept for global-plane outages.
        self._last_routes: dict[tuple[str, str, str], tuple[float, _Regions]] = {}
        self.outage = OutageGate(clock=clock)
        self._refresh: SingleFlight[Principal] = SingleFlight("edge keys")
        self.region_checks = RegionChecks(self._region_info, clock)

    async def authenticate(self, secret: str) -> Principal:
        """The tenant behind ``secret``; raises MeshError (UNAUTHENTICATED…)."""
        hit = self._auth_cache.get(secret)
        if hit is not None:
            age = self._clock() - hit[0]
            if age < self._auth_cache_s:
                if refresh_due(age, self._auth_cache_s) and not self.outage.down:
                    self._refresh.start(secret, lambda: self._ask_key(secret, hit))
                return hit[1]
        # Requests that find the key unknown or expired together wait for one call.
        return await asyncio.shield(self._refresh.start(secret, lambda: self._ask_key(secret, hit)))

    async def _ask_key(self, secret: str, hit: tuple[float, Principal] | None) -> Principal:
        """``AuthenticateKey``, remembered; while the global plane is
        unreachable, ``hit`` if it is younger than the outage grace. A key the
        global plane refuses is forgotten at once."""
        stale = hit is not None and self._clock() - hit[0] < self._outage_grace_s
        if hit is not None and stale and self.outage.skip():
            return hit[1]
        try:
            resp = await self.policy.AuthenticateKey(
                policy_service_pb2.AuthenticateKeyRequest(secret=secret),
                timeout=PROBE_TIMEOUT_S if stale else 5.0,
            )
        except grpc.aio.AioRpcError as err:
            error = self._global_failure(err)
            if hit is not None and self._usable_in_outage(error, hit[0]):
                return hit[1]
            if error.reason != Reason.GLOBAL_PLANE_UNAVAILABLE:
                self._auth_cache.pop(secret, None)
            raise error from err
        self.outage.answered()
        principal = Principal(secret=secret, tenant=resp.tenant, key_id=resp.key_id)
        self._auth_cache[secret] = (self._clock(), principal)
        return principal

    async def route(self, tenant_id: str, model: str) -> list[geo_routing_service_pb2.RegionStatus]:
        """The tenant's serving regions, best first; raises when there are none."""

        async def fetch() -> list[geo_routing_service_pb2.RegionStatus]:
            return await self._ask_route(
                (tenant_id, model, ""),
                geo_routing_service_pb2.RouteRequest(
                    tenant_id=tenant_id, model=model, client_location_hint=self._location
                ),
            )

        return list(await self._routes.route(tenant_id, model, fetch))

    def forget_region(self, region: str) -> None:
        """A region refused or dropped a turn: ask geo-routing afresh for the
        routes through it, and keep it in none against geo-routing for a while."""
        self.region_checks.failed(region)
        self._routes.invalidate_region(region)

    async def _ask_route(
        self, key: tuple[str, str, str], request: geo_routing_service_pb2.RouteRequest
    ) -> list[geo_routing_service_pb2.RegionStatus]:
        """``Route``, with the regions of the last answer to the same question
        that it leaves out and this edge finds serving (:mod:`edge.region_checks`);
        while the global plane is unreachable, the last answer if it is
        younger than the outage grace."""
        last = self._last_routes.get(key)
        stale = last is not None and self._clock() - last[0] < self._outage_grace_s
        if last is not None and stale and self.outage.skip():
            return last[1]
        previous = last[1] if last is not None else []
        try:
            resp = await self.geo.Route(request, timeout=PROBE_TIMEOUT_S if stale else 5.0)
        except grpc.aio.AioRpcError as err:
            error = self._global_failure(err)
            if last is not None and self._usable_in_outage(error, last[0]):
                return last[1]
            # Geo-routing lists none of the zone's regions; those this edge still finds serving do.
            kept = (
                await self.region_checks.route([], previous, self._running, request.model)
                if error.reason == Reason.NO_REGION_IN_ZONE
                else []
            )
            if not kept:
                raise error from err
            regions = kept
        else:
            self.outage.answered()
            regions = await self.region_checks.route(resp.regions, previous, self._running, request.model)
        self._last_routes[key] = (self._clock(), regions)
        return regions

    def _running(self, status: geo_routing_service_pb2.RegionStatus) -> int:
        """Turns this edge runs on the region now."""
        session = self._sessions.get(status.report.chat_address)
        return session.running if session is not None else 0

    async def _region_info(self, address: str) -> chat_service_pb2.GetRegionInfoResponse:
        """The region at ``address`` says what it is; AioRpcError when it does not answer in time."""
        info: chat_service_pb2.GetRegionInfoResponse = await self.chat(address).GetRegionInfo(
            chat_service_pb2.GetRegionInfoRequest(), timeout=PROBE_TIMEOUT_S
        )
        return info

    def _global_failure(self, err: grpc.aio.AioRpcError) -> MeshError:
        error = global_error(err)
        if error.reason == Reason.GLOBAL_PLANE_UNAVAILABLE:
            self.outage.failed()
        return error

    def _usable_in_outage(self, error: MeshError, answered_at: float) -> bool:
        return (
            error.reason == Reason.GLOBAL_PLANE_UNAVAILABLE
            and self._clock() - answered_at < self._outage_grace_s
        )

    async def list_models(self) -> list[model_registry_service_pb2.Model]:
        async def fetch(token: str) -> tuple[Sequence[model_registry_service_pb2.Model], str]:
            request = model_registry_service_pb2.ListModelsRequest(page_size=100, page_token=token)
            resp = await self.registry.ListModels(request, timeout=5.0)
            return resp.models, resp.next_page_token

        try:
            return await collect_pages(fetch)
        except grpc.aio.AioRpcError as err:
            raise global_error(err) from err

    async def list_regions(self) -> list[geo_routing_service_pb2.RegionStatus]:
        try:
            resp = await self.geo.ListRegions(
                geo_routing_service_pb2.ListRegionsRequest(page_size=500), timeout=5.0
            )
        except grpc.aio.AioRpcError as err:
            raise global_error(err) from err
        return list(resp.regions)

    async def usage(self, tenant_id: str, period: str) -> billing_service_pb2.GetUsageResponse:
        """A tenant's billed usage in one period ("YYYY-MM", empty for now)."""
        try:
            resp: billing_service_pb2.GetUsageResponse = await self.billing.GetUsage(
                billing_service_pb2.GetUsageRequest(tenant_id=tenant_id, period=period), timeout=5.0
            )
        except grpc.aio.AioRpcError as err:
            raise global_error(err) from err
        return resp

    async def global_serving(self) -> bool:
        try:
            resp = await self._global_health.Check(health_pb2.HealthCheckRequest(), timeout=2.0)
        except grpc.aio.AioRpcError:
            return False
        return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)

    async def zone_regions(
        self, tenant_id: str, preferred_region: str = ""
    ) -> list[geo_routing_service_pb2.RegionStatus]:
        """The serving regions of the tenant's zone, best first, and
        ``preferred_region`` (a conversation's home) first while it serves."""
        return await self._ask_route(
            (tenant_id, "", preferred_region),
            geo_routing_service_pb2.RouteRequest(
                tenant_id=tenant_id, preferred_region=preferred_region, client_location_hint=self._location
            ),
        )

    async def in_zone(
        self,
        principal: Principal,
        call: Callable[[chat_service_pb2_grpc.ChatServiceStub, Metadata], Awaitable[T]],
        *,
        home_region: str = "",
    ) -> T:
        """Make one unary ChatService call as ``principal`` on the tenant's
        zone: its home region first, the zone's next region only when one is
        unreachable (the zone's regions share its store). Any other failure
        is the answer, raised as MeshError."""
        last_error: MeshError | None = None
        for region in await self.zone_regions(principal.tenant.id, home_region):
            stub = self.chat(region.report.chat_address)
            try:
                return await call(stub, (("authorization", f"Bearer {principal.secret}"),))
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE:
                    raise from_rpc_error(err) from err
                last_error = from_rpc_error(err)
        raise last_error or Unavailable(Reason.NO_REGION_IN_ZONE, "no region of the zone is serving")

    def chat(self, address: str) -> chat_service_pb2_grpc.ChatServiceStub:
        """A ChatService stub for a region, one channel (and stub) per address."""
        stub = self._chat_stubs.get(address)
        if stub is None:
            stub = self._chat_stubs[address] = chat_service_pb2_grpc.ChatServiceStub(
                self.region_channel(address)
            )
        return stub

    def region_channel(self, address: str) -> grpc.aio.Channel:
        """The channel to a region, one per address, shared by every service
        the edge calls there (ChatService, embeddings, moderation)."""
        channel = self._regions.get(address)
        if channel is None:
            channel = self._regions[address] = (
                open_secure_channel(address, self._security, role_name(Role.REGION), self._region_options)
                if self._security is not None
                else grpc.aio.insecure_channel(
                    address, options=self._region_options, interceptors=client_interceptors() or None
                )
            )
        return channel

    def session(self, address: str) -> RegionSession:
        """The ChatSession stream to a region, one per address, shared by
        every turn this edge runs there."""
        session = self._sessions.get(address)
        if session is None:
            session = self._sessions[address] = region_session(self.chat(address), address)
        return session

    async def close(self) -> None:
        for session in self._sessions.values():
            await session.close()
        await self._refresh.close()
        await self._routes.close()
        await self.region_checks.close()
        await self.models.close()
        for channel in self._regions.values():
            await channel.close()
        await self._global.close()
        if self._admin is not None:
            await self._admin.close()

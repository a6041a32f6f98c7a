"""Starting and stopping one region plane."""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass

import grpc.aio
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from llmmesh.core import lifecycle
from llmmesh.core.access import AccessPolicy
from llmmesh.core.addresses import advertised_address, advertised_url, check_advertisable, split_host_port
from llmmesh.core.errors import InvalidArgument, Reason
from llmmesh.core.grpcserver import GrpcServer, open_channel
from llmmesh.core.identity import Role, role_name
from llmmesh.core.ids import is_valid_name
from llmmesh.core.metrics_http import MetricsEndpoint
from llmmesh.core.model_resolver import ModelResolver
from llmmesh.core.readiness import ReadinessWatch
from llmmesh.region.admission.control import Admission
from llmmesh.region.admission.fair_queue import FairQueue
from llmmesh.region.admission.quota import QuotaLedger
from llmmesh.region.admission.ratelimit import LocalRateLimiter, RateLimiter
from llmmesh.region.admission.ratelimit_redis import RedisRateLimiter
from llmmesh.region.chat_session import ChatSessions
from llmmesh.region.conversations import ConversationService
from llmmesh.region.embedding_pods import EmbeddingPods
from llmmesh.region.embeddings import EMBEDDINGS_SERVICE_NAME, EmbeddingsGateway, RegionEmbeddingServicer
from llmmesh.region.end_user_servicer import END_USER_METHODS, END_USER_SERVICE_NAME, EndUserServicer
from llmmesh.region.engine_complete import engine_completer
from llmmesh.region.engine_pool import EnginePool
from llmmesh.region.gateway import ChatGateway
from llmmesh.region.heartbeat import Heartbeater, model_pods
from llmmesh.region.knowledge.memory import UserMemory
from llmmesh.region.knowledge.memory_servicer import MEMORY_METHODS, MEMORY_SERVICE_NAME, MemoryServicer
from llmmesh.region.knowledge.memory_store import MemoryStore
from llmmesh.region.knowledge.retrieval import RetrievalGateway
from llmmesh.region.knowledge.retrieval_context import ChatRetrievalContext
from llmmesh.region.knowledge.retrieval_servicer import (
    RETRIEVAL_METHODS,
    RETRIEVAL_SERVICE_NAME,
    RetrievalServicer,
)
from llmmesh.region.knowledge.vector_store import VectorStoreDb
from llmmesh.region.lifecycle.region_lifecycle import RegionLifecycle, build_lifecycle
from llmmesh.region.metrics_gauges import GAUGES, RegionReadings, serve_region_metrics
from llmmesh.region.modelchoice.difficulty_inputs import quota_budget, stored_history
from llmmesh.region.modelchoice.difficulty_route import FleetPolicy, ModelRouter
from llmmesh.region.modelchoice.lookup_warmer import LookupWarmer
from llmmesh.region.moderation import MODERATION_SERVICE_NAME, ModerationGateway, ModerationServicer
from llmmesh.region.placement.hedging import HedgingPolicy
from llmmesh.region.placement.kv_events_feed import KvEventFeeds
from llmmesh.region.placement.kv_index import InMemoryPrefixIndex, PrefixIndex
from llmmesh.region.placement.kv_index_redis import RedisPrefixIndex
from llmmesh.region.placement.router import KvAffinityRouter, LoadBoard, RoutingPolicy
from llmmesh.region.policy_cache import PolicyCache
from llmmesh.region.readiness import region_readiness
from llmmesh.region.safety import SafetyFilters, build_filters
from llmmesh.region.servicer import ChatServicer, region_health
from llmmesh.region.settings import RegionSettings
from llmmesh.region.tokenizer_client import TokenizerClient
from llmmesh.region.turn.admit import TurnAdmission
from llmmesh.region.turn.knowledge import TurnKnowledge
from llmmesh.region.turn.place import TurnPlacement
from llmmesh.region.turn.prepare import TurnPreparation
from llmmesh.region.turn.prompt import TurnPrompts
from llmmesh.region.turn.record import TurnRecorder
from llmmesh.region.turn.settle import TurnSettlement
from llmmesh.region.turn.stream import PodStream
from llmmesh.region.usage_shipper import UsageShipper
from llmmesh.region.zone_store.store import ZoneStore
from llmmesh.v1 import (
    billing_service_pb2_grpc,
    chat_service_pb2,
    chat_service_pb2_grpc,
    common_pb2,
    embedding_service_pb2_grpc,
    end_user_service_pb2_grpc,
    geo_routing_service_pb2,
    geo_routing_service_pb2_grpc,
    memory_service_pb2_grpc,
    model_registry_service_pb2_grpc,
    moderation_service_pb2_grpc,
    policy_service_pb2_grpc,
    retrieval_service_pb2_grpc,
)

log = logging.getLogger(__name__)

SERVICE_NAME = "llmmesh.v1.ChatService"

# Turns and conversations come from the edge, from a gRPC client holding a
# client certificate (with its API key, as at the edge), or an operator;
# only the edge may continue a failed-over turn (checked per turn).
_SPEAKERS = (Role.EDGE, Role.CLIENT, Role.ADMIN)
REGION_ACCESS = {
    "Chat": _SPEAKERS,
    "ChatSession": _SPEAKERS,
    "CreateConversation": _SPEAKERS,
    "GetConversation": _SPEAKERS,
    "ListConversations": _SPEAKERS,
    "DeleteConversation": _SPEAKERS,
    "ListMessages": _SPEAKERS,
    "ListBranches": _SPEAKERS,
    "CreateEmbeddings": _SPEAKERS,
    "Moderate": _SPEAKERS,
    "GetRegionInfo": (Role.EDGE, Role.GLOBAL, Role.REGION, Role.ADMIN),
    # Only the edge knows what reached a client (checked again per call).
    "SettleTurn": (Role.EDGE,),
    # Files, vector stores and search: tenant content, reached as turns are.
    **dict.fromkeys(RETRIEVAL_METHODS, _SPEAKERS),
    **dict.fromkeys(MEMORY_METHODS, _SPEAKERS),
    # An operator's, to ask billing by an end user's pseudonym; no other
    # plane may hold an oracle of the zone's pseudonyms.
    **dict.fromkeys(END_USER_METHODS, (Role.ADMIN,)),
}


def parse_location(text: str) -> common_pb2.GeoPoint:
    """A 'lat,lon' setting as a GeoPoint."""
    try:
        lat_text, lon_text = text.split(",")
        lat, lon = float(lat_text), float(lon_text)
    except ValueError as exc:
        raise InvalidArgument(Reason.INVALID_REQUEST, f"location must be 'lat,lon', got {text!r}") from exc
    if not (-90 <= lat <= 90 and -180 <= lon <= 180):
        raise InvalidArgument(Reason.INVALID_REQUEST, f"location out of range: {text!r}")
    return common_pb2.GeoPoint(latitude=lat, longitude=lon)


@dataclass(frozen=True)
class RegionLinks:
    """What a running region holds of the mesh beyond it: its channel to the
    global plane and what it keeps from there (the policy snapshot, model
    lookups, heartbeats), its zone's Redis, its metrics endpoint, and the
    readiness watch over those it needs (:mod:`region.readiness`)."""

    global_channel: grpc.aio.Channel
    policy: PolicyCache
    models: ModelResolver
    heartbeat: Heartbeater
    redis: redis.asyncio.Redis | None
    metrics: MetricsEndpoint | None
    readiness: ReadinessWatch


@dataclass(frozen=True)
class RegionPods:
    """A running region's engine pods: the pool, the router and the KV-event
    feeds it places by, the embedding pods, and the warm model lookups."""

    pool: EnginePool
    router: KvAffinityRouter
    feeds: KvEventFeeds | None
    embedding_pods: EmbeddingPods
    lookups: LookupWarmer


@dataclass(frozen=True)
class RegionStores:
    """What a running region keeps: the zone store, its usage shipper, the
    retrieval store, and the housekeeping over them."""

    store: ZoneStore
    shipper: UsageShipper
    retrieval: RetrievalGateway
    lifecycle: RegionLifecycle


@dataclass
class RegionPlane:
    """A running region: its server, its gateway and sessions, and its
    links, pods and stores (each part also reachable by name, as tests do)."""

    settings: RegionSettings
    address: str
    server: GrpcServer
    gateway: ChatGateway
    sessions: ChatSessions
    links: RegionLinks
    pods: RegionPods
    stores: RegionStores

    @property
    def global_channel(self) -> grpc.aio.Channel:
        return self.links.global_channel

    @property
    def policy(self) -> PolicyCache:
        return self.links.policy

    @property
    def models(self) -> ModelResolver:
        return self.links.models

    @property
    def heartbeat(self) -> Heartbeater:
        return self.links.heartbeat

    @property
    def redis(self) -> redis.asyncio.Redis | None:
        return self.links.redis

    @property
    def metrics(self) -> MetricsEndpoint | None:
        return self.links.metrics

    @property
    def pool(self) -> EnginePool:
        return self.pods.pool

    @property
    def router(self) -> KvAffinityRouter:
        return self.pods.router

    @property
    def feeds(self) -> KvEventFeeds | None:
        return self.pods.feeds

    @property
    def embedding_pods(self) -> EmbeddingPods:
        return self.pods.embedding_pods

    @property
    def lookups(self) -> LookupWarmer:
        return self.pods.lookups

    @property
    def store(self) -> ZoneStore:
        return self.stores.store

    @property
    def shipper(self) -> UsageShipper:
        return self.stores.shipper

    @property
    def retrieval(self) -> RetrievalGateway:
        return self.stores.retrieval

    @property
    def lifecycle(self) -> RegionLifecycle:
        return self.stores.lifecycle

    @property
    def metrics_url(self) -> str:
        """Where others scrape this region's /metrics: its advertised host, the endpoint's port."""
        return advertised_url(self.metrics.url, self.address) if self.metrics else ""

    def info(self) -> chat_service_pb2.GetRegionInfoResponse:
        healthy = len(self.pool.healthy_pods)
        return chat_service_pb2.GetRegionInfoResponse(
            region=self.settings.region,
            zone=self.settings.zone,
            # Chat models and the embedding models the same pods serve.
            models=sorted({*self.pool.models, *self.embedding_pods.models}),
            engine_pods=len(self.pool.pods),
            healthy_engine_pods=healthy,
            health=region_health(healthy, len(self.pool.pods)),
        )

    def report(self) -> geo_routing_service_pb2.RegionReport:
        info = self.info()
        queue = self.gateway.admission.queue.stats()
        waiting_at_pods = 0
        for pod in self.pool.healthy_pods:
            load = self.router.loads.report(pod.pod_id)
            waiting_at_pods += load.waiting if load is not None else 0
        return geo_routing_service_pb2.RegionReport(
            region=info.region,
            zone=info.zone,
            chat_address=self.address,
            health=info.health,
            # Turns the region admits at once: its engines' batch slots, overcommitted.
            capacity=queue.capacity,
            # Turns waiting: for admission here, and for a batch slot at the pods.
            queue_depth=queue.total_waiting + waiting_at_pods,
            models=info.models,
            location=parse_location(self.settings.location),
            engine_pods=info.engine_pods,
            healthy_engine_pods=info.healthy_engine_pods,
            model_pods=model_pods(self.pool.pods, self.embedding_pods.pods_by_model()),
        )

    async def stop(self, grace_s: float = 5.0) -> None:
        """Drain streams, stop reporting, deliver pending usage."""
        GAUGES.remove(self.settings.region)
        # First: a readiness change must not report the draining server SERVING.
        await self.links.readiness.close()
        self.sessions.drain()
        await self.server.stop(grace_s)
        await self.heartbeat.close()
        await self.policy.close()
        await self.lookups.close()
        await self.models.close()
        await self.lifecycle.close()
        await self.gateway.drain()
        await self.shipper.close()
        await asyncio.to_thread(self.store.dispose)
        await self.gateway.drain_memory()
        await asyncio.to_thread(self.retrieval.db.dispose)
        if self.feeds is not None:
            await self.feeds.close()
        await self.router.loads.close()
        await self.embedding_pods.close()
        await self.pool.close()
        if self.redis is not None:
            await self.redis.aclose()
        await self.global_channel.close()
        if self.metrics is not None:
            self.metrics.stop()


async def start_region(settings: RegionSettings) -> RegionPlane:
    """Start a region plane in this process and return it serving."""
    for name, value in (("region", settings.region), ("zone", settings.zone)):
        if not is_valid_name(value):
            raise InvalidArgument(Reason.INVALID_REQUEST, f"invalid {name} name {value!r}")
    parse_location(settings.location)
    if not settings.engine_address_list():
        raise InvalidArgument(Reason.INVALID_REQUEST, "a region needs at least one engine address")
    if settings.routing_policy not in {p.value for p in RoutingPolicy}:
        choices = ", ".join(p.value for p in RoutingPolicy)
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            f"unknown routing policy {settings.routing_policy!r}; use one of {choices}",
        )
    plane_name = f"region {settings.region}"
    check_advertisable(settings.host, settings.advertise_address, plane_name)
    split_host_port(settings.global_address, "global_address")
    for engine_address in settings.engine_address_list():
        split_host_port(engine_address, "engine_addresses")
    security = settings.mesh_security(f"region-{settings.region}")
    own = security.expect_role(Role.REGION)
    if own is not None and (own.zone, own.region) != (settings.zone, settings.region):
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            f"this region's certificate names {own}, not region {settings.region} of zone {settings.zone}",
        )
    global_channel = open_channel(settings.global_address, security, role_name(Role.GLOBAL))
    policy = PolicyCache(
        policy_service_pb2_grpc.PolicyServiceStub(global_channel),
        settings.zone,
        refresh_s=settings.policy_refresh_ms / 1000,
        max_staleness_s=settings.policy_max_staleness_ms / 1000,
    )
    models = ModelResolver(model_registry_service_pb2_grpc.ModelRegistryServiceStub(global_channel))
    routing = RoutingPolicy(settings.routing_policy)
    pod_name = role_name(Role.ENGINE, settings.zone, settings.region)
    pool = EnginePool(
        settings.engine_address_list(),
        settings.engine_health_interval_ms / 1000,
        dial=lambda address: open_channel(address, security, pod_name),
    )
    store = await ZoneStore.open(settings.zone_store_database_url(), settings.zone, settings.region)
    billing = billing_service_pb2_grpc.BillingServiceStub(global_channel)
    shipper = UsageShipper(store, billing)
    # The zone's key, read (or made, by the zone's first region) before any turn needs it.
    await shipper.pseudonyms.load()
    shared = _open_redis(settings.redis_url) if settings.redis_url else None
    limiter: RateLimiter = (
        RedisRateLimiter(shared, prefix=f"llmmesh:{settings.zone}:rl:") if shared else LocalRateLimiter()
    )
    index: PrefixIndex = (
        RedisPrefixIndex(shared, key_prefix=f"llmmesh:{settings.region}:kv")
        if shared
        else InMemoryPrefixIndex()
    )
    tokenizer = TokenizerClient(pool)
    loads = LoadBoard(pool, slow_start_s=settings.pod_slow_start_ms / 1000)
    hedging = HedgingPolicy(settings.hedge_ttft_ms / 1000, settings.hedge_max_priority)
    router = KvAffinityRouter(routing, pool, index, tokenizer, loads=loads, hedging=hedging)
    feeds = KvEventFeeds(index) if routing is RoutingPolicy.PRECISE else None
    queue = FairQueue(0, max_waiting=settings.admission_max_waiting)
    admission = Admission(limiter, QuotaLedger(billing, store, settings.quota_refresh_ms / 1000), queue)
    safety = _safety_filters(settings, pool)
    embedding_pods = EmbeddingPods(pool)

    def embedding_models() -> list[str]:
        return embedding_pods.models

    # Registered first: a turn queued for a slot fails at once when its model's last pod goes.
    turn_admission = TurnAdmission(admission, store, pool)

    def pods_checked() -> None:
        # Paying tiers may overcommit the engines' batch slots (the engines
        # order their waiting turns by priority); the free tier never fills
        # them, so a paying turn finds a slot in the next engine step.
        slots = pool.batch_slots
        capacity = math.ceil(slots * settings.admission_overcommit)
        free_limit = max(0, slots - math.ceil(slots * settings.admission_reserve))
        queue.set_capacity(capacity, reserve=max(0, capacity - free_limit))
        if feeds is not None:
            feeds.follow(pool.healthy_pods)

    pool.on_checked(pods_checked)
    pool.on_checked(embedding_pods.refresh_soon)
    lookups = LookupWarmer(
        models,
        pool,
        tiers=lambda: {tenant.tier for tenant in policy.tenants()},
        embedding_models=embedding_models,
    )
    pool.on_checked(lookups.checked)
    embeddings = EmbeddingsGateway(settings, policy, models, embedding_pods, admission, store, shipper)
    vector_db = await VectorStoreDb.open(
        settings.zone_store_database_url(),
        settings.region,
        dimensions=settings.retrieval_embedding_dimensions,
    )
    retrieval = RetrievalGateway(settings, settings.zone, policy, vector_db, embeddings)
    memory_store = MemoryStore(vector_db)
    await asyncio.to_thread(memory_store.create_schema)
    zone_data = (vector_db, memory_store)
    lifecycle = build_lifecycle(
        settings, store, shipper, pool, models, policy, admission, embedding_models, tenant_data=zone_data
    )
    knowledge = TurnKnowledge(
        store,
        ChatRetrievalContext(retrieval, settings.retrieval_context_results),
        UserMemory(memory_store, lifecycle.extract),
    )
    model_router = ModelRouter(
        models,
        pool,
        router.loads,
        quota_budget(admission.quota),
        embedding_models=embedding_models,
        policy=FleetPolicy.of(settings.fallback_queue_factor, settings.named_fallback_tiers),
        history=stored_history(store),
    )
    prompts = TurnPrompts(settings, pool, tokenizer, store, lifecycle.summaries)
    preparation = TurnPreparation(
        settings, policy, model_router, pool, safety, knowledge, prompts, embedding_models
    )
    recorder = TurnRecorder(settings, store, shipper, lifecycle.retries)
    pods = PodStream(settings, safety, turn_admission, recorder, pool=pool)
    placement = TurnPlacement(router, pool, preparation, turn_admission, pods)
    gateway = ChatGateway(preparation, turn_admission, placement, recorder)
    moderation = ModerationGateway(settings, policy, admission, safety)
    conversations = ConversationService(policy, store, models, settings)
    plane: RegionPlane | None = None

    def info() -> chat_service_pb2.GetRegionInfoResponse:
        assert plane is not None
        return plane.info()

    sessions = ChatSessions()
    settlement = TurnSettlement(settings.region, policy, store, shipper)
    servicer = ChatServicer(gateway, conversations, info, sessions, settlement)

    def register(server: grpc.aio.Server) -> None:
        chat_service_pb2_grpc.add_ChatServiceServicer_to_server(servicer, server)
        embedding_service_pb2_grpc.add_RegionEmbeddingServiceServicer_to_server(
            RegionEmbeddingServicer(embeddings), server
        )
        moderation_service_pb2_grpc.add_ModerationServiceServicer_to_server(
            ModerationServicer(moderation), server
        )
        retrieval_service_pb2_grpc.add_RetrievalServiceServicer_to_server(
            RetrievalServicer(retrieval), server
        )
        memory_service_pb2_grpc.add_MemoryServiceServicer_to_server(
            MemoryServicer(policy, memory_store), server
        )
        end_user_service_pb2_grpc.add_EndUserServiceServicer_to_server(
            EndUserServicer(settings.zone, policy, shipper.pseudonyms), server
        )

    server = GrpcServer(
        register,
        [
            SERVICE_NAME,
            EMBEDDINGS_SERVICE_NAME,
            MODERATION_SERVICE_NAME,
            RETRIEVAL_SERVICE_NAME,
            MEMORY_SERVICE_NAME,
            END_USER_SERVICE_NAME,
        ],
        settings.host,
        settings.port,
        security=security,
        access=AccessPolicy(REGION_ACCESS, zone=settings.zone),
    )
    await pool.check()
    await embedding_pods.refresh()
    await policy.refresh()
    # What the region registers as its chat_address: the edge dials it from another host.
    address = advertised_address(await server.start(), settings.advertise_address, plane_name)
    heartbeat = Heartbeater(
        geo_routing_service_pb2_grpc.GeoRoutingServiceStub(global_channel),
        lambda: plane.report() if plane else geo_routing_service_pb2.RegionReport(),
        settings.heartbeat_interval_ms / 1000,
        # A model retired or changed in the registry is seen at the next heartbeat, not the cache's TTL.
        on_catalog_change=models.forget_all,
    )
    readings = RegionReadings(settings.region, settings.zone, queue, pool, loads, shipper.outbox)
    plane = RegionPlane(
        settings,
        address,
        server,
        gateway,
        sessions,
        RegionLinks(
            global_channel,
            policy,
            models,
            heartbeat,
            shared,
            serve_region_metrics(readings, settings.host, settings.metrics_port),
            region_readiness(server, shared, store, policy),
        ),
        RegionPods(pool, router, feeds, embedding_pods, lookups),
        RegionStores(store, shipper, retrieval, lifecycle),
    )
    lifecycle.start()
    pool.start()
    loads.start(settings.load_refresh_ms / 1000)
    policy.start()
    shipper.start()
    heartbeat.start()
    plane.links.readiness.start()
    await heartbeat.beat()
    log.info("region %s (zone %s) serving ChatService on %s", settings.region, settings.zone, address)
    return plane


def _open_redis(url: str) -> redis.asyncio.Redis:
    """The shared Redis; short timeouts, since every caller has a way to go on without it."""
    return redis.asyncio.Redis.from_url(
        url, socket_connect_timeout=0.5, socket_timeout=1.0, retry=Retry(NoBackoff(), 1)
    )


def _safety_filters(settings: RegionSettings, pool: EnginePool) -> SafetyFilters | None:
    """The configured filters, or None when every backend is off."""
    try:
        judge = engine_completer(pool, settings.safety_judge_model)
        filters = build_filters(settings, judge=judge)
    except ValueError as err:
        raise InvalidArgument(Reason.INVALID_REQUEST, f"safety settings: {err}") from err
    return filters if filters.backends else None


async def serve(settings: RegionSettings) -> None:
    """Run a region until SIGTERM or SIGINT, then drain."""
    stop = lifecycle.stop_event()
    plane = await start_region(settings)
    lifecycle.settle_heap()
    lifecycle.write_ready_file(
        settings.ready_file,
        {
            "address": plane.address,
            "region": settings.region,
            "zone": settings.zone,
            "metrics_url": plane.metrics_url,
        },
    )
    await stop.wait()
    log.info("region %s draining", settings.region)
    await plane.stop()

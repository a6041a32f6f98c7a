"""``llmmesh bench routing --clock virtual``: the region's real placement
code over simulator pods, in one process, in virtual time.

What runs is the code a region runs, wired as :mod:`region.server` wires
it, with the network replaced by :mod:`llmmesh.bench.inprocess_grpc`
(every message still serialized and parsed): per region an
:class:`~region.engine_pool.EnginePool` with its health checks, the
:class:`~region.placement.router.LoadBoard` polling ``GetLoad``, the
:class:`~region.placement.router.KvAffinityRouter` with its policies, the
:class:`~region.placement.kv_index.InMemoryPrefixIndex` fed by
:class:`~region.placement.kv_events_feed.KvEventFeeds` over the pods'
``StreamKvEvents``, disaggregated placement and hedging when asked
(:class:`VirtualSpec`; the CLI runs hedging off, the region's default), and
the :class:`~region.admission.fair_queue.FairQueue` sized to the pods'
batch slots as the region sizes it. Each turn takes a queue slot, is
tokenized with the pods' published tokenizer (:class:`PromptTokens`),
placed, and generated over the pod's shared
``GenerateSession``, as :mod:`region.turn.place` and
:mod:`region.turn.stream` do. The pods are :class:`engine.sim.backend.SimBackend`
behind the real :class:`engine.servicer.EngineServicer`
(:mod:`llmmesh.bench.virtual_pods`), with the
simulator's documented step model (:mod:`engine.sim.timing`) at its
calibrated defaults: a step lasts what the model says, on the loop's
clock.

The loop is :mod:`llmmesh.bench.virtual_clock`'s: time advances only from
one timer to the next, so the figures are a function of the seed and the
plan alone, the same on any machine and under any load (the JSON is
byte-identical run to run). TTFT runs from a turn's arrival at the region
(before the fair queue) to its first delta there; ITL is the gap between
deltas; throughput is output tokens over the measured phase's virtual
duration; the hit rate is the pods' own prefix-cache counters over the
measured phase. Routing decision cost is counted, not timed
(:class:`~region.placement.router.DecisionCost`: pods scored and prefix
blocks looked up in the index per decision).

Not modelled, so absent from every figure: the time the region's own code
and the network take (a turn's way through authentication, safety filters,
the zone store and metering is not run at all; in-process calls and the KV
event feed deliver in zero time), the edge, the global plane and clients
outside the region; GPU telemetry (a simulated pod reports none). A
virtual run therefore says how the placement decisions shape queueing and
prefix reuse under the simulator's step model, not how fast the mesh's
Python runs: ``--clock real`` is the end-to-end cross-check.

Scale: pods are split evenly over ``regions`` (each with its own router,
index and queue), each tenant is pinned to one region (tenant ``t`` to
region ``t % regions``) and the users are split evenly over the regions,
each region's users taking its tenants' conversations. Each system's trace
(every prompt placed, in order) also gives the offline oracle hit rates of
:mod:`llmmesh.bench.routing_oracle`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import cast

import grpc.aio

from llmmesh.bench.plan import RoutingBackendPlan
from llmmesh.bench.routing_clients import PrefixCacheCounts
from llmmesh.bench.routing_oracle import OracleHitRates, OracleTrace
from llmmesh.bench.routing_report import DISAGGREGATED, BackendReport, ItlTail, SystemResult, system_name
from llmmesh.bench.routing_workload import Conversation, ConversationWorkload, Turn
from llmmesh.bench.stats import RequestRecord, summarize
from llmmesh.bench.virtual_pods import PromptTokens, VirtualPod, virtual_pod
from llmmesh.engine.settings import EngineSettings
from llmmesh.region.admission.fair_queue import FairQueue, engine_priority
from llmmesh.region.engine_pool import EnginePool
from llmmesh.region.placement.hedging import HedgingPolicy
from llmmesh.region.placement.kv_events_feed import KvEventFeeds
from llmmesh.region.placement.kv_index import InMemoryPrefixIndex
from llmmesh.region.placement.router import KvAffinityRouter, LoadBoard, RoutingPolicy, RoutingTuning
from llmmesh.region.settings import RegionSettings
from llmmesh.region.tokenizer_client import TokenizerClient
from llmmesh.v1 import common_pb2, engine_service_pb2

Progress = Callable[[str], None]

MEASURED_VIRTUAL = (
    "virtual time, one process: the region's router, prefix index (fed by the pods' KV events), load "
    "board and fair queue over simulator pods through in-process gRPC; TTFT from the turn's "
    "arrival at the region to its first delta there; prefix-cache hit rate from the pods' own counters "
    "over the measured phase; decision cost counted in pods scored and prefix blocks looked up"
)
TIER = "pro"


@dataclass(frozen=True)
class VirtualSpec:
    """The simulated fleet: pods (split evenly over ``regions``), their KV
    blocks and batch, and the region's settings that shape placement."""

    pods: int
    kv_blocks: int
    block_size: int
    max_num_seqs: int
    context_window: int
    regions: int = 1
    hedge_after_s: float = 0.0
    tuning: RoutingTuning = field(default_factory=RoutingTuning)

    def __post_init__(self) -> None:
        if self.regions < 1 or self.pods < self.regions:
            raise ValueError(f"{self.pods} pods cannot be split over {self.regions} regions")

    def pod_settings(self, pod_id: str, role: str) -> EngineSettings:
        """One simulator pod's settings (timing at the calibrated defaults)."""
        return EngineSettings(
            backend="sim",
            pod_id=pod_id,
            kv_blocks=self.kv_blocks,
            block_size=self.block_size,
            max_num_seqs=self.max_num_seqs,
            context_window=self.context_window,
            pod_role=role,
        )


class VirtualRegion:
    """One region's placement plane over its pods, as :mod:`region.server`
    builds it (see the module docstring); :meth:`open` starts its
    background loops, :meth:`close` stops them."""

    def __init__(
        self, name: str, policy: str, pods: Sequence[VirtualPod], spec: VirtualSpec, model: str
    ) -> None:
        self.name = name
        self.pods = list(pods)
        self.model = model
        servers = {pod.address: pod.server for pod in pods}
        region = RegionSettings()
        self.pool = EnginePool(
            [pod.address for pod in pods],
            region.engine_health_interval_ms / 1000,
            dial=lambda address: cast(grpc.aio.Channel, servers[address].channel()),
        )
        self.prompts: PromptTokens | None = None
        self.loads = LoadBoard(self.pool)
        self.index = InMemoryPrefixIndex()
        self.routing = RoutingPolicy(policy)
        loop = asyncio.get_running_loop()
        self.router = KvAffinityRouter(
            self.routing,
            self.pool,
            self.index,
            TokenizerClient(self.pool),
            spec.tuning,
            loads=self.loads,
            clock=loop.time,
            hedging=HedgingPolicy(spec.hedge_after_s, engine_priority(TIER)),
        )
        self.feeds = KvEventFeeds(self.index) if self.routing is RoutingPolicy.PRECISE else None
        self.queue = FairQueue(0, max_waiting=region.admission_max_waiting, clock=loop.time)
        self._overcommit = region.admission_overcommit
        self._reserve = region.admission_reserve
        self._load_refresh_s = region.load_refresh_ms / 1000
        self.pool.on_checked(self._checked)

    def _checked(self) -> None:
        slots = self.pool.batch_slots
        capacity = math.ceil(slots * self._overcommit)
        free_limit = max(0, slots - math.ceil(slots * self._reserve))
        self.queue.set_capacity(capacity, reserve=max(0, capacity - free_limit))
        if self.feeds is not None:
            self.feeds.follow(self.pool.healthy_pods)

    async def open(self) -> None:
        for pod in self.pods:
            await pod.backend.start()
        await self.pool.check()
        self.prompts = await PromptTokens.of(self.pool, self.model)
        await self.loads.refresh()
        self.pool.start()
        self.loads.start(self._load_refresh_s)

    async def close(self) -> None:
        await self.loads.close()
        if self.feeds is not None:
            await self.feeds.close()
        await self.pool.close()
        for pod in self.pods:
            await pod.backend.close()

    def prefix_counts(self) -> PrefixCacheCounts:
        total = PrefixCacheCounts()
        for pod in self.pods:
            total = total + pod.prefix_counts()
        return total

    async def run_turn(self, turn: Turn, trace: OracleTrace, measured: bool) -> RequestRecord:
        """One turn through the queue, the tokenizer, the router and a pod's
        session; its record on the loop's clock."""
        loop = asyncio.get_running_loop()
        record = RequestRecord(sent_at=loop.time())
        ticket = await self.queue.acquire(TIER)
        try:
            assert self.prompts is not None, "open the region first"
            token_ids = self.prompts.prompt(turn.messages)
            decision = await self.router.choose(self.model, token_ids)
            trace.add(token_ids, measured)
            pod = decision.pod
            record.served_by = decision.pod_id
            pod.in_flight += 1
            try:
                start = engine_service_pb2.GenerateStart(
                    request_id=turn.turn_id,
                    model=self.model,
                    prompt_token_ids=token_ids,
                    sampling=common_pb2.SamplingParams(
                        max_tokens=turn.max_tokens, temperature=0.0, ignore_eos=True
                    ),
                    priority=engine_priority(TIER),
                )
                generation = await pod.session.start(
                    turn.turn_id, engine_service_pb2.GenerateSessionRequest(start=start)
                )
                async for event in generation:
                    kind = event.WhichOneof("event")
                    if kind == "delta":
                        record.add_tokens(loop.time(), len(event.delta.token_ids))
                    elif kind == "finished":
                        record.finish(loop.time())
                    elif kind == "error":
                        record.fail(f"{event.error.reason}: {event.error.message}")
            finally:
                pod.in_flight -= 1
        except Exception as error:  # a failed turn is a figure, not a crash
            record.fail(f"{type(error).__name__}: {error}")
        finally:
            self.queue.release(ticket)
        if record.finished_at is None and record.error is None:
            record.fail("the generation ended without a finished event")
        return record


async def _drive(
    regions: Sequence[VirtualRegion],
    conversations: Sequence[Conversation],
    users: int,
    trace: OracleTrace,
    measured: bool,
) -> list[RequestRecord]:
    """Run ``conversations`` with ``users`` users, each region's users
    taking its tenants' conversations in order, a conversation's turns one
    after the other; records in the conversations' order."""
    by_region: list[list[int]] = [[] for _ in regions]
    for index, conversation in enumerate(conversations):
        by_region[conversation.tenant % len(regions)].append(index)
    records: list[list[RequestRecord]] = [[] for _ in conversations]
    async with asyncio.TaskGroup() as group:
        for number, (region, mine) in enumerate(zip(regions, by_region, strict=True)):
            share = users // len(regions) + (1 if number < users % len(regions) else 0)
            queue = list(reversed(mine))

            async def user(region: VirtualRegion = region, queue: list[int] = queue) -> None:
                while queue:
                    index = queue.pop()
                    for turn in conversations[index].turns:
                        records[index].append(await region.run_turn(turn, trace, measured))

            for _ in range(min(max(share, 1), len(mine))):
                group.create_task(user())
    return [record for turns in records for record in turns]


@dataclass(frozen=True)
class VirtualRun:
    """One system's virtual run and what the oracle says of its trace."""

    result: SystemResult
    oracle: OracleHitRates


async def run_system(
    policy: str,
    spec: VirtualSpec,
    workload: ConversationWorkload,
    users: int,
    warmup_per_tenant: int,
    model: str,
    roles: Sequence[str] = (),
    progress: Progress | None = None,
) -> VirtualRun:
    """Build fresh pods and regions, warm up, measure; must run on a
    :class:`~llmmesh.bench.virtual_clock.VirtualClockLoop`."""
    loop = asyncio.get_running_loop()
    per_region = [
        spec.pods // spec.regions + (1 if r < spec.pods % spec.regions else 0) for r in range(spec.regions)
    ]
    regions: list[VirtualRegion] = []
    number = 0
    for r, count in enumerate(per_region):
        name = f"region-{r}"
        pods = [
            virtual_pod(spec.pod_settings(f"{name}-pod-{number + i}", roles[number + i] if roles else "both"))
            for i in range(count)
        ]
        number += count
        regions.append(VirtualRegion(name, policy, pods, spec, model))
    trace = OracleTrace(spec.block_size)
    try:
        for region in regions:
            await region.open()
        if warmup_per_tenant:
            await _drive(regions, workload.conversations("warmup", warmup_per_tenant), users, trace, False)
        before = _prefix(regions)
        conversations = workload.conversations("measure")
        started = loop.time()
        records = await _drive(regions, conversations, users, trace, True)
        wall_s = loop.time() - started
        prefix = _prefix(regions) - before
    finally:
        for region in regions:
            await region.close()
    cost = _cost(regions)
    oracle = trace.hit_rates(spec.pods * spec.kv_blocks)
    metrics = summarize(records, wall_s)
    hit_rate = prefix.hit_rate
    extras: dict[str, object] = {
        **cost,
        **oracle.as_dict(),
        "hit_rate_share_of_oracle": (
            None if hit_rate is None or not oracle.pooled_lru else round(hit_rate / oracle.pooled_lru, 4)
        ),
    }
    if progress is not None:
        progress(
            f"virtual {policy}: ttft p90 {_ms(metrics.ttft_p90_s)}, hit rate "
            f"{'-' if hit_rate is None else f'{hit_rate:.3f}'}, oracle {oracle.pooled_lru:.3f}, "
            f"{metrics.requests} turns, {metrics.errors} failed, {wall_s:.1f} virtual s"
        )
    result = SystemResult(metrics, prefix, ItlTail.of(records), extras)
    return VirtualRun(result, oracle)


def _prefix(regions: Sequence[VirtualRegion]) -> PrefixCacheCounts:
    total = PrefixCacheCounts()
    for region in regions:
        total = total + region.prefix_counts()
    return total


def _cost(regions: Sequence[VirtualRegion]) -> dict[str, object]:
    decisions = sum(region.router.cost.decisions for region in regions)
    pods = sum(region.router.cost.pods_scored for region in regions)
    blocks = sum(region.router.cost.prefix_blocks for region in regions)
    return {
        "routing_decisions": decisions,
        "routing_pods_scored": pods,
        "routing_prefix_blocks": blocks,
        "routing_ops_per_decision": round((pods + blocks) / decisions, 3) if decisions else None,
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f} ms"


async def run_systems(
    policies: Sequence[str],
    disaggregated: Sequence[str],
    spec: VirtualSpec,
    workload: ConversationWorkload,
    users: int,
    warmup_per_tenant: int,
    model: str,
    progress: Progress | None = None,
) -> dict[str, SystemResult]:
    """Every policy on whole-turn pods, then each of ``disaggregated`` on
    the same pods split into prefill and decode pods (per region, the
    rounding favouring decode)."""
    systems: dict[str, SystemResult] = {}
    for policy in policies:
        run = await run_system(policy, spec, workload, users, warmup_per_tenant, model, (), progress)
        systems[system_name(policy)] = run.result
    if disaggregated:
        roles: list[str] = []
        for r in range(spec.regions):
            count = spec.pods // spec.regions + (1 if r < spec.pods % spec.regions else 0)
            roles += ["prefill"] * (count // 2) + ["decode"] * (count - count // 2)
        for policy in disaggregated:
            run = await run_system(policy, spec, workload, users, warmup_per_tenant, model, roles, progress)
            systems[system_name(policy + DISAGGREGATED)] = run.result
    return systems


async def virtual_backend_report(
    plan: RoutingBackendPlan, regions: int, model: str, progress: Progress
) -> BackendReport:
    """The simulator's part of ``llmmesh bench routing --clock virtual``:
    the workload and KV sizing of ``plan`` (as the real-time run sizes
    them), every system run in virtual time. Must run on a
    :class:`~llmmesh.bench.virtual_clock.VirtualClockLoop`."""
    from llmmesh.bench.routing import sim_setup

    workload, sizing, pod_spec = sim_setup(plan)
    kv_blocks = pod_spec.kv_blocks
    spec = VirtualSpec(
        plan.pods, kv_blocks, plan.block_size, plan.max_num_seqs, pod_spec.context_window, regions
    )
    progress(
        f"virtual sim: {plan.pods} pods in {regions} regions of {kv_blocks} KV blocks, KV pressure "
        f"{sizing.kv_pressure:.2f}, {plan.concurrency} users"
    )
    with _quiet("llmmesh.region", "llmmesh.engine"):
        systems = await run_systems(
            plan.policies,
            plan.disaggregated,
            spec,
            workload,
            plan.concurrency,
            plan.warmup_per_tenant,
            model,
            progress,
        )
    engine = {**pod_spec.as_dict(), "regions": regions}
    return BackendReport("sim", plan.concurrency, engine, workload.describe(), sizing.as_dict(), systems)


@contextlib.contextmanager
def _quiet(*names: str) -> Iterator[None]:
    """Hold the planes' INFO logs (pods coming up, hundreds of times over)."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(max(logger.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)

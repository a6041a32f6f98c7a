"""The KV-affinity router: which engine pod of a region runs a turn.

Policies (:class:`RoutingPolicy`):

- ``precise``: the pods' resident prefix blocks from their KV-cache events
  (:class:`region.placement.kv_index.PrefixIndex`), scored against load.
  Events lag a placement by the turn's queue wait, its prefill and the
  feed's delivery, so the index alone cannot see a prefix still being
  computed: a burst of one new tenant's turns would each miss and compute
  it on several pods. The router bridges that window with its own
  placements of the last ``pending_ttl_s`` (a :class:`RecentPrefixes`),
  after which the index, which also sees evictions, is the only word.
  Precise therefore sees what approximate would guess while it is news,
  and what the pods really hold after.
- ``approximate``: no events; the router remembers which pod it sent each
  prefix to (:class:`region.placement.kv_index.RecentPrefixes`), scored the same way.
- ``round_robin``: the next pod in turn.
- ``least_loaded``: the pod with the least load (:meth:`PodLoad.load`);
  with no load reports that is the fewest turns in flight, as
  :meth:`region.engine_pool.EnginePool.pick` places turns today.

Score (precise, approximate), llm-d's precise prefix-cache scorer plus
its load scorers as the anchor: ``hit_weight`` (1.0) * the prompt's
resident prefix fraction - ``load_weight`` (0.5) * the pod's load relative
to the candidates' (0 for the least loaded, 1 for the most; llm-d's queue
scorer normalizes across candidates the same way), load in [0, 1] from the
queue and the KV usage (:meth:`PodLoad.load`). Why these weights: a prompt
that finds most of its prefix on a pod (a tenant's system prompt, a
conversation's history) goes there whatever the load, because a miss
costs a whole prefill, which stalls every turn on the pod it lands on and
evicts another tenant's prefix; a prompt that shares little (a RAG prompt
sharing only a short system prompt) goes to the lighter pod, because the
load term, spanning the full 0.5 between the lightest and the busiest
candidate, outweighs a hit fraction under 0.5.

The hot-spot guard (what llm-d's load-aware scorer does for a pod with
waiting requests): when the best-scoring pod is a hot spot (a turn already
waits behind its full batch and its queue is ``hotspot_queue_gap`` deeper
than the lightest pod's, or running generations hold ``hotspot_kv_usage``
of its KV cache), the turn goes to the best-scoring pod that can start it
now (a replica of the prefix before a cold pod), so one shared system
prompt cannot pin a region's traffic to the single pod that cached it
first. Below that a pod is left alone: a hit there starts within the
batch, a miss elsewhere costs a prefill. The virtual-time routing bench
(``llmmesh bench routing --clock virtual``) shows what the earlier, more
eager guard (any full batch, KV usage 0.9) cost: at the reference
workload it moved turns of a tenant off the pod holding its prefix, each
such turn prefilling thousands of tokens elsewhere, and TTFT p90 rose
ninefold (95 ms to 873 ms).

Disaggregated serving: when the healthy pods include prefill pods and
decode pods (their ``GetEngineInfo.role``), a turn's prefill phase is
placed by the policy over the prefill pods and its decode phase on a
decode pod (by resident blocks and load under ``precise``, else the least
loaded; :mod:`region.placement.disaggregation`); otherwise turns go
to the pods that serve whole turns, and a premium turn may hedge onto the
least-loaded other one (:mod:`region.placement.hedging`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import grpc
import grpc.aio

from llmmesh.core.errors import Reason, Unavailable
from llmmesh.core.tasks import cancel_and_wait
from llmmesh.region.engine_pool import EnginePodHandle, EnginePool
from llmmesh.region.placement.disaggregation import phased_pod, role_of
from llmmesh.region.placement.hedging import HedgingPolicy, hedged_pod
from llmmesh.region.placement.kv_index import PrefixIndex, PrefixIndexError
from llmmesh.region.placement.recent_prefixes import RecentPrefixes
from llmmesh.region.tokenizer_client import TokenizerClient
from llmmesh.v1 import common_pb2, engine_service_pb2

log = logging.getLogger(__name__)


class RoutingPolicy(StrEnum):
    """How the router places a turn."""

    PRECISE = "precise"
    APPROXIMATE = "approximate"
    ROUND_ROBIN = "round_robin"
    LEAST_LOADED = "least_loaded"


@dataclass(frozen=True)
class RoutingTuning:
    """Weights and thresholds of the scoring policies (the module
    docstring says why these).

    The defaults: a full prefix hit (1.0) outweighs the whole load term
    (0.5 at most, between the lightest and the busiest candidate), so under
    light or even load the cache wins; the guard handles heavy skew. A
    queue of a full batch or more counts as fully loaded; KV usage counts
    less than the queue, since a pod with a full cache of idle prefix
    blocks can still evict them. ``pending_ttl_s`` is how long precise
    trusts its own placement of a prefix before the pod's KV events must
    confirm it.
    """

    hit_weight: float = 1.0
    load_weight: float = 0.5
    queue_share: float = 0.6
    kv_share: float = 0.4
    hotspot_queue_gap: int = 4
    hotspot_kv_usage: float = 0.9
    pending_ttl_s: float = 2.0
    approx_block_size: int = 16
    approx_ttl_s: float = 300.0
    approx_capacity: int = 100_000
    # Where a pod reports GPU utilisation (NVML), its share of the load;
    # pods without GPUs (the CPU build, the simulator) are scored without it.
    gpu_share: float = 0.3


@dataclass(frozen=True)
class PodLoad:
    """A pod's load as the router sees it: its last load report merged with
    the turns this router has in flight there (fresher than any report)."""

    running: int
    waiting: int
    kv_cache_usage: float
    in_flight: int
    max_num_seqs: int
    # Mean GPU utilisation in [0, 1] from the pod's NVML reading; None without.
    gpu_utilization: float | None = None
    # The share of its batch a pod back from an outage is given while it
    # warms up (:class:`LoadBoard`'s slow start); 1 otherwise.
    capacity_share: float = 1.0

    @property
    def depth(self) -> int:
        """Turns at the pod: the larger of its report and our in-flight count."""
        return max(self.in_flight, self.running + self.waiting)

    def load(self, tuning: RoutingTuning) -> float:
        """Normalized load in [0, 1]: ``queue_share`` * min(1, depth /
        max_num_seqs) + ``kv_share`` * KV usage, blended with the GPU
        utilisation at ``gpu_share`` where the pod reports one."""
        queue = min(1.0, self.depth / max(self.max_num_seqs * self.capacity_share, 1.0))
        kv = min(1.0, max(0.0, self.kv_cache_usage))
        load = tuning.queue_share * queue + tuning.kv_share * kv
        if self.gpu_utilization is None:
            return load
        gpu = min(1.0, max(0.0, self.gpu_utilization))
        return (1.0 - tuning.gpu_share) * load + tuning.gpu_share * gpu


@dataclass(frozen=True)
class RoutingDecision:
    """Where a turn goes and why. ``score_parts`` holds the chosen pod's
    ``hit`` fraction, ``load``, ``score`` and ``guard`` (1 when the hot-spot
    guard overrode the score) for the scoring policies, and ``index_down``
    when the prefix index failed and the turn was placed on load alone;
    ``decode_load`` when the turn is disaggregated."""

    pod_id: str
    policy: RoutingPolicy
    resident_tokens: int
    score_parts: Mapping[str, float]
    pod: EnginePodHandle = field(repr=False, compare=False)
    # Disaggregated serving: the pod that runs the prefill phase (``pod`` is
    # then the decode pod's PodView and ``pod_id`` the decode pod's); empty otherwise.
    prefill_pod_id: str = ""


@dataclass
class DecisionCost:
    """The work of a router's placement decisions, counted rather than timed
    (so a benchmark on a virtual clock can report it): ``decisions`` made,
    ``pods_scored`` (a candidate's load and hit fraction computed), and
    ``prefix_blocks``: prompt blocks hashed and looked up in the prefix
    index (a lookup stops after the first block no pod holds) or recorded
    in the approximate one."""

    decisions: int = 0
    pods_scored: int = 0
    prefix_blocks: int = 0


def _blocks_looked_up(prompt_tokens: int, resident: Mapping[str, int], block_size: int) -> int:
    """Blocks a prefix lookup hashed: those matched, and the first miss."""
    if block_size <= 0:
        return 0
    matched = max(resident.values(), default=0) // block_size
    return min(prompt_tokens // block_size, matched + 1)


class LoadBoard:
    """The latest load report of each pod of a pool, by pod id.

    Slow start (Envoy's ``slow_start_config``, linear): a pod back from an
    outage (:attr:`EnginePodHandle.returned_s`) comes back with a cold KV
    cache, and as the least loaded pod every turn without a cache hit would
    land on it at once. For ``slow_start_s`` after its return its batch
    counts as ``capacity_share`` of its size, growing linearly from
    ``MIN_SHARE`` to all of it, so the load scorers give it a growing share
    of the turns rather than all of them. Pods starting with the region are
    not slowed."""

    MIN_SHARE = 0.1

    def __init__(
        self,
        pods: EnginePool,
        timeout_s: float = 1.0,
        slow_start_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pods = pods
        self._timeout_s = timeout_s
        self._slow_start_s = slow_start_s
        self._clock = clock
        self._reports: dict[str, engine_service_pb2.LoadReport] = {}
        self._task: asyncio.Task[None] | None = None

    def record(self, report: engine_service_pb2.LoadReport) -> None:
        """Take a report (from GetLoad, WatchLoad or a test)."""
        self._reports[report.pod_id] = report

    def report(self, pod_id: str) -> engine_service_pb2.LoadReport | None:
        return self._reports.get(pod_id)

    async def refresh(self) -> None:
        """Ask every healthy pod for its load once; a pod that does not
        answer keeps its last report (health checks take it out)."""

        async def ask(pod: EnginePodHandle) -> None:
            with contextlib.suppress(grpc.aio.AioRpcError):
                response = await pod.stub.GetLoad(
                    engine_service_pb2.GetLoadRequest(), timeout=self._timeout_s
                )
                self.record(response.report)

        await asyncio.gather(*(ask(pod) for pod in self._pods.healthy_pods))

    def start(self, interval_s: float) -> None:
        """Refresh every ``interval_s`` in the background."""

        async def loop() -> None:
            while True:
                await self.refresh()
                await asyncio.sleep(interval_s)

        if self._task is None:
            self._task = asyncio.create_task(loop(), name="engine-loads")

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    def load_of(self, pod: EnginePodHandle) -> PodLoad:
        report = self._reports.get(pod.pod_id)
        return PodLoad(
            running=report.running if report else 0,
            waiting=report.waiting if report else 0,
            kv_cache_usage=report.kv_cache_usage if report else 0.0,
            in_flight=pod.in_flight,
            max_num_seqs=pod.info.max_num_seqs,
            gpu_utilization=gpu_utilization(report),
            capacity_share=self.capacity_share(pod),
        )

    def capacity_share(self, pod: EnginePodHandle) -> float:
        """The share of its batch ``pod`` is given now (1 outside slow start)."""
        if self._slow_start_s <= 0 or not pod.returned_s:
            return 1.0
        ramp = (self._clock() - pod.returned_s) / self._slow_start_s
        return 1.0 if ramp >= 1.0 else max(self.MIN_SHARE, ramp)


def gpu_utilization(report: engine_service_pb2.LoadReport | None) -> float | None:
    """A load report's mean GPU utilisation in [0, 1]; None when the pod
    read none (no GPU, no NVML)."""
    if report is None or not report.gpu.available or not report.gpu.devices:
        return None
    devices = report.gpu.devices
    return sum(device.utilization_percent for device in devices) / (100.0 * len(devices))


class KvAffinityRouter:
    """Places turns on the healthy pods of ``pods`` by ``policy``.

    ``choose`` reads each pod's ``in_flight``; the caller counts the turn in
    flight on the chosen pod before its next ``await`` (the gateway does, in
    ``_run_on_pod``), so a burst of turns sees its own earlier placements.
    """

    def __init__(
        self,
        policy: RoutingPolicy | str,
        pods: EnginePool,
        index: PrefixIndex | None,
        tokenizer: TokenizerClient,
        tuning: RoutingTuning | None = None,
        loads: LoadBoard | None = None,
        clock: Callable[[], float] | None = None,
        hedging: HedgingPolicy | None = None,
    ) -> None:
        self.policy = RoutingPolicy(policy)
        self.hedging = hedging or HedgingPolicy()
        if self.policy is RoutingPolicy.PRECISE and index is None:
            raise ValueError("the precise policy needs a prefix index")
        self.tuning = tuning or RoutingTuning()
        self.loads = loads or LoadBoard(pods)
        self._pods = pods
        self._index = index
        self._tokenizer = tokenizer
        self._turn = itertools.count()
        self.cost = DecisionCost()
        self.recent = RecentPrefixes(
            self.tuning.approx_block_size,
            self.tuning.approx_capacity,
            self.tuning.approx_ttl_s,
            **({"clock": clock} if clock else {}),
        )
        # Precise's placements not yet confirmed by the pods' KV events.
        self.pending = RecentPrefixes(
            self.tuning.approx_block_size,
            self.tuning.approx_capacity,
            self.tuning.pending_ttl_s,
            **({"clock": clock} if clock else {}),
        )

    async def choose_for_messages(
        self,
        model: str,
        messages: Sequence[common_pb2.ChatMessage],
        exclude: Collection[str] = (),
        resume_output_token_ids: Sequence[int] = (),
    ) -> tuple[RoutingDecision, tuple[int, ...]]:
        """Tokenize a chat prompt as the engine will, then :meth:`choose`.
        Returns the decision and the prompt's tokens (output tokens of a
        continuation extend the prefix the pod will compute)."""
        token_ids = await self._tokenizer.tokenize(model, messages)
        decision = await self.choose(model, [*token_ids, *resume_output_token_ids], exclude)
        return decision, token_ids

    async def choose(
        self, model: str, token_ids: Sequence[int], exclude: Collection[str] = ()
    ) -> RoutingDecision:
        """The pod for a prompt of ``token_ids``. ``exclude`` names pods (by
        pod id or address) not to use, e.g. ones that already failed this
        turn. Raises Unavailable when no healthy pod serves ``model``."""
        candidates = [
            pod
            for pod in self._pods.healthy_pods
            if pod.pod_id
            and pod.pod_id not in exclude
            and pod.address not in exclude
            and (not model or not pod.model or pod.model == model)
        ]
        if not candidates:
            raise Unavailable(
                Reason.ENGINE_UNAVAILABLE,
                f"no healthy engine pod serves model {model!r} in this region",
                retry_after_s=1.0,
            )
        roles = {pod.pod_id: role_of(pod) for pod in candidates}
        prefill = [pod for pod in candidates if roles[pod.pod_id] == engine_service_pb2.POD_ROLE_PREFILL]
        decode = [pod for pod in candidates if roles[pod.pod_id] == engine_service_pb2.POD_ROLE_DECODE]
        if prefill and decode:
            return await self._disaggregated(prefill, decode, token_ids)
        # Whole turns: a prefill pod only when nothing else is up.
        whole = [pod for pod in candidates if roles[pod.pod_id] != engine_service_pb2.POD_ROLE_PREFILL]
        decision = await self._place(whole or candidates, token_ids)
        others = [pod for pod in whole if pod is not decision.pod]
        if self.hedging.enabled and others:
            backup = functools.partial(self._backup, others)
            decision = dataclasses.replace(decision, pod=hedged_pod(decision.pod, backup, self.hedging))
        return decision

    async def _backup(self, pods: list[EnginePodHandle]) -> EnginePodHandle | None:
        """A hedged turn's second pod: the least loaded of ``pods`` still healthy."""
        healthy = [pod for pod in pods if pod.healthy]
        if not healthy:
            return None
        return min(
            healthy, key=lambda p: (self.loads.load_of(p).load(self.tuning), self.loads.load_of(p).depth)
        )

    async def _disaggregated(
        self, prefill: list[EnginePodHandle], decode: list[EnginePodHandle], token_ids: Sequence[int]
    ) -> RoutingDecision:
        """The prefill phase by the policy over the prefill pods, the decode
        phase on the decode pod :meth:`_place_decode` picks
        (:mod:`region.placement.disaggregation`)."""
        prefill_decision = await self._place(prefill, token_ids)
        loads = {pod.pod_id: self.loads.load_of(pod) for pod in decode}
        chosen = await self._place_decode(decode, loads, token_ids)
        parts = {**prefill_decision.score_parts, "decode_load": loads[chosen.pod_id].load(self.tuning)}
        return RoutingDecision(
            chosen.pod_id,
            self.policy,
            prefill_decision.resident_tokens,
            parts,
            phased_pod(prefill_decision.pod, chosen),
            prefill_pod_id=prefill_decision.pod_id,
        )

    async def _place_decode(
        self, decode: list[EnginePodHandle], loads: dict[str, PodLoad], token_ids: Sequence[int]
    ) -> EnginePodHandle:
        """The decode pod: under ``precise``, scored like any pod by the
        prompt's blocks already resident there (a decode pod pulls only the
        blocks it lacks, and a tenant's turns share their prefix in its
        cache) and by load; otherwise, or with the index down, the least loaded."""
        if self.policy is RoutingPolicy.PRECISE:
            assert self._index is not None
            try:
                resident = await self._index.match(token_ids)
            except PrefixIndexError as err:
                log.warning("prefix index unavailable, placing the decode phase on load: %s", err)
            else:
                return self._score(decode, loads, resident, len(token_ids)).pod
        return min(decode, key=lambda p: (loads[p.pod_id].load(self.tuning), loads[p.pod_id].depth))

    async def _place(self, candidates: list[EnginePodHandle], token_ids: Sequence[int]) -> RoutingDecision:
        """The pod of ``candidates`` the policy picks for ``token_ids``."""
        self.cost.decisions += 1
        if self.policy is RoutingPolicy.ROUND_ROBIN:
            pod = candidates[next(self._turn) % len(candidates)]
            return RoutingDecision(pod.pod_id, self.policy, 0, {}, pod)
        loads = {pod.pod_id: self.loads.load_of(pod) for pod in candidates}
        self.cost.pods_scored += len(candidates)
        if self.policy is RoutingPolicy.LEAST_LOADED:
            pod = min(candidates, key=lambda p: (loads[p.pod_id].load(self.tuning), loads[p.pod_id].depth))
            parts = {"load": loads[pod.pod_id].load(self.tuning)}
            return RoutingDecision(pod.pod_id, self.policy, 0, parts, pod)
        index_down = False
        if self.policy is RoutingPolicy.PRECISE:
            assert self._index is not None
            try:
                resident = await self._index.match(token_ids)
            except PrefixIndexError as err:
                # Placement must not fail with the index: route on load alone.
                log.warning("prefix index unavailable, routing on load: %s", err)
                resident, index_down = {}, True
            block_size = max((pod.info.block_size for pod in candidates), default=0)
            self.cost.prefix_blocks += _blocks_looked_up(len(token_ids), resident, block_size)
            pending = self.pending.match(token_ids)
            self.cost.prefix_blocks += _blocks_looked_up(len(token_ids), pending, self.pending.block_size)
            for pod_id, tokens in pending.items():
                resident[pod_id] = max(resident.get(pod_id, 0), tokens)
        else:
            resident = self.recent.match(token_ids)
            block_size = self.recent.block_size
            self.cost.prefix_blocks += _blocks_looked_up(len(token_ids), resident, block_size)
        decision = self._score(candidates, loads, resident, len(token_ids))
        if index_down:
            decision = dataclasses.replace(decision, score_parts={**decision.score_parts, "index_down": 1.0})
        recorder = self.recent if self.policy is RoutingPolicy.APPROXIMATE else self.pending
        recorder.record(token_ids, decision.pod_id)
        self.cost.prefix_blocks += len(token_ids) // recorder.block_size
        return decision

    def _score(
        self,
        candidates: list[EnginePodHandle],
        loads: Mapping[str, PodLoad],
        resident: Mapping[str, int],
        prompt_tokens: int,
    ) -> RoutingDecision:
        tuning = self.tuning
        load = {pod_id: pod_load.load(tuning) for pod_id, pod_load in loads.items()}
        hit = {
            pod.pod_id: min(1.0, resident.get(pod.pod_id, 0) / prompt_tokens) if prompt_tokens else 0.0
            for pod in candidates
        }
        lightest = min(load[p] for p in hit)
        spread = max(load[p] for p in hit) - lightest
        relative = {p: (load[p] - lightest) / spread if spread > 0 else 0.0 for p in hit}
        score = {p: tuning.hit_weight * hit[p] - tuning.load_weight * relative[p] for p in hit}
        # Ties go to the shallower queue, then to the pool's order.
        best = max(candidates, key=lambda p: (score[p.pod_id], -loads[p.pod_id].depth))
        least = min(loads[p.pod_id].depth for p in candidates)

        def hot(pod: EnginePodHandle) -> bool:
            # A hot spot cannot start the turn soon: a turn already waits
            # behind its full batch while another pod's queue is
            # ``hotspot_queue_gap`` shallower, or running generations hold
            # nearly all its KV cache. Below that, a cache hit there costs no
            # wait, and a miss elsewhere costs a whole prefill (and evicts
            # another tenant's prefix there).
            pod_load = loads[pod.pod_id]
            waiting = pod_load.depth > max(pod_load.max_num_seqs, 1)
            return (waiting and pod_load.depth - least >= tuning.hotspot_queue_gap) or (
                pod_load.kv_cache_usage >= tuning.hotspot_kv_usage
            )

        chosen = best
        guard = False
        if hot(best):
            calm = [
                pod
                for pod in candidates
                if not hot(pod) and loads[pod.pod_id].depth < max(loads[pod.pod_id].max_num_seqs, 1)
            ]
            if calm:
                # The best score among pods that can start the turn now: a
                # replica of the prefix before a cold pod, then the lighter load.
                chosen = max(calm, key=lambda p: (score[p.pod_id], -loads[p.pod_id].depth))
                guard = True
                log.debug("hot-spot guard: %s is busy; turn goes to %s", best.pod_id, chosen.pod_id)
        pod_id = chosen.pod_id
        parts = {"hit": hit[pod_id], "load": load[pod_id], "score": score[pod_id], "guard": float(guard)}
        return RoutingDecision(pod_id, self.policy, resident.get(pod_id, 0), parts, chosen)

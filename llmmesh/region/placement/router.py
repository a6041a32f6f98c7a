"""The KV-affinity router: which engine pod of a region runs a turn.

Policies (:class:`RoutingPolicy`):

- ``precise``: the pods' resident prefix blocks from their KV-cache events
  (:class:`region.kv_index.PrefixIndex`), scored against load.
- ``approximate``: no events; the router remembers which pod it sent each
  prefix to (:class:`region.kv_index.RecentPrefixes`), scored the same way.
- ``round_robin``: the next pod in turn.
- ``least_loaded``: the pod with the least load (:meth:`PodLoad.load`);
  with no load reports that is the fewest turns in flight, as
  :meth:`region.engine_pool.EnginePool.pick` places turns today.

Score (precise, approximate) = ``hit_weight`` * resident prefix fraction -
``load_weight`` * load, load in [0, 1] (see :class:`RoutingTuning`). The
hot-spot guard (llm-d's prefix scorer mixed with its load-aware scorers):
when the best-scoring pod cannot start the turn now (its batch is full) and
is much busier than the least-loaded one, or its KV cache is nearly full of
running generations, the turn goes to the least-loaded pod instead, so one
shared system prompt cannot pin a region's traffic to the single pod that
cached it first.

Disaggregated serving: when the healthy pods include prefill pods and
decode pods (their ``GetEngineInfo.role``), a turn's prefill phase is
placed by the policy over the prefill pods and its decode phase on a
decode pod (by resident blocks and load under ``precise``, else the least
loaded; :mod:`region.disaggregation`); otherwise turns go
to the pods that serve whole turns, and a premium turn may hedge onto the
least-loaded other one (:mod:`region.hedging`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import grpc
import grpc.aio

from llmmesh.core.errors import Reason, Unavailable
from llmmesh.core.tasks import cancel_and_wait
from llmmesh.v1 import common_pb2, engine_service_pb2
from llmmesh.region.placement.disaggregation import phased_pod, role_of
from llmmesh.region.engine_pool import EnginePodHandle, EnginePool
from llmmesh.region.placement.hedging import HedgingPolicy, hedged_pod
from llmmesh.region.placement.kv_index import PrefixIndex, PrefixIndexError
from llmmesh.region.placement.recent_prefixes import RecentPrefixes
from llmmesh.region.tokenizer_client import TokenizerClient

log = logging.getLogger(__name__)


class RoutingPolicy(StrEnum):
    """How the router places a turn."""

    PRECISE = "precise"
    APPROXIMATE = "approximate"
    ROUND_ROBIN = "round_robin"
    LEAST_LOADED = "least_loaded"


@dataclass(frozen=True)
class RoutingTuning:
    """Weights and thresholds of the scoring policies.

    The defaults: a full prefix hit (1.0) outweighs the whole load term
    (0.5 at most), so under light or even load the cache wins; the guard
    handles heavy skew. A queue of a full batch or more counts as fully
    loaded; KV usage counts less than the queue, since a pod with a full
    cache of idle prefix blocks can still evict them.
    """

    hit_weight: float = 1.0
    load_weight: float = 0.5
    queue_share: float = 0.6
    kv_share: float = 0.4
    hotspot_queue_gap: int = 4
    hotspot_kv_usage: float = 0.9
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

    @property
    def depth(self) -> int:
        """Turns at the pod: the larger of its report and our in-flight count."""
        return max(self.in_flight, self.running + self.waiting)

    def load(self, tuning: RoutingTuning) -> float:
        """Normalized load in [0, 1]: ``queue_share`` * min(1, depth /
        max_num_seqs) + ``kv_share`` * KV usage, blended with the GPU
        utilisation at ``gpu_share`` where the pod reports one."""
        queue = min(1.0, self.depth / max(self.max_num_seqs, 1))
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


class LoadBoard:
    """The latest load report of each pod of a pool, by pod id."""

    def __init__(self, pods: EnginePool, timeout_s: float = 1.0) -> None:
        self._pods = pods
        self._timeout_s = timeout_s
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
        )


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
        self.recent = RecentPrefixes(
            self.tuning.approx_block_size,
            self.tuning.approx_capacity,
            self.tuning.approx_ttl_s,
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
        (:mod:`region.disaggregation`)."""
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
        if self.policy is RoutingPolicy.ROUND_ROBIN:
            pod = candidates[next(self._turn) % len(candidates)]
            return RoutingDecision(pod.pod_id, self.policy, 0, {}, pod)
        loads = {pod.pod_id: self.loads.load_of(pod) for pod in candidates}
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
        else:
            resident = self.recent.match(token_ids)
        decision = self._score(candidates, loads, resident, len(token_ids))
        if index_down:
            decision = dataclasses.replace(decision, score_parts={**decision.score_parts, "index_down": 1.0})
        if self.policy is RoutingPolicy.APPROXIMATE:
            self.recent.record(token_ids, decision.pod_id)
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
        score = {p: tuning.hit_weight * hit[p] - tuning.load_weight * load[p] for p in hit}
        # Ties go to the shallower queue, then to the pool's order.
        best = max(candidates, key=lambda p: (score[p.pod_id], -loads[p.pod_id].depth))
        least = min(candidates, key=lambda p: (load[p.pod_id], loads[p.pod_id].depth))
        hot, cool = loads[best.pod_id], loads[least.pod_id]
        # Only a pod that cannot start the turn now is a hot spot: below its
        # batch size a cache hit there costs no wait, and a miss elsewhere
        # costs a whole prefill (and evicts another tenant's prefix).
        saturated = hot.depth >= max(hot.max_num_seqs, 1) and cool.depth < max(cool.max_num_seqs, 1)
        guard = best is not least and (
            (saturated and hot.depth - cool.depth >= tuning.hotspot_queue_gap)
            or (hot.kv_cache_usage >= tuning.hotspot_kv_usage > cool.kv_cache_usage)
        )
        chosen = best
        if guard:
            # Prefer load; among the least loaded, the one with more cache.
            chosen = min(candidates, key=lambda p: (load[p.pod_id], loads[p.pod_id].depth, -hit[p.pod_id]))
            log.debug("hot-spot guard: %s is busy; turn goes to %s", best.pod_id, chosen.pod_id)
        pod_id = chosen.pod_id
        parts = {"hit": hit[pod_id], "load": load[pod_id], "score": score[pod_id], "guard": float(guard)}
        return RoutingDecision(pod_id, self.policy, resident.get(pod_id, 0), parts, chosen)

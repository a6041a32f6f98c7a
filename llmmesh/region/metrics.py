"""The region plane's Prometheus metrics, served on its ``/metrics``.

Every series is named ``llmmesh_region_*``; labels are bounded (tiers,
reasons, safety categories, pools, pods and tenants, never request ids).
A pool is the set of the region's pods serving one model, named by it.
Counters and histograms are recorded where things happen, through the
one-line functions below; the scrape-time gauges (queue depth, KV usage,
pods, the usage outbox) are in :mod:`region.metrics_gauges`.

- ``llmmesh_region_admission_wait_seconds{tier}``: seconds an admitted turn waited in the fair queue.
- ``llmmesh_region_admission_refusals_total{reason}``: turns refused at admission:
  ``rpm``/``tpm`` (rate limits), ``quota`` (monthly quota), ``overloaded`` (queue shed).
- ``llmmesh_region_turn_errors_total{reason}``: turns ended by an error (refusals
  included), by ErrorInfo reason.
- ``llmmesh_region_turns_total{pool,finish_reason}``: turns that ended, by finish reason.
- ``llmmesh_region_routing_decisions_total{pool,policy,pod}``: placements by the KV-affinity router.
- ``llmmesh_region_routed_prompt_tokens_total{pool}``: prompt tokens of placed turns.
- ``llmmesh_region_prefix_hit_tokens_total{pool}``: of those, tokens the router found
  resident on the chosen pod (its predicted prefix-cache hits).
- ``llmmesh_region_safety_blocks_total{stage,category}``: turns blocked by the safety filters.
- ``llmmesh_region_continuations_accepted_total``: failed-over turns this region went on with.
- ``llmmesh_region_tokens_total{tenant,kind}``: tokens of ended turns: ``prompt``,
  ``completion`` (delivered) and ``cached_prompt`` (the pods' prefix-cache hits).
- ``llmmesh_region_time_to_first_token_seconds{pool}``: seconds from a turn's
  arrival to its first delivered token.
- ``llmmesh_region_inter_token_latency_seconds{pool}``: seconds between delivered tokens.
- ``llmmesh_region_usage_shipped_records_total``: usage records billing accepted.
- ``llmmesh_region_usage_ship_failures_total``: usage shipments that failed (retried later).
- ``llmmesh_region_usage_shipping_lag_seconds``: seconds from a turn's end to
  billing accepting its usage record.

Hedged and disaggregated turns are counted in :mod:`region.metrics_phases`
(``llmmesh_region_hedges_*``, ``llmmesh_region_hedge_losers_aborted_total``,
``llmmesh_region_disaggregated_turns_total``, ``llmmesh_region_kv_transfer_fallbacks_total``).
The region's readiness and its stores' failures are the shared
``llmmesh_dependency_up{plane="region"}`` and ``llmmesh_store_errors_total``
(:mod:`llmmesh.core.dependency_metrics`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram

from llmmesh.core import dependency_metrics
from llmmesh.core.errors import MeshError, Reason
from llmmesh.core.hop_timing import hop_histogram
from llmmesh.v1 import billing_service_pb2, common_pb2

REGISTRY = CollectorRegistry()
dependency_metrics.register(REGISTRY)

SAFETY_STAGES = ("input", "output", "retrieval")
ADMISSION_REFUSALS = ("rpm", "tpm", "quota", "overloaded")
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 1.0, 2.5)
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
LAG_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)

ADMISSION_WAIT = Histogram(
    "llmmesh_region_admission_wait_seconds",
    "Seconds an admitted turn waited in the fair queue, by tier",
    ["tier"],
    buckets=WAIT_BUCKETS,
    registry=REGISTRY,
)
ADMISSION_REFUSED = Counter(
    "llmmesh_region_admission_refusals",
    "Turns refused at admission: rpm, tpm (rate limits), quota, overloaded (shed)",
    ["reason"],
    registry=REGISTRY,
)
TURN_ERRORS = Counter(
    "llmmesh_region_turn_errors",
    "Turns ended by an error, refusals included, by ErrorInfo reason",
    ["reason"],
    registry=REGISTRY,
)
TURNS = Counter(
    "llmmesh_region_turns",
    "Turns that ended, by pool and finish reason",
    ["pool", "finish_reason"],
    registry=REGISTRY,
)
ROUTING_DECISIONS = Counter(
    "llmmesh_region_routing_decisions",
    "Turns placed by the KV-affinity router, by pool, policy and pod",
    ["pool", "policy", "pod"],
    registry=REGISTRY,
)
ROUTED_TOKENS = Counter(
    "llmmesh_region_routed_prompt_tokens", "Prompt tokens of placed turns", ["pool"], registry=REGISTRY
)
PREFIX_HIT_TOKENS = Counter(
    "llmmesh_region_prefix_hit_tokens",
    "Prompt tokens the router found resident on the chosen pod",
    ["pool"],
    registry=REGISTRY,
)
SAFETY_BLOCKS = Counter(
    "llmmesh_region_safety_blocks",
    "Turns blocked by the safety filters (input, output) and retrieved excerpts left out "
    "(retrieval), by stage and category",
    ["stage", "category"],
    registry=REGISTRY,
)
CONTINUATIONS = Counter(
    "llmmesh_region_continuations_accepted",
    "Failed-over turns this region accepted to go on with",
    registry=REGISTRY,
)
TURNS_MOVED = Counter(
    "llmmesh_region_turns_moved",
    "Turns another pod of the region took over after their pod failed mid-stream, by model",
    ["model"],
    registry=REGISTRY,
)
TURNS_PLACED_AGAIN = Counter(
    "llmmesh_region_turns_placed_again",
    "Turns another pod of the region took after their pod failed before any output, by model",
    ["model"],
    registry=REGISTRY,
)
PODS_STALLED = Counter(
    "llmmesh_region_pod_stalls",
    "Turns whose pod sent nothing for --pod-stall-ms after their first token, or fell to its health "
    "checks before it (another pod went on), by pod",
    ["pod"],
    registry=REGISTRY,
)
TOKENS = Counter(
    "llmmesh_region_tokens",
    "Tokens of ended turns by tenant: prompt, completion (delivered), cached_prompt",
    ["tenant", "kind"],
    registry=REGISTRY,
)
TIME_TO_FIRST_TOKEN = Histogram(
    "llmmesh_region_time_to_first_token_seconds",
    "Seconds from a turn's arrival at the region to its first delivered token",
    ["pool"],
    buckets=TTFT_BUCKETS,
    registry=REGISTRY,
)
INTER_TOKEN_LATENCY = Histogram(
    "llmmesh_region_inter_token_latency_seconds",
    "Seconds between a turn's delivered tokens",
    ["pool"],
    buckets=ITL_BUCKETS,
    registry=REGISTRY,
)
USAGE_SHIPPED = Counter(
    "llmmesh_region_usage_shipped_records", "Usage records billing accepted", registry=REGISTRY
)
USAGE_SHIP_FAILURES = Counter(
    "llmmesh_region_usage_ship_failures", "Usage shipments that failed, to be retried", registry=REGISTRY
)
USAGE_SHIPPING_LAG = Histogram(
    "llmmesh_region_usage_shipping_lag_seconds",
    "Seconds from a turn's end to billing accepting its usage record",
    buckets=LAG_BUCKETS,
    registry=REGISTRY,
)

# Every label value that is known up front is exposed from the start, at 0,
# so rates and dashboards see the series before the first event.
for _reason in ADMISSION_REFUSALS:
    ADMISSION_REFUSED.labels(_reason)
for _reason in Reason:
    TURN_ERRORS.labels(str(_reason))


def init_safety_categories(categories: Iterable[str]) -> None:
    """Expose every (stage, category) block counter at 0."""
    for stage in SAFETY_STAGES:
        for category in categories:
            SAFETY_BLOCKS.labels(stage, category)


def admission_waited(tier: str, seconds: float) -> None:
    ADMISSION_WAIT.labels(tier).observe(max(0.0, seconds))


def admission_refused(error: BaseException) -> None:
    """Count a refusal at admission; other errors are not refusals."""
    if not isinstance(error, MeshError):
        return
    if error.reason == Reason.RATE_LIMITED:
        ADMISSION_REFUSED.labels("tpm" if error.metadata.get("limit") == "tokens" else "rpm").inc()
    elif error.reason == Reason.QUOTA_EXCEEDED:
        ADMISSION_REFUSED.labels("quota").inc()
    elif error.reason == Reason.OVERLOADED:
        ADMISSION_REFUSED.labels("overloaded").inc()


def turn_failed(error: MeshError) -> None:
    TURN_ERRORS.labels(error.reason).inc()


def routed(pool: str, policy: str, pod: str, prompt_tokens: int, resident_tokens: int) -> None:
    ROUTING_DECISIONS.labels(pool, policy, pod).inc()
    ROUTED_TOKENS.labels(pool).inc(prompt_tokens)
    PREFIX_HIT_TOKENS.labels(pool).inc(min(resident_tokens, prompt_tokens))


def safety_blocked(stage: str, categories: Iterable[str]) -> None:
    for category in categories:
        SAFETY_BLOCKS.labels(stage, category).inc()


def continuation_accepted() -> None:
    CONTINUATIONS.inc()


def turn_moved(model: str) -> None:
    TURNS_MOVED.labels(model).inc()


def turn_placed_again(model: str) -> None:
    TURNS_PLACED_AGAIN.labels(model).inc()


def pod_stalled(pod: str) -> None:
    PODS_STALLED.labels(pod).inc()


def turn_ended(
    pool: str,
    tenant: str,
    reason: common_pb2.FinishReason.ValueType,
    prompt: int,
    completion: int,
    cached: int,
) -> None:
    """Count an ended turn (finish reason ``unspecified``: it ended before
    one was known) and its tokens, what this region served of it."""
    try:
        finish_reason = common_pb2.FinishReason.Name(reason).removeprefix("FINISH_REASON_").lower()
    except ValueError:
        finish_reason = "unknown"
    TURNS.labels(pool, finish_reason).inc()
    TOKENS.labels(tenant, "prompt").inc(max(0, prompt))
    TOKENS.labels(tenant, "completion").inc(max(0, completion))
    TOKENS.labels(tenant, "cached_prompt").inc(max(0, cached))


def usage_ship_failed() -> None:
    USAGE_SHIP_FAILURES.inc()


def _end_times(records: Sequence[bytes]) -> list[float]:
    """Epoch seconds at which the serialized usage records' turns ended (0 when unset)."""
    ends = []
    for data in records:
        end = billing_service_pb2.UsageRecord.FromString(data).end_time
        ends.append(end.seconds + end.nanos / 1e9)
    return ends


@dataclass
class OutboxReading:
    """What a usage shipper last saw of its outbox, for the outbox gauges."""

    pending: int = 0
    oldest_end_s: float | None = None

    def saw(self, records: Sequence[bytes], pending: int) -> None:
        """A batch of serialized records was read; ``pending`` are unshipped in all."""
        ends = [end for end in _end_times(records) if end > 0]
        self.pending = max(pending, len(records))
        self.oldest_end_s = min(ends) if ends else None

    def shipped(self, records: Sequence[bytes]) -> None:
        """Billing accepted ``records``: count them and their lag."""
        now = time.time()
        for end_s in _end_times(records):
            USAGE_SHIPPED.inc()
            if end_s > 0:
                USAGE_SHIPPING_LAG.observe(max(0.0, now - end_s))
        self.pending = max(0, self.pending - len(records))
        if not self.pending:
            self.oldest_end_s = None


@dataclass
class TurnLatency:
    """Times one turn's delivered tokens: the first against its arrival,
    the others against the token before (a delta of n tokens after a gap
    counts n gaps of gap/n, the pace its client saw)."""

    pool: str
    arrived_s: float = field(default_factory=time.monotonic)
    last_s: float | None = None
    # The pool's inter-token histogram, looked up once a turn rather than once a delta.
    _gaps: Histogram | None = field(default=None, repr=False)

    def delivered(self, tokens: int) -> None:
        if tokens <= 0:
            return
        now = time.monotonic()
        if self.last_s is None:
            TIME_TO_FIRST_TOKEN.labels(self.pool).observe(now - self.arrived_s)
        else:
            gap = (now - self.last_s) / tokens
            if self._gaps is None:
                self._gaps = INTER_TOKEN_LATENCY.labels(self.pool)
            for _ in range(tokens):
                self._gaps.observe(gap)
        self.last_s = now


# A turn's way to its first token through the region (llmmesh.core.hop_timing).
REGION_HOPS = (
    "prepare",  # arrival to the input safety check: authentication, validation, the model
    "safety_input",  # the input safety filter (with the filters on)
    "prompt",  # retrieval, remembered facts, the prompt fitted and tokenized
    "admission",  # rate limits, quota, a slot of the fair queue
    "store_accept",  # the zone store's acceptance of the request id
    "route",  # the KV-affinity router's pod
    "pod_send",  # the generation's start sent on the pod's session
    "pod_first_event",  # to the pod's first event (its ``started``: the turn is scheduled)
    "request_id_hold",  # the zone store marks the request id started
    "pod_first_delta",  # to the pod's first delta
    "output_filter",  # to the first delta the output filter releases, sent on to the caller
)
HOPS = hop_histogram("llmmesh_region_hop_seconds", "region", ", ".join(REGION_HOPS), REGISTRY)

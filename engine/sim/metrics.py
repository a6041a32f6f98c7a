"""The simulator's Prometheus metrics, named and labelled as vLLM v1 names them.

Dashboards, autoscalers and the llm-d inference scheduler read a vLLM pod's
``/metrics``; a simulated pod serves the same series, so they can be pointed
at a simulated mesh unchanged. Every series carries ``model_name`` and
``engine="0"`` (one engine core per pod), as vLLM's do.

- Scheduler state, read at scrape time from :class:`SchedulerStats`: gauges
  ``vllm:num_requests_running``, ``vllm:num_requests_waiting`` and
  ``vllm:kv_cache_usage_perc`` (a fraction, 1.0 for full, despite the name),
  and the counters ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits``
  (in tokens) and ``vllm:num_preemptions``.
- Per-token and per-request observations, recorded by the scheduler as they
  happen: counters ``vllm:prompt_tokens`` (a request's prompt, counted at its
  first token), ``vllm:generation_tokens``, ``vllm:request_success`` (label
  ``finished_reason``: ``stop``, ``length`` or ``abort``; a generation failed
  by an injected fault is not counted), and the histograms
  ``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds``,
  ``vllm:e2e_request_latency_seconds`` and ``vllm:request_queue_time_seconds``
  with vLLM's buckets.

Times are on the scheduler's simulated clock, so the histograms are the same
on every run. prometheus_client appends ``_total`` to the counters, as
vLLM's exposition shows them. Each instance owns its registry: several pods
share a process in tests and the embedded mesh.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from engine.backend import FinishReason

ENGINE_INDEX = "0"
LABELS = ("model_name", "engine")
VLLM_FINISHED_REASONS = {
    FinishReason.STOP: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.CANCELLED: "abort",
    # vLLM's engine ends a reply of tool calls like any other: a stop.
    FinishReason.TOOL_CALLS: "stop",
}
# vLLM v1's buckets (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = (
    *(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75),
    *(1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
)
INTER_TOKEN_BUCKETS = (
    *(0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5),
    *(0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0),
)
REQUEST_LATENCY_BUCKETS = (
    *(0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0),
    *(30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0),
)


@dataclass(frozen=True)
class SchedulerStats:
    """The scheduler's state at one moment; counters are totals since start."""

    running: int
    waiting: int
    kv_cache_usage: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    preemptions: int


@dataclass
class RequestTimeline:
    """When one request reached each stage, on the simulated clock."""

    queued_s: float = 0.0
    scheduled_s: float | None = None
    last_token_s: float | None = None


class SchedulerStatsCollector:
    """Serves :class:`SchedulerStats` as vLLM's gauges and counters at scrape
    time, so they never lag the scheduler."""

    def __init__(self, model_name: str, stats: Callable[[], SchedulerStats]) -> None:
        self._labels = [model_name, ENGINE_INDEX]
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        return self._families(self._stats())

    def describe(self) -> Iterator[Metric]:
        """The series' names, so the registry refuses a clashing collector."""
        return self._families(SchedulerStats(0, 0, 0.0, 0, 0, 0))

    def _families(self, stats: SchedulerStats) -> Iterator[Metric]:
        gauges = (
            ("vllm:num_requests_running", "Number of requests in model execution batches.", stats.running),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", stats.waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", stats.kv_cache_usage),
        )
        for name, documentation, value in gauges:
            gauge = GaugeMetricFamily(name, documentation, labels=LABELS)
            gauge.add_metric(self._labels, value)
            yield gauge
        counters = (
            (
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens.",
                stats.prefix_cache_queries,
            ),
            (
                "vllm:prefix_cache_hits",
                "Prefix cache hits, in terms of number of cached tokens.",
                stats.prefix_cache_hits,
            ),
            ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", stats.preemptions),
        )
        for name, documentation, total in counters:
            counter = CounterMetricFamily(name, documentation, labels=LABELS)
            counter.add_metric(self._labels, total)
            yield counter


class SimEngineMetrics:
    """One simulated pod's metrics and the private registry that serves them."""

    def __init__(self, model_name: str, stats: Callable[[], SchedulerStats]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(SchedulerStatsCollector(model_name, stats))
        labels = (model_name, ENGINE_INDEX)
        registry = self.registry
        self._prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", LABELS, registry=registry
        ).labels(*labels)
        self._generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", LABELS, registry=registry
        ).labels(*labels)
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            (*LABELS, "finished_reason"),
            registry=registry,
        )
        # Every reason is exposed from the start, at 0, as vLLM does.
        self._request_success = {
            reason: success.labels(*labels, label) for reason, label in VLLM_FINISHED_REASONS.items()
        }
        self._time_to_first_token = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            LABELS,
            registry=registry,
            buckets=TTFT_BUCKETS,
        ).labels(*labels)
        self._inter_token_latency = Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            LABELS,
            registry=registry,
            buckets=INTER_TOKEN_BUCKETS,
        ).labels(*labels)
        self._e2e_request_latency = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            LABELS,
            registry=registry,
            buckets=REQUEST_LATENCY_BUCKETS,
        ).labels(*labels)
        self._request_queue_time = Histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            LABELS,
            registry=registry,
            buckets=REQUEST_LATENCY_BUCKETS,
        ).labels(*labels)

    def request_scheduled(self, timeline: RequestTimeline, now_s: float) -> None:
        """A request entered the batch for the first time (readmissions after
        a preemption do not count: vLLM's queue time ends at first scheduling)."""
        if timeline.scheduled_s is None:
            timeline.scheduled_s = now_s
            self._request_queue_time.observe(now_s - timeline.queued_s)

    def token_generated(self, timeline: RequestTimeline, now_s: float, prompt_tokens: int) -> None:
        """A request produced one output token at ``now_s``."""
        self._generation_tokens.inc()
        if timeline.last_token_s is None:
            self._prompt_tokens.inc(prompt_tokens)
            self._time_to_first_token.observe(now_s - timeline.queued_s)
        else:
            self._inter_token_latency.observe(now_s - timeline.last_token_s)
        timeline.last_token_s = now_s

    def request_finished(self, timeline: RequestTimeline, now_s: float, reason: FinishReason) -> None:
        """A request ended with ``reason`` at ``now_s``."""
        self._request_success[reason].inc()
        self._e2e_request_latency.observe(now_s - timeline.queued_s)

"""The simulator's Prometheus metrics, named and labelled as vLLM v1 names them.

Dashboards, autoscalers and the llm-d inference scheduler read a vLLM pod's
``/metrics``; a simulated pod serves the same series, so they can be pointed
at a simulated mesh unchanged. Every series carries ``model_name`` and
``engine="0"`` (one engine core per pod), as vLLM's do.

- Scheduler state, read at scrape time from :class:`SchedulerStats`: gauges
  ``vllm:num_requests_running``, ``vllm:num_requests_waiting`` and
  ``vllm:kv_cache_usage_perc`` (a fraction, 1.0 for full, despite the name),
  and the counters ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits``
  (in tokens), ``vllm:prompt_tokens_cached`` (the same hits: the simulator
  has no external KV cache) and ``vllm:num_preemptions``.
- Per-token and per-request observations, recorded by the scheduler as they
  happen: counters ``vllm:prompt_tokens`` (a request's prompt, counted at its
  first token), ``vllm:generation_tokens``, ``vllm:request_success`` (label
  ``finished_reason``: ``stop``, ``length`` or ``abort``; a generation failed
  by an injected fault is not counted), and the histograms
  ``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds``,
  ``vllm:e2e_request_latency_seconds`` and ``vllm:request_queue_time_seconds``
  with vLLM's buckets; per finished request, as vLLM observes them, the
  histograms ``vllm:request_prompt_tokens``, ``vllm:request_generation_tokens``,
  ``vllm:request_prefill_time_seconds`` (first scheduled to first token),
  ``vllm:request_decode_time_seconds`` (first to last token),
  ``vllm:request_inference_time_seconds`` (first scheduled to last token) and
  ``vllm:request_time_per_output_token_seconds`` (decode time over the
  tokens after the first).

Not modelled, so not exported: multimodal and LoRA series, KV-transfer and
speculative-decoding counters, ``vllm:iteration_tokens_total`` and the
request-parameter histograms (``vllm:request_params_*``).

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

from llmmesh.engine.backend import FinishReason

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
# vLLM sizes its token-count buckets by the model's context (1, 2, 5, 10, ... up to it).
DEFAULT_MAX_MODEL_LEN = 4096
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
    steps: int = 0
    prefill_steps: int = 0
    """Steps that prefilled anything: each costs the timing's ``prefill_overhead_s`` more."""


@dataclass
class RequestTimeline:
    """When one request reached each stage, on the simulated clock."""

    queued_s: float = 0.0
    scheduled_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    prompt_tokens: int = 0
    generated: int = 0


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
            (
                "vllm:prompt_tokens_cached",
                "Number of cached prompt tokens (local + external).",
                stats.prefix_cache_hits,
            ),
            ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", stats.preemptions),
        )
        for name, documentation, total in counters:
            counter = CounterMetricFamily(name, documentation, labels=LABELS)
            counter.add_metric(self._labels, total)
            yield counter


class SimStepsCollector:
    """The simulator's own series, which vLLM has no name for: the steps it
    ran and those that prefilled (each costs the timing's
    ``prefill_overhead_s`` more), as ``llmmesh_sim_steps_total`` and
    ``llmmesh_sim_prefill_steps_total``. The pod serves them beside vLLM's
    names, as it serves its GPU's."""

    def __init__(self, stats: Callable[[], SchedulerStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        steps = CounterMetricFamily("llmmesh_sim_steps", "Engine steps the simulator ran.")
        steps.add_metric([], stats.steps)
        prefill = CounterMetricFamily(
            "llmmesh_sim_prefill_steps",
            "Engine steps that prefilled anything (each costs sim_prefill_overhead_s more).",
        )
        prefill.add_metric([], stats.prefill_steps)
        return iter((steps, prefill))


class SimEngineMetrics:
    """One simulated pod's metrics and the private registry that serves them."""

    def __init__(
        self,
        model_name: str,
        stats: Callable[[], SchedulerStats],
        max_model_len: int = DEFAULT_MAX_MODEL_LEN,
    ) -> None:
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
        token_buckets = request_token_buckets(max_model_len)

        def histogram(name: str, documentation: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, documentation, LABELS, registry=registry, buckets=buckets).labels(*labels)

        self._request_prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", token_buckets
        )
        self._request_generation_tokens = histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", token_buckets
        )
        self._request_prefill_time = histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self._request_decode_time = histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self._request_inference_time = histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self._request_time_per_output_token = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            INTER_TOKEN_BUCKETS,
        )

    def request_scheduled(self, timeline: RequestTimeline, now_s: float) -> None:
        """A request entered the batch for the first time (readmissions after
        a preemption do not count: vLLM's queue time ends at first scheduling)."""
        if timeline.scheduled_s is None:
            timeline.scheduled_s = now_s
            self._request_queue_time.observe(now_s - timeline.queued_s)

    def token_generated(self, timeline: RequestTimeline, now_s: float, prompt_tokens: int) -> None:
        """A request produced one output token at ``now_s``."""
        self._generation_tokens.inc()
        timeline.generated += 1
        if timeline.last_token_s is None:
            self._prompt_tokens.inc(prompt_tokens)
            timeline.prompt_tokens = prompt_tokens
            timeline.first_token_s = now_s
            self._time_to_first_token.observe(now_s - timeline.queued_s)
        else:
            self._inter_token_latency.observe(now_s - timeline.last_token_s)
        timeline.last_token_s = now_s

    def request_finished(self, timeline: RequestTimeline, now_s: float, reason: FinishReason) -> None:
        """A request ended with ``reason`` at ``now_s``."""
        self._request_success[reason].inc()
        self._e2e_request_latency.observe(now_s - timeline.queued_s)
        self._request_prompt_tokens.observe(timeline.prompt_tokens)
        self._request_generation_tokens.observe(timeline.generated)
        scheduled, first, last = timeline.scheduled_s, timeline.first_token_s, timeline.last_token_s
        if scheduled is None or first is None or last is None:
            return  # ended before its first token: vLLM times no phases either
        self._request_prefill_time.observe(first - scheduled)
        self._request_decode_time.observe(last - first)
        self._request_inference_time.observe(last - scheduled)
        if timeline.generated > 1:
            self._request_time_per_output_token.observe((last - first) / (timeline.generated - 1))


def request_token_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's buckets for token counts: 1, 2, 5, 10, 20, 50, ... up to ``max_model_len``."""
    buckets: list[float] = []
    magnitude = 1
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * magnitude
            if value > max_model_len:
                return tuple(buckets)
            buckets.append(float(value))
        magnitude *= 10

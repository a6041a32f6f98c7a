"""The load vLLM reports after each engine step, kept for ``GetLoad``.

vLLM hands every stat logger a ``SchedulerStats`` per step; this one keeps
the last one and sums the prefix-cache counters. It is passed to ``AsyncLLM``
beside vLLM's own loggers, so the Prometheus metrics stay vLLM's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.config import VllmConfig
from vllm.v1.metrics.loggers import StatLoggerBase
from vllm.v1.metrics.stats import IterationStats, SchedulerStats


@dataclass
class SchedulerLoad:
    """The engine's view of its load; counters are totals since start."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    preemptions: int = 0


class LoadRecorder(StatLoggerBase):  # type: ignore[misc]  # vLLM is used untyped
    """A vLLM stat logger that records into one shared :class:`SchedulerLoad`.

    vLLM builds loggers from factories (``factory(vllm_config, engine_index)``);
    :meth:`factory` binds the shared record.
    """

    def __init__(self, vllm_config: VllmConfig, engine_index: int = 0, load: SchedulerLoad | None = None):
        self.load = load if load is not None else SchedulerLoad()

    @staticmethod
    def factory(load: SchedulerLoad) -> Any:
        def build(vllm_config: VllmConfig, engine_index: int = 0) -> LoadRecorder:
            return LoadRecorder(vllm_config, engine_index, load)

        return build

    def record(
        self,
        scheduler_stats: SchedulerStats | None,
        iteration_stats: IterationStats | None,
        mm_cache_stats: object | None = None,
        engine_idx: int = 0,
    ) -> None:
        if scheduler_stats is not None:
            self.load.running = scheduler_stats.num_running_reqs
            self.load.waiting = scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
            self.load.kv_cache_usage = scheduler_stats.kv_cache_usage
            self.load.prefix_cache_queries += scheduler_stats.prefix_cache_stats.queries
            self.load.prefix_cache_hits += scheduler_stats.prefix_cache_stats.hits
        if iteration_stats is not None:
            self.load.preemptions += iteration_stats.num_preempted_reqs

    def log_engine_initialized(self) -> None:
        pass

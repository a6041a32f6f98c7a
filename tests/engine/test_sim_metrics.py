"""The simulator's Prometheus metrics: vLLM's names and labels, counts equal
to what was streamed, latencies on the simulated clock."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from llmmesh.engine.backend import FinishReason, GenerationRequest, SamplingOptions
from llmmesh.engine.sim.backend import SimBackend
from llmmesh.engine.sim.metrics import RequestTimeline
from tests.engine.support import FAST, SteppedSimulator, collect

LABELS = {"model_name": FAST.model, "engine": "0"}
VLLM_SERIES = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:num_preemptions": "counter",
    "vllm:request_success": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
}


def value(backend: SimBackend, name: str, **labels: str) -> float:
    sample = backend.prometheus_registry().get_sample_value(name, {**LABELS, **labels})
    assert sample is not None, name
    return sample


@pytest.mark.asyncio
async def test_generations_are_counted_under_vllm_names(backend: SimBackend) -> None:
    prompts = [tuple(range(300, 320)), tuple(range(400, 406))]
    clock = backend.scheduler.clock_s
    natural = await collect(backend, GenerationRequest("natural", prompts[0]))
    capped = await collect(backend, GenerationRequest("capped", prompts[1], SamplingOptions(max_tokens=5)))
    elapsed_s = backend.scheduler.clock_s - clock
    assert natural.finished is not None and natural.finished.reason is FinishReason.STOP
    assert capped.finished is not None and capped.finished.reason is FinishReason.LENGTH
    outputs = len(natural.token_ids) + len(capped.token_ids)

    exposition = generate_latest(backend.prometheus_registry()).decode()
    families = {family.name: family for family in text_string_to_metric_families(exposition)}
    assert {name: families[name].type for name in VLLM_SERIES} == VLLM_SERIES
    for name in VLLM_SERIES:
        assert all(sample.labels.items() >= LABELS.items() for sample in families[name].samples), name
    assert "vllm:generation_tokens_total" in exposition

    assert value(backend, "vllm:generation_tokens_total") == outputs
    assert value(backend, "vllm:prompt_tokens_total") == sum(len(p) for p in prompts)
    assert value(backend, "vllm:request_success_total", finished_reason="stop") == 1
    assert value(backend, "vllm:request_success_total", finished_reason="length") == 1
    assert value(backend, "vllm:request_success_total", finished_reason="abort") == 0
    load = backend.load()
    assert value(backend, "vllm:prefix_cache_queries_total") == load.prefix_cache_queries
    assert value(backend, "vllm:prefix_cache_hits_total") == load.prefix_cache_hits
    assert value(backend, "vllm:num_preemptions_total") == 0
    for gauge in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert value(backend, gauge) == 0

    # Each ran alone, so the clock gives every latency exactly.
    timing = backend.timing
    ttft = value(backend, "vllm:time_to_first_token_seconds_sum")
    assert value(backend, "vllm:time_to_first_token_seconds_count") == 2
    assert ttft == pytest.approx(sum(timing.step_s(1, len(p)) for p in prompts))
    assert value(backend, "vllm:inter_token_latency_seconds_count") == outputs - 2
    itl = value(backend, "vllm:inter_token_latency_seconds_sum")
    assert itl == pytest.approx((outputs - 2) * timing.decode_step_s(1))
    assert value(backend, "vllm:e2e_request_latency_seconds_count") == 2
    assert value(backend, "vllm:e2e_request_latency_seconds_sum") == pytest.approx(elapsed_s)
    assert value(backend, "vllm:request_queue_time_seconds_sum") == 0.0
    assert value(backend, "vllm:request_queue_time_seconds_count") == 2


def test_gauges_follow_the_batch_and_the_pool() -> None:
    simulator = SteppedSimulator(dataclasses.replace(FAST, max_num_seqs=1))
    simulator.submit(GenerationRequest("running", tuple(range(300, 310))))
    simulator.submit(GenerationRequest("waiting", tuple(range(400, 410))))
    simulator.step()
    registry = simulator.scheduler.metrics.registry
    assert registry.get_sample_value("vllm:num_requests_running", LABELS) == 1
    assert registry.get_sample_value("vllm:num_requests_waiting", LABELS) == 1
    usage = simulator.pool.used_blocks / simulator.pool.total_blocks
    assert usage > 0
    assert registry.get_sample_value("vllm:kv_cache_usage_perc", LABELS) == pytest.approx(usage)
    admitted_at_s = 0.0
    while simulator.generations["waiting"].started is None:
        admitted_at_s = simulator.scheduler.clock_s
        simulator.step()
    simulator.run_until_idle()
    # Both were queued at 0 s; the second entered the batch when the first left.
    assert registry.get_sample_value("vllm:request_queue_time_seconds_count", LABELS) == 2
    assert registry.get_sample_value("vllm:request_queue_time_seconds_sum", LABELS) == admitted_at_s > 0


def test_every_pod_has_its_own_registry() -> None:
    first, second = SimBackend(FAST), SimBackend(FAST)
    assert first.prometheus_registry() is not second.prometheus_registry()
    first.scheduler.metrics.token_generated(RequestTimeline(), 0.5, prompt_tokens=3)
    assert value(first, "vllm:generation_tokens_total") == 1
    assert value(second, "vllm:generation_tokens_total") == 0

"""The simulator's per-request vLLM histograms (token counts, prefill,
decode, inference and time per output token on the simulated clock), and
every vLLM name it exports is one the installed vLLM exports too."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from llmmesh.engine.backend import GenerationRequest, SamplingOptions
from llmmesh.engine.sim.backend import SimBackend
from llmmesh.engine.sim.metrics import SchedulerStats, SimEngineMetrics, request_token_buckets
from tests.engine.support import FAST, collect

LABELS = {"model_name": FAST.model, "engine": "0"}


def value(backend: SimBackend, name: str) -> float:
    sample = backend.prometheus_registry().get_sample_value(name, LABELS)
    assert sample is not None, name
    return sample


@pytest.mark.asyncio
async def test_a_finished_request_is_timed_by_phase(backend: SimBackend) -> None:
    prompt = tuple(range(500, 512))
    reply = await collect(backend, GenerationRequest("timed", prompt, SamplingOptions(max_tokens=6)))
    generated = len(reply.token_ids)
    assert generated == 6
    timing = backend.timing
    assert value(backend, "vllm:request_prompt_tokens_count") == 1
    assert value(backend, "vllm:request_prompt_tokens_sum") == len(prompt)
    assert value(backend, "vllm:request_generation_tokens_sum") == generated
    # Alone in the batch: prefill is one step over the prompt, each later token one decode step.
    prefill = value(backend, "vllm:request_prefill_time_seconds_sum")
    assert prefill == pytest.approx(timing.step_s(1, len(prompt)))
    decode = value(backend, "vllm:request_decode_time_seconds_sum")
    assert decode == pytest.approx((generated - 1) * timing.decode_step_s(1))
    assert value(backend, "vllm:request_inference_time_seconds_sum") == pytest.approx(prefill + decode)
    tpot = value(backend, "vllm:request_time_per_output_token_seconds_sum")
    assert tpot == pytest.approx(timing.decode_step_s(1))
    assert value(backend, "vllm:prompt_tokens_cached_total") == backend.load().prefix_cache_hits
    # The simulator's own: one step prefilled, the five after it decoded.
    registry = backend.prometheus_registry()
    assert registry.get_sample_value("llmmesh_sim_steps_total") == 6
    assert registry.get_sample_value("llmmesh_sim_prefill_steps_total") == 1


def test_token_buckets_are_vllms() -> None:
    assert request_token_buckets(4096) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)
    assert request_token_buckets(1) == (1,)


def vllm_metric_names() -> set[str]:
    """The ``vllm:*`` names the installed vLLM's Prometheus logger declares."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed (LLMMESH_NO_VLLM=1)")
    loggers = Path(spec.origin).parent / "v1" / "metrics" / "loggers.py"
    return set(re.findall(r'name="(vllm:[a-z0-9_:]+)"', loggers.read_text()))


def test_the_simulator_exports_only_names_vllm_exports() -> None:
    registry = SimEngineMetrics("m", lambda: SchedulerStats(0, 0, 0.0, 0, 0, 0)).registry
    exported = {family.name for family in registry.collect()}
    declared = vllm_metric_names()
    assert len(exported) >= 20
    # prometheus_client keeps a counter's name without _total; vLLM declares it so too.
    assert exported <= declared, sorted(exported - declared)

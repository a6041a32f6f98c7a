"""GPU telemetry: what the pod's /metrics says about its GPUs (here, on a
machine without NVML or a GPU, that there is none and why nothing else is
exported), and the series a reading with GPUs becomes."""

from __future__ import annotations

import asyncio
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from llmmesh.engine.gpu import GpuCollector, GpuDevice, GpuTelemetry, NvmlProbe
from llmmesh.engine.server import EnginePod


class ReadingProbe(NvmlProbe):
    """A probe that returns one fixed reading, as NVML would on a GPU host."""

    def __init__(self, telemetry: GpuTelemetry) -> None:
        super().__init__()
        self._telemetry = telemetry

    def read(self) -> GpuTelemetry:
        return self._telemetry


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


@pytest.mark.asyncio
async def test_a_pod_without_gpus_says_so_on_its_metrics(pod: EnginePod) -> None:
    text = await asyncio.to_thread(scrape, pod.metrics.url)
    assert "llmmesh_gpu_available 0.0" in text
    assert "llmmesh_gpu_utilization_percent{" not in text


def test_each_gpu_is_a_labelled_series() -> None:
    reading = GpuTelemetry(
        available=True,
        devices=(
            GpuDevice(0, "NVIDIA H100", 87.0, 40 * 2**30, 80 * 2**30),
            GpuDevice(1, "NVIDIA H100", 13.0, 10 * 2**30, 80 * 2**30),
        ),
    )
    registry = CollectorRegistry()
    registry.register(GpuCollector(ReadingProbe(reading)))
    text = generate_latest(registry).decode()
    assert "llmmesh_gpu_available 1.0" in text
    assert 'llmmesh_gpu_utilization_percent{gpu="0",name="NVIDIA H100"} 87.0' in text
    assert 'llmmesh_gpu_memory_used_bytes{gpu="1",name="NVIDIA H100"} 1.073741824e+10' in text
    assert 'llmmesh_gpu_memory_total_bytes{gpu="1",name="NVIDIA H100"} 8.589934592e+10' in text


def test_nvml_absence_is_read_once_and_explained() -> None:
    probe = NvmlProbe()
    first, second = probe.read(), probe.read()
    if first.available:
        pytest.skip("this machine has GPUs")
    assert first == second and first.unavailable_reason

"""The router's load signal from GPU telemetry: a pod that reports GPU
utilisation (NVML) has it blended into its load; one that reports none (the
CPU build, the simulator) is scored as before."""

from __future__ import annotations

import pytest

from llmmesh.region.placement.router import PodLoad, RoutingTuning, gpu_utilization
from llmmesh.v1 import engine_service_pb2 as pb

TUNING = RoutingTuning()


def report(*utilizations: float, available: bool = True) -> pb.LoadReport:
    devices = [pb.GpuDevice(index=i, name="gpu", utilization_percent=u) for i, u in enumerate(utilizations)]
    return pb.LoadReport(pod_id="p", gpu=pb.GpuTelemetry(available=available, devices=devices))


def test_gpu_utilization_is_the_mean_over_the_pods_gpus() -> None:
    assert gpu_utilization(report(80.0, 40.0)) == pytest.approx(0.6)
    assert gpu_utilization(report(available=False)) is None
    assert gpu_utilization(pb.LoadReport(pod_id="p")) is None
    assert gpu_utilization(None) is None


def test_a_busy_gpu_makes_a_pod_look_busier_and_no_gpu_changes_nothing() -> None:
    idle_queue = PodLoad(running=1, waiting=0, kv_cache_usage=0.1, in_flight=1, max_num_seqs=8)
    cpu_only = idle_queue.load(TUNING)
    assert cpu_only == pytest.approx(0.6 * 1 / 8 + 0.4 * 0.1)
    hot = PodLoad(1, 0, 0.1, 1, 8, gpu_utilization=0.95).load(TUNING)
    cool = PodLoad(1, 0, 0.1, 1, 8, gpu_utilization=0.05).load(TUNING)
    assert hot == pytest.approx(0.7 * cpu_only + 0.3 * 0.95)
    assert cool < cpu_only < hot

"""GPU telemetry through NVML (``nvidia-ml-py``), read lazily.

Without the library, a driver or a GPU, telemetry says so and why; it never
makes numbers up. The pod reports it in its load reports (the region's
router weighs GPU utilisation into a pod's load where present) and on its
``/metrics`` (:class:`GpuCollector`).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as NVML reports it."""

    index: int
    name: str
    utilization_percent: float
    memory_used_bytes: int
    memory_total_bytes: int


@dataclass(frozen=True)
class GpuTelemetry:
    """Every GPU of the pod, or why there is no reading."""

    available: bool
    unavailable_reason: str = ""
    devices: tuple[GpuDevice, ...] = ()


class NvmlProbe:
    """Reads NVML; initializes it on first use and remembers a failure, so a
    machine without GPUs pays the import attempt once, not every report."""

    def __init__(self) -> None:
        self._nvml: ModuleType | None = None
        self._failure = ""

    def _initialized(self) -> ModuleType | None:
        if self._nvml is None and not self._failure:
            try:
                nvml = importlib.import_module("pynvml")
            except ImportError:
                self._failure = "nvidia-ml-py (pynvml) is not installed"
                return None
            try:
                nvml.nvmlInit()
            except Exception as exc:  # NVMLError and its many subclasses
                self._failure = f"NVML did not initialize: {exc}"
                return None
            self._nvml = nvml
        return self._nvml

    def read(self) -> GpuTelemetry:
        """The current reading of every GPU."""
        nvml = self._initialized()
        if nvml is None:
            return GpuTelemetry(available=False, unavailable_reason=self._failure)
        try:
            devices = []
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                name = nvml.nvmlDeviceGetName(handle)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                utilization = nvml.nvmlDeviceGetUtilizationRates(handle)
                devices.append(
                    GpuDevice(
                        index=index,
                        name=name.decode() if isinstance(name, bytes) else str(name),
                        utilization_percent=float(utilization.gpu),
                        memory_used_bytes=int(memory.used),
                        memory_total_bytes=int(memory.total),
                    )
                )
        except Exception as exc:  # a GPU can fall off the bus between reads
            return GpuTelemetry(available=False, unavailable_reason=f"NVML query failed: {exc}")
        if not devices:
            return GpuTelemetry(available=False, unavailable_reason="NVML found no GPU")
        return GpuTelemetry(available=True, devices=tuple(devices))

    def close(self) -> None:
        """Release NVML if it was initialized."""
        if self._nvml is not None:
            self._nvml.nvmlShutdown()
            self._nvml = None


class GpuCollector(Collector):
    """The pod's GPUs on its ``/metrics``, read from NVML at scrape time:
    ``llmmesh_gpu_available`` (1 or 0; a pod without GPUs says so rather
    than exporting nothing), and per GPU (labels ``gpu`` index and ``name``)
    ``llmmesh_gpu_utilization_percent``, ``llmmesh_gpu_memory_used_bytes``
    and ``llmmesh_gpu_memory_total_bytes``. vLLM exports no GPU series of
    its own, so the names are the mesh's."""

    def __init__(self, probe: NvmlProbe) -> None:
        self._probe = probe

    def describe(self) -> list[Metric]:
        # The series' names, so a registry refuses a clashing collector.
        return list(self._families(GpuTelemetry(available=False)))

    def collect(self) -> Iterator[Metric]:
        return self._families(self._probe.read())

    @staticmethod
    def _families(telemetry: GpuTelemetry) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "llmmesh_gpu_available",
            "1 when NVML reads the pod's GPUs, 0 otherwise",
            float(telemetry.available),
        )
        labels = ["gpu", "name"]
        families = {
            "utilization_percent": GaugeMetricFamily(
                "llmmesh_gpu_utilization_percent",
                "GPU utilisation over NVML's last sample period",
                labels=labels,
            ),
            "memory_used_bytes": GaugeMetricFamily(
                "llmmesh_gpu_memory_used_bytes", "GPU memory in use", labels=labels
            ),
            "memory_total_bytes": GaugeMetricFamily(
                "llmmesh_gpu_memory_total_bytes", "GPU memory in all", labels=labels
            ),
        }
        for device in telemetry.devices:
            values = [str(device.index), device.name]
            families["utilization_percent"].add_metric(values, device.utilization_percent)
            families["memory_used_bytes"].add_metric(values, float(device.memory_used_bytes))
            families["memory_total_bytes"].add_metric(values, float(device.memory_total_bytes))
        yield from families.values()

"""GPU telemetry through NVML (``nvidia-ml-py``), read lazily.

Without the library, a driver or a GPU, telemetry says so and why; it never
makes numbers up.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType


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

"""A simulated NVML: the few pynvml functions the GPU monitor calls, over scripted GPUs.

For the monitor's tests and ``benchmarks/monitor_overhead.py`` on machines without a GPU::

    nvml = SimulatedNvml([SimGpu(temp_c=[60, 70, 85], throttle=[0, 0, 0x40]), SimGpu()],
                         call_s=0.0005)
    monitor = GpuMonitor.start_if_available(path, interval_s=1.0, nvml=nvml)

Each reading is a list: the k-th call of that function on that GPU returns element k (the last
one once the list is used up). ``call_s`` makes every call sleep that long, releasing the GIL as a
real NVML call through ctypes does. Setting ``lost = True`` on a GPU makes every later call on it
raise NVML_ERROR_GPU_IS_LOST, as a GPU that fell off the bus does; a name in ``unsupported``
raises NVML_ERROR_NOT_SUPPORTED. Setting ``transient_error`` to an NVML code (e.g.
``NVML_ERROR_TIMEOUT``) makes every reading raise it (the name and UUID still answer) until it is
set back to None, as a busy or briefly unresponsive driver does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10


class NVMLError(Exception):
    """pynvml's exception: ``value`` is the NVML return code."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {NVML_ERROR_NOT_SUPPORTED: "Not Supported", NVML_ERROR_GPU_IS_LOST: "GPU is lost",
                NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
                NVML_ERROR_TIMEOUT: "Timeout"}.get(self.value, str(self.value))


@dataclass
class SimGpu:
    """One simulated GPU; each reading is the list of values its successive calls return."""

    name: str = "Simulated GPU"
    uuid: str = ""
    util_pct: list[float] = field(default_factory=lambda: [95.0])
    mem_used_gib: list[float] = field(default_factory=lambda: [10.0])
    mem_total_gib: float = 24.0
    temp_c: list[float] = field(default_factory=lambda: [65.0])
    power_w: list[float] = field(default_factory=lambda: [300.0])
    power_limit_w: float = 350.0
    sm_clock_mhz: list[float] = field(default_factory=lambda: [1800.0])
    throttle: list[int] = field(default_factory=lambda: [0])
    unsupported: set[str] = field(default_factory=set)  # e.g. {"nvmlDeviceGetPowerUsage"}
    lost: bool = False
    transient_error: int | None = None  # an NVML code every reading raises while set
    calls: dict[str, int] = field(default_factory=dict)


_IDENTITY = ("nvmlDeviceGetName", "nvmlDeviceGetUUID")  # read once, when the monitor starts


class SimulatedNvml:
    """Stands in for the ``pynvml`` module (pass it as ``nvml=``)."""

    NVMLError = NVMLError
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1

    def __init__(self, gpus: list[SimGpu] | int = 1, call_s: float = 0.0,
                 driver_loaded: bool = True) -> None:
        self.gpus = [SimGpu() for _ in range(gpus)] if isinstance(gpus, int) else list(gpus)
        for i, g in enumerate(self.gpus):
            g.uuid = g.uuid or f"GPU-00000000-0000-0000-0000-{i:012d}"
        self.call_s = call_s
        self.driver_loaded = driver_loaded
        self.initialised = False
        self.total_calls = 0

    def _call(self, handle: int, fn: str, values: list[Any] | None = None) -> Any:
        self.total_calls += 1
        if self.call_s:
            time.sleep(self.call_s)
        gpu = self.gpus[handle]
        if gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if fn in gpu.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if gpu.transient_error is not None and fn not in _IDENTITY:
            raise NVMLError(gpu.transient_error)
        k = gpu.calls.get(fn, 0)
        gpu.calls[fn] = k + 1
        return None if values is None else values[min(k, len(values) - 1)]

    def nvmlInit(self) -> None:
        if not self.driver_loaded:
            raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < len(self.gpus):
            raise NVMLError(2)  # NVML_ERROR_INVALID_ARGUMENT
        return index

    def nvmlDeviceGetName(self, h: int) -> str:
        return self._call(h, "nvmlDeviceGetName", [self.gpus[h].name])

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self._call(h, "nvmlDeviceGetUUID", [self.gpus[h].uuid])

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=self._call(h, "nvmlDeviceGetUtilizationRates",
                                              self.gpus[h].util_pct), memory=0)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        g = self.gpus[h]
        used = self._call(h, "nvmlDeviceGetMemoryInfo", g.mem_used_gib)
        return SimpleNamespace(used=int(used * (1 << 30)), total=int(g.mem_total_gib * (1 << 30)))

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return self._call(h, "nvmlDeviceGetTemperature", self.gpus[h].temp_c)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return int(1000 * self._call(h, "nvmlDeviceGetPowerUsage", self.gpus[h].power_w))

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return int(1000 * self._call(h, "nvmlDeviceGetEnforcedPowerLimit",
                                     [self.gpus[h].power_limit_w]))

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        return self._call(h, "nvmlDeviceGetClockInfo", self.gpus[h].sm_clock_mhz)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return self._call(h, "nvmlDeviceGetCurrentClocksEventReasons", self.gpus[h].throttle)

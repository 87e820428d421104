"""The GPU monitor: a background thread that samples every GPU of the node through NVML.

    monitor = GpuMonitor.start_if_available(run_dir / "gpu.jsonl", interval_s=5.0)
    ...
    monitor.summary()      # "gpus 8: hottest #3 81C, lowest util #5 42%, throttled #3 hw_thermal"
    monitor.latest()       # {nvml index: its last sample}
    monitor.close()

Every sample of every GPU is one line of ``gpu.jsonl``::

    {"time": 1700000000.0, "step": 120, "gpu": 0, "name": "NVIDIA H100 80GB HBM3",
     "util_pct": 97.0, "mem_used_gib": 61.2, "mem_total_gib": 79.6, "temp_c": 64.0,
     "power_w": 612.3, "power_limit_w": 700.0, "sm_clock_mhz": 1980.0, "throttle": []}

(``step`` is the last step the metrics logger saw; ``throttle`` names NVML's clock event
reasons, see ``THROTTLE_REASONS``). A reading the GPU does not support (power on some consumer
cards) is left out of its lines and not asked again. A GPU that stops answering (fallen off the
bus, NVML_ERROR_GPU_IS_LOST) gets one ``{"gpu": 2, "lost": true, "error": "..."}`` line and is
not asked again; the others go on. Any other NVML error (a timeout, a busy driver) is transient:
that reading is left out of the sample, a round with no reading at all writes no line, and the
GPU counts as lost only after ``LOST_AFTER_ROUNDS`` such rounds in a row.

The sampler never runs on the training thread: NVML calls go through ctypes, which releases the
GIL, so the training thread pays only for the Python between calls (``benchmarks/
monitor_overhead.py`` measures it). Without nvidia-ml-py, without a driver, or without a GPU,
``start_if_available`` returns None and nothing runs.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from bertgpu.telemetry.records import open_for_append

_GIB = float(1 << 30)

# NVML's clock event ("throttle") reason bits, nvmlClocksEventReason* in nvml.h.
THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks",
}
# Reasons that do not slow a busy GPU down (it is idle, or its clocks were set on purpose):
# kept in the series, not flagged in the summary.
BENIGN_THROTTLE = frozenset({"gpu_idle", "applications_clocks", "display_clocks"})


def slowdown_reasons(throttle: Any) -> list[str]:
    """The reasons of a sample's ``throttle`` list that mean "throttled": all but the benign
    ones. The one definition for the console, watch, the sinks and the report."""
    return [r for r in throttle or () if r not in BENIGN_THROTTLE]

_NVML_ERROR_NOT_SUPPORTED = 3
# Rounds in a row in which a GPU answered nothing (transient errors only) before it counts as
# lost: one hiccup must not end its series, but a GPU that never answers again is as good as gone.
LOST_AFTER_ROUNDS = 5
_NVML_ERROR_GPU_IS_LOST = 15
_NVML_TEMPERATURE_GPU = 0
_NVML_CLOCK_SM = 1


def decode_throttle(mask: int) -> list[str]:
    """NVML's reason bit mask -> names in bit order; unknown bits as hex (``"0x200"``)."""
    names = [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
    unknown = mask & ~sum(THROTTLE_REASONS)
    bit = 1
    while unknown >= bit:
        if unknown & bit:
            names.append(hex(bit))
        bit <<= 1
    return names


def _throttle_mask(nvml: Any, h: Any) -> int:
    # Renamed "clocks event reasons" in newer NVML; the old name still exists in older wheels.
    fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    fn = fn or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    return int(fn(h))


def _memory(nvml: Any, h: Any) -> dict[str, float]:
    info = nvml.nvmlDeviceGetMemoryInfo(h)
    return {"mem_used_gib": round(info.used / _GIB, 3),
            "mem_total_gib": round(info.total / _GIB, 3)}


# What each sample reads, in order: (name, read(nvml module, device handle) -> fields).
_READINGS: tuple[tuple[str, Callable[[Any, Any], dict[str, Any]]], ...] = (
    ("util", lambda n, h: {"util_pct": float(n.nvmlDeviceGetUtilizationRates(h).gpu)}),
    ("memory", _memory),
    ("temp", lambda n, h: {"temp_c": float(n.nvmlDeviceGetTemperature(h, _NVML_TEMPERATURE_GPU))}),
    ("power", lambda n, h: {"power_w": round(n.nvmlDeviceGetPowerUsage(h) / 1000.0, 1)}),
    ("power_limit",
     lambda n, h: {"power_limit_w": round(n.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0, 1)}),
    ("clock", lambda n, h: {"sm_clock_mhz": float(n.nvmlDeviceGetClockInfo(h, _NVML_CLOCK_SM))}),
    ("throttle", lambda n, h: {"throttle": decode_throttle(_throttle_mask(n, h))}),
)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class _Gpu:
    index: int
    handle: Any
    name: str
    uuid: str
    unsupported: set[str] = field(default_factory=set)
    lost: bool = False
    failed_rounds: int = 0  # rounds in a row with transient errors and no reading


class GpuMonitor:
    """Samples every GPU of the node every ``interval_s`` seconds on a daemon thread.

    ``nvml`` is the pynvml module (tests pass ``bertgpu.testing.nvml_sim.SimulatedNvml``);
    ``path`` the JSON-lines file the samples are appended to (None: keep the latest only).
    Build it with ``start_if_available``; ``sample()`` reads once on the calling thread.
    """

    def __init__(self, nvml: Any, path: Path | None, interval_s: float) -> None:
        self._nvml = nvml
        self.path = path
        self.interval_s = float(interval_s)
        self.step = 0  # set by the metrics logger at each log call, copied into the samples
        self.samples = 0  # completed sampling rounds: a reader polls it to see new data
        self._lock = threading.Lock()
        self._latest: dict[int, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._file: IO[str] | None = None
        self._device_index: dict[str, int | None] = {}
        self._gpus = [self._describe(i) for i in range(int(nvml.nvmlDeviceGetCount()))]

    def _describe(self, index: int) -> _Gpu:
        n = self._nvml
        h = n.nvmlDeviceGetHandleByIndex(index)
        parts = []
        for fn in (n.nvmlDeviceGetName, n.nvmlDeviceGetUUID):
            try:
                parts.append(_text(fn(h)))
            except Exception:
                parts.append("")
        return _Gpu(index, h, parts[0] or f"GPU {index}", parts[1])

    @classmethod
    def start_if_available(
        cls, path: Path | None, interval_s: float = 5.0, nvml: Any = None
    ) -> GpuMonitor | None:
        """A started monitor, or None (quietly) when NVML or a GPU is absent or interval is 0."""
        if interval_s <= 0:
            return None
        try:
            if nvml is None:
                import pynvml as nvml  # nvidia-ml-py
            nvml.nvmlInit()
        except Exception:  # not installed, no driver, no permission: no monitor
            return None
        try:
            monitor = cls(nvml, path, interval_s)
        except Exception:
            _shutdown(nvml)
            return None
        if not monitor._gpus:
            _shutdown(nvml)
            return None
        monitor.start()
        return monitor

    @property
    def gpu_count(self) -> int:
        return len(self._gpus)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="bertgpu-gpu-monitor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                self.sample()
            except Exception:  # a monitor must never take the run down; try again next time
                pass
            if self._stop.wait(self.interval_s):
                return

    def sample(self) -> list[dict[str, Any]]:
        """Read every GPU once, append the lines to the file, and return them."""
        now = round(time.time(), 3)
        read = [self._sample_one(gpu, now) for gpu in self._gpus if not gpu.lost]
        lines = [rec for rec in read if rec is not None]
        with self._lock:
            for rec in lines:
                if rec.get("lost"):
                    self._latest.pop(rec["gpu"], None)
                else:
                    self._latest[rec["gpu"]] = rec
            self.samples += 1
        if self.path is not None and lines:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open_for_append(self.path)
            self._file.write("".join(json.dumps(r) + "\n" for r in lines))
            self._file.flush()
        return lines

    def _sample_one(self, gpu: _Gpu, now: float) -> dict[str, Any] | None:
        """The GPU's line for this round: its readings, a "lost" line, or None when a transient
        error left nothing to write (its last sample stays its latest)."""
        rec: dict[str, Any] = {"time": now, "step": self.step, "gpu": gpu.index, "name": gpu.name}
        error: Exception | None = None
        read = 0
        for key, fn in _READINGS:
            if key in gpu.unsupported:
                continue
            try:
                rec.update(fn(self._nvml, gpu.handle))
                read += 1
            except Exception as e:
                code = getattr(e, "value", None)
                if code == _NVML_ERROR_GPU_IS_LOST:
                    error, read = e, 0
                    break
                nvml_error = getattr(self._nvml, "NVMLError", Exception)
                if code == _NVML_ERROR_NOT_SUPPORTED or not isinstance(e, nvml_error):
                    gpu.unsupported.add(key)  # not on this GPU (or this driver): stop asking
                else:
                    error = e  # transient: left out of this sample only
        if error is None or read > 0:
            gpu.failed_rounds = 0
            return rec
        gpu.failed_rounds += 1
        if getattr(error, "value", None) != _NVML_ERROR_GPU_IS_LOST \
                and gpu.failed_rounds < LOST_AFTER_ROUNDS:
            return None
        gpu.lost = True
        detail = f"{type(error).__name__}: {error}"
        if getattr(error, "value", None) != _NVML_ERROR_GPU_IS_LOST:
            detail += f" ({gpu.failed_rounds} rounds in a row without a reading)"
        return {"time": now, "step": self.step, "gpu": gpu.index, "name": gpu.name,
                "lost": True, "error": detail[:200]}

    def latest(self) -> dict[int, dict[str, Any]]:
        """The last sample of every GPU still answering, by NVML index."""
        with self._lock:
            return dict(self._latest)

    def summary(self) -> str:
        """One line for the progress line: hottest GPU, lowest utilisation, throttling."""
        return summarize(list(self.latest().values()), lost=[g.index for g in self._gpus if g.lost])

    def device_stats(self, device: Any = None) -> dict[str, float]:
        """``gpu_util_pct`` and ``gpu_mem_used_gib`` of this process's GPU from the last sample
        (``{}`` on a CPU or before the first sample)."""
        index = self._nvml_index(device)
        rec = self.latest().get(index) if index is not None else None
        if not rec:
            return {}
        out = {}
        if "util_pct" in rec:
            out["gpu_util_pct"] = rec["util_pct"]
        if "mem_used_gib" in rec:
            out["gpu_mem_used_gib"] = rec["mem_used_gib"]
        return out

    def _nvml_index(self, device: Any) -> int | None:
        key = str(device)
        if key not in self._device_index:
            self._device_index[key] = _torch_to_nvml(device, self._gpus)
        return self._device_index[key]

    def close(self) -> None:
        """Stop the thread, close the file and NVML; safe to call twice."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._file is not None:
            self._file.close()
            self._file = None
        _shutdown(self._nvml)


def _shutdown(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception:
        pass


def summarize(samples: list[dict[str, Any]], lost: list[int] | tuple[int, ...] = ()) -> str:
    """``"gpu0 81C 97%"`` for one GPU, ``"gpus 8: hottest #3 81C, lowest util #5 42%"`` for
    several, with ``throttled #3 hw_thermal`` and ``lost #2`` when that happens; ``""`` when
    there is nothing to say. Also used by ``bertgpu watch`` on the samples it reads."""
    samples = [s for s in samples if not s.get("lost")]
    parts = []
    temps = [(s["temp_c"], s["gpu"]) for s in samples if _finite(s.get("temp_c"))]
    utils = [(s["util_pct"], s["gpu"]) for s in samples if _finite(s.get("util_pct"))]
    if len(samples) == 1:
        words = [f"gpu{samples[0]['gpu']}"]
        words += [f"{temps[0][0]:.0f}C"] if temps else []
        words += [f"{utils[0][0]:.0f}%"] if utils else []
        parts.append(" ".join(words))
    elif samples:
        extremes = []
        if temps:  # the hottest; the lowest index among equals
            t, i = max(temps, key=lambda p: (p[0], -p[1]))
            extremes.append(f"hottest #{i} {t:.0f}C")
        if utils:
            u, i = min(utils)
            extremes.append(f"lowest util #{i} {u:.0f}%")
        parts.append(f"gpus {len(samples)}: " + ", ".join(extremes) if extremes
                     else f"gpus {len(samples)}")
    throttled = [(s["gpu"], slowdown_reasons(s.get("throttle"))) for s in samples]
    parts += [f"throttled #{i} {'+'.join(r)}" for i, r in throttled if r]
    if lost:
        parts.append("lost " + " ".join(f"#{i}" for i in lost))
    return ", ".join(parts)


def _finite(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and v == v
            and abs(v) != float("inf"))


def nvml_index_of(torch_index: int, torch_uuid: str | None, visible: str | None,
                  uuids: list[str]) -> int | None:
    """NVML's index of torch's CUDA device ``torch_index``.

    torch counts only the visible GPUs (``CUDA_VISIBLE_DEVICES``), NVML counts all of them; the
    UUID names one GPU in both, so it decides when known. Else the visible list maps (integers
    only), else the indices are the same.
    """
    if torch_uuid:
        want = torch_uuid.lower().removeprefix("gpu-")
        for i, u in enumerate(uuids):
            if u and u.lower().removeprefix("gpu-") == want:
                return i
    if visible:
        entries = [e.strip() for e in visible.split(",") if e.strip()]
        if torch_index < len(entries) and entries[torch_index].isdigit():
            return int(entries[torch_index])
        return None
    return torch_index if 0 <= torch_index < len(uuids) else None


def _torch_to_nvml(device: Any, gpus: list[_Gpu]) -> int | None:
    import os

    if device is not None and not str(device).startswith("cuda"):
        return None
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        index = torch.device(device).index if device is not None else None
        index = torch.cuda.current_device() if index is None else index
        uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", "") or "")
    except Exception:
        return None
    return nvml_index_of(index, uuid, os.environ.get("CUDA_VISIBLE_DEVICES"),
                         [g.uuid for g in gpus])

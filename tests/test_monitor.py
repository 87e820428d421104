"""Tests for bertgpu.telemetry.monitor on a simulated NVML: the per-GPU series in gpu.jsonl, the
one-line summary, throttle decoding, a GPU vanishing mid-run, unsupported readings, the
background thread, absent NVML, the device-index mapping, and the logger's use of it all."""

from __future__ import annotations

import io
import sys
import time

import pytest

from bertgpu.telemetry import monitor as monitor_mod
from bertgpu.telemetry.metrics import MetricsLogger, gpu_utilisation
from bertgpu.telemetry.monitor import GpuMonitor, decode_throttle, nvml_index_of, summarize
from bertgpu.telemetry.records import read_jsonl, read_metrics
from bertgpu.testing.nvml_sim import NVML_ERROR_TIMEOUT, NVMLError, SimGpu, SimulatedNvml


def test_decode_throttle():
    assert decode_throttle(0) == []
    assert decode_throttle(0x1) == ["gpu_idle"]
    # Bit order, every known reason, and unknown bits kept as hex rather than dropped.
    assert decode_throttle(0x4 | 0x40 | 0x8) == ["sw_power_cap", "hw_slowdown", "hw_thermal"]
    assert decode_throttle(0x1FF) == ["gpu_idle", "applications_clocks", "sw_power_cap",
                                      "hw_slowdown", "sync_boost", "sw_thermal", "hw_thermal",
                                      "hw_power_brake", "display_clocks"]
    assert decode_throttle(0x80 | 0x200 | 0x1000) == ["hw_power_brake", "0x200", "0x1000"]


def _two_gpus() -> SimulatedNvml:
    return SimulatedNvml([
        SimGpu(name="RTX 3090", temp_c=[60, 72, 84], util_pct=[99, 98, 97],
               power_w=[340.5, 349.0, 350.0], sm_clock_mhz=[1900, 1850, 1400],
               throttle=[0, 0x4, 0x40 | 0x1], mem_used_gib=[20.0, 21.5, 22.0]),
        SimGpu(name="RTX 3060", temp_c=[55, 58, 61], util_pct=[60, 45, 50], mem_total_gib=12.0),
    ])


def test_series_and_summary(tmp_path):
    sim = _two_gpus()
    mon = GpuMonitor(sim, tmp_path / "gpu.jsonl", interval_s=5.0)
    assert mon.gpu_count == 2 and mon.summary() == ""  # nothing sampled yet
    mon.step = 10
    mon.sample()
    assert mon.summary() == "gpus 2: hottest #0 60C, lowest util #1 60%"
    mon.step = 20
    mon.sample()
    assert mon.summary() == "gpus 2: hottest #0 72C, lowest util #1 45%, throttled #0 sw_power_cap"
    mon.sample()
    mon.close()
    lines = read_jsonl(tmp_path / "gpu.jsonl")
    assert [(r["gpu"], r["step"]) for r in lines] == [(0, 10), (1, 10), (0, 20), (1, 20),
                                                       (0, 20), (1, 20)]
    first = lines[0]
    assert first["name"] == "RTX 3090"
    assert (first["util_pct"], first["temp_c"], first["power_w"], first["sm_clock_mhz"]) == \
        (99.0, 60.0, 340.5, 1900.0)
    assert (first["mem_used_gib"], first["mem_total_gib"], first["power_limit_w"]) == \
        (20.0, 24.0, 350.0)
    assert first["throttle"] == [] and lines[1]["mem_total_gib"] == 12.0
    series = [r["temp_c"] for r in lines if r["gpu"] == 0]
    assert series == [60.0, 72.0, 84.0]
    assert lines[4]["throttle"] == ["gpu_idle", "hw_thermal"] and lines[4]["sm_clock_mhz"] == 1400
    # Idle is not worth a flag; a thermal slowdown is.
    assert summarize([lines[4]]) == "gpu0 84C 97%, throttled #0 hw_thermal"
    assert summarize([{**lines[4], "throttle": ["gpu_idle"]}]) == "gpu0 84C 97%"
    assert not sim.initialised  # close() shut NVML down


def test_gpu_vanishing_mid_run_and_unsupported_readings(tmp_path):
    sim = SimulatedNvml([SimGpu(), SimGpu(unsupported={"nvmlDeviceGetPowerUsage"}), SimGpu()])
    mon = GpuMonitor(sim, tmp_path / "gpu.jsonl", interval_s=5.0)
    mon.sample()
    calls_before = sim.gpus[1].calls.get("nvmlDeviceGetPowerUsage", 0)
    sim.gpus[1].lost = True  # falls off the bus
    mon.sample()
    assert "lost #1" in mon.summary() and set(mon.latest()) == {0, 2}
    mon.sample()
    sim.gpus[0].lost = sim.gpus[2].lost = True
    mon.sample()
    mon.sample()  # nothing left to ask: no error, no line
    assert mon.latest() == {} and mon.summary() == "lost #0 #1 #2"
    mon.close()
    lines = read_jsonl(tmp_path / "gpu.jsonl")
    by_gpu = {i: [r for r in lines if r["gpu"] == i] for i in range(3)}
    # GPU 1: one good sample without power (not supported: left out), then one "lost" line.
    assert "power_w" not in by_gpu[1][0] and "power_limit_w" in by_gpu[1][0]
    assert [r.get("lost", False) for r in by_gpu[1]] == [False, True]
    assert "GPU is lost" in by_gpu[1][1]["error"]
    assert [r.get("lost", False) for r in by_gpu[0]] == [False, False, False, True]
    assert len(by_gpu[2]) == 4
    assert sim.gpus[1].calls.get("nvmlDeviceGetPowerUsage", 0) == calls_before  # not asked again
    assert len(lines) == 2 + 1 + 3 + 4  # no line for a GPU after its "lost" line


def test_absent_nvml_or_gpu_starts_nothing(monkeypatch):
    assert GpuMonitor.start_if_available(None, nvml=SimulatedNvml(driver_loaded=False)) is None
    assert GpuMonitor.start_if_available(None, nvml=SimulatedNvml(0)) is None
    assert GpuMonitor.start_if_available(None, interval_s=0, nvml=SimulatedNvml(1)) is None
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed
    assert GpuMonitor.start_if_available(None) is None


def test_background_thread_samples_and_stops(tmp_path):
    sim = _two_gpus()
    mon = GpuMonitor.start_if_available(tmp_path / "gpu.jsonl", interval_s=0.02, nvml=sim)
    assert mon is not None
    deadline = time.monotonic() + 10
    while mon.samples < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    mon.close()
    mon.close()  # idempotent
    n = mon.samples
    assert n >= 3
    time.sleep(0.05)
    assert mon.samples == n  # the thread is gone
    assert len(read_jsonl(tmp_path / "gpu.jsonl")) == 2 * n


def test_nvml_index_of():
    uuids = ["GPU-aaa", "GPU-bbb", "GPU-ccc", "GPU-ddd"]
    assert nvml_index_of(0, "bbb", None, uuids) == 1  # the UUID decides
    assert nvml_index_of(0, "GPU-DDD", "3", uuids) == 3
    assert nvml_index_of(1, None, "2,3", uuids) == 3  # torch's 1 is the second visible GPU
    assert nvml_index_of(0, None, "GPU-ccc", uuids) is None  # UUID list without a UUID to match
    assert nvml_index_of(2, None, None, uuids) == 2
    assert nvml_index_of(5, None, None, uuids) is None


def test_logger_with_monitor(tmp_path, monkeypatch):
    sim = _two_gpus()
    mon = GpuMonitor(sim, tmp_path / "gpu.jsonl", interval_s=5.0)
    mon.sample()
    monkeypatch.setattr(monitor_mod, "_torch_to_nvml", lambda device, gpus: 1)  # "cuda:0" is #1
    assert gpu_utilisation("cuda:0", mon) == {"gpu_util_pct": 60.0, "gpu_mem_used_gib": 10.0}
    assert gpu_utilisation("cuda:0") == {}  # no monitor: no second NVML path
    out = io.StringIO()
    log = MetricsLogger(tmp_path, is_main=True, total_steps=4, log_every=1, stream=out,
                        monitor=mon, device="cuda:0")
    log.log(1, "train", loss=2.0)
    log.log(1, "eval", val_loss=2.5)
    assert mon.step == 1
    log.close()
    assert not sim.initialised  # the logger closed its monitor
    train, evaluation = read_metrics(tmp_path)
    assert train["gpu_util_pct"] == 60.0 and train["gpu_mem_used_gib"] == 10.0
    assert train["gpu_temp_max_c"] == 60.0 and train["gpu_util_min_pct"] == 60.0
    assert "gpu_temp_max_c" not in evaluation
    line = out.getvalue().splitlines()[0]
    assert line.endswith("| gpus 2: hottest #0 60C, lowest util #1 60%")
    assert "gpu_util_pct" not in line  # summed up by the summary instead


@pytest.mark.parametrize("installed", [True, False])
def test_real_pynvml_without_a_driver_is_silent(installed, monkeypatch):
    if installed:
        pytest.importorskip("pynvml")
        try:
            import pynvml

            pynvml.nvmlInit()
            pynvml.nvmlShutdown()
            pytest.skip("a real NVML driver is present")
        except pynvml.NVMLError:
            pass
    else:
        monkeypatch.setitem(sys.modules, "pynvml", None)
    t0 = time.perf_counter()
    assert GpuMonitor.start_if_available(None, interval_s=1.0) is None
    assert time.perf_counter() - t0 < 5  # cheap: no retries, no waiting


def test_transient_nvml_errors_do_not_lose_a_gpu(tmp_path):
    # A timeout is not a GPU off the bus: the round without readings writes no line for that GPU,
    # and the next round that answers carries on its series (NVML_ERROR_GPU_IS_LOST: see above).
    sim = SimulatedNvml([SimGpu(temp_c=[60, 61, 62, 63]), SimGpu()])
    mon = GpuMonitor(sim, tmp_path / "gpu.jsonl", interval_s=5.0)
    mon.sample()
    sim.gpus[0].transient_error = NVML_ERROR_TIMEOUT
    assert [r["gpu"] for r in mon.sample()] == [1]
    assert "lost" not in mon.summary() and set(mon.latest()) == {0, 1}
    sim.gpus[0].transient_error = None
    assert [(r["gpu"], r["temp_c"]) for r in mon.sample()] == [(0, 61.0), (1, 65.0)]
    assert "lost" not in mon.summary() and mon.latest()[0]["temp_c"] == 61.0
    # One reading failing leaves only that reading out of the line.
    def power_times_out(h):
        raise NVMLError(NVML_ERROR_TIMEOUT)

    real, sim.nvmlDeviceGetPowerUsage = sim.nvmlDeviceGetPowerUsage, power_times_out
    line = mon.sample()[0]
    assert "power_w" not in line and line["temp_c"] == 62.0 and not line.get("lost")
    sim.nvmlDeviceGetPowerUsage = real
    assert "power_w" in mon.sample()[0]  # asked again: a timeout is not "not supported"
    # A GPU that answers nothing for LOST_AFTER_ROUNDS rounds in a row counts as lost.
    sim.gpus[0].transient_error = NVML_ERROR_TIMEOUT
    for _ in range(monitor_mod.LOST_AFTER_ROUNDS - 1):
        assert [r["gpu"] for r in mon.sample()] == [1]
    (lost_line, _) = mon.sample()
    assert lost_line["lost"] and lost_line["error"].startswith("NVMLError: Timeout")
    assert "rounds in a row" in lost_line["error"]
    assert mon.summary().endswith("lost #0") and set(mon.latest()) == {1}
    mon.close()
    lines = read_jsonl(tmp_path / "gpu.jsonl")
    assert [r.get("lost", False) for r in lines if r["gpu"] == 0] == [False] * 4 + [True]

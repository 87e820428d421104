"""The GPU monitor's cost to training: step time with and without the sampler thread.

    .venv/bin/python benchmarks/monitor_overhead.py                  # 8 simulated GPUs, stressed
    .venv/bin/python benchmarks/monitor_overhead.py --interval 1 --blocks 60   # a real interval

A real training step (a small BERT on the CPU: forward, backward, AdamW) runs in short blocks of
--steps steps, alternating between the monitor off and on; each off/on pair gives a ratio of
median step times, and the median of those ratios is the overhead (drifting load on a shared
machine hits both halves of a pair alike, where whole-run medians would mostly measure the
neighbours); every --log-every steps the metrics logger writes a train
record, which with the monitor adds the GPU keys and the summary line. The monitor samples
--gpus simulated GPUs (``bertgpu.testing.nvml_sim``) whose every NVML call sleeps --call-ms,
releasing the GIL as a real call through ctypes does (real calls take ~0.05-1 ms).

At the default interval of [logging] gpu_monitor_interval_s (5 s) the cost is far below what a
shared 2-core machine's noise lets a wall clock see, so by default the sampler runs back to back
(--interval 0.001: a round of 56 calls as soon as the last one ends, hundreds of times more often
than the default). The measured slowdown divided by the rounds per second gives the training
time one round costs, and that over an interval gives the overhead at that interval. Also
reported: the sampler thread's own CPU time per round. Target: below 1% of the step time.
"""

from __future__ import annotations

import argparse
import io
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", type=int, default=8, help="simulated GPUs (default 8, one node)")
    ap.add_argument("--call-ms", type=float, default=1.0, help="latency of one NVML call")
    ap.add_argument("--interval", type=float, default=0.001,
                    help="sampling interval, seconds (default: back to back)")
    ap.add_argument("--blocks", type=int, default=40, help="off/on pairs of blocks")
    ap.add_argument("--steps", type=int, default=6, help="steps per block")
    ap.add_argument("--log-every", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    args = ap.parse_args()

    from bertgpu.models.bert.config import BertConfig
    from bertgpu.models.bert.model import BertForPreTraining
    from bertgpu.telemetry.metrics import MetricsLogger
    from bertgpu.telemetry.monitor import GpuMonitor
    from bertgpu.testing.nvml_sim import SimGpu, SimulatedNvml

    torch.set_num_threads(1)  # one core for the step, the other for the machine's neighbours
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=8192, hidden_size=args.hidden, num_hidden_layers=args.layers,
                     num_attention_heads=max(args.hidden // 64, 1),
                     intermediate_size=4 * args.hidden)
    model = BertForPreTraining(cfg, with_nsp=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(5, cfg.vocab_size, (args.batch, args.seq))
    labels = torch.where(torch.rand(ids.shape) < 0.15, ids, torch.full_like(ids, -100))
    mask = torch.ones_like(ids)

    def step() -> float:
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(out.loss.detach())

    for _ in range(3):
        step()  # warm-up: allocator, first-call paths

    nvml = SimulatedNvml([SimGpu(temp_c=[60.0 + i]) for i in range(args.gpus)],
                         call_s=args.call_ms / 1000)
    def run_block(monitored: bool, tmp: Path) -> tuple[list[float], int]:
        """Step times of one block, and the monitor's sampling rounds during it."""
        mon = None
        if monitored:
            mon = GpuMonitor.start_if_available(tmp / "gpu.jsonl", args.interval, nvml=nvml)
            assert mon is not None
        log = MetricsLogger(tmp / "metrics", True, total_steps=None, stream=io.StringIO(),
                            log_every=args.log_every, tensorboard=False, monitor=mon)
        block_times = []
        for i in range(1, args.steps + 1):
            t0 = time.perf_counter()
            loss = step()
            if i % args.log_every == 0:
                log.log(i, "train", loss=loss)
            block_times.append(time.perf_counter() - t0)
        log.close()
        return block_times, mon.samples if mon is not None else 0

    times: dict[str, list[float]] = {"off": [], "on": []}
    ratios: list[float] = []
    sampler_cpu: list[float] = []
    samples = 0
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(args.blocks):
            # off-on, then on-off: a load that drifts across a pair biases neither condition
            medians = {}
            for cond in ("off", "on") if pair % 2 == 0 else ("on", "off"):
                block_times, rounds = run_block(cond == "on", Path(tmp))
                times[cond] += block_times
                medians[cond] = statistics.median(block_times)
                samples += rounds
            ratios.append(medians["on"] / medians["off"])
        # The sampler thread's own CPU per round, measured apart (NVML sleeps are not CPU).
        mon = GpuMonitor(nvml, Path(tmp) / "cpu.jsonl", args.interval)
        done = threading.Event()

        def measure() -> None:
            t = time.thread_time()
            for _ in range(50):
                mon.sample()
            sampler_cpu.append((time.thread_time() - t) / 50)
            done.set()

        threading.Thread(target=measure).start()
        done.wait()
        mon.close()

    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    mean_off, mean_on = statistics.fmean(times["off"]), statistics.fmean(times["on"])
    per_sample_s = args.gpus * 7 * args.call_ms / 1000
    print(f"step: {args.layers} layers x {args.hidden}, batch {args.batch} x {args.seq}, CPU, "
          f"{torch.get_num_threads()} thread; {len(times['off'])} steps per condition")
    print(f"monitor: {args.gpus} simulated GPUs, {args.call_ms:g} ms per NVML call "
          f"({per_sample_s * 1000:.0f} ms of calls per round), every {args.interval:g} s; "
          f"{samples} rounds during the 'on' blocks")
    print("| condition | median step (ms) | mean step (ms) |")
    print("|---|---:|---:|")
    print(f"| monitor off | {1000 * off:.2f} | {1000 * mean_off:.2f} |")
    print(f"| monitor on | {1000 * on:.2f} | {1000 * mean_on:.2f} |")
    q1, q2, q3 = statistics.quantiles(ratios, n=4)
    print(f"overhead, median of {len(ratios)} paired block ratios: {100 * (q2 - 1):+.2f}% "
          f"(quartiles {100 * (q1 - 1):+.2f}% .. {100 * (q3 - 1):+.2f}%); of the whole-run "
          f"medians: {100 * (on / off - 1):+.2f}%")
    cpu = sampler_cpu[0]
    on_s = sum(times["on"])
    cost = (q2 - 1) * on_s / max(samples, 1)  # training seconds lost per sampling round
    print(f"rounds: {samples / on_s:.2f} per second of 'on' steps -> {1000 * cost:.2f} ms of "
          f"training time per round -> overhead at a 1 s interval {100 * cost:.3f}%, at the "
          f"default 5 s {100 * cost / 5:.4f}%")
    print(f"sampler CPU per round: {1000 * cpu:.3f} ms, measured apart = "
          f"{100 * cpu:.3f}% of one core at a 1 s interval, {100 * cpu / 5.0:.4f}% at 5 s")

if __name__ == "__main__":
    main()

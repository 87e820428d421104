"""How long a checkpoint stops training: written in place vs in the background, side by side.

    PYTHONPATH=src python3 benchmarks/checkpoint_stall.py --device cpu --size small --out /tmp/ck
    PYTHONPATH=src python3 benchmarks/checkpoint_stall.py --device cuda --size base --out /tmp/ck

Builds BERT (`bench/batches.py` sizes, vocab 30522, with the MLM and NSP heads) on the device with
AdamW, trains one step so that the optimizer has its moments, then saves the same state through
the run's own checkpointer (`train/full_checkpoints.py`, what ddp and one-process runs use):
`--repeats` times in place (`checkpoint.async_save = false`: weights to the host, safetensors,
torch.save, sha256, fsync, rename, all on the training thread) and `--repeats` times in the
background (the training thread copies the state into pinned host buffers, non-blocking, one
synchronisation; a thread writes the same files). One training step runs between two saves, as
in a run. The stall is the time `save` keeps the training thread; the first background save
also allocates the host buffers, so it is reported apart and left out of the median. Also
reported: the background write time, and the training step time while a background write goes
on (the writer thread competes for the CPU and the GIL) against the step time without one.

The last line is the table row: medians in seconds and the background/in-place stall ratio
(the goal: under 0.1 for BERT-small on the CPU, under 0.3 s for BERT-base on an H100). Rows are
appended to OUT/checkpoint_stall.jsonl; the checkpoints go to OUT/sync and OUT/background (the
newest one of each is kept). No network; torch 2.11 or later.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:  # a plain checkout: PYTHONPATH=src is the usual way
    sys.path.insert(0, str(ROOT / "src"))


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--size", choices=("tiny", "small", "base", "large"), default="small")
    ap.add_argument("--repeats", type=int, default=3, help="saves of each kind (default 3)")
    ap.add_argument("--batch", type=int, default=8, help="sequences per training step")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--out", type=Path, required=True, help="folder for the checkpoints and rows")
    a = ap.parse_args()

    import torch

    from bertgpu.bench.batches import SIZES, make_batches
    from bertgpu.models.bert.config import BertConfig
    from bertgpu.models.bert.model import BertForPreTraining
    from bertgpu.train.distributed import DistInfo
    from bertgpu.train.full_checkpoints import FullCheckpoints
    from bertgpu.train.optim import build_optimizer

    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("checkpoint_stall: --device cuda but torch sees no GPU")
    device = torch.device("cuda", 0) if a.device == "cuda" else torch.device("cpu")
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**SIZES[a.size])).to(device).train()
    optimizer = build_optimizer(model, "adamw", 1e-4)
    batch = make_batches(1, a.batch, a.seq_len, 30522, "full", 0, device)[0]
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda"
                else torch.autocast("cpu", enabled=False))

    def step() -> float:
        t0 = time.perf_counter()
        with autocast:
            out = model(**batch)
        (out.mlm_loss_sum + out.nsp_loss_sum).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _sync(device)
        return time.perf_counter() - t0

    step()
    step_s = statistics.median(step() for _ in range(3))
    params = sum(p.numel() for p in model.parameters())
    info = DistInfo(device=str(device))
    files = {"config.json": json.dumps(SIZES[a.size])}
    a.out.mkdir(parents=True, exist_ok=True)

    def save(ckpts: FullCheckpoints, n: int, background: bool) -> float:
        state = {"step": n, "note": "checkpoint_stall benchmark"}
        _sync(device)  # the step's kernels are done: the stall is the save's own
        t0 = time.perf_counter()
        ckpts.save(n, model, optimizer, state, files, background=background)
        return time.perf_counter() - t0

    in_place = FullCheckpoints(a.out / "sync", info, keep_last=1, background=False)
    sync_s = []
    for n in range(1, a.repeats + 1):
        sync_s.append(save(in_place, n, False))
        step()
    bg = FullCheckpoints(a.out / "background", info, keep_last=1, background=True)
    bg_s, write_s, during = [], [], []
    for n in range(1, a.repeats + 2):  # the first allocates the host buffers
        bg_s.append(save(bg, n, True))
        while True:  # training goes on while the thread writes
            written = bg.poll()
            if written is not None or bg.pending() is None:
                break
            during.append(step())
        bg.wait()  # raises if the write failed
        write_s.append(written.write_s if written is not None else float("nan"))
    first, later = bg_s[0], bg_s[1:]
    folder = a.out / "sync" / "checkpoints"
    row = {
        "bench": "checkpoint_stall", "device": torch.cuda.get_device_name(device)
        if device.type == "cuda" else "cpu", "size": a.size, "params": params,
        "checkpoint_bytes": sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()),
        "sync_stall_s": statistics.median(sync_s), "background_stall_s": statistics.median(later),
        "first_background_stall_s": first, "background_write_s": statistics.median(write_s[1:]),
        "step_s": step_s, "step_s_during_write": statistics.median(during) if during else None,
        "repeats": a.repeats, "torch": torch.__version__,
    }
    row["ratio"] = row["background_stall_s"] / row["sync_stall_s"]
    with open(a.out / "checkpoint_stall.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
    during_text = (f"{row['step_s_during_write']:.3f}" if row["step_s_during_write"] is not None
                   else "-")
    print(f"BERT-{a.size} ({params / 1e6:.1f} M parameters, checkpoint "
          f"{row['checkpoint_bytes'] / 1e9:.2f} GB) on {row['device']}, torch {torch.__version__}; "
          f"seconds, median of {a.repeats}")
    print("| device | size | in-place stall | background stall | ratio | first background stall "
          "| background write | step | step during write |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(f"| {row['device']} | {a.size} | {row['sync_stall_s']:.3f} | "
          f"{row['background_stall_s']:.3f} | {row['ratio']:.3f} | {first:.3f} | "
          f"{row['background_write_s']:.3f} | {step_s:.3f} | {during_text} |")


if __name__ == "__main__":
    main()

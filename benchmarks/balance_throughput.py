"""Load balancing across unequal devices, measured: 2 CPU workers (gloo), one slowed on purpose.

    python benchmarks/balance_throughput.py [--slow 0.004] [--steps 60]

Runs the same short pretraining twice under `--nproc 2` with rank 1 made slower by
BERTGPU_FAULTS=slow_rank=1:SECONDS (it sleeps SECONDS per sequence it computes, like a slower
card): once with equal shares of the global batch, once with `distributed.balance = auto`. Prints
tokens/s of both over the steps after the first rebalancing, their ratio, and the ideal ratio
from the measured per-rank speeds: with speeds v_fast, v_slow, equal shares run at 2 v_slow
sequences/s (the slow rank decides) and proportional shares at v_fast + v_slow.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def run(data: Path, out: Path, slow: float, steps: int, balance: bool) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1",
           "BERTGPU_FAULTS": f"slow_rank=1:{slow}"}
    cmd = [sys.executable, "-m", "bertgpu", "pretrain", str(ROOT / "configs" / "tiny.toml"),
           "--data", str(data), "--out", str(out), "--nproc", "2", "--model.vocab_size", "512",
           "--model.max_position_embeddings", "64", "--train.max_steps", str(steps),
           "--train.global_batch_size", "32", "--impl.micro_batch_size", "8",
           "--train.log_every_steps", "10", "--train.eval_every_steps", "0",
           "--checkpoint.every_steps", "0", "--distributed.balance", "auto" if balance else "none",
           "--distributed.balance_every_steps", "10"]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if r["kind"] == "train"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slow", type=float, default=0.004,
                    help="seconds per sequence added on rank 1")
    ap.add_argument("--steps", type=int, default=60)
    a = ap.parse_args()
    from _shards import write_synthetic_shards

    with tempfile.TemporaryDirectory() as tmp:
        data = write_synthetic_shards(Path(tmp) / "d", n_train=4096, n_val=64, seq_len=64,
                                      vocab_size=512)
        equal = run(data, Path(tmp) / "equal", a.slow, a.steps, False)
        balanced = run(data, Path(tmp) / "balanced", a.slow, a.steps, True)
    late = [r for r in balanced if r["step"] > 20]
    late_equal = [r for r in equal if r["step"] > 20]
    tok_eq = sum(r["tokens_per_s"] for r in late_equal) / len(late_equal)
    tok_bal = sum(r["tokens_per_s"] for r in late) / len(late)
    # Per-rank speeds from the equal-shares run: the same samples on each rank, compute seconds.
    secs = [sum(r["rank_compute_s"][k] for r in late_equal) for k in (0, 1)]
    speeds = [1.0 / s for s in secs]
    ideal = (speeds[0] + speeds[1]) / (2 * min(speeds))
    print(f"rank compute seconds over the window (equal shares): {secs[0]:.3f} / {secs[1]:.3f}")
    print(f"tokens/s equal shares {tok_eq:,.0f} | balanced {tok_bal:,.0f} | ratio "
          f"{tok_bal / tok_eq:.2f} (ideal from the measured speeds {ideal:.2f})")
    print(f"last shares logged: {[r.get('slowest_rank') for r in late[-1:]]} slowest rank, "
          f"slowest_vs_median {late[-1].get('slowest_vs_median'):.2f} balanced vs "
          f"{late_equal[-1].get('slowest_vs_median'):.2f} equal")


if __name__ == "__main__":
    main()

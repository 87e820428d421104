"""Training-step time of bertgpu's ModernBertForMaskedLM vs transformers' (same weights, same
batches), and of the BERT and ModernBERT recipes side by side.

Timed steps alternate between the models in one process, so the ratios are fair on a noisy
machine. A step is forward + backward on full-length sequences with MLM labels at each recipe's
`data.mask_rate` (no optimizer: the same for all). transformers runs with SDPA attention and its
own sparse MLM head (`sparse_prediction=True`), so both predict only the masked tokens.

    python benchmarks/modernbert_vs_hf.py        # modern-tiny vs HF, tiny vs modern-tiny
    python benchmarks/modernbert_vs_hf.py \\
        --recipes configs/budget-24h.toml configs/modern-budget-24h.toml \\
        --device cuda --batch 64 --iters 20      # bf16 autocast on a GPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import nullcontext

import torch

from bertgpu.config.overrides import config_to_dict
from bertgpu.config.schema import load_config
from bertgpu.models.build import build_model
from bertgpu.models.layout import hf_state_dict
from bertgpu.models.shared import num_parameters


def batch(vocab: int, b: int, t: int, mask_rate: float, device: str,
          seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (b, t), generator=g)
    labels = torch.where(torch.rand(b, t, generator=g) < mask_rate, ids, torch.full_like(ids, -100))
    out = dict(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels)
    return {k: v.to(device) for k, v in out.items()}


def timed_steps(models: dict, batches: dict, iters: int, device: str) -> dict[str, list[float]]:
    """Alternate fwd+bwd steps of the models; per model the step times (after one warm-up)."""
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else nullcontext()
    times: dict[str, list[float]] = {name: [] for name in models}
    for i in range(iters + 1):
        for name, model in models.items():
            model.zero_grad(set_to_none=True)
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            with autocast:
                loss = model(**batches[name]).loss
            loss.backward()
            if device == "cuda":
                torch.cuda.synchronize()
            if i:
                times[name].append(time.perf_counter() - t0)
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipes", nargs="+",
                   default=["configs/tiny.toml", "configs/modern-tiny.toml"])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0 = torch's default)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    models, batches, rows = {}, {}, []
    for path in args.recipes:
        cfg = load_config(path)
        torch.manual_seed(0)
        model = build_model(config_to_dict(cfg.model), "masked_lm").to(args.device).train()
        models[path] = model
        batches[path] = batch(cfg.model.vocab_size, args.batch, args.seq_len, cfg.data.mask_rate,
                              args.device)
        if cfg.model.architecture == "modernbert":
            fields = {**model.config.to_dict(), "sparse_prediction": True}
            hf = transformers.ModernBertForMaskedLM(
                transformers.ModernBertConfig(**fields, attn_implementation="sdpa"))
            hf.load_state_dict(hf_state_dict(model))  # our padded vocabulary cut to HF's
            models[f"transformers {path}"] = hf.to(args.device).train()
            batches[f"transformers {path}"] = batches[path]
            with torch.no_grad():
                diff = (model(**batches[path]).loss - hf(**batches[path]).loss).abs().item()
            rows.append({"pair": path, "loss_abs_diff": diff})
    times = timed_steps(models, batches, args.iters, args.device)
    base = statistics.median(times[args.recipes[0]])
    print(f"{'model':48s} {'params':>8s} {'step ms (median)':>17s} {'vs first':>9s}")
    for name, ts in times.items():
        med = statistics.median(ts)
        n = num_parameters(models[name]) / 1e6
        print(f"{name:48s} {n:7.2f}M {1000 * med:17.1f} {med / base:8.2f}x")
        rows.append({"model": name, "params_m": n, "step_s_median": med, "device": args.device,
                     "batch": args.batch, "seq_len": args.seq_len,
                     "threads": torch.get_num_threads()})
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()

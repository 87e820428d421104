"""Training-step throughput of bertgpu's BertForPreTraining vs transformers' (SDPA attention).

Both models hold the same weights and see the same batches (full-length sequences, 15% MLM labels,
NSP labels); timed steps alternate between the two in one process, so the ratio is fair even on a
noisy machine. A step is forward + backward (no optimizer: it is the same for both).

    python benchmarks/model_vs_hf.py --size base --batch 8 --seq-len 128 --iters 3  # CPU fp32
    python benchmarks/model_vs_hf.py --device cuda --batch 32 --iters 20             # bf16 autocast
    python benchmarks/model_vs_hf.py --size tiny --out results/model_vs_hf.jsonl     # append JSON

The difference comes from the sparse MLM head (transform + decoder only on masked tokens), SDPA
without a mask when nothing is padded and, on the CPU, cheaper dropout masks and attention with
dropout written out (models/dropout.py); the math is the same (the loss difference is printed).
For forward / backward / optimizer times, bf16, compile, unpadding and MFU use
`bertgpu bench model`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from contextlib import nullcontext

import torch

from bertgpu.bench.batches import SIZES
from bertgpu.models.bert.config import BertConfig
from bertgpu.models.bert.model import BertForPreTraining
from bertgpu.models.layout import load_hf_state_dict


def make_batches(n: int, batch: int, seq_len: int, vocab: int, device: str,
                 seed: int) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        input_ids = torch.randint(5, vocab, (batch, seq_len), generator=g)
        input_ids[:, 0] = 2  # [CLS]
        token_type_ids = ((torch.arange(seq_len) >= seq_len // 2).long()
                          .expand(batch, -1).contiguous())
        labels = torch.full((batch, seq_len), -100)
        masked = torch.rand(batch, seq_len, generator=g) < 0.15
        masked[:, 0] = False
        labels[masked] = input_ids[masked]
        b = dict(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                 token_type_ids=token_type_ids, labels=labels,
                 next_sentence_label=torch.randint(0, 2, (batch,), generator=g))
        out.append({k: v.to(device) for k, v in b.items()})
    return out


def step(model: torch.nn.Module, batch: dict, autocast) -> float:
    """One forward + backward; returns the loss."""
    with autocast():
        loss = model(**batch).loss
    loss.backward()
    model.zero_grad(set_to_none=True)
    return loss.item()  # also synchronises the device


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=sorted(SIZES), default="base")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--iters", type=int, default=3, help="timed steps per model")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per model first")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default=None,
                   help="bf16 = autocast (default on CUDA), fp32 otherwise")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="append one JSON line with the results to this file")
    args = p.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    dtype = args.dtype or ("bf16" if args.device.startswith("cuda") else "fp32")
    dev_type = torch.device(args.device).type
    autocast = ((lambda: torch.autocast(dev_type, dtype=torch.bfloat16)) if dtype == "bf16"
                else nullcontext)
    if dev_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    size = SIZES[args.size]
    torch.manual_seed(args.seed)
    hf = transformers.BertForPreTraining(
        transformers.BertConfig(**size, attn_implementation="sdpa")).to(args.device).train()
    ours = BertForPreTraining(BertConfig(**size)).to(args.device).train()
    load_hf_state_dict(ours, hf.state_dict())  # our layout: fused QKV, padded vocabulary
    models = {"bertgpu": ours, "transformers": hf}
    batches = make_batches(max(2, min(args.iters, 4)), args.batch, args.seq_len, 30522,
                           args.device, args.seed)

    # Same weights, same batch: the losses agree up to dropout (different random streams).
    with torch.no_grad():
        ours.eval(), hf.eval()
        diff = abs(ours(**batches[0]).loss.item() - hf(**batches[0]).loss.item())
        ours.train(), hf.train()

    for i in range(args.warmup):
        for m in models.values():
            step(m, batches[i % len(batches)], autocast)
    elapsed = dict.fromkeys(models, 0.0)
    for i in range(args.iters):
        order = list(models) if i % 2 == 0 else list(reversed(models))  # alternate who goes first
        for name in order:
            t0 = time.perf_counter()
            step(models[name], batches[i % len(batches)], autocast)
            elapsed[name] += time.perf_counter() - t0

    tokens = args.iters * args.batch * args.seq_len
    tps = {name: tokens / t for name, t in elapsed.items()}
    ratio = tps["bertgpu"] / tps["transformers"]
    device_name = (torch.cuda.get_device_name() if dev_type == "cuda"
                   else platform.processor() or "cpu")
    print(f"BertForPreTraining fwd+bwd | size={args.size} batch={args.batch} "
          f"seq_len={args.seq_len} iters={args.iters} device={args.device} ({device_name}, "
          f"{torch.get_num_threads()} threads) dtype={dtype} | eval loss |diff|={diff:.2e}")
    print(f"{'model':<14}{'step_s':>10}{'tokens/s':>12}")
    for name in models:
        print(f"{name:<14}{elapsed[name] / args.iters:>10.3f}{tps[name]:>12.0f}")
    print(f"speed-up bertgpu / transformers: {ratio:.2f}x")
    if args.out:
        rec = dict(bench="model_vs_hf", size=args.size, batch=args.batch, seq_len=args.seq_len,
                   iters=args.iters, device=args.device,
                   device_name=device_name, dtype=dtype, threads=torch.get_num_threads(),
                   tokens_per_s=tps, ratio=ratio, loss_abs_diff=diff, torch=torch.__version__,
                   transformers=transformers.__version__, time=time.time())
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()

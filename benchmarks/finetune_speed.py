"""Fine-tuning throughput: our BertForSequenceClassification training step vs transformers'.

    .venv/bin/python benchmarks/finetune_speed.py                # BERT-base shape, seq 128, CPU
    .venv/bin/python benchmarks/finetune_speed.py --layers 2 --hidden 128 --steps 3 --batch 8

Both models get the same random BERT-base-shaped weights (ours exported, loaded into
transformers), the same batches (full length, GLUE-style pairs at max_seq_len) and AdamW; a step
is forward + backward + optimizer. Ours goes through `engine.Engine.train_step`, exactly as
`bertgpu finetune` does; transformers' is the plain loop. Prints examples/s of each (after one
warm-up step) and writes nothing.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    args = ap.parse_args()

    import transformers

    from bertgpu.batch import batch_meta
    from bertgpu.models.bert.config import BertConfig
    from bertgpu.models.bert.model import BertForSequenceClassification
    from bertgpu.models.hf_export import save_pretrained
    from bertgpu.train.engine import Engine
    from bertgpu.train.optim import build_optimizer

    cfg = BertConfig(hidden_size=args.hidden, num_hidden_layers=args.layers,
                     num_attention_heads=max(args.hidden // 64, 1),
                     intermediate_size=4 * args.hidden)
    torch.manual_seed(0)
    ours = BertForSequenceClassification(cfg, num_labels=2)
    with tempfile.TemporaryDirectory() as d, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save_pretrained(ours, d)
        hf = transformers.BertForSequenceClassification.from_pretrained(
            d, attn_implementation="sdpa")

    g = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(args.steps + 1):
        ids = torch.randint(5, cfg.vocab_size, (args.batch, args.seq), generator=g)
        types = torch.zeros_like(ids)
        types[:, args.seq // 2:] = 1  # a sentence pair, as in MNLI/QQP
        batches.append({"input_ids": ids, "token_type_ids": types,
                        "attention_mask": torch.ones_like(ids),
                        "labels": torch.randint(0, 2, (args.batch,), generator=g)})

    def run(name: str, step) -> float:
        step(batches[0])  # warm-up: allocator, kernels
        t0 = time.perf_counter()
        for b in batches[1:]:
            step(b)
        rate = args.steps * args.batch / (time.perf_counter() - t0)
        print(f"{name:<40} {rate:8.2f} examples/s", flush=True)
        return rate

    engine = Engine(ours, build_optimizer(ours, "adamw", 2e-5), precision=args.precision,
                    grad_clip=1.0)
    ours.train()
    # Ours gets the host-side metadata the fine-tuning collator attaches (no host sync in forward).
    r_ours = run("bertgpu (Engine.train_step)",
                 lambda b: engine.train_step([{**b, "batch_meta": batch_meta(b["attention_mask"])}],
                                             lambda m, x: {"cls": m(**x).loss_sum},
                                             lambda x: {"cls": x["input_ids"].shape[0]}))

    opt = torch.optim.AdamW(hf.parameters(), lr=2e-5)
    hf.train()
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16")

    def hf_step(b: dict) -> None:
        with autocast:
            loss = hf(**b).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    r_hf = run(f"transformers {transformers.__version__} (sdpa)", hf_step)
    print(f"L={args.layers} H={args.hidden} seq={args.seq} batch={args.batch} {args.precision}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads: ours / transformers = "
          f"{r_ours / r_hf:.2f}")


if __name__ == "__main__":
    main()

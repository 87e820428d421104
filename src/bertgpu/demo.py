"""The whole pipeline, tiny, offline, on a CPU in a few minutes:

    bertgpu demo --out demo_out        # (make demo does this in a fresh virtual environment)

1. tokenizer  WordPiece on a real Wikipedia sample (106 articles shipped in gensim's test data)
2. prepare    stream the XML dump into token shards (MLM, packed 128-token sequences)
3. pretrain   configs/tiny.toml: a 2-layer BERT; loss and MLM accuracy should move the right way
4. export     the Hugging Face layout, loaded back through transformers for fill-in-the-blank
5. finetune   the real labelled sets in gensim's test data (polarity sentences as an SST-2-style
              task, Lee document similarity as an STS-B-style task), pretrained vs random init

Every stage is the same code path as the corresponding `bertgpu` command.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from typing import Any

from bertgpu.errors import BertgpuError

WIKI_SAMPLE = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
ROOT = Path(__file__).resolve().parents[2]

FILL_MASK_SENTENCES = [
    "the city is the [MASK] of the province.",
    "he was born in [MASK] and studied law.",
    "the war ended in [MASK].",
    "she is an american [MASK] and writer.",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="demo_out", help="folder for everything the demo writes")
    parser.add_argument("--steps", type=int, default=None, help="pretraining steps (default: the tiny recipe's)")
    parser.add_argument("--vocab-size", type=int, default=8192, help="WordPiece vocabulary size")
    parser.add_argument("--skip-finetune", action="store_true", help="stop after export and fill-mask")
    parser.add_argument("--fresh", action="store_true", help="delete --out first (otherwise stages resume)")


def _stage(title: str) -> float:
    print(f"\n=== {title} " + "=" * max(0, 70 - len(title)), flush=True)
    return time.perf_counter()


def _done(t0: float) -> None:
    print(f"    ({time.perf_counter() - t0:.1f} s)", flush=True)


def _recipe() -> Path:
    """configs/tiny.toml from the source tree; the same recipe is bundled for installed copies."""
    for candidate in (ROOT / "configs" / "tiny.toml", Path(__file__).with_name("tiny.toml")):
        if candidate.is_file():
            return candidate
    raise BertgpuError("configs/tiny.toml: not found next to the package; run the demo from a source checkout")


def _train_curve(run_dir: Path) -> list[dict[str, Any]]:
    from bertgpu.train.metrics import read_metrics

    return read_metrics(run_dir / "metrics.jsonl", drop_superseded=True)


def fill_mask(hf_dir: Path, sentences: list[str], top_k: int = 3) -> list[tuple[str, list[str]]]:
    """Top-k predictions for each [MASK], through transformers (independent of our model code)."""
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf_dir)
    model = AutoModelForMaskedLM.from_pretrained(hf_dir).eval()
    results = []
    for text in sentences:
        enc = tok(text, return_tensors="pt")
        with torch.no_grad():
            logits = model(**enc).logits[0]  # (T, V)
        where = (enc["input_ids"][0] == tok.mask_token_id).nonzero().flatten()
        if len(where) == 0:
            continue
        top = logits[where[0]].topk(top_k).indices.tolist()
        results.append((text, [tok.convert_ids_to_tokens(i) for i in top]))
    return results


# Tiny-model fine-tuning settings, short sequences (~1 min on 2 cores). The 160 polarity sentences
# need many epochs at a moderate lr (at 1e-3 the tiny post-LN model stays at chance); the 985 Lee
# pairs converge in a few epochs.
FINETUNE_OVERRIDES = ["--global_batch_size", "16", "--max_seq_len", "64", "--warmup_fraction", "0.1"]
FINETUNE_PER_TASK = {
    "polarity": ["--epochs", "15", "--lr", "3e-4"],
    "lee": ["--epochs", "6", "--lr", "1e-3"],
}


def finetune_table(hf_dir: Path, out: Path, seed: int = 0) -> str:
    """Fine-tune the exported model and a randomly initialised twin (same architecture) on the
    real labelled sets in gensim's test data; a markdown table of their dev scores."""
    from bertgpu.finetune import demo_tasks, finetune_examples

    lines = [
        "    | task (real data in gensim's test folder) | scored like | metric | pretrained | random init |",
        "    |---|---|---|---:|---:|",
    ]
    described = {
        "polarity": "polarity: 200 movie-review sentences",
        "lee": "lee: similarity of 50 news documents",
    }
    for name, (train, dev, task) in demo_tasks(seed).items():
        scores, metric_names = {}, ""
        for label, init, extra in (("pretrained", hf_dir, {}), ("random", "random", {"config_from": hf_dir})):
            res = finetune_examples(task, train, dev, init, out / f"{name}-{label}",
                                    overrides=[*FINETUNE_OVERRIDES, *FINETUNE_PER_TASK.get(name, []),
                                               "--seed", str(seed)], name=name, **extra)
            scores[label] = res["score"]
            dev_metrics = next(iter(res["metrics"].values()))  # {"dev": {"accuracy": ...}}
            metric_names = " / ".join(dev_metrics)
        lines.append(f"    | {described.get(name, name)} ({len(train)} train, {len(dev)} dev) | {task.name} | "
                     f"{metric_names} | {scores['pretrained']:.1f} | {scores['random']:.1f} |")
    lines.append(
        "    (Dev sets this small make differences of a few points noise. A model pretrained "
        "for two minutes on\n     106 articles has learned little more than word frequencies; the same "
        "commands with configs/bert-base.toml\n     on a GPU and a real corpus are what move these numbers.)"
    )
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from bertgpu import pretrain
    from bertgpu.data.corpus import gensim_test_data
    from bertgpu.data.prepare import prepare
    from bertgpu.data.tokenizer import train_tokenizer
    from bertgpu.train import config

    out = Path(args.out)
    if args.fresh and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    wiki = gensim_test_data(WIKI_SAMPLE)
    print(f"corpus: {wiki.name} ({wiki.stat().st_size / 1e6:.1f} MB bz2, real English Wikipedia)")

    tok_dir, data_dir, run_dir = out / "tokenizer", out / "data", out / "run"
    t0 = _stage(f"1. bertgpu tokenizer --vocab-size {args.vocab_size}")
    if not tok_dir.exists():
        train_tokenizer([wiki], tok_dir, vocab_size=args.vocab_size)
    print(f"    {tok_dir}: {sum(1 for _ in open(tok_dir / 'vocab.txt', encoding='utf-8')):,} WordPieces")
    _done(t0)

    t0 = _stage("2. bertgpu prepare --objective mlm --seq-len 128")
    if not data_dir.exists():
        prepare([wiki], tok_dir, data_dir, seq_len=128, objective="mlm", validation_fraction=0.05)
    manifest = json.loads((data_dir / "manifest.json").read_text())
    splits = manifest["splits"]
    print(f"    {manifest['counts']['documents']} documents -> {splits['train']['sequences']:,} train / "
          f"{splits['validation']['sequences']:,} validation sequences of {manifest['seq_len']} tokens")
    _done(t0)

    t0 = _stage("3. bertgpu pretrain configs/tiny.toml")
    overrides = ["--data", str(data_dir), "--out", str(run_dir), "--model.vocab_size", str(args.vocab_size)]
    if args.steps:
        overrides += ["--train.max_steps", str(args.steps)]
    cfg = config.load_config(_recipe(), overrides)
    result = pretrain.run(cfg)
    _done(t0)

    curve = _train_curve(run_dir)
    train = [r for r in curve if r["kind"] == "train"]
    evals = [r for r in curve if r["kind"] == "eval"]
    print("\n    how pretraining went (metrics.jsonl):")
    print("    | step | train MLM loss | train MLM acc | val MLM loss | val MLM acc |")
    print("    |---:|---:|---:|---:|---:|")
    by_step = {r["step"]: r for r in evals}
    shown = [train[0]] + [r for r in train[1:] if r["step"] in by_step] if train else []
    for r in shown:
        e = by_step.get(r["step"], {})
        val_loss = f"{e['val_mlm_loss']:.3f}" if "val_mlm_loss" in e else ""
        val_acc = f"{e['val_mlm_acc']:.1%}" if "val_mlm_acc" in e else ""
        print(f"    | {r['step']} | {r['loss']:.3f} | {r.get('mlm_acc', 0):.1%} | {val_loss} | {val_acc} |")

    hf_dir = result.export_dir or run_dir / "hf"
    t0 = _stage("4. bertgpu export -> transformers AutoModelForMaskedLM fill-mask")
    for text, top in fill_mask(hf_dir, FILL_MASK_SENTENCES):
        print(f"    {text:<45} -> {', '.join(top)}")
    _done(t0)

    if not args.skip_finetune:
        t0 = _stage("5. bertgpu finetune on gensim's labelled sets: pretrained vs random init")
        print(finetune_table(hf_dir, out / "finetune"))
        _done(t0)

    print(f"\ndemo finished in {time.perf_counter() - t_all:.0f} s; everything is under {out}/")
    print(f"  tokenizer {tok_dir}/  shards {data_dir}/  run {run_dir}/  Hugging Face export {hf_dir}/")
    return 0

"""Raw text -> token-id shards + manifest.json, streamed, on all cores, in bounded memory.

    bertgpu prepare --corpus wiki.xml.bz2 books/ --tokenizer tok/ --out data/ --seq-len 128
    bertgpu prepare --corpus sample_text.txt --tokenizer tok/ --out data_nsp/ --objective mlm+nsp
    bertgpu prepare --corpus reviews.txt --format lines --tokenizer tok/ --out data/
    bertgpu prepare --corpus news.txt --format lines --tokenizer tok/ --out data/ \\
        --whole-word-segmenter jieba

    from bertgpu.data.prepare import prepare
    manifest = prepare(["corpus/"], "tok/", "data/", seq_len=128, objective="mlm")

How (`pipeline`): the corpus is read as a stream of document parts, tokenized on the workers
(`packing`), cut into units that go to train or validation by their token counts (`split`),
packed into rows (mlm, `writer`) or paired into sentence pairs on the workers (mlm+nsp), and
written shard by shard (`writer`). Memory does not grow with the corpus or with the length of a
document, and the output is byte-identical for any --workers.

Objectives
- ``mlm``: the token streams of the documents, [SEP] between documents, packed into rows of
  ``[CLS] + seq_len-2 tokens + [SEP]``; every row is full except the last of each split.
- ``mlm+nsp``: BERT's sentence pairs ``[CLS] A [SEP] B [SEP]`` with next-sentence labels
  (`packing` has the recipe).

Train/validation split (`split`): ``--validation-fraction F`` holds out F of the tokens, within
a tenth of F, by whole documents when they are small enough and by chunks of documents when
there are too few (the summary and the manifest's ``split_unit`` say which);
``--validation-fraction 0`` holds out nothing; ``--validation-docs N`` holds out the first N
documents instead.

The output layout (shards, dtypes, manifest keys) is specified in docs/ARCHITECTURE.md. All files
are written to DATADIR.tmp, which is renamed to DATADIR at the end (or removed on failure).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from bertgpu import __version__
from bertgpu.data import pipeline
from bertgpu.data.corpus import (
    CorpusStats,
    add_corpus_arguments,
    iter_raw_documents,
    resolve_inputs,
)
from bertgpu.data.manifest import OBJECTIVES, Manifest, total_counts
from bertgpu.data.segment import SEGMENTERS, check_segmenter
from bertgpu.data.split import MIN_UNIT_TOKENS, SplitPlan
from bertgpu.data.tokenizer import (
    TOKENIZER_FILES,
    find_tokenizer_folder,
    is_lowercase,
    load_tokenizer,
    special_token_ids,
    tokenizer_hash,
)
from bertgpu.data.writer import SPLITS, Packer, ShardSetWriter, ShardWriter
from bertgpu.errors import BertgpuError


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _check_args(seq_len: int, objective: str, short_seq_prob: float, validation_fraction: float,
                validation_docs: int | None, shard_size: int, workers: int, chunk_docs: int,
                segmenter: str | None) -> None:
    if objective not in OBJECTIVES:
        raise BertgpuError(f"--objective {objective!r}: unknown; expected one of "
                           f"{', '.join(OBJECTIVES)}")
    if seq_len < 8:
        raise BertgpuError(f"--seq-len {seq_len}: too short; expected 8 or more (128 and "
                           "512 are usual)")
    if not 0.0 <= short_seq_prob <= 1.0:
        raise BertgpuError(f"--short-seq-prob {short_seq_prob}: expected a probability in [0, 1]")
    if not 0.0 <= validation_fraction < 1.0:
        raise BertgpuError(f"--validation-fraction {validation_fraction}: expected a "
                           "value in [0, 1)")
    if validation_docs is not None and validation_docs < 0:
        raise BertgpuError(f"--validation-docs {validation_docs}: expected 0 or more")
    if shard_size < 1 or workers < 1 or chunk_docs < 1:
        raise BertgpuError("--shard-size, --workers and --chunk-docs: expected 1 or more")
    if segmenter is not None:
        check_segmenter(segmenter)


def prepare(
    paths: list[str | os.PathLike],
    tokenizer_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    seq_len: int = 128,
    objective: str = "mlm",
    short_seq_prob: float = 0.1,
    validation_fraction: float = 0.01,
    validation_docs: int | None = None,
    seed: int = 12345,
    shard_size: int = 65536,
    workers: int | None = None,
    fmt: str = "auto",
    text_field: str = "text",
    skip_bad: bool = False,
    overwrite: bool = False,
    chunk_docs: int = 1000,
    progress: bool = False,
    segmenter: str | None = None,
) -> dict[str, Any]:
    """Tokenize the corpus into shards under ``out_dir`` and return manifest.json's content.

    ``validation_docs`` (the first N documents) replaces ``validation_fraction`` when given.
    ``workers``: tokenizing processes (default: all cores); the output does not depend on it.
    ``segmenter``: a whole-word segmenter (`segment.SEGMENTERS`) whose word starts are stored.
    """
    workers = workers or os.cpu_count() or 1
    _check_args(seq_len, objective, short_seq_prob, validation_fraction, validation_docs,
                shard_size, workers, chunk_docs, segmenter)
    tok_dir = find_tokenizer_folder(tokenizer_dir) or Path(tokenizer_dir)  # errors name the path
    special = special_token_ids(tok_dir)  # also checks the folder loads
    vocab_size = load_tokenizer(tok_dir).get_vocab_size(with_added_tokens=True)
    dtype = np.dtype(np.uint32 if vocab_size > 65535 else np.uint16)
    inputs = resolve_inputs(paths)  # fail on a missing input before any work
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise BertgpuError(f"{out}: already exists and is not empty; expected a new folder "
                           "(or --overwrite)")

    nsp = objective == "mlm+nsp"
    with ShardSetWriter(out, seq_len, dtype, shard_size, nsp,
                        word_starts=segmenter is not None) as data:
        stats = CorpusStats()
        packers = {s: Packer(data.writers[s], seq_len, special["cls"], special["sep"])
                   for s in SPLITS}
        settings = {"seed": seed, "objective": objective, "seq_len": seq_len,
                    "short_seq_prob": short_seq_prob, "cls": special["cls"], "sep": special["sep"],
                    "segmenter": segmenter}
        plan = SplitPlan(seed, validation_fraction, validation_docs,
                         sum(p.stat().st_size for p in inputs),
                         min_unit=4 * seq_len if nsp else MIN_UNIT_TOKENS)
        raw = iter_raw_documents(inputs, fmt=fmt, text_field=text_field, skip_bad=skip_bad,
                                 stats=stats)
        results = pipeline.run(raw, plan, chunk_docs, workers, str(tok_dir), settings,
                               skip_bad, stats)
        _write(results, nsp, data.writers, packers, stats, progress)
        if stats.documents == 0:
            raise BertgpuError("no documents read from the corpus; expected text to tokenize")
        splits = data.close(plan.documents)
        manifest = _manifest(objective, seq_len, dtype, vocab_size, tok_dir, special, seed,
                             None if validation_docs is not None else validation_fraction,
                             validation_docs, stats, splits, inputs, plan, segmenter)
        _copy_tokenizer(tok_dir, data.folder / "tokenizer")
        data.commit(manifest)
    return manifest.to_json()


def _write(results: Iterator, nsp: bool, writers: dict[str, ShardWriter],
           packers: dict[str, Packer], stats: CorpusStats, progress: bool) -> None:
    """The pipeline's results into shards: mlm units through the packers, mlm+nsp rows directly."""
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(unit="doc", desc="prepare", file=sys.stderr)
    for result in results:
        if nsp:
            for split, part in result.items():
                writers[split].add({"input_ids": part["ids"], "lengths": part["lengths"],
                                    "token_type_ids": part["tt"], "nsp_labels": part["labels"],
                                    "word_starts": part["word_starts"]})
        else:
            is_val, tokens, word_starts, joins = result
            packers["validation" if is_val else "train"].add(tokens, word_starts, joins)
        if bar is not None:
            bar.update(stats.documents - bar.n)
    if bar is not None:
        bar.close()
    for split in SPLITS:
        packers[split].finish()  # the writers' last shards are written by ShardSetWriter.close


def _manifest(objective: str, seq_len: int, dtype: np.dtype, vocab_size: int, tok_dir: Path,
              special: dict[str, int], seed: int, fraction: float | None,
              validation_docs: int | None, stats: CorpusStats, splits: dict[str, dict[str, Any]],
              inputs: list[Path], plan: SplitPlan, segmenter: str | None) -> Manifest:
    counts = total_counts(splits, stats.documents)
    skipped = {p for p, _ in stats.skipped}
    return Manifest(
        objective=objective, seq_len=seq_len, dtype=dtype.name, vocab_size=vocab_size,
        tokenizer_hash=tokenizer_hash(tok_dir), do_lower_case=is_lowercase(tok_dir),
        special_tokens=special, seed=seed, validation_fraction=fraction,
        validation_docs=validation_docs, split_unit=plan.split_unit,
        cut_documents=plan.cut_documents,
        validation_share=round(splits["validation"]["tokens"] / max(counts["tokens"], 1), 6),
        whole_word_segmenter=segmenter, counts=counts, splits=splits,
        inputs=[{"path": str(p), "bytes": p.stat().st_size, "sha256": _sha256(p)}
                for p in inputs if str(p) not in skipped],
        skipped_inputs=[{"path": p, "reason": r} for p, r in stats.skipped],
        created_by=f"bertgpu {__version__}",
    )


def _copy_tokenizer(src: Path, dst: Path) -> None:
    dst.mkdir()
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)


def split_summary(manifest: dict[str, Any]) -> str:
    """One line on the validation split: its share of the tokens and how it was cut."""
    val, share = manifest["splits"]["validation"], manifest.get("validation_share", 0.0)
    unit = manifest.get("split_unit")
    if unit == "none":
        return "no validation split (--validation-fraction 0)"
    if manifest.get("validation_docs") is not None:
        return (f"validation: the first {manifest['validation_docs']} documents, "
                f"{val['sequences']} sequences, {share:.2%} of the tokens")
    asked = manifest["validation_fraction"]
    text = (f"validation: {val['sequences']} sequences, {share:.2%} of the tokens "
            f"(asked {asked:.2%})")
    if unit == "chunk":
        n = manifest["counts"]["documents"]
        return (f"{text}; split by chunks of documents: {manifest['cut_documents']} of {n} "
                "documents have chunks on both sides (too few documents to hold out whole ones)")
    return f"{text}; split by whole documents"


# --------------------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_corpus_arguments(parser)
    parser.add_argument("--tokenizer", required=True, metavar="TOKDIR",
                        help="output of `bertgpu tokenizer`, a Hugging Face model folder "
                             "(vocab.txt or tokenizer.json), or a bertgpu run folder (its "
                             "tokenizer/): the vocabulary of a model to continue pretraining")
    parser.add_argument("--out", required=True, metavar="DATADIR",
                        help="output folder (new or empty)")
    parser.add_argument("--seq-len", type=int, default=128,
                        help="tokens per sequence incl. [CLS]/[SEP] (default 128)")
    parser.add_argument("--objective", choices=OBJECTIVES, default="mlm",
                        help="mlm: packed full rows; mlm+nsp: BERT sentence pairs (default mlm)")
    parser.add_argument("--short-seq-prob", type=float, default=0.1,
                        help="mlm+nsp: probability of a shorter target length (default 0.1)")
    val = parser.add_mutually_exclusive_group()
    val.add_argument("--validation-fraction", type=float, default=0.01,
                     help="share of the text held out, by documents or, with too few, by chunks of "
                          "documents (default 0.01; 0 = none)")
    val.add_argument("--validation-docs", type=int, default=None,
                     help="hold out the first N documents instead")
    parser.add_argument("--seed", type=int, default=12345,
                        help="seed of the split and the NSP choices")
    parser.add_argument("--shard-size", type=int, default=65536,
                        help="sequences per shard file (default 65536)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="tokenizing processes (default: all cores); the output does "
                             "not depend on it")
    parser.add_argument("--chunk-docs", type=int, default=1000,
                        help="mlm+nsp: documents (or pieces of long ones) per work unit, also the "
                             "pool random B segments come from (default 1000)")
    parser.add_argument("--whole-word-segmenter", choices=SEGMENTERS, default=None,
                        help="store word boundaries for whole-word masking of Chinese (needs `pip "
                             "install jieba`)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing non-empty output folder")


def main(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    manifest = prepare(
        args.corpus, args.tokenizer, args.out, seq_len=args.seq_len, objective=args.objective,
        short_seq_prob=args.short_seq_prob, validation_fraction=args.validation_fraction,
        validation_docs=args.validation_docs, seed=args.seed, shard_size=args.shard_size,
        workers=args.workers, fmt=args.format, text_field=args.text_field, skip_bad=args.skip_bad,
        overwrite=args.overwrite, chunk_docs=args.chunk_docs, progress=sys.stderr.isatty(),
        segmenter=args.whole_word_segmenter,
    )
    c, s = manifest["counts"], time.perf_counter() - start
    print(f"prepare: {c['documents']} documents -> {c['sequences']} sequences, {c['tokens']} "
          f"tokens (train {manifest['splits']['train']['sequences']}, validation "
          f"{manifest['splits']['validation']['sequences']}) in {s:.1f}s, "
          f"{c['tokens'] / max(s, 1e-9) / 1e6:.2f} M tokens/s -> {args.out}")
    print(f"prepare: {split_summary(manifest)}")
    for item in manifest["skipped_inputs"]:
        print(f"prepare: skipped {item['reason']}")
    return 0

"""Raw text -> token-id shards + manifest.json, streamed, on all cores, in bounded memory.

    bertgpu prepare --corpus wiki.xml.bz2 books/ --tokenizer tok/ --out data/ --seq-len 128
    bertgpu prepare --corpus sample_text.txt --tokenizer tok/ --out data_nsp/ --objective mlm+nsp

    from bertgpu.prepare import prepare
    manifest = prepare(["corpus/"], "tok/", "data/", seq_len=128, objective="mlm")

Pipeline: `corpus.iter_documents` (main process) -> chunks of documents -> worker processes
(tokenize with `encode_batch`, build sequences) -> main process (pack / write shards). Chunks are
processed in order with a bounded number in flight, and every random choice uses a generator
seeded from (seed, chunk index), so the output is byte-identical for any --workers.

Objectives
- ``mlm``: the token streams of the documents, [SEP] between documents, packed into rows of
  ``[CLS] + seq_len-2 tokens + [SEP]``; every row is full except the last of each split.
- ``mlm+nsp``: BERT's create_pretraining_data recipe (Devlin et al. 2018): per document a target
  length (seq_len-3, or with --short-seq-prob a random shorter one), sentences accumulated into
  segments A and B, B replaced by a random span of another document half of the time
  (nsp_label 1), ``[CLS] A [SEP] B [SEP]`` with token types 0/1. The "other document" comes from
  the same chunk and split (at most --chunk-docs documents are held, not the corpus); a chunk
  with a single document falls back to that document, as the original does after 10 misses.

Train/validation split, per document (document i counts from 0 over all inputs):
- ``--validation-fraction F``: i is held out when blake2b(seed, i) / 2**64 < F; when F > 0 the
  second document (i = 1) is always held out, so that any corpus of 2+ documents has one.
- ``--validation-docs N``: the first N documents are held out.

The output layout (shards, dtypes, manifest keys) is specified in docs/ARCHITECTURE.md. All files
are written to DATADIR.tmp, which is renamed to DATADIR at the end (or removed on failure).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import queue
import shutil
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from bertgpu import __version__
from bertgpu.corpus import FORMATS, CorpusStats, iter_documents, resolve_inputs
from bertgpu.errors import BertgpuError
from bertgpu.tokenizer import (
    TOKENIZER_FILES,
    is_lowercase,
    load_tokenizer,
    special_token_ids,
    tokenizer_hash,
)

FORMAT_VERSION = 1
OBJECTIVES = ("mlm", "mlm+nsp")
SPLITS = ("train", "validation")
CHUNK_CHARS = 500_000  # a chunk also closes at this many characters (after MIN_CHUNK_DOCS): bounds memory, spreads work
MIN_CHUNK_DOCS = 16  # so that a random NSP segment can come from another document even for books


# --------------------------------------------------------------------------- worker side

_STATE: dict = {}


def _init_worker(tokenizer_dir: str, settings: dict) -> None:
    """Load the tokenizer once per process (also used in-process when workers == 1)."""
    tok = load_tokenizer(tokenizer_dir)
    tok.no_truncation()
    tok.no_padding()
    _STATE["tok"] = tok
    _STATE["encode"] = getattr(tok, "encode_batch_fast", tok.encode_batch)  # skips offsets (>=0.20)
    _STATE.update(settings)


def _process_chunk(task: tuple[int, list[list[str]], list[bool]]) -> dict[str, dict]:
    """Tokenize one chunk of documents and turn it into sequences, per split."""
    index, docs, is_val = task
    rng = np.random.default_rng([_STATE["seed"], index])
    out: dict[str, dict] = {}
    for split, flag in (("train", False), ("validation", True)):
        part = [d for d, v in zip(docs, is_val, strict=True) if v == flag]
        if _STATE["objective"] == "mlm":
            out[split] = _mlm_stream(part)
        else:
            out[split] = _nsp_rows(part, rng)
    return out


def _mlm_stream(docs: list[list[str]]) -> dict:
    """The chunk's token stream: each document's ids, [SEP] between documents."""
    if not docs:
        return {"stream": np.empty(0, np.int32), "documents": 0}
    # Joining sentences with a space tokenizes exactly like encoding them one by one (the BERT
    # pre-tokenizer splits on whitespace), with far fewer Encoding objects.
    encs = _STATE["encode"]([" ".join(d) for d in docs], add_special_tokens=False)
    sep = [_STATE["sep"]]
    pieces: list[list[int]] = []
    for e in encs:
        ids = e.ids
        if ids:
            if pieces:
                pieces.append(sep)
            pieces.append(ids)
    total = sum(len(p) for p in pieces)
    stream = np.fromiter((t for p in pieces for t in p), dtype=np.int32, count=total)
    return {"stream": stream, "documents": len(docs)}


def _nsp_rows(docs: list[list[str]], rng: np.random.Generator) -> dict:
    """Sentence-pair rows of a chunk (BERT's create_instances_from_document, once per document)."""
    seq_len = _STATE["seq_len"]
    flat = [s for d in docs for s in d]
    encs = _STATE["encode"](flat, add_special_tokens=False) if flat else []
    tokenized: list[list[list[int]]] = []
    k = 0
    for d in docs:
        sents = [encs[k + j].ids for j in range(len(d))]
        k += len(d)
        sents = [s for s in sents if s]  # a sentence of control characters only has no tokens
        if sents:
            tokenized.append(sents)
    pairs: list[tuple[list[int], list[int], int]] = []
    for d in range(len(tokenized)):
        pairs.extend(_document_pairs(tokenized, d, rng, seq_len - 3, _STATE["short_seq_prob"]))
    n = len(pairs)
    ids = np.zeros((n, seq_len), np.int32)
    tts = np.zeros((n, seq_len), np.uint8)
    lengths = np.zeros(n, np.int32)
    labels = np.zeros(n, np.uint8)
    cls, sep = _STATE["cls"], _STATE["sep"]
    for r, (a, b, label) in enumerate(pairs):
        row = [cls, *a, sep, *b, sep]
        ids[r, : len(row)] = row
        tts[r, len(a) + 2 : len(row)] = 1
        lengths[r] = len(row)
        labels[r] = label
    return {"ids": ids, "tt": tts, "lengths": lengths, "labels": labels, "documents": len(docs)}


def _document_pairs(
    docs: list[list[list[int]]], d: int, rng: np.random.Generator, max_tokens: int, short_seq_prob: float
) -> list[tuple[list[int], list[int], int]]:
    """(A, B, nsp_label) pairs from document d; the random B comes from another of ``docs``."""
    document = docs[d]
    target = max_tokens
    if rng.random() < short_seq_prob:
        target = int(rng.integers(2, max_tokens + 1))  # short sequences: fine-tuning sees them too
    pairs = []
    chunk: list[list[int]] = []
    length = 0
    i = 0
    while i < len(document):
        chunk.append(document[i])
        length += len(document[i])
        if i == len(document) - 1 or length >= target:
            a_end = int(rng.integers(1, len(chunk))) if len(chunk) >= 2 else 1
            a = [t for s in chunk[:a_end] for t in s]
            if len(chunk) == 1 or rng.random() < 0.5:
                label = 1
                other = docs[_other_document(len(docs), d, rng)]
                b: list[int] = []
                for j in range(int(rng.integers(0, len(other))), len(other)):
                    b.extend(other[j])
                    if len(b) >= target - len(a):
                        break
                i -= len(chunk) - a_end  # the unused segments of this document go back
            else:
                label = 0
                b = [t for s in chunk[a_end:] for t in s]
            a, b = _truncate_pair(a, b, max_tokens, rng)
            pairs.append((a, b, label))
            chunk = []
            length = 0
        i += 1
    return pairs


def _other_document(n: int, d: int, rng: np.random.Generator) -> int:
    if n == 1:
        return d
    r = int(rng.integers(0, n - 1))
    return r if r < d else r + 1  # uniform over the other n-1 documents


def _truncate_pair(a: list[int], b: list[int], max_tokens: int, rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """BERT's truncate_seq_pair: trim the longer side, one token at a time from a random end.

    The per-token coin flips are drawn in bulk: which side loses each token is fixed (the longer,
    ties to B), and the number taken from the front of a side is Binomial(removed, 1/2).
    """
    la, lb = len(a), len(b)
    while la + lb > max_tokens:
        if la > lb:
            la -= 1
        else:
            lb -= 1
    return _trim(a, len(a) - la, rng), _trim(b, len(b) - lb, rng)


def _trim(seq: list[int], remove: int, rng: np.random.Generator) -> list[int]:
    if remove <= 0:
        return seq
    front = int(rng.binomial(remove, 0.5))
    return seq[front : len(seq) - (remove - front)]


# --------------------------------------------------------------------------- main side


class _ShardWriter:
    """Fills a preallocated buffer of shard_size rows and saves it as .npy files when full."""

    def __init__(self, folder: Path, split: str, seq_len: int, dtype: np.dtype, shard_size: int, nsp: bool):
        self.folder, self.split, self.nsp = folder, split, nsp
        self.ids = np.zeros((shard_size, seq_len), dtype)
        self.lengths = np.zeros(shard_size, np.int32)
        self.tt = np.zeros((shard_size, seq_len), np.uint8) if nsp else None
        self.labels = np.zeros(shard_size, np.uint8) if nsp else None
        self.n = 0
        self.shards: list[dict] = []
        self.documents = 0

    def add(self, ids: np.ndarray, lengths: np.ndarray, tt: np.ndarray | None = None,
            labels: np.ndarray | None = None) -> None:
        done = 0
        while done < len(ids):
            take = min(len(self.ids) - self.n, len(ids) - done)
            rows = slice(self.n, self.n + take)
            src = slice(done, done + take)
            self.ids[rows] = ids[src]
            self.lengths[rows] = lengths[src]
            if self.nsp:
                self.tt[rows] = tt[src]
                self.labels[rows] = labels[src]
            self.n += take
            done += take
            if self.n == len(self.ids):
                self.flush()

    def flush(self) -> None:
        if self.n == 0:
            return
        name = f"{self.split}-{len(self.shards):05d}"
        arrays = {"input_ids": self.ids, "lengths": self.lengths}
        if self.nsp:
            arrays.update(token_type_ids=self.tt, nsp_labels=self.labels)
        for key, arr in arrays.items():
            np.save(self.folder / f"{name}.{key}.npy", arr[: self.n])
        self.shards.append({"name": name, "sequences": self.n, "tokens": int(self.lengths[: self.n].sum())})
        self.n = 0

    def summary(self) -> dict:
        return {
            "sequences": sum(s["sequences"] for s in self.shards),
            "tokens": sum(s["tokens"] for s in self.shards),
            "documents": self.documents,
            "shards": self.shards,
        }


class _Packer:
    """Packs a split's token stream into full [CLS] ... [SEP] rows; carries the remainder over."""

    def __init__(self, writer: _ShardWriter, seq_len: int, cls: int, sep: int):
        self.writer, self.seq_len, self.cls, self.sep = writer, seq_len, cls, sep
        self.carry = np.empty(0, np.int32)
        self.started = False

    def add(self, stream: np.ndarray) -> None:
        if stream.size == 0:
            return
        parts = [self.carry, np.array([self.sep], np.int32), stream] if self.started else [self.carry, stream]
        self.started = True
        buf = np.concatenate(parts)
        content = self.seq_len - 2
        n = len(buf) // content
        if n:
            rows = np.empty((n, self.seq_len), self.writer.ids.dtype)
            rows[:, 0] = self.cls
            rows[:, 1:-1] = buf[: n * content].reshape(n, content)
            rows[:, -1] = self.sep
            self.writer.add(rows, np.full(n, self.seq_len, np.int32))
        self.carry = buf[n * content :]

    def finish(self) -> None:
        if self.carry.size:
            row = np.zeros((1, self.seq_len), self.writer.ids.dtype)
            k = self.carry.size
            row[0, 0] = self.cls
            row[0, 1 : k + 1] = self.carry
            row[0, k + 1] = self.sep
            self.writer.add(row, np.array([k + 2], np.int32))
            self.carry = np.empty(0, np.int32)


def _is_validation(seed: int, index: int, fraction: float, validation_docs: int | None) -> bool:
    if validation_docs is not None:
        return index < validation_docs
    if fraction <= 0:
        return False
    if index == 1:
        return True  # guarantee: a corpus of 2+ documents has a validation document
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64 < fraction


def _chunks(
    docs: Iterator[list[str]], seed: int, fraction: float, validation_docs: int | None, chunk_docs: int
) -> Iterator[tuple[int, list[list[str]], list[bool]]]:
    """(chunk index, documents, is-validation flags): boundaries depend on the corpus alone."""
    index = doc_index = chars = 0
    batch: list[list[str]] = []
    flags: list[bool] = []
    for doc in docs:
        batch.append(doc)
        flags.append(_is_validation(seed, doc_index, fraction, validation_docs))
        doc_index += 1
        chars += sum(len(s) for s in doc)
        if len(batch) >= chunk_docs or (chars >= CHUNK_CHARS and len(batch) >= MIN_CHUNK_DOCS):
            yield index, batch, flags
            index += 1
            batch, flags, chars = [], [], 0
    if batch:
        yield index, batch, flags


def _ordered_results(tasks: Iterator, workers: int, tokenizer_dir: str, settings: dict) -> Iterator[dict]:
    """Results of `_process_chunk` in task order, with at most 2 x workers chunks in flight.

    Pool.imap would pull the whole corpus into its task queue when workers lag behind the reader;
    a bounded window of apply_async keeps memory flat.
    """
    if workers <= 1:
        _init_worker(tokenizer_dir, settings)  # in-process; encode_batch uses Rust threads itself
        # Reading runs in a thread meanwhile: encode_batch releases the GIL while it works.
        for task in _prefetch(tasks, depth=2):
            yield _process_chunk(task)
        return
    method = "fork" if sys.platform.startswith("linux") else "spawn"
    ctx = multiprocessing.get_context(method)
    # Each worker tokenizes single-threaded: processes already use the cores, and a forked child
    # of a process that used Rust threads would otherwise warn and disable them anyway.
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        pool = ctx.Pool(workers, initializer=_init_worker, initargs=(tokenizer_dir, settings))
    finally:
        if saved is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved
    with pool:
        pending: deque = deque()
        for task in tasks:
            pending.append(pool.apply_async(_process_chunk, (task,)))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def _prefetch(items: Iterator, depth: int) -> Iterator:
    """Iterate ``items`` in a background thread, at most ``depth`` ahead; re-raise its errors here."""
    done = object()
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(done)
        except BaseException as exc:  # handed to the consumer, which raises it
            q.put(exc)

    thread = threading.Thread(target=produce, daemon=True, name="bertgpu-reader")
    thread.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()  # the consumer stopped early (an error downstream): let the reader end
        thread.join()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _check_args(seq_len: int, objective: str, short_seq_prob: float, validation_fraction: float,
                validation_docs: int | None, shard_size: int, workers: int, chunk_docs: int) -> None:
    if objective not in OBJECTIVES:
        raise BertgpuError(f"--objective {objective!r}: unknown; expected one of {', '.join(OBJECTIVES)}")
    if seq_len < 8:
        raise BertgpuError(f"--seq-len {seq_len}: too short; expected 8 or more (128 and 512 are usual)")
    if not 0.0 <= short_seq_prob <= 1.0:
        raise BertgpuError(f"--short-seq-prob {short_seq_prob}: expected a probability in [0, 1]")
    if not 0.0 <= validation_fraction < 1.0:
        raise BertgpuError(f"--validation-fraction {validation_fraction}: expected a value in [0, 1)")
    if validation_docs is not None and validation_docs < 0:
        raise BertgpuError(f"--validation-docs {validation_docs}: expected 0 or more")
    if shard_size < 1 or workers < 1 or chunk_docs < 1:
        raise BertgpuError("--shard-size, --workers and --chunk-docs: expected 1 or more")


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
) -> dict:
    """Tokenize the corpus into shards under ``out_dir`` and return the manifest (also saved).

    ``validation_docs`` (the first N documents) replaces ``validation_fraction`` when given.
    ``workers``: tokenizing processes (default: all cores); the output does not depend on it.
    """
    workers = workers or os.cpu_count() or 1
    _check_args(seq_len, objective, short_seq_prob, validation_fraction, validation_docs, shard_size,
                workers, chunk_docs)
    tok_dir = Path(tokenizer_dir)
    special = special_token_ids(tok_dir)  # also checks the folder loads
    vocab_size = load_tokenizer(tok_dir).get_vocab_size(with_added_tokens=True)
    dtype = np.dtype(np.uint32 if vocab_size > 65535 else np.uint16)
    inputs = resolve_inputs(paths)  # fail on a missing input before any work
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise BertgpuError(f"{out}: already exists and is not empty; expected a new folder (or --overwrite)")

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)  # left over from a killed run
    tmp.mkdir(parents=True)
    try:
        stats = CorpusStats()
        nsp = objective == "mlm+nsp"
        writers = {s: _ShardWriter(tmp, s, seq_len, dtype, shard_size, nsp) for s in SPLITS}
        packers = {s: _Packer(writers[s], seq_len, special["cls"], special["sep"]) for s in SPLITS}
        settings = {"seed": seed, "objective": objective, "seq_len": seq_len, "short_seq_prob": short_seq_prob,
                    "cls": special["cls"], "sep": special["sep"]}
        docs = iter_documents(inputs, fmt=fmt, text_field=text_field, skip_bad=skip_bad, stats=stats)
        tasks = _chunks(docs, seed, validation_fraction, validation_docs, chunk_docs)
        bar = _progress_bar(progress)
        for result in _ordered_results(tasks, workers, str(tok_dir), settings):
            for split, part in result.items():
                writers[split].documents += part["documents"]
                if nsp:
                    writers[split].add(part["ids"], part["lengths"], part["tt"], part["labels"])
                else:
                    packers[split].add(part["stream"])
            if bar is not None:
                bar.update(sum(p["documents"] for p in result.values()))
        if bar is not None:
            bar.close()
        for split in SPLITS:
            packers[split].finish()
            writers[split].flush()
        if stats.documents == 0:
            raise BertgpuError("no documents read from the corpus; expected text to tokenize")
        manifest = _manifest(objective, seq_len, dtype, vocab_size, tok_dir, special, seed,
                             None if validation_docs is not None else validation_fraction, validation_docs,
                             stats, writers, inputs)
        _copy_tokenizer(tok_dir, tmp / "tokenizer")
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _progress_bar(enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(unit="doc", desc="prepare", file=sys.stderr)


def _manifest(objective, seq_len, dtype, vocab_size, tok_dir, special, seed, fraction, validation_docs,
              stats, writers, inputs) -> dict:
    splits = {s: writers[s].summary() for s in SPLITS}
    tokens = sum(v["tokens"] for v in splits.values())
    skipped = {p for p, _ in stats.skipped}
    return {
        "format_version": FORMAT_VERSION,
        "objective": objective,
        "seq_len": seq_len,
        "dtype": dtype.name,
        "vocab_size": vocab_size,
        "tokenizer_hash": tokenizer_hash(tok_dir),
        "do_lower_case": is_lowercase(tok_dir),
        "special_tokens": special,
        "seed": seed,
        "validation_fraction": fraction,
        "validation_docs": validation_docs,
        "counts": {
            "documents": stats.documents,
            "sequences": sum(v["sequences"] for v in splits.values()),
            "tokens": tokens,
        },
        "splits": splits,
        "inputs": [
            {"path": str(p), "bytes": p.stat().st_size, "sha256": _sha256(p)} for p in inputs if str(p) not in skipped
        ],
        "skipped_inputs": [{"path": p, "reason": r} for p, r in stats.skipped],
        "created_by": f"bertgpu {__version__}",
    }


def _copy_tokenizer(src: Path, dst: Path) -> None:
    dst.mkdir()
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)


# --------------------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--corpus", nargs="+", required=True, metavar="PATH",
                        help="files, folders (recursive) or glob patterns")
    parser.add_argument("--tokenizer", required=True, metavar="TOKDIR", help="output of `bertgpu tokenizer`")
    parser.add_argument("--out", required=True, metavar="DATADIR", help="output folder (new or empty)")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sequence incl. [CLS]/[SEP] (default 128)")
    parser.add_argument("--objective", choices=OBJECTIVES, default="mlm",
                        help="mlm: packed full rows; mlm+nsp: BERT sentence pairs (default mlm)")
    parser.add_argument("--short-seq-prob", type=float, default=0.1,
                        help="mlm+nsp: probability of a shorter target length (default 0.1)")
    val = parser.add_mutually_exclusive_group()
    val.add_argument("--validation-fraction", type=float, default=0.01,
                     help="fraction of documents held out (default 0.01)")
    val.add_argument("--validation-docs", type=int, default=None, help="hold out the first N documents instead")
    parser.add_argument("--seed", type=int, default=12345, help="seed of the split and the NSP choices")
    parser.add_argument("--shard-size", type=int, default=65536, help="sequences per shard file (default 65536)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="tokenizing processes (default: all cores); the output does not depend on it")
    parser.add_argument("--chunk-docs", type=int, default=1000,
                        help="documents per work unit; also the pool random NSP segments come from")
    parser.add_argument("--format", default="auto", choices=FORMATS, help="corpus format (default: by extension)")
    parser.add_argument("--text-field", default="text", help="JSONL field with the text (default 'text')")
    parser.add_argument("--skip-bad", action="store_true", help="skip unreadable files instead of stopping")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing non-empty output folder")


def main(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    manifest = prepare(
        args.corpus, args.tokenizer, args.out, seq_len=args.seq_len, objective=args.objective,
        short_seq_prob=args.short_seq_prob, validation_fraction=args.validation_fraction,
        validation_docs=args.validation_docs, seed=args.seed, shard_size=args.shard_size,
        workers=args.workers, fmt=args.format, text_field=args.text_field, skip_bad=args.skip_bad,
        overwrite=args.overwrite, chunk_docs=args.chunk_docs, progress=sys.stderr.isatty(),
    )
    c, s = manifest["counts"], time.perf_counter() - start
    print(f"prepare: {c['documents']} documents -> {c['sequences']} sequences, {c['tokens']} tokens "
          f"(train {manifest['splits']['train']['sequences']}, validation "
          f"{manifest['splits']['validation']['sequences']}) in {s:.1f}s, "
          f"{c['tokens'] / max(s, 1e-9) / 1e6:.2f} M tokens/s -> {args.out}")
    for item in manifest["skipped_inputs"]:
        print(f"prepare: skipped {item['reason']}")
    return 0

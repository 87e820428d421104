"""Raw text -> token-id shards + manifest.json, streamed, on all cores, in bounded memory.

    bertgpu prepare --corpus wiki.xml.bz2 books/ --tokenizer tok/ --out data/ --seq-len 128
    bertgpu prepare --corpus sample_text.txt --tokenizer tok/ --out data_nsp/ --objective mlm+nsp

    from bertgpu.data.prepare import prepare
    manifest = prepare(["corpus/"], "tok/", "data/", seq_len=128, objective="mlm")

Pipeline (with --workers N > 1):

    main: read (decompress, decode, parse XML)  -> batches of raw documents (a reader thread)
    workers: strip wiki markup, split sentences  (`corpus.convert_items`)
    main: drop empty documents, train/validation flags, chunks of documents
    workers: tokenize (`encode_batch_fast`), build sequences  (`_process_chunk`)
    main: pack rows / write shards

The per-document text work runs on the workers because it costs as much as tokenizing (wiki
markup) and the main process is a single core. Both stages run in order with a bounded number
of batches in flight (memory does not grow with the corpus), chunk boundaries depend on the
documents alone, and every random choice uses a generator seeded from (seed, chunk index), so
the output is byte-identical for any --workers. With --workers 1 the reading and text work
run in a thread of the one process while it tokenizes.

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
from bertgpu.data.corpus import (
    CorpusStats,
    add_corpus_arguments,
    convert_item,
    convert_items,
    iter_raw_documents,
    needs_conversion,
    resolve_inputs,
    settle_documents,
)
from bertgpu.data.shards import FORMAT_VERSION, OBJECTIVES
from bertgpu.data.tokenizer import (
    TOKENIZER_FILES,
    is_lowercase,
    load_tokenizer,
    special_token_ids,
    tokenizer_hash,
)
from bertgpu.errors import BertgpuError

SPLITS = ("train", "validation")
CHUNK_CHARS = 500_000  # a chunk also closes at this many characters (after MIN_CHUNK_DOCS): bounds memory, spreads work
MIN_CHUNK_DOCS = 16  # so that a random NSP segment can come from another document even for books
RAW_BATCH_CHARS = 1 << 19  # raw documents per conversion task: at most this many characters ...
RAW_BATCH_ITEMS = 512  # ... or this many items


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
    sep = np.array([_STATE["sep"]], np.int32)
    pieces: list[np.ndarray] = []
    for e in encs:
        ids = e.ids
        if ids:
            if pieces:
                pieces.append(sep)
            pieces.append(np.array(ids, np.int32))  # one C-level conversion per document
    stream = np.concatenate(pieces) if pieces else np.empty(0, np.int32)
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
    """Streams rows into the current shard's files; a shard holds shard_size rows.

    Rows go straight to ``NAME.KEY.npy.part`` (raw bytes); when the shard is complete they are
    copied behind the .npy header of the final shape (the same bytes as ``np.save``). Nothing
    of the shard stays in memory, so memory does not depend on --shard-size or the corpus.
    """

    def __init__(self, folder: Path, split: str, seq_len: int, dtype: np.dtype, shard_size: int, nsp: bool):
        self.folder, self.split, self.nsp = folder, split, nsp
        self.seq_len, self.dtype, self.shard_size = seq_len, np.dtype(dtype), shard_size
        self.dtypes = {"input_ids": self.dtype, "lengths": np.dtype(np.int32)}
        if nsp:
            self.dtypes.update(token_type_ids=np.dtype(np.uint8), nsp_labels=np.dtype(np.uint8))
        self.files: dict = {}
        self.n = 0
        self.tokens = 0
        self.shards: list[dict] = []
        self.documents = 0

    def _name(self) -> str:
        return f"{self.split}-{len(self.shards):05d}"

    def add(self, ids: np.ndarray, lengths: np.ndarray, tt: np.ndarray | None = None,
            labels: np.ndarray | None = None) -> None:
        arrays = {"input_ids": ids, "lengths": lengths}
        if self.nsp:
            arrays.update(token_type_ids=tt, nsp_labels=labels)
        done = 0
        while done < len(ids):
            take = min(self.shard_size - self.n, len(ids) - done)
            if not self.files:
                name = self._name()
                self.files = {key: open(self.folder / f"{name}.{key}.npy.part", "wb") for key in self.dtypes}
            for key, arr in arrays.items():
                part = np.ascontiguousarray(arr[done : done + take], dtype=self.dtypes[key])
                self.files[key].write(part.data)
            self.tokens += int(lengths[done : done + take].sum())
            self.n += take
            done += take
            if self.n == self.shard_size:
                self.flush()

    def flush(self) -> None:
        if self.n == 0:
            return
        name = self._name()
        for key, f in self.files.items():
            f.close()
            shape = (self.n, self.seq_len) if key in ("input_ids", "token_type_ids") else (self.n,)
            header = {"descr": np.lib.format.dtype_to_descr(self.dtypes[key]), "fortran_order": False,
                      "shape": shape}
            part = self.folder / f"{name}.{key}.npy.part"
            with open(self.folder / f"{name}.{key}.npy", "wb") as out, open(part, "rb") as src:
                np.lib.format.write_array_header_1_0(out, header)
                shutil.copyfileobj(src, out, 1 << 20)
            part.unlink()
        self.files = {}
        self.shards.append({"name": name, "sequences": self.n, "tokens": self.tokens})
        self.n = 0
        self.tokens = 0

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
            rows = np.empty((n, self.seq_len), self.writer.dtype)
            rows[:, 0] = self.cls
            rows[:, 1:-1] = buf[: n * content].reshape(n, content)
            rows[:, -1] = self.sep
            self.writer.add(rows, np.full(n, self.seq_len, np.int32))
        self.carry = buf[n * content :]

    def finish(self) -> None:
        if self.carry.size:
            row = np.zeros((1, self.seq_len), self.writer.dtype)
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


def _raw_batches(items: Iterator[tuple]) -> Iterator[list[tuple]]:
    """Raw items grouped into conversion tasks of bounded size (events travel with the documents)."""
    batch: list[tuple] = []
    chars = 0
    for item in items:
        batch.append(item)
        payload = item[1]
        chars += len(payload) if isinstance(payload, str) else sum(map(len, payload)) if item[0] == "lines" else 0
        if chars >= RAW_BATCH_CHARS or len(batch) >= RAW_BATCH_ITEMS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def _ordered_map(pool, fn, items: Iterator, window: int, local=None) -> Iterator:
    """``fn(item)`` for each item, in order, on ``pool``, with at most ``window`` tasks in flight.

    Pool.imap would pull the whole input into its task queue when the workers lag behind the
    reader; a bounded window of apply_async keeps memory flat. ``local(item)`` true: run ``fn``
    here instead (work too small to be worth pickling), still in order.
    """
    pending: deque = deque()
    for item in items:
        if local is not None and local(item):
            pending.append(_Done(fn(item)))
        else:
            pending.append(pool.apply_async(fn, (item,)))
        while len(pending) >= window or (pending and isinstance(pending[0], _Done)):
            yield pending.popleft().get()
    while pending:
        yield pending.popleft().get()


class _Done:
    """A result computed in-process, queued like an AsyncResult."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def get(self):
        return self.value


def _make_pool(workers: int, tokenizer_dir: str, settings: dict):
    method = "fork" if sys.platform.startswith("linux") else "spawn"
    ctx = multiprocessing.get_context(method)
    # Each worker tokenizes single-threaded: processes already use the cores, and a forked child
    # of a process that used Rust threads would otherwise warn and disable them anyway.
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        return ctx.Pool(workers, initializer=_init_worker, initargs=(tokenizer_dir, settings))
    finally:
        if saved is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved


def _pipeline(raw: Iterator[tuple], chunking: dict, workers: int, tokenizer_dir: str, settings: dict,
              skip_bad: bool, stats: CorpusStats) -> Iterator[dict]:
    """Results of `_process_chunk` in corpus order (see the module docstring for the stages)."""
    if workers <= 1:
        _init_worker(tokenizer_dir, settings)  # in-process; encode_batch uses Rust threads itself
        docs = settle_documents((convert_item(item) for item in raw), skip_bad, stats)
        # Reading and text work run in a thread meanwhile: encode_batch releases the GIL.
        for task in _prefetch(_chunks(docs, **chunking), depth=2):
            yield _process_chunk(task)
        return
    with _make_pool(workers, tokenizer_dir, settings) as pool:
        batches = _prefetch(_raw_batches(raw), depth=2)  # decompression overlaps the rest of main
        converted = _ordered_map(pool, convert_items, batches, 2 * workers,
                                 local=lambda b: not needs_conversion(b))
        docs = settle_documents((item for batch in converted for item in batch), skip_bad, stats)
        yield from _ordered_map(pool, _process_chunk, _chunks(docs, **chunking), 2 * workers)


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
        raw = iter_raw_documents(inputs, fmt=fmt, text_field=text_field, skip_bad=skip_bad, stats=stats)
        chunking = {"seed": seed, "fraction": validation_fraction, "validation_docs": validation_docs,
                    "chunk_docs": chunk_docs}
        bar = _progress_bar(progress)
        for result in _pipeline(raw, chunking, workers, str(tok_dir), settings, skip_bad, stats):
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
    add_corpus_arguments(parser)
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

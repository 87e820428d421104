"""One work unit of `bertgpu prepare`, start to end, on whatever runs it (this machine's main
process with its pool, or a Ray worker): read its pieces, tokenize, split, pack or pair, write
its shards, and last its record.

    job = UnitJob(tokenizer_json=..., settings=..., ..., out="data/")    # the same for every unit
    record = run_unit(job, unit, held_docs=None)                          # unit: `units.Unit`

The shards of unit u are ``train-UUUUU-KKKKK`` and ``validation-UUUUU-KKKKK``; the record
(`output.WorkFolder.write_record`) holds what the manifest needs: the shards and counts per split,
documents, files read and skipped, rows of null text skipped, how the split was cut, and each
piece's sha256. Everything in a unit depends on the unit's text and the job alone, so any engine,
any worker count and any order of completion give the same bytes.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from bertgpu.data import pipeline
from bertgpu.data.compressed import read_errors
from bertgpu.data.corpus import CorpusStats, iter_piece_items
from bertgpu.data.output import StoreFailed, WorkFolder
from bertgpu.data.prepare_worker import RANDOM_CAUSES
from bertgpu.data.sources import local_or_url, open_raw
from bertgpu.data.split import SplitPlan
from bertgpu.data.units import Unit
from bertgpu.data.writer import SPLITS, Packer, ShardWriter
from bertgpu.errors import BertgpuError, from_network
from bertgpu.testing import faults

Progress = Callable[[int, int], None]  # (tokens written, stored bytes read) so far in the unit


@dataclass(frozen=True)
class UnitJob:
    """What every unit of one `prepare` run shares; sent once to each worker."""

    tokenizer_json: str
    """The tokenizer, serialized (`tokenizers.Tokenizer.to_str`): a worker may be another
    machine, and loads it from memory (no folder written anywhere)."""
    tokenizer_hash: str
    settings: dict[str, Any]
    """For `prepare_worker.init_worker`: seed, objective, seq_len, short_seq_prob, cls, sep,
    unk, segmenter; ``text``: "as written" for a tokenizer whose tokens depend on whitespace
    (`document_parts`), absent for BERT's."""
    fmt: str
    text_field: str
    skip_bad: bool
    fraction: float
    validation_docs: int | None
    min_unit: int
    shard_size: int
    chunk_docs: int
    dtype: str
    word_starts: bool
    out: str
    """The output as given (a local path or a URL)."""
    base: str
    """The driver's working directory: relative local paths are relative to it."""

    @property
    def nsp(self) -> bool:
        return self.settings["objective"] == "mlm+nsp"

    @property
    def keys(self) -> list[str]:
        """The .npy files of each shard."""
        keys = ["input_ids", "lengths"]
        keys += ["token_type_ids", "nsp_labels"] if self.nsp else []
        return keys + (["word_starts"] if self.word_starts else [])


def _sha256(src, span: tuple[int, int]) -> str:
    """sha256 of the stored bytes ``[a, b)`` of a file (a whole file is ``[0, size)``); a file
    that cannot be read (since its text was: a lost connection, a server without range requests
    for this span) is a one-line error naming it."""
    h = hashlib.sha256()
    a, b = span
    try:
        with open_raw(src) as f:
            f.seek(a)
            left = b - a
            while left > 0:
                block = f.read(min(left, 8 << 20))
                if not block:
                    break
                h.update(block)
                left -= len(block)
    except read_errors() as exc:
        raise BertgpuError(f"{src}: cannot read ({' '.join(str(exc).split())})") from None
    return h.hexdigest()


def _peak_rss_kb() -> int | None:
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))
    except (OSError, StopIteration):
        return None


def run_unit(job: UnitJob, unit: Unit, held_docs: int | None, workers: int = 1, pool=None,
             progress: Progress | None = None) -> dict[str, Any]:
    """Prepare ``unit`` and return its record (also written to the work folder, last).

    ``held_docs``: with --validation-docs N, how many of the first N documents are left to hold
    out when this unit starts (the units before it hold the others). A file skipped (--skip-bad)
    after some of its text went into the shards is left out whole: the unit is prepared again
    without it, its first shards replaced.

    A corpus file that cannot be read for the network (a reset connection, a timeout) is a
    `StoreFailed`, not bad input: the run stops and keeps its finished units.
    """
    try:
        return _run_unit(job, unit, held_docs, workers, pool, progress)
    except BertgpuError as exc:
        if not from_network(exc):
            raise
        raise StoreFailed(str(exc)) from None


def _run_unit(job: UnitJob, unit: Unit, held_docs: int | None, workers: int, pool,
              progress: Progress | None) -> dict[str, Any]:
    start = time.perf_counter()
    work = WorkFolder(job.out, job.base)
    if held_docs is not None:  # maybe run again, to hold another count (`engines.run_all`)
        work.forget(unit.index)
    pieces = [replace(p, src=local_or_url(p.src, job.base)) for p in unit.pieces]
    writers, plan, stats, counts = _prepare(job, unit, pieces, held_docs, work, workers, pool,
                                            progress)
    if stats.partial:
        bad = {path for path, _ in stats.skipped}
        first = [shard["name"] for w in writers.values() for shard in w.shards]
        kept = [q for q in pieces if str(q.src) not in bad]
        writers, plan, again, counts = _prepare(job, unit, kept, held_docs, work, workers, pool,
                                                progress)
        again.skipped[:0] = stats.skipped  # the others were read to their end again
        stats = again
        names = {shard["name"] for w in writers.values() for shard in w.shards}
        work.remove([f"{name}.{key}.npy" for name in first if name not in names
                     for key in job.keys])
    # The files as the plan names them (as given: relative paths stay relative), not as opened.
    named = {str(q.src): str(p.src) for p, q in zip(unit.pieces, pieces, strict=True)}
    # A skipped file is left out of the manifest: not read again for a sha256 (it failed once)
    skipped = {path for path, _ in stats.skipped}
    record = {
        "unit": unit.index,
        "keys": job.keys,
        "splits": {s: w.summary(plan.documents[s]) for s, w in writers.items()},
        "documents": sum(plan.documents.values()),
        "files": stats.files,
        "skipped": [[named.get(path, path), _renamed(reason, path, named.get(path, path))]
                    for path, reason in stats.skipped],
        "slices": {named.get(path, path): n for path, n in stats.slices.items()},
        "nulls": {named.get(path, path): n for path, n in stats.nulls.items()},
        "cut_documents": plan.cut_documents,
        "bytes": unit.bytes,
        "held_docs": held_docs,
        "inputs": [{"path": str(p.src), "part": p.part, "parts": p.parts,
                    "span": list(p.span) if p.span else None,
                    "sha256": (_sha256(q.src, p.span) if p.span and str(q.src) not in skipped
                               else None)}
                   for p, q in zip(unit.pieces, pieces, strict=True)],
        **counts,
        "seconds": round(time.perf_counter() - start, 3),
        "peak_rss_kb": _peak_rss_kb(),
    }
    work.write_record(unit.index, record)
    return record


def _renamed(reason: str, opened: str, named: str) -> str:
    return named + reason[len(opened):] if reason.startswith(opened) else reason


def _prepare(job: UnitJob, unit: Unit, pieces: list, held_docs: int | None, work: WorkFolder,
             workers: int, pool, progress: Progress | None
             ) -> tuple[dict[str, ShardWriter], SplitPlan, CorpusStats, dict[str, int]]:
    """One pass over the pieces: the unit's shards written; (writers, plan, stats, counts)."""
    stats = CorpusStats()
    by_docs = job.validation_docs is not None
    plan = SplitPlan(job.settings["seed"], 0.0 if by_docs else job.fraction,
                     held_docs if by_docs else None, unit.bytes, job.min_unit,
                     work_unit=unit.index)
    scratch = work.scratch(unit.index)
    seq_len = job.settings["seq_len"]
    dtype = np.dtype(job.dtype)
    try:
        writers = {s: ShardWriter(scratch, s, seq_len, dtype, job.shard_size, job.nsp,
                                  job.word_starts, prefix=f"{s}-{unit.index:05d}",
                                  on_file=work.publish) for s in SPLITS}
        raw = iter_piece_items(pieces, job.fmt, job.text_field, job.skip_bad, stats,
                               as_written=job.settings.get("text") == "as written")
        results = pipeline.run(raw, plan, job.chunk_docs, workers, job.tokenizer_json,
                               job.settings, job.skip_bad, stats, pool=pool)
        counts = _write(results, job, writers, stats, unit.index, progress)
        for writer in writers.values():
            writer.flush()
    finally:
        work.drop_scratch(scratch)
    return writers, plan, stats, counts


def _write(results: Iterator, job: UnitJob, writers: dict[str, ShardWriter], stats: CorpusStats,
           unit: int, progress: Progress | None) -> dict[str, int]:
    """The pipeline's results into shards: mlm units through the packers, mlm+nsp rows directly.
    Returns what the driver's warnings need: ``unk_tokens`` (the tokenizer's [UNK] among the
    text's tokens), and for mlm+nsp ``nsp_random`` (rows labelled 1) and, of those,
    ``nsp_same_document`` (rows whose B had to come from A's own document: a chunk with pieces
    of one document) and the causes of the rows random because A is one sentence
    (``nsp_one_sentence_document``, ...: `prepare_worker.RANDOM_CAUSES`); the validation split's
    rows and same-document rows apart (``nsp_validation_rows``, ...), which are a hundredth of
    the whole and whose chunks more often hold pieces of one document."""
    special = job.settings
    packers = {s: Packer(writers[s], special["seq_len"], special["cls"], special["sep"])
               for s in SPLITS}
    unk = special.get("unk")
    tokens = 0
    counts = {"unk_tokens": 0}
    if job.nsp:
        counts.update({"nsp_random": 0, **{f"nsp_{c}": 0 for c in RANDOM_CAUSES},
                       "nsp_validation_rows": 0, "nsp_validation_same_document": 0})
    for result in results:
        if job.nsp:
            for split, part in result.items():
                writers[split].add({"input_ids": part["ids"], "lengths": part["lengths"],
                                    "token_type_ids": part["tt"], "nsp_labels": part["labels"],
                                    "word_starts": part["word_starts"]})
                tokens += int(part["lengths"].sum())
                counts["nsp_random"] += int(part["labels"].sum())
                for cause in RANDOM_CAUSES:
                    counts[f"nsp_{cause}"] += part[cause]
                if split == "validation":
                    counts["nsp_validation_rows"] += len(part["lengths"])
                    counts["nsp_validation_same_document"] += part["same_document"]
                if unk is not None:
                    counts["unk_tokens"] += int(np.count_nonzero(part["ids"] == unk))
        else:
            is_val, ids, word_starts, joins = result
            packers["validation" if is_val else "train"].add(ids, word_starts, joins)
            tokens += len(ids)
            if unk is not None:
                counts["unk_tokens"] += int(np.count_nonzero(ids == unk))
        if writers["train"].shards:  # a shard is out: a fault may strike mid-unit
            faults.kill_unit(unit)
        if progress is not None:
            progress(tokens, stats.read)
    for split in SPLITS:
        packers[split].finish()
    return counts

"""Raw text -> token-id shards + manifest.json, streamed, on all cores or a Ray cluster, in bounded
memory.

    bertgpu prepare --corpus wiki.xml.bz2 books/ --tokenizer tok/ --out data/ --seq-len 128
    bertgpu prepare --corpus sample_text.txt --tokenizer tok/ --out data_nsp/ --objective mlm+nsp
    bertgpu prepare --corpus reviews.txt --format lines --tokenizer tok/ --out data/
    bertgpu prepare --corpus news.txt --format lines --tokenizer tok/ --out data/ \\
        --whole-word-segmenter jieba
    bertgpu prepare --corpus s3://bucket/fineweb/*.parquet --tokenizer tok/ \\
        --out s3://bucket/data/ --engine ray --ray-address HEAD:6379

    from bertgpu.data.prepare import prepare
    manifest = prepare(["corpus/"], "tok/", "data/", seq_len=128, objective="mlm")

How: the corpus is cut into work units (`units`: whole files up to --unit-bytes, or parts of a
larger Parquet or uncompressed line-based file), and each unit is prepared on its own
(`unit_job`): read as a stream of document parts, tokenized (`pipeline`, on the pool of
--workers processes), cut into pieces that go to train or validation by their token counts
(`split`), packed into rows (mlm, `writer`) or paired into sentence pairs (mlm+nsp), and written
as the unit's own shards. The engine (`engines`: ``local``, or ``ray`` for a cluster) only
decides where and in what order units run: the shards, the manifest and the split are the same
bytes for any engine, any --workers and any order of completion. Memory does not grow with the
corpus or with the length of a document.

Objectives
- ``mlm``: the token streams of the documents, [SEP] between documents, packed into rows of
  ``[CLS] + seq_len-2 tokens + [SEP]``; every row is full except the last of each split of each
  work unit.
- ``mlm+nsp``: BERT's sentence pairs ``[CLS] A [SEP] B [SEP]`` with next-sentence labels
  (`prepare_worker` has the recipe).

Train/validation split (`split`): ``--validation-fraction F`` holds out F of the tokens, within
a tenth of F, by whole documents when they are small enough and by chunks of documents when
there are too few (the summary and the manifest's ``split_unit`` say which);
``--validation-fraction 0`` holds out nothing; ``--validation-docs N`` holds out the first N
documents instead.

The output layout (shards, dtypes, manifest keys) is specified in docs/ARCHITECTURE.md. A local
output is written to DATADIR.tmp and renamed to DATADIR at the end; a URL output is written in
place with manifest.json last (`output`). Bad input stops the run with one line and removes what
it wrote; with --skip-bad a bad file is left out whole (a unit that read part of it before the
problem is prepared again without it, and the other parts of a file read in parts are dropped),
and listed in the manifest's ``skipped_inputs``. A run stopped otherwise (a worker or the driver
killed, Ctrl-C, a store or the network failing midway: `output.StoreFailed`) keeps its finished
units: the same command redoes only the others. Run again after the end, it finds the set made
from the same corpus and settings and does nothing; a set made otherwise at --out is an error
naming the difference, unless --overwrite (`rerun`).

A finished run warns (`prepare_warnings`) when the set is complete but not what the user
expects: mostly [UNK], NSP labels mostly one class, random next segments from A's own document.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bertgpu import __version__
from bertgpu.data.corpus import add_corpus_arguments, resolve_inputs
from bertgpu.data.document_parts import whitespace_sensitive
from bertgpu.data.engines import ENGINES, Progress, RunStopped, left_out, open_engine, run_all
from bertgpu.data.jsonl import null_text_message
from bertgpu.data.manifest import OBJECTIVES, Manifest, total_counts
from bertgpu.data.output import SHARD_SET, StoreFailed, WorkFolder, is_shard_set, shard_files
from bertgpu.data.prepare_warnings import warn_about_result
from bertgpu.data.rerun import resolved_paths, same_as_prepared
from bertgpu.data.segment import SEGMENTERS, check_segmenter
from bertgpu.data.sources import (
    check_glob_apart,
    check_not_cwd,
    check_url_apart,
    is_url,
    local_path,
    no_documents,
)
from bertgpu.data.split import MIN_UNIT_TOKENS
from bertgpu.data.tokenizer_folder import (
    TOKENIZER_FILES,
    find_tokenizer_folder,
    is_lowercase,
    load_tokenizer,
    local_tokenizer_folder,
    special_token_ids,
    tokenizer_hash,
)
from bertgpu.data.unit_job import UnitJob
from bertgpu.data.units import UNIT_BYTES, Unit, plan_record, plan_units
from bertgpu.data.writer import SPLITS
from bertgpu.errors import BertgpuError
from bertgpu.fsutil import check_apart, check_output_folder
from bertgpu.locks import output_lock


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
    for flag, value in (("--shard-size", shard_size), ("--workers", workers),
                        ("--chunk-docs", chunk_docs)):
        if value < 1:
            raise BertgpuError(f"{flag} {value}: expected 1 or more")
    if objective == "mlm+nsp" and chunk_docs < 2:
        raise BertgpuError(f"--chunk-docs {chunk_docs}: mlm+nsp takes a random next segment "
                           "from another document of the chunk; expected 2 or more")
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
    progress_lines: bool = False,
    segmenter: str | None = None,
    engine: str = "local",
    ray_address: str | None = None,
    unit_bytes: int = UNIT_BYTES,
    report: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Tokenize the corpus into shards under ``out_dir`` and return manifest.json's content.

    ``validation_docs`` (the first N documents) replaces ``validation_fraction`` when given.
    ``workers``: tokenizing processes (default: all cores), or the CPUs of a local Ray cluster;
    the output does not depend on it, nor on ``engine`` ("local" or "ray"; ``ray_address`` joins
    a running cluster). ``unit_bytes``: stored bytes per work unit (it does change the output:
    each unit packs its own rows). ``segmenter``: a whole-word segmenter (`segment.SEGMENTERS`)
    whose word starts are stored. ``report``: filled with the work units' records and how many
    an earlier run had finished (benchmarks).
    """
    workers = (os.cpu_count() or 1) if workers is None else workers
    _check_args(seq_len, objective, short_seq_prob, validation_fraction, validation_docs,
                shard_size, workers, chunk_docs, segmenter)
    if engine not in ENGINES:
        raise BertgpuError(f"--engine {engine!r}: unknown; expected one of {', '.join(ENGINES)}")
    if engine == "ray":
        from bertgpu.data.ray_engine import check_shared_inputs

        check_shared_inputs(paths)
    tokenizer_dir = local_tokenizer_folder(tokenizer_dir)
    tok_dir = find_tokenizer_folder(tokenizer_dir) or Path(tokenizer_dir)  # errors name the path
    special = special_token_ids(tok_dir)  # also checks the folder loads
    tokenizer = load_tokenizer(tok_dir)
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    spaced = whitespace_sensitive(tokenizer.to_str())  # its tokens hold the text's whitespace
    if spaced and objective == "mlm+nsp":
        raise BertgpuError(
            f"--objective mlm+nsp: the tokenizer in {tok_dir} encodes the whitespace between "
            f"sentences ({spaced}), which sentence pairs made of sentences encoded one by one "
            "would change; expected --objective mlm (ModernBERT, whose tokenizers these are, "
            "has no next-sentence head) or a WordPiece tokenizer for BERT's sentence pairs")
    tokenizer_files = {n: (tok_dir / n).read_bytes() for n in TOKENIZER_FILES
                       if (tok_dir / n).is_file()}
    dtype = np.dtype(np.uint32 if vocab_size > 65535 else np.uint16)
    skipped: list[tuple[str, str]] = []  # broken links in folders, with --skip-bad
    inputs = resolve_inputs(paths, skipped if skip_bad else None)  # before any work
    out = local_path(out_dir)  # a file:// URL is checked like the local folder it names
    check_not_cwd(out)
    if not is_url(out):  # only an earlier shard set is replaced, and only with --overwrite
        out = os.path.normpath(out)  # "sub/x/.." is sub: its name builds sub.tmp
        check_output_folder(out, SHARD_SET, replaces=is_shard_set)  # else new, empty or a set
        check_apart(out, [local_path(p) for p in (*paths, *inputs)])
        check_glob_apart(out, paths)  # what a pattern would match on a re-run
    else:
        check_url_apart(out, [*paths, *inputs])
    units = plan_units(inputs, fmt, unit_bytes)
    nsp = objective == "mlm+nsp"
    job = UnitJob(
        tokenizer_json=tokenizer.to_str(),
        tokenizer_hash=tokenizer_hash(tok_dir),
        settings={"seed": seed, "objective": objective, "seq_len": seq_len,
                  "short_seq_prob": short_seq_prob, "cls": special["cls"], "sep": special["sep"],
                  "unk": special["unk"], "segmenter": segmenter,
                  # the plan changed: units of a run that matched them as specials are redone
                  "special_tokens_in_text": "text",
                  # a tokenizer that encodes whitespace reads each document as written
                  **({"text": "as written"} if spaced else {})},
        fmt=fmt, text_field=text_field, skip_bad=skip_bad, fraction=validation_fraction,
        validation_docs=validation_docs, min_unit=4 * seq_len if nsp else MIN_UNIT_TOKENS,
        shard_size=shard_size, chunk_docs=chunk_docs, dtype=dtype.name,
        word_starts=segmenter is not None, out=out, base=os.getcwd())
    # one prepare at a time writes OUT (through OUT.tmp): two died on each other's files
    with output_lock(out, "bertgpu prepare"):
        work = WorkFolder(out, job.base)
        plan = resolved_paths({  # (local files by resolved path: ./c.txt is $PWD/c.txt)
            "created_by": f"bertgpu {__version__}", "tokenizer_hash": job.tokenizer_hash,
            "settings": job.settings, "unit_bytes": unit_bytes,
            "job": [fmt, text_field, skip_bad, validation_fraction, validation_docs, shard_size,
                    chunk_docs, dtype.name], **plan_record(units)}, job.base, mark_base=True)
        sealed = work.sealed() if not overwrite else (None, None)  # a set there: the same plan's?
        if same_as_prepared(out, *sealed, plan):  # (another plan's is an error naming how)
            if report is not None:
                report.update(done=True)
            return Manifest.parse(sealed[0], Path(work.out, "manifest.json")).to_json()
        finished = work.begin(plan, overwrite)
        bar = Progress(units, finished, progress, lines=progress_lines)
        try:
            runner = open_engine(engine, job, workers, ray_address, bar)
            try:
                records = run_all(runner, units, finished, validation_docs)
            finally:
                runner.close()
            kept = sorted(i for i in finished if records[i] is finished[i])  # (not run again)
            bar.close()
            _leave_out_skipped_parts(units, records, work)
            work.check_arrived(records, engine)
            manifest = _manifest(job, units, records, vocab_size, tok_dir, special, seed,
                                 None if validation_docs is not None else validation_fraction,
                                 skipped)
            work.seal(manifest.dumps(), tokenizer_files)
        except RunStopped:
            raise  # the finished units stay for a re-run (its message says so)
        except StoreFailed as exc:  # checking or sealing: the store, not the input
            raise RunStopped(f"{exc}; the work units finished so far are kept in {work.folder}; "
                             "the same command goes on from them") from None
        except KeyboardInterrupt:  # Ctrl-C, SIGTERM: the finished units stay for a re-run
            print(f"bertgpu prepare: the work units finished so far are kept in {work.folder}; the "
                  "same command goes on from them", file=sys.stderr, flush=True)
            raise
        except BaseException:
            work.discard()
            raise
        finally:
            bar.close()
        if report is not None:
            report.update(units=[records[u.index] for u in units], resumed=len(kept), kept=kept,
                          engine=engine)
        warn_about_result([records[u.index] for u in units], manifest, tokenizer_dir)
        return manifest.to_json()


def _leave_out_skipped_parts(units: list[Unit], records: dict[int, dict[str, Any]],
                             work: WorkFolder) -> None:
    """A file read in parts by several units and skipped by one of them (--skip-bad) is left out
    whole: the other parts' units (one piece each) are emptied and their shards removed."""
    for index in sorted(left_out(units, records)):
        record = records[index]
        work.remove(shard_files(record))
        records[index] = {
            **record, "documents": 0, "slices": {}, "nulls": {}, "cut_documents": 0,
            "splits": {s: {"sequences": 0, "tokens": 0, "documents": 0, "shards": []}
                       for s in record["splits"]},
            **{k: 0 for k in record if k == "unk_tokens" or k.startswith("nsp_")}}


def _manifest(job: UnitJob, units: list[Unit], records: dict[int, dict[str, Any]],
              vocab_size: int, tok_dir: Path, special: dict[str, int], seed: int,
              fraction: float | None, skipped_before: list[tuple[str, str]] = ()) -> Manifest:
    """The manifest of the finished units, in unit order (so in corpus order).
    ``skipped_before``: inputs left out before any unit ran (broken links, --skip-bad)."""
    ordered = [records[u.index] for u in units]
    skipped = list(skipped_before)
    for path, reason in (tuple(s) for r in ordered for s in r["skipped"]):
        if (path, reason) not in skipped:  # a file in parts may be skipped by two of them
            skipped.append((path, reason))
    bad = {p for p, _ in skipped}
    texts: dict[str, int] = {}
    nulls: dict[str, int] = {}  # rows of null text skipped, per file
    for r in ordered:
        for path, n in r["slices"].items():
            texts[path] = texts.get(path, 0) + n
        for path, n in r.get("nulls", {}).items():  # (not in a record of an older version)
            nulls[path] = nulls.get(path, 0) + n
    for path, n in texts.items():  # a file read in parts: did any part have text?
        if n == 0 and path not in bad:
            message = (null_text_message(path, nulls[path]) if nulls.get(path) else
                       f"{path}: no text (only blank lines, markup or control characters); "
                       "expected at least one document")
            if not job.skip_bad:
                raise BertgpuError(message)
            skipped.append((path, message))
            bad.add(path)
    documents = sum(r["documents"] for r in ordered)
    if documents == 0:
        raise no_documents(skipped, "text to tokenize")
    splits = {s: {"sequences": sum(r["splits"][s]["sequences"] for r in ordered),
                  "tokens": sum(r["splits"][s]["tokens"] for r in ordered),
                  "documents": sum(r["splits"][s]["documents"] for r in ordered),
                  "shards": [shard for r in ordered for shard in r["splits"][s]["shards"]]}
              for s in SPLITS}
    if splits["train"]["sequences"] == 0:
        if splits["validation"]["sequences"] == 0:  # (only documents with tokens are counted)
            raise BertgpuError("the corpus gave no tokens; expected text to tokenize")
        asked = (f"--validation-docs {job.validation_docs}" if job.validation_docs is not None
                 else f"--validation-fraction {job.fraction}")
        raise BertgpuError(f"{asked}: the corpus has {documents} documents and all of them were "
                           "held out, leaving no training data; expected fewer held out")
    counts = total_counts(splits, documents)
    null_rows = sum(n for path, n in nulls.items() if path not in bad)
    if null_rows:  # only then: the manifest of a corpus without nulls is as it was
        counts["null_rows"] = null_rows
    by_docs = job.validation_docs is not None
    none = job.validation_docs == 0 if by_docs else job.fraction <= 0
    cut = sum(r["cut_documents"] for r in ordered)
    return Manifest(
        objective=job.settings["objective"], seq_len=job.settings["seq_len"], dtype=job.dtype,
        vocab_size=vocab_size, tokenizer_hash=job.tokenizer_hash,
        do_lower_case=is_lowercase(tok_dir), special_tokens=special, seed=seed,
        validation_fraction=fraction, validation_docs=job.validation_docs,
        split_unit="none" if none else "chunk" if cut else "document", cut_documents=cut,
        validation_share=round(splits["validation"]["tokens"] / max(counts["tokens"], 1), 6),
        whole_word_segmenter=job.settings["segmenter"], counts=counts, splits=splits,
        inputs=_inputs(ordered, bad), skipped_inputs=[{"path": p, "reason": r} for p, r in skipped],
        created_by=f"bertgpu {__version__}",
    )


def _inputs(records: list[dict[str, Any]], bad: set[str]) -> list[dict[str, Any]]:
    """The manifest's ``inputs``: path, stored bytes and sha256 of each file read; a file read
    in parts has the sha256 of each part's bytes instead (no one worker read all of it)."""
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        for piece in r["inputs"]:
            path, (a, b) = piece["path"], piece["span"]
            if path in bad:
                continue
            if piece["parts"] == 1:
                out[path] = {"path": path, "bytes": b - a, "sha256": piece["sha256"]}
                continue
            entry = out.setdefault(path, {"path": path, "bytes": 0, "parts": []})
            entry["bytes"] += b - a
            entry["parts"].append({"start": a, "end": b, "sha256": piece["sha256"]})
    return list(out.values())


def split_summary(manifest: dict[str, Any]) -> str:
    """One line on the validation split: its share of the tokens and how it was cut."""
    val, share = manifest["splits"]["validation"], manifest.get("validation_share", 0.0)
    unit = manifest.get("split_unit")
    if unit == "none":  # named by the flag that asked for it
        given = "docs" if manifest.get("validation_docs") is not None else "fraction"
        return f"no validation split (--validation-{given} 0)"
    if manifest.get("validation_docs") is not None:
        return (f"validation: the first {manifest['validation_docs']} documents, "
                f"{val['sequences']} sequences, {share:.2%} of the tokens")
    asked = manifest["validation_fraction"]
    text = (f"validation: {val['sequences']} sequences, {share:.2%} of the tokens "
            f"(asked {asked:.2%})")
    if manifest.get("objective") == "mlm+nsp":  # the split counts the corpus's tokens
        text = (f"validation: {val['sequences']} sequences, {share:.2%} of the shards' tokens "
                f"(asked {asked:.2%} of the corpus's: sentence pairs add [CLS], [SEP] and "
                "random next sentences, in other proportions in a small split)")
    if unit == "chunk":
        n = manifest["counts"]["documents"]
        return (f"{text}; split by chunks of documents: {manifest['cut_documents']} of {n} "
                "documents have chunks on both sides (a document larger than the split unit, "
                "a small share of the validation target, is held out in chunks so that the "
                "share stays near the one asked)")
    return f"{text}; split by whole documents"


# --------------------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_corpus_arguments(parser)
    parser.add_argument("--tokenizer", required=True, metavar="TOKDIR",
                        help="output of `bertgpu tokenizer`, a Hugging Face model folder "
                             "(vocab.txt or tokenizer.json), or a bertgpu run folder (its "
                             "tokenizer/): the vocabulary of a model to continue pretraining")
    parser.add_argument("--out", required=True, metavar="DATADIR",
                        help="output folder: new or empty, or this command's earlier output "
                             "(the same corpus and settings: nothing to do; others: an error), "
                             "or a URL (s3://bucket/data/, ...)")
    parser.add_argument("--seq-len", type=int, default=128,
                        help="tokens per sequence incl. [CLS]/[SEP] (default 128)")
    parser.add_argument("--objective", choices=OBJECTIVES, default="mlm",
                        help="mlm: packed full rows; mlm+nsp: BERT sentence pairs (default mlm)")
    parser.add_argument("--short-seq-prob", type=float, default=None,
                        help="mlm+nsp: probability of a shorter target length (default 0.1)")
    val = parser.add_mutually_exclusive_group()
    val.add_argument("--validation-fraction", type=float, default=0.01,
                     help="share of the text held out, by documents or, with too few, by chunks of "
                          "documents (default 0.01; 0 = none)")
    val.add_argument("--validation-docs", type=int, default=None,
                     help="hold out the first N documents instead")
    parser.add_argument("--seed", type=int, default=12345,
                        help="seed of the split and the NSP choices (default 12345)")
    parser.add_argument("--shard-size", type=int, default=65536,
                        help="sequences per shard file (default 65536)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="tokenizing processes, 1 or more (default: all cores), or the "
                             "CPUs of the local Ray cluster --engine ray starts; the output does "
                             "not depend on it")
    parser.add_argument("--engine", choices=ENGINES, default="local",
                        help="local: this machine's processes (default); ray: the work units as "
                             "tasks on a Ray cluster (needs bertgpu[ray]); the same output")
    parser.add_argument("--ray-address", default=None, metavar="HOST:PORT",
                        help="--engine ray: join this running cluster (what `ray start --head` "
                             "printed) instead of starting one on this machine; default: "
                             "RAY_ADDRESS when set, as Ray itself does")
    parser.add_argument("--unit-bytes", type=int, default=UNIT_BYTES, metavar="BYTES",
                        help="stored bytes per work unit: whole files up to this, larger "
                             "Parquet and uncompressed files in parts of it (default 64 MiB)")
    parser.add_argument("--chunk-docs", type=int, default=None,
                        help="mlm+nsp: documents (or pieces of long ones) per chunk (at most "
                             "about 1M characters), the pool random B segments come from; a "
                             "chunk of few long documents also draws from earlier documents of "
                             "its work unit (default 1000)")
    parser.add_argument("--whole-word-segmenter", choices=SEGMENTERS, default=None,
                        help="store word boundaries for whole-word masking of Chinese (needs "
                             "`pip install 'bertgpu[zh]'`, or jieba)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the shard set an earlier prepare wrote in --out (any other "
                             "non-empty folder is still refused)")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


def _rate(per_s: float) -> str:
    """Tokens/s as people read them: "1.99 M", "7.6 k" (a small corpus read "0.00 M")."""
    return f"{per_s / 1e6:.2f} M" if per_s >= 1e5 else f"{per_s / 1e3:.1f} k"


def main(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    nsp_settings = {name: value for name, value in (("short_seq_prob", args.short_seq_prob),
                                                    ("chunk_docs", args.chunk_docs))
                    if value is not None}  # given: only mlm+nsp draws pairs from chunks
    for name, value in nsp_settings.items():
        if args.objective != "mlm+nsp":
            raise BertgpuError(f"--{name.replace('_', '-')} {value}: only with --objective "
                               "mlm+nsp (mlm packs whole rows in corpus order and draws no pairs)")
    report: dict[str, Any] = {}
    manifest = prepare(
        args.corpus, args.tokenizer, args.out, seq_len=args.seq_len, objective=args.objective,
        validation_fraction=args.validation_fraction,
        validation_docs=args.validation_docs, seed=args.seed, shard_size=args.shard_size,
        workers=args.workers, fmt=args.format, text_field=args.text_field, skip_bad=args.skip_bad,
        overwrite=args.overwrite, progress=sys.stderr.isatty(), progress_lines=True,
        segmenter=args.whole_word_segmenter, engine=args.engine, ray_address=args.ray_address,
        unit_bytes=args.unit_bytes, report=report, **nsp_settings,
    )
    c, s = manifest["counts"], time.perf_counter() - start
    if report.get("done"):
        print(f"prepare: {args.out} already holds this shard set, prepared from the same corpus "
              f"with the same tokenizer and settings ({_count(c['documents'], 'document')} -> "
              f"{c['sequences']} sequences); nothing to do (--overwrite prepares it again)")
        return 0
    kept = set(report["kept"])  # units an earlier run tokenized: not in this run's rate
    new = sum(split["tokens"] for r in report["units"] if r["unit"] not in kept
              for split in r["splits"].values())
    print(f"prepare: {_count(c['documents'], 'document')} -> {c['sequences']} sequences, "
          f"{c['tokens']} "
          f"tokens (train {manifest['splits']['train']['sequences']}, validation "
          f"{manifest['splits']['validation']['sequences']}) in {s:.1f}s, "
          f"{_rate(new / max(s, 1e-9))} tokens/s"
          + (f" (the {new} tokens of the units this run tokenized)" if kept else "")
          + f" -> {args.out}")
    if c.get("null_rows"):
        n = c["null_rows"]
        print(f"prepare: {n} null text{'s' if n != 1 else ''} skipped (a row whose text is null "
              "is no document, in Parquet, Arrow and JSON Lines alike)")
    print(f"prepare: {split_summary(manifest)}")
    units, resumed = len(report["units"]), report["resumed"]
    print(f"prepare: {_count(units, 'work unit')} on the {args.engine} engine"
          + (f", {resumed} of them finished by an earlier run and kept" if resumed else ""))
    for item in manifest["skipped_inputs"]:
        print(f"prepare: skipped {item['reason']}")
    if manifest.get("whole_word_segmenter"):  # no shipped config turns whole-word masking on
        print(f"prepare: {manifest['whole_word_segmenter']} word starts stored with the shards; "
              "pretraining uses them only with data.whole_word_masking = true (`bertgpu "
              "pretrain ... --data.whole_word_masking true`), otherwise it masks single tokens")
    return 0

"""WordPiece tokenizer training, into files that transformers' AutoTokenizer loads.

    bertgpu tokenizer --corpus wiki.xml.bz2 books/ --vocab-size 30522 --out tok/
    bertgpu tokenizer --corpus data.jsonl --text-field body --vocab-size 32000 --cased --out tok/
    bertgpu tokenizer --corpus s3://bucket/fineweb/ --sample-bytes 2000000000 --out tok/

    from bertgpu.data.tokenizer_folder import load_tokenizer
    tok = load_tokenizer("tok/")                     # a tokenizers.Tokenizer
    tok.encode("Hello world", "Second segment").ids  # [CLS] A [SEP] B [SEP]

The pipeline is BERT's: BertNormalizer (clean text, CJK characters split one by one, lower-case
and strip accents unless --cased), BertPreTokenizer, WordPiece with "##" continuations,
[CLS]/[SEP] templates with token type ids. Special tokens [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4.

The corpus is read like `bertgpu prepare` reads it (every format, URLs). ``--sample-bytes N``
trains on about N bytes of text (UTF-8: 3 bytes a CJK character) spread over the whole corpus
(`units.sample_plan`): each file gets a share of N proportional to its size, read as evenly
spaced windows of an uncompressed line-based or Parquet file, or by reading a compressed file,
wiki dump or Arrow file through and keeping every k-th document (a URL's from its start:
through, it would be downloaded whole); a vocabulary of a remote corpus without downloading all
of it. The sample is the same on every run.

The output folder holds vocab.txt, tokenizer.json, tokenizer_config.json (BertTokenizerFast),
special_tokens_map.json and trained-from.json (the settings and the corpus files' versions: the
same command run again finds the folder trained that way and does nothing, `rerun`). Loading a
folder (`load_tokenizer`, `is_lowercase`, `tokenizer_hash`) is `tokenizer_folder`'s: any Hugging
Face BERT folder, encoded as transformers' AutoTokenizer encodes it.

With --skip-bad a file skipped after part of its text was read is left out whole, as `prepare`
leaves it out: the corpus is read again without it before the trainer runs.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

from bertgpu.data.corpus import (
    FORMATS,
    CorpusStats,
    Piece,
    add_corpus_arguments,
    convert_item,
    iter_piece_items,
    resolve_inputs,
    settle_parts,
)
from bertgpu.data.rerun import TRAINED, same_as_trained, tokenizer_record
from bertgpu.data.sources import (
    check_glob_apart,
    check_not_cwd,
    file_version,
    is_url,
    local_path,
    no_documents,
)
from bertgpu.data.tokenizer_folder import (
    MAX_WORD_CHARS,
    SPECIAL_TOKEN_MAP,
    SPECIAL_TOKENS,
    load_tokenizer,
)
from bertgpu.errors import BertgpuError
from bertgpu.fsutil import (
    check_apart,
    check_output_folder,
    check_siblings,
    human_bytes,
    make_scratch,
    remove_marked,
    replace_dir,
)
from bertgpu.locks import output_lock

__all__ = ["train_tokenizer"]

VOCAB_SHORTFALL_WARN = 0.75
"""A vocabulary under this share of --vocab-size is a warning (the summary line gives the size
in every case: a corpus often gives a few percent fewer pieces than asked)."""
MODEL_MAX_LENGTH = 512
STRIP_SAMPLE_BYTES = 1 << 20
"""Bytes of the trainer's copy of the corpus that the accent-stripping check reads, as
STRIP_SAMPLE_WINDOWS evenly spaced windows: the first MiB alone missed 1.5 MB of Japanese
after 1.1 MB of English (and warned with the files given the other way round)."""
STRIP_SAMPLE_WINDOWS = 16


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------- training


def train_tokenizer(
    paths: list[str | os.PathLike],
    out_dir: str | os.PathLike,
    vocab_size: int = 30522,
    lowercase: bool = True,
    min_frequency: int = 2,
    fmt: str = "auto",
    skip_bad: bool = False,
    text_field: str = "text",
    strip_accents: bool | None = None,
    limit_alphabet: int = 1000,
    stats: CorpusStats | None = None,
    sample_bytes: int | None = None,
    report: dict | None = None,
) -> Path:
    """Train a WordPiece vocabulary on the corpus and write an AutoTokenizer-loadable folder.

    ``strip_accents=None`` follows ``lowercase`` (BERT's convention: uncased models also drop
    accents). ``sample_bytes``: train on about that many bytes of text spread over the corpus.
    The folder is written as ``OUT.tmp`` and renamed, so it is complete or absent. A folder
    trained the same way (its trained-from.json: the settings and the corpus files' versions)
    is kept as it is, and ``report["done"]`` set; one trained otherwise is an error naming how.
    """
    if sample_bytes is not None and sample_bytes < 1:
        raise BertgpuError(f"--sample-bytes {sample_bytes}: expected 1 or more")
    if vocab_size < len(SPECIAL_TOKENS) + 1:
        raise BertgpuError(f"--vocab-size {vocab_size}: too small; expected at least "
                           f"{len(SPECIAL_TOKENS) + 1}")
    if min_frequency < 1:
        raise BertgpuError(f"--min-frequency {min_frequency}: expected 1 or more")
    if limit_alphabet < 1:  # 0 kept no character (a vocabulary of the specials alone)
        raise BertgpuError(f"--limit-alphabet {limit_alphabet}: expected 1 or more (the most "
                           "distinct characters kept; default 1000)")
    out_dir = local_path(out_dir)  # a file:// URL is the local folder it names
    if is_url(out_dir):  # Path() would make "s3:/b/tok" a local folder
        raise BertgpuError(f"--out {out_dir}: the tokenizer writes a local folder; "
                           "expected a local path (copy the folder to the store afterwards)")
    check_not_cwd(out_dir)
    out = Path(os.path.normpath(out_dir))  # "sub/x/.." is sub: its name builds sub.tmp
    if fmt not in FORMATS:
        raise BertgpuError(f"--format {fmt!r}: unknown; expected one of {', '.join(FORMATS)}")
    broken: list[tuple[str, str]] = []  # broken links in folders, with --skip-bad
    inputs = resolve_inputs(paths, broken if skip_bad else None)  # before any work
    strip = {None: "auto", True: "yes", False: "no"}[strip_accents]
    record = tokenizer_record(inputs, {
        "vocab_size": vocab_size, "cased": not lowercase, "strip_accents": strip,
        "min_frequency": min_frequency, "format": fmt, "text_field": text_field,
        "skip_bad": skip_bad, "limit_alphabet": limit_alphabet, "sample_bytes": sample_bytes,
    }, file_version)
    if same_as_trained(out, record):  # a re-run: nothing to do (another record raises)
        if report is not None:
            report["done"] = True
        return out
    _check_out_dir(out, paths, inputs)
    stats = stats if stats is not None else CorpusStats()

    from bertgpu.data.wordpiece import (  # (it imports _pipeline)
        new_wordpiece,
        train_on_copy,
        warn_stripped_letters,
    )

    tok = new_wordpiece(lowercase, strip_accents)
    with output_lock(out, "bertgpu tokenizer"):  # one at a time writes OUT (OUT.tmp)
        tmp = make_scratch(out.with_name(out.name + ".tmp"), out)
        try:
            copy = tmp / "corpus.txt"
            alphabet, pieces = _copy_corpus(tok, copy, inputs, broken, fmt, text_field, skip_bad,
                                            stats, sample_bytes, limit_alphabet, vocab_size)
            tok = train_on_copy(tok, copy, alphabet, pieces, lowercase, strip_accents, vocab_size,
                                min_frequency)
            if lowercase if strip_accents is None else strip_accents:
                warn_stripped_letters(_spread_sample(copy))
            copied = copy.stat().st_size
            copy.unlink()
            if report is not None and sample_bytes is not None:
                report["sample_bytes"] = copied  # what the summary line says was trained on
            got = tok.get_vocab_size(with_added_tokens=True)
            if got < VOCAB_SHORTFALL_WARN * vocab_size:  # a few percent short is the corpus's way
                warnings.warn(_shortfall(vocab_size, got, min_frequency, sample_bytes, inputs,
                                         copied), stacklevel=2)
            _write_folder(tok, tmp, lowercase, strip_accents)
            # (ASCII: a file name that is not UTF-8 is kept as its escaped surrogates)
            (tmp / TRAINED).write_text(json.dumps(record, indent=2) + "\n", encoding="ascii")
            if out.exists():
                out.rmdir()  # _check_out_dir made sure it is empty
            replace_dir(tmp, out)
        except BaseException:
            remove_marked(tmp)
            raise
    return out


def _spread_sample(copy: Path) -> str:
    """About STRIP_SAMPLE_BYTES of the text of ``copy``, all of it or STRIP_SAMPLE_WINDOWS
    windows spread evenly from its start to its end (a window cut inside a character gives a
    replacement character, which is no letter)."""
    size = copy.stat().st_size
    with open(copy, "rb") as f:
        if size <= STRIP_SAMPLE_BYTES:
            return f.read().decode("utf-8", errors="replace")
        width = STRIP_SAMPLE_BYTES // STRIP_SAMPLE_WINDOWS
        windows = []
        for k in range(STRIP_SAMPLE_WINDOWS):
            f.seek(k * (size - width) // (STRIP_SAMPLE_WINDOWS - 1))
            windows.append(f.read(width).decode("utf-8", errors="replace"))
    return "\n".join(windows)


def _shortfall(vocab_size: int, got: int, min_frequency: int, sample_bytes: int | None,
               inputs: list, copied: int) -> str:
    """The warning of a vocabulary well short of --vocab-size, naming what limited it:
    --sample-bytes when the sample was smaller than the corpus (`--sample-bytes 1` gave 6 tokens,
    and the warning asked for a larger corpus), else the corpus. A compressed file's stored size
    is not its text's: there, a sample that filled half of --sample-bytes (`copied`: the bytes
    of text kept; the sampler keeps N/2 to N of a larger corpus) names --sample-bytes too."""
    from bertgpu.data.sources import file_size
    from bertgpu.data.units import is_compressed

    seen = f"pieces seen at least --min-frequency {min_frequency} times"
    if sample_bytes is not None and (
            sample_bytes < sum(file_size(src) for src in inputs)
            or (2 * copied >= sample_bytes and any(is_compressed(src) for src in inputs))):
        return (f"--vocab-size {vocab_size}: the --sample-bytes {sample_bytes} sample of the "
                f"corpus gave only {got} tokens ({seen}); expected a larger --sample-bytes (or "
                "none: the whole corpus), or a smaller --vocab-size")
    return (f"--vocab-size {vocab_size}: the corpus gave only {got} tokens ({seen}); expected a "
            "larger or more varied corpus, or a smaller --vocab-size")


def _copy_corpus(tok, copy: Path, inputs: list, before: list[tuple[str, str]], fmt: str,
                 text_field: str, skip_bad: bool, stats: CorpusStats, sample_bytes: int | None,
                 limit_alphabet: int, vocab_size: int) -> tuple[list[str], list[str]]:
    """Read the corpus files ``inputs`` (`resolve_inputs`; ``before``: the broken links it
    skipped) into the trainer's copy (`wordpiece.copy_corpus`): (alphabet, pieces); ``stats``
    counts what the copy holds.

    A file skipped (--skip-bad) after some of its text was read is left out whole, as `prepare`
    leaves it out: the corpus is read again without the files skipped the first time (their
    reasons kept), so that neither the vocabulary nor the counts hold any of its text. A corpus
    with no document, or whose text is only characters BERT's normaliser removes or runs that
    can only be [UNK] (`_no_text`), is an error.
    """
    from bertgpu.data.wordpiece import copy_corpus

    left_out: set[str] = set()
    while True:
        read = CorpusStats(skipped=list(before))
        kept = [src for src in inputs if str(src) not in left_out]
        parts = _document_parts(kept, fmt, text_field, skip_bad, read, sample_bytes)
        alphabet, pieces = copy_corpus(parts, tok, copy, limit_alphabet, vocab_size)
        skipped_now = {path for path, _ in read.skipped[len(before):]}
        if not set(read.partial) | {p for p in skipped_now if read.slices.get(p)}:
            break
        left_out |= skipped_now
        before = read.skipped
    for f in fields(CorpusStats):  # the caller's stats describe the pass that counts
        setattr(stats, f.name, getattr(read, f.name))
    if stats.documents == 0:
        raise no_documents(stats.skipped, "text to train on")
    if not alphabet:
        bad = {path for path, _ in stats.skipped}
        names = [str(src) for src in kept if str(src) not in bad]
        more = f" and {len(names) - 3} more files" if len(names) > 3 else ""
        raise BertgpuError(f"{', '.join(names[:3])}{more}: {_no_text(copy)}")
    return alphabet, pieces


def _no_text(copy: Path) -> str:
    """Why a corpus with documents left no character to train on, read off the trainer's copy:
    it holds the text as read, less the runs of letters longer than MAX_WORD_CHARS (each cut to
    a space, `wordpiece._without_unknown_words`). Nothing but spaces and line breaks left: all
    of the text was such runs (base64, hex, a script without spaces), which the warning before
    counted; anything else left is what BERT's normaliser removes."""
    with open(copy, encoding="utf-8", errors="replace") as f:
        while chunk := f.read(1 << 20):
            if chunk.strip(" \t\r\n"):
                return ("no text (only control or format characters, which BERT's normaliser "
                        "removes); expected text to train on")
    return (f"no text left to train on: all of it is in runs of letters or digits longer than "
            f"{MAX_WORD_CHARS} characters without a space or punctuation, which BERT encodes as "
            "[UNK] and the vocabulary's training leaves out; expected text split into words "
            "(not base64 or hex data; Thai: PyThaiNLP's word_tokenize)")


def _document_parts(inputs: list, fmt: str, text_field: str, skip_bad: bool, stats: CorpusStats,
                    sample_bytes: int | None) -> Iterator[tuple[list[str], bool]]:
    """The document parts of the files ``inputs`` (`corpus.iter_document_parts`), or with
    ``sample_bytes`` of a sample of about that many bytes of text (UTF-8) spread over them."""
    if sample_bytes is None:
        raw = iter_piece_items([Piece(src) for src in inputs], fmt, text_field, skip_bad, stats)
    else:
        raw = _sample_items(inputs, fmt, text_field, skip_bad, stats, sample_bytes)
    return settle_parts((convert_item(item) for item in raw), skip_bad, stats)


def _sample_items(inputs: list, fmt: str, text_field: str, skip_bad: bool, stats: CorpusStats,
                  sample_bytes: int) -> Iterator[tuple]:
    """The raw items of a sample spread over the files (`units.sample_plan`): each file's share
    in proportion to its size, from evenly spaced windows or every k-th document. A file read in
    windows closes with one "end" event, so that it counts as one file and "no text" means none
    of its windows had any."""
    from bertgpu.data.sources import file_size
    from bertgpu.data.units import every_kth_document, sample_plan, sample_quota

    sizes = [file_size(src) for src in inputs]
    total = sum(sizes) or 1
    plans = [sample_plan(src, size, fmt, sample_bytes * size / total)
             for src, size in zip(inputs, sizes, strict=True)]
    quota = sample_quota([p for pieces, _ in plans for p in pieces], sample_bytes)
    for pieces, through in plans:
        if through:
            items = iter_piece_items(pieces, fmt, text_field, skip_bad, stats)
            yield from every_kth_document(items, quota(pieces[0]))
            continue
        slices = 0
        for item in iter_piece_items(pieces, fmt, text_field, skip_bad, stats, quota=quota):
            if item[0] == "slice":
                slices += 1
                if slices == len(pieces):
                    yield "end", item[1], False
                continue
            yield item
            if item[0] == "bad":  # the file is skipped: its other windows are not read
                break


def _check_out_dir(out: Path, paths: list[str | os.PathLike], inputs: list) -> None:
    """``out`` is new or empty and apart from the corpus: the paths given (file:// ones are
    local too), the files they resolved to (``inputs``), and what a pattern would match on a
    re-run; as `prepare` checks its output."""
    check_output_folder(out, "a new output folder")
    if out.exists() and any(out.iterdir()):
        raise BertgpuError(f"{out}: already exists and is not empty; expected a new output folder")
    check_siblings(out)
    check_apart(out, [local_path(p) for p in (*paths, *inputs)])
    check_glob_apart(out, paths)


def _write_folder(tok, folder: Path, lowercase: bool, strip_accents: bool | None) -> None:
    vocab = tok.get_vocab(with_added_tokens=True)
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise RuntimeError("vocabulary ids are not contiguous")
    with open(folder / "vocab.txt", "w", encoding="utf-8") as f:
        f.writelines(t + "\n" for t, _ in by_id)
    tok.save(str(folder / "tokenizer.json"))
    # null = "same as do_lower_case" for transformers, like the original BERT uncased/cased configs.
    strip = None if strip_accents is None or strip_accents == lowercase else strip_accents
    config = {
        "tokenizer_class": "BertTokenizerFast",
        "do_lower_case": lowercase,
        "strip_accents": strip,
        "tokenize_chinese_chars": True,
        "clean_up_tokenization_spaces": True,
        "model_max_length": MODEL_MAX_LENGTH,
        **SPECIAL_TOKEN_MAP,
    }
    _write_json(folder / "tokenizer_config.json", config)
    _write_json(folder / "special_tokens_map.json", dict(SPECIAL_TOKEN_MAP))


# --------------------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_corpus_arguments(parser)
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="output folder: new or empty, or this command's earlier output "
                             "(the same corpus and settings: nothing to do; others: an error)")
    parser.add_argument("--vocab-size", type=int, default=30522,
                        help="vocabulary size, never exceeded: when the alphabet (each "
                             "character and its ## piece) does not fit, the most frequent "
                             "characters that fit are kept, with a warning (default 30522)")
    parser.add_argument("--min-frequency", type=int, default=2,
                        help="minimum count of a merged piece (default 2)")
    parser.add_argument("--cased", action="store_true",
                        help="keep case and accents (default: lower-case)")
    parser.add_argument("--strip-accents", choices=["auto", "yes", "no"], default="auto",
                        help="accent stripping; auto = with lower-casing, like BERT (default)")
    parser.add_argument("--limit-alphabet", type=int, default=1000,
                        help="most distinct characters kept in the initial alphabet, CJK "
                        "ideographs aside (kept as far as --vocab-size has room after them); "
                        "fewer when --vocab-size has no room for them all (default 1000)")
    parser.add_argument("--sample-bytes", type=int, default=None, metavar="N",
                        help="train on about N bytes of text (UTF-8) spread over the whole corpus "
                             "instead of all of it: each file's share in proportion to its size, "
                             "from evenly spaced stretches of it (a compressed file, wiki dump "
                             "or Arrow file is read through, keeping every k-th document; a "
                             "remote one from its start, not downloaded whole)")


def main(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    stats = CorpusStats()
    strip = {"auto": None, "yes": True, "no": False}[args.strip_accents]
    report: dict = {}
    out = train_tokenizer(
        args.corpus, args.out, vocab_size=args.vocab_size, lowercase=not args.cased,
        min_frequency=args.min_frequency, fmt=args.format, skip_bad=args.skip_bad,
        text_field=args.text_field, strip_accents=strip, limit_alphabet=args.limit_alphabet,
        stats=stats, sample_bytes=args.sample_bytes, report=report,
    )
    size = load_tokenizer(out).get_vocab_size(with_added_tokens=True)
    if report.get("done"):
        print(f"tokenizer: {out} already holds this tokenizer (vocab {size}), trained on the same "
              "corpus with the same settings; nothing to do")
        return 0
    sample = (f" (a sample: {human_bytes(report['sample_bytes'])} of text)"
              if "sample_bytes" in report else "")
    print(f"tokenizer: vocab {size} ({'uncased' if not args.cased else 'cased'}) from "
          f"{stats.summary(documents=not sample)}{sample} in {time.perf_counter() - start:.1f}s "
          f"-> {out}")
    for _, reason in stats.skipped:  # a line each, as prepare's
        print(f"tokenizer: skipped {reason}")
    return 0

"""WordPiece tokenizer training and loading, in files that transformers' AutoTokenizer loads.

    bertgpu tokenizer --corpus wiki.xml.bz2 books/ --vocab-size 30522 --out tok/
    bertgpu tokenizer --corpus data.jsonl --text-field body --vocab-size 32000 --cased --out tok/
    bertgpu tokenizer --corpus s3://bucket/fineweb/ --sample-bytes 2000000000 --out tok/

    from bertgpu.data.tokenizer import load_tokenizer
    tok = load_tokenizer("tok/")                     # a tokenizers.Tokenizer
    tok.encode("Hello world", "Second segment").ids  # [CLS] A [SEP] B [SEP]

The pipeline is BERT's: BertNormalizer (clean text, CJK characters split one by one, lower-case
and strip accents unless --cased), BertPreTokenizer, WordPiece with "##" continuations,
[CLS]/[SEP] templates with token type ids. Special tokens [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4.

The corpus is read like `bertgpu prepare` reads it (every format, URLs). ``--sample-bytes N``
trains on about N bytes of text spread over the whole corpus: from each file, or part of a
large Parquet or uncompressed file (`units.split_file`), a share of N proportional to its size,
read from its start; a vocabulary of a remote corpus without downloading all of it.

The output folder holds vocab.txt, tokenizer.json, tokenizer_config.json (BertTokenizerFast)
and special_tokens_map.json. `load_tokenizer` also accepts any Hugging Face BERT folder that has
only vocab.txt (+ tokenizer_config.json).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

from bertgpu.data.corpus import (
    CorpusStats,
    add_corpus_arguments,
    convert_item,
    iter_document_parts,
    iter_piece_items,
    resolve_inputs,
    settle_parts,
)
from bertgpu.data.sources import check_not_cwd, is_url
from bertgpu.errors import BertgpuError
from bertgpu.fsutil import (
    check_apart,
    check_output_folder,
    check_siblings,
    make_scratch,
    replace_dir,
)

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB_SHORTFALL_WARN = 0.75
"""A vocabulary under this share of --vocab-size is a warning (the summary line gives the size
in every case: a corpus often gives a few percent fewer pieces than asked)."""
MAX_WORD_CHARS = 100
"""A longer word encodes as [UNK] (BERT's max_input_chars_per_word)."""
_SPECIAL_KEYS = {"pad": "pad_token", "unk": "unk_token", "cls": "cls_token", "sep": "sep_token",
                 "mask": "mask_token"}
_DEFAULT_SPECIAL = dict(zip(_SPECIAL_KEYS.values(), SPECIAL_TOKENS, strict=True))
MODEL_MAX_LENGTH = 512
# Files `prepare` copies into a data folder and `save_pretrained` next to a model.
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json")


# --------------------------------------------------------------------------- building blocks


def _pipeline(tokenizer, lowercase: bool, strip_accents: bool | None, cls_id: int, sep_id: int,
              cls: str = "[CLS]", sep: str = "[SEP]") -> None:
    """Attach BERT's normaliser, pre-tokenizer, templates and decoder to a WordPiece tokenizer."""
    from tokenizers import decoders, normalizers, pre_tokenizers, processors

    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=strip_accents, lowercase=lowercase
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0",
        pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, cls_id), (sep, sep_id)],
    )
    tokenizer.decoder = decoders.WordPiece(prefix="##")


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
) -> Path:
    """Train a WordPiece vocabulary on the corpus and write an AutoTokenizer-loadable folder.

    ``strip_accents=None`` follows ``lowercase`` (BERT's convention: uncased models also drop
    accents). ``sample_bytes``: train on about that many bytes of text spread over the corpus.
    The folder is written as ``OUT.tmp`` and renamed, so it is complete or absent.
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
    if is_url(os.fspath(out_dir)):  # Path() would make "s3:/b/tok" a local folder
        raise BertgpuError(f"--out {os.fspath(out_dir)}: the tokenizer writes a local folder; "
                           "expected a local path (copy the folder to the store afterwards)")
    check_not_cwd(out_dir)
    out = Path(os.path.normpath(out_dir))  # "sub/x/.." is sub: its name builds sub.tmp
    _check_out_dir(out, paths)
    stats = stats if stats is not None else CorpusStats()

    from bertgpu.data.wordpiece import train_wordpiece  # (it imports this module's pipeline)

    tmp = make_scratch(out.with_name(out.name + ".tmp"), out)
    try:
        if sample_bytes is None:
            parts = iter_document_parts(paths, fmt=fmt, text_field=text_field,
                                        skip_bad=skip_bad, stats=stats)
        else:
            parts = _sample_parts(paths, fmt, text_field, skip_bad, stats, sample_bytes)
        tok = train_wordpiece(parts, tmp / "corpus.txt", lowercase, strip_accents, vocab_size,
                              min_frequency, limit_alphabet)
        if stats.documents == 0:
            raise BertgpuError("no documents read from the corpus; expected text to train on")
        (tmp / "corpus.txt").unlink()
        got = tok.get_vocab_size(with_added_tokens=True)
        if got < VOCAB_SHORTFALL_WARN * vocab_size:  # a few percent short is the corpus's way
            warnings.warn(f"--vocab-size {vocab_size}: the corpus gave only {got} tokens "
                          f"(pieces seen at least --min-frequency {min_frequency} times); expected "
                          "a larger or more varied corpus, or a smaller --vocab-size", stacklevel=2)
        _write_folder(tok, tmp, lowercase, strip_accents)
        if out.exists():
            out.rmdir()  # _check_out_dir made sure it is empty
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _sample_parts(paths: list[str | os.PathLike], fmt: str, text_field: str, skip_bad: bool,
                  stats: CorpusStats, sample_bytes: int) -> Iterator[tuple[list[str], bool]]:
    """The document parts of a sample of about ``sample_bytes`` characters of the corpus."""
    from bertgpu.data.sources import file_size
    from bertgpu.data.units import UNIT_BYTES, sample_quota, split_file

    pieces = [piece for src in resolve_inputs(paths, stats.skipped if skip_bad else None)
              for piece in split_file(src, file_size(src), fmt, UNIT_BYTES)]
    raw = iter_piece_items(pieces, fmt, text_field, skip_bad, stats,
                           quota=sample_quota(pieces, sample_bytes))
    return settle_parts((convert_item(item) for item in raw), skip_bad, stats)


def _check_out_dir(out: Path, paths: list[str | os.PathLike]) -> None:
    check_output_folder(out, "a new output folder")
    if out.exists() and any(out.iterdir()):
        raise BertgpuError(f"{out}: already exists and is not empty; expected a new output folder")
    check_siblings(out)
    check_apart(out, list(paths))


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
        **_DEFAULT_SPECIAL,
    }
    _write_json(folder / "tokenizer_config.json", config)
    _write_json(folder / "special_tokens_map.json", dict(_DEFAULT_SPECIAL))


# --------------------------------------------------------------------------- loading


def _read_config(folder: Path) -> dict:
    return _read_json_or_empty(folder / "tokenizer_config.json", "; expected a tokenizer config")


def _special_strings(folder: Path) -> dict[str, str]:
    """Special token strings by key (pad, unk, ...), from special_tokens_map.json or the config."""
    names = dict(_DEFAULT_SPECIAL)
    for source in (_read_config(folder), _read_json_or_empty(folder / "special_tokens_map.json")):
        for attr in names:
            value = source.get(attr)
            if isinstance(value, dict):  # {"content": "[CLS]", ...} in newer files
                value = value.get("content")
            if isinstance(value, str):
                names[attr] = value
    return {key: names[attr] for key, attr in _SPECIAL_KEYS.items()}


def _read_json_or_empty(path: Path, expected: str = "") -> dict:
    """The JSON object in `path`, {} when there is no such file."""
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BertgpuError(f"{path}: not valid JSON ({exc}){expected}") from None


def _check_folder(folder: Path) -> None:
    if folder.is_file():
        raise BertgpuError(f"{folder}: a file, not a tokenizer folder; expected the folder that "
                           f"holds it ({folder.parent})")
    if not folder.is_dir():
        raise BertgpuError(f"{folder}: no such tokenizer folder; expected the output of "
                           "`bertgpu tokenizer`")
    if not (folder / "tokenizer.json").is_file() and not (folder / "vocab.txt").is_file():
        raise BertgpuError(
            f"{folder}: neither tokenizer.json nor vocab.txt found; expected a tokenizer folder"
        )


def find_tokenizer_folder(path: str | os.PathLike) -> Path | None:
    """The tokenizer folder that `path` names, or None: a tokenizer folder or a Hugging Face model
    folder (vocab.txt or tokenizer.json) as is; a bertgpu run folder's tokenizer/, also from one
    of its checkpoints/step_N (so `prepare --tokenizer runs/phase1` makes shards for a run
    continued from it)."""
    folder = Path(path)
    candidates = [folder, folder / "tokenizer"]
    if folder.parent.name == "checkpoints":
        candidates.append(folder.parent.parent / "tokenizer")
    for candidate in candidates:
        if (candidate / "tokenizer.json").is_file() or (candidate / "vocab.txt").is_file():
            return candidate
    return None


def is_lowercase(folder: str | os.PathLike) -> bool:
    """Whether the tokenizer lower-cases its input (do_lower_case; BERT's default True)."""
    folder = Path(folder)
    _check_folder(folder)
    config = _read_config(folder)
    if "do_lower_case" in config:
        return bool(config["do_lower_case"])
    normalizer = _tokenizer_json(folder).get("normalizer") or {}
    return bool(normalizer.get("lowercase", True))


def _strip_accents(folder: Path) -> bool:
    """The effective accent stripping (null/None means: same as lower-casing)."""
    value = _read_config(folder).get("strip_accents")
    return is_lowercase(folder) if value is None else bool(value)


def _tokenizer_json(folder: Path) -> dict:
    path = folder / "tokenizer.json"
    return _read_json_or_empty(path) if path.is_file() else {}


def load_tokenizer(folder: str | os.PathLike):
    """The `tokenizers.Tokenizer` of a folder: tokenizer.json, or else built from vocab.txt.

    The vocab.txt route rebuilds BERT's pipeline with the config's do_lower_case /
    strip_accents, so a Hugging Face BERT folder without tokenizer.json works too.
    """
    from tokenizers import AddedToken, Tokenizer, models

    folder = Path(folder)
    _check_folder(folder)
    if (folder / "tokenizer.json").is_file():
        try:
            return Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as exc:  # the Rust side raises plain Exception with its message
            raise BertgpuError(f"{folder / 'tokenizer.json'}: cannot load ({exc}); expected a "
                               "tokenizers JSON file") from None
    specials = _special_strings(folder)
    vocab = _read_vocab(folder / "vocab.txt")
    missing = [t for t in specials.values() if t not in vocab]
    if missing:
        raise BertgpuError(f"{folder / 'vocab.txt'}: special tokens {missing} missing; expected "
                           "them in the vocabulary")
    tok = Tokenizer(models.WordPiece(vocab, unk_token=specials["unk"],
                                     continuing_subword_prefix="##",
                                     max_input_chars_per_word=MAX_WORD_CHARS))
    config = _read_config(folder)
    lowercase = is_lowercase(folder)
    strip = config.get("strip_accents")
    _pipeline(tok, lowercase, None if strip is None else bool(strip), vocab[specials["cls"]],
              vocab[specials["sep"]], cls=specials["cls"], sep=specials["sep"])
    tok.add_special_tokens([AddedToken(t, special=True) for t in specials.values()])
    return tok


def _read_vocab(path: Path) -> dict[str, int]:
    vocab: dict[str, int] = {}
    try:
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(f):
                vocab.setdefault(line.rstrip("\n"), i)
    except UnicodeDecodeError:
        raise BertgpuError(f"{path}: invalid UTF-8; expected one token per line") from None
    if not vocab:
        raise BertgpuError(f"{path}: empty; expected one token per line")
    return vocab


def special_token_ids(folder: str | os.PathLike) -> dict[str, int]:
    """Ids of the special tokens: keys pad, unk, cls, sep, mask."""
    folder = Path(folder)
    tok = load_tokenizer(folder)
    ids: dict[str, int] = {}
    for key, token in _special_strings(folder).items():
        idx = tok.token_to_id(token)
        if idx is None:
            raise BertgpuError(f"{folder}: special token {token} is not in the vocabulary")
        ids[key] = idx
    return ids


def tokenizer_hash(folder: str | os.PathLike) -> str:
    """sha256 over vocab.txt and the normalisation settings: equal hash = identical encoding."""
    folder = Path(folder)
    _check_folder(folder)
    h = hashlib.sha256()
    vocab_path = folder / "vocab.txt"
    if vocab_path.is_file():
        h.update(vocab_path.read_bytes())
    else:  # a tokenizer.json-only folder: its vocabulary in id order stands in for vocab.txt
        vocab = load_tokenizer(folder).get_vocab(with_added_tokens=True)
        h.update("".join(t + "\n" for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])).encode())
    settings = {"lowercase": is_lowercase(folder), "strip_accents": _strip_accents(folder),
                "chinese_chars": True}
    h.update(json.dumps(settings, sort_keys=True).encode())
    return h.hexdigest()


# --------------------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_corpus_arguments(parser)
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="output folder (must not exist or be empty)")
    parser.add_argument("--vocab-size", type=int, default=30522,
                        help="vocabulary size (default 30522)")
    parser.add_argument("--min-frequency", type=int, default=2,
                        help="minimum count of a merged piece (default 2)")
    parser.add_argument("--cased", action="store_true",
                        help="keep case and accents (default: lower-case)")
    parser.add_argument("--strip-accents", choices=["auto", "yes", "no"], default="auto",
                        help="accent stripping; auto = with lower-casing, like BERT (default)")
    parser.add_argument("--limit-alphabet", type=int, default=1000,
                        help="most distinct characters kept in the initial alphabet, CJK "
                        "ideographs aside (kept as far as --vocab-size has room; default 1000)")
    parser.add_argument("--sample-bytes", type=int, default=None, metavar="N",
                        help="train on about N bytes of text spread over the whole corpus (each "
                             "file or part of a large one in proportion to its size) instead of "
                             "all of it")


def main(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    stats = CorpusStats()
    strip = {"auto": None, "yes": True, "no": False}[args.strip_accents]
    out = train_tokenizer(
        args.corpus, args.out, vocab_size=args.vocab_size, lowercase=not args.cased,
        min_frequency=args.min_frequency, fmt=args.format, skip_bad=args.skip_bad,
        text_field=args.text_field, strip_accents=strip, limit_alphabet=args.limit_alphabet,
        stats=stats, sample_bytes=args.sample_bytes,
    )
    size = load_tokenizer(out).get_vocab_size(with_added_tokens=True)
    print(f"tokenizer: vocab {size} ({'uncased' if not args.cased else 'cased'}) from "
          f"{stats.summary()} in {time.perf_counter() - start:.1f}s -> {out}")
    return 0

"""`bertgpu finetune ner`: token classification (named entities) on your own files.

    bertgpu finetune ner --train-file train.conll --dev-file dev.conll --init runs/base --out ft/ner
    bertgpu finetune ner --train-file train.jsonl --dev-file dev.jsonl --text-field words \\
        --label-field ner_tags --init hf/ --out ft/ner

Files, chosen by extension:
- CoNLL style (any extension but the two below, `.conll`, `.txt`, `.tsv`, `.iob`, ...): one token
  per line with its tag in the last column (so CoNLL-2003's four columns work as they are), a
  blank line between sentences, `-DOCSTART-` lines skipped. Columns are split on tabs in a line
  that has one (a token may then hold spaces: "New York"), else on ASCII spaces, never on a
  no-break or other Unicode space ("10\u00a0000" stays one token);
- `.jsonl` / `.json`: one sentence per line, a list of tokens (`--text-field`, default "tokens")
  and a list of tags (`--label-field`, default "tags");
- `.csv`: a header line, tokens and tags as space-separated strings in those two columns (split
  on ASCII whitespace only, as CoNLL columns: a no-break space stays inside its token).

Tags are BIO / IOB2: `O`, `B-TYPE`, `I-TYPE` (anything else, BIOES's `E-`/`S-` or a bare `PER`,
is an error naming the line). The label set is `O` plus `B-` and `I-` of every entity type in the
training file (an `I-LOC` that training only saw as `B-LOC` is fine; a type only in dev is an
error), ordered `O, B-A, I-A, B-B, ...` by type, and written into the exported config.json for
`transformers.pipeline("token-classification")`.

Sub-words: the first piece of each word carries the word's tag, its other pieces are not trained
on (-100), and a word's prediction is its first piece's. A byte-level BPE tokenizer
(RoBERTa's, ModernBERT's) gets each word with a leading space, as transformers'
`is_split_into_words` with `add_prefix_space=True`. Words cut off by `max_seq_len` (default
128 tokens) are predicted `O` (a warning says how many). Metrics (0-100): entity-level precision,
recall and F1 by conlleval's span rules, micro-averaged (seqeval's default), and word accuracy;
the run's score is the F1. predictions.conll (token, gold tag, predicted tag: conlleval's input)
is written with the final model, space-separated, or tab-separated when a token holds a space.
"""

from __future__ import annotations

import json
import os
import re
import string
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bertgpu.batch import IGNORE_INDEX
from bertgpu.errors import BertgpuError
from bertgpu.fsutil import not_utf8
from bertgpu.tasks.finetuning import Encoded, EvalSet, Job, JobRequest
from bertgpu.tasks.tables import (
    Fields,
    check_own_files,
    own_files,
    own_files_record,
    read_rows,
    request_fields,
)

if TYPE_CHECKING:
    from bertgpu.config.finetune import FinetuneConfig

NER_FIELDS = Fields(text="tokens", label="tags")
DEFAULT_MAX_SEQ_LEN = 128
"""Tokens per sequence unless --max_seq_len (capped at the model's max_position_embeddings:
finetune.py)."""


@dataclass
class Sentence:
    """One sentence: its words, their tags, and the file line of each word (for errors)."""

    tokens: list[str]
    tags: list[str]
    lines: list[int]


# --------------------------------------------------------------------------------------------
# Reading


def check_tag(path: Path, line: int, tag: str) -> str:
    """`tag` when it is O, B-TYPE or I-TYPE; BertgpuError naming the line otherwise."""
    if tag == "O" or (tag[:2] in ("B-", "I-") and len(tag) > 2):
        return tag
    if not tag:
        raise BertgpuError(f"{path}:{line}: empty tag; expected O, B-TYPE or I-TYPE on every token")
    raise BertgpuError(f"{path}:{line}: tag {tag!r} is not O, B-TYPE or I-TYPE "
                       "(expected BIO / IOB2 tags; BIOES and bare types are not read)")


def read_sentences(path: str | os.PathLike[str], fields: Fields = NER_FIELDS) -> list[Sentence]:
    """The sentences of a CoNLL, JSONL or CSV file (module docstring)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson", ".csv"):
        sentences = _table_sentences(path, fields)
    else:
        sentences = _conll_sentences(path)
    if not sentences:
        raise BertgpuError(f"{path}: no sentences (expected tokens with their tags)")
    return sentences


def _conll_sentences(path: Path) -> list[Sentence]:
    sentences: list[Sentence] = []
    current = Sentence([], [], [])
    try:
        with open(path, encoding="utf-8-sig") as f:
            for n, line in enumerate(f, 1):
                parts = _columns(line)
                if not parts or parts[0] == "-DOCSTART-":  # a blank line ends the sentence
                    if current.tokens:
                        sentences.append(current)
                        current = Sentence([], [], [])
                    continue
                if len(parts) < 2:
                    raise BertgpuError(f"{path}:{n}: one field {parts[0]!r}; expected a token and "
                                       "its tag separated by whitespace (CoNLL style)")
                current.tokens.append(parts[0])
                current.tags.append(check_tag(path, n, parts[-1]))
                current.lines.append(n)
    except FileNotFoundError:
        raise BertgpuError(f"{path}: not found") from None
    except UnicodeDecodeError:
        raise not_utf8(path) from None
    if current.tokens:
        sentences.append(current)
    return sentences


def _columns(line: str) -> list[str]:
    """The fields of a CoNLL line: tab-separated when it has a tab, else separated by ASCII
    spaces; str.split() would also cut a token at a no-break space (U+00A0, "10 000" in French
    corpora) and silently keep only its first word. A line of whitespace alone is blank; a tab
    at the end of a space-separated line (spreadsheet exports leave one) does not make it
    tab-separated."""
    if not line.strip():
        return []
    body = line.strip(" \t\r\n")
    sep = "\t" if "\t" in body else " "
    return [f for f in (p.strip(" \t\r\n") for p in body.split(sep)) if f]


_ASCII_SPACE = re.compile(f"[{re.escape(string.whitespace)}]+")
"""Separators of a CSV cell's words: ASCII whitespace only, as `_columns` splits CoNLL lines."""


def _word_list(path: Path, line: int, value: Any, name: str) -> list[str]:
    """A JSON list of strings, or a CSV cell of words separated by ASCII whitespace; str.split()
    would also cut a word at a no-break space (U+00A0, "10\u00a0000") and then count one
    token more than its tags."""
    if isinstance(value, str):
        value = [w for w in _ASCII_SPACE.split(value) if w]
    if (isinstance(value, list) and value
            and all(isinstance(w, int) and not isinstance(w, bool) for w in value)):
        raise BertgpuError(f"{path}:{line}: {name!r} holds integer ids (e.g. {value[0]}); "
                           "expected names (strings such as 'B-PER'): map each id to its name "
                           "with the dataset's features (Hugging Face: "
                           f"ds.features[{name!r}].feature.names) before writing the file")
    if not isinstance(value, list) or not all(isinstance(w, str) for w in value):
        raise BertgpuError(f"{path}:{line}: {name!r} is not a list of strings")
    # ASCII whitespace only is empty, as CoNLL reads it; a full-width space (U+3000) is a token
    # in Chinese sets (People's Daily), as in their CoNLL files
    if not value or any(not w.strip(" \t\r\n") for w in value):
        raise BertgpuError(f"{path}:{line}: {name!r} is empty or has an empty entry; expected "
                           "one per token")
    return value


def _table_sentences(path: Path, fields: Fields) -> list[Sentence]:
    sentences = []
    for line, row in read_rows(path, {fields.text: "--text-field", fields.label: "--label-field"}):
        tokens = _word_list(path, line, row[fields.text], fields.text)
        tags = _word_list(path, line, row[fields.label], fields.label)
        if len(tokens) != len(tags):
            raise BertgpuError(f"{path}:{line}: {len(tokens)} tokens but {len(tags)} tags; "
                               "expected one tag per token")
        sentences.append(Sentence(tokens, [check_tag(path, line, t) for t in tags],
                                  [line] * len(tokens)))
    return sentences


# --------------------------------------------------------------------------------------------
# Labels and encoding


def tag_set(path: Path, sentences: list[Sentence]) -> tuple[str, ...]:
    """O, then B- and I- of every entity type of the training file, by type."""
    types = sorted({t[2:] for s in sentences for t in s.tags if t != "O"})
    if not types:
        raise BertgpuError(f"{path}: every tag is O; expected some entities (B-TYPE / I-TYPE tags)")
    return ("O", *[f"{prefix}-{t}" for t in types for prefix in ("B", "I")])


def check_known(path: Path, sentences: list[Sentence], labels: tuple[str, ...],
                cut: tuple[int, list[Sentence]] | None = None) -> None:
    """Every tag of `sentences` (the dev file) must be in the training file's label set.
    ``cut``: (--max_train_examples, the whole training file), so that a type past the cut is
    named as such."""
    known = set(labels)
    for s in sentences:
        for tag, line in zip(s.tags, s.lines, strict=True):
            if tag not in known:
                types = sorted({t[2:] for t in labels if t != "O"})
                where = "is not in the training file"
                if cut is not None and any(t[2:] == tag[2:] for x in cut[1] for t in x.tags):
                    where = ("is in the training file but not in its first "
                             f"{f'{cut[0]} sentences' if cut[0] != 1 else 'sentence'} "
                             f"(--max_train_examples {cut[0]})")
                raise BertgpuError(f"{path}:{line}: tag {tag!r}: entity type {tag[2:]!r} {where} "
                                   f"(expected one of {', '.join(types)})")


def encode_sentences(tokenizer: Any, sentences: list[Sentence], tag_ids: dict[str, int],
                     max_seq_len: int) -> tuple[Encoded, list[np.ndarray]]:
    """`[CLS] pieces [SEP]` per sentence with the tag id on each word's first piece (IGNORE_INDEX
    elsewhere), and per sentence the position of each word's first piece (-1: a word the
    tokenizer gives no token, -2: a word cut off by `max_seq_len`).

    A byte-level BPE tokenizer (RoBERTa's, ModernBERT's) gets every word with a leading space,
    as transformers' `is_split_into_words` with `add_prefix_space=True`: without it "of" is
    cut into the space-less pieces "o", "f" that pretraining and the exported model's pipeline,
    which both see running text ("Ġof"), never produce. WordPiece tokenizers split on
    whitespace and see the words unchanged."""
    tokenizer.enable_truncation(max_length=max_seq_len)
    tokenizer.no_padding()  # a Hugging Face tokenizer.json may carry its own padding setting
    words = [s.tokens for s in sentences]
    if is_byte_level(tokenizer):
        words = [[w if w.startswith(" ") else " " + w for w in ws] for ws in words]
    encs = tokenizer.encode_batch(words, is_pretokenized=True) if sentences else []
    enc = Encoded([np.asarray(e.ids, dtype=np.int64) for e in encs],
                  [np.asarray(e.type_ids, dtype=np.int64) for e in encs])
    labels, firsts = [], []
    for s, e in zip(sentences, encs, strict=True):
        first = np.full(len(s.tokens), -1, dtype=np.int64)
        row = np.full(len(e.ids), IGNORE_INDEX, dtype=np.int64)
        previous = None
        for pos, word in enumerate(e.word_ids):
            if word is not None and word != previous:
                first[word] = pos
                row[pos] = tag_ids[s.tags[word]]
            previous = word
        if e.overflowing:  # truncated: the words after the last one with a token were cut
            kept = np.flatnonzero(first >= 0)
            tail = first[kept[-1] + 1 if len(kept) else 0:]  # a view
            tail[tail < 0] = -2
        labels.append(row)
        firsts.append(first)
    enc.token_targets["labels"] = labels
    return enc, firsts


def _warn_tokenless(path: Path, sentences: list[Sentence], firsts: list[np.ndarray],
                    outcome: str) -> None:
    """One warning for the words tagged other than O that the tokenizer gives no token (a
    full-width space U+3000, control characters; `encode_sentences`' -1)."""
    words = [s.tokens[w] for s, f in zip(sentences, firsts, strict=True)
             for w in np.flatnonzero(f == -1) if s.tags[w] != "O"]
    if words:
        warnings.warn(f"{path}: the tokenizer gives no token to {len(words)} of the words tagged "
                      f"as entities (e.g. {words[0]!r}): {outcome}", stacklevel=3)


def is_byte_level(tokenizer: Any) -> bool:
    """Whether the tokenizer's pre-tokenizer (alone or inside a Sequence) is ByteLevel, the
    GPT-2 byte-to-symbol mapping in which a word's leading space is part of its first piece."""
    pre = json.loads(tokenizer.to_str()).get("pre_tokenizer")

    def has(node: Any) -> bool:
        if isinstance(node, dict):
            return node.get("type") == "ByteLevel" or any(has(v) for v in node.values())
        return isinstance(node, list) and any(has(v) for v in node)

    return has(pre)


def word_predictions(logits: np.ndarray, firsts: list[np.ndarray],
                     labels: tuple[str, ...]) -> list[list[str]]:
    """Per-token logits (N, T, C) -> each word's tag: its first piece's argmax, O when cut off."""
    ids = logits.argmax(axis=-1) if len(logits) else np.zeros((0, 0), dtype=np.int64)  # (N, T)
    return [[labels[int(ids[i, p])] if p >= 0 else "O" for p in first]
            for i, first in enumerate(firsts)]


# --------------------------------------------------------------------------------------------
# The job


def check_request(request: JobRequest) -> None:
    """No classify-only flags; your two files named and present."""
    if request.text_pair_field or request.regression:
        raise BertgpuError("finetune ner: --text-pair-field and --regression are for classify")
    check_own_files(request)


def input_files(request: JobRequest) -> list[Path]:
    """The files `build_job` reads (finetune.py hashes them before anything is encoded)."""
    return own_files(request)


def build_job(request: JobRequest, tokenizer: Any,
              cfg: FinetuneConfig) -> tuple[Job, dict[str, Any]]:
    """The ner job and what results.json records about its data (files, columns, tag names)."""
    check_request(request)
    fields = request_fields(request, NER_FIELDS)
    assert request.train_file is not None and request.dev_file is not None  # checked just above
    job = ner_job(request.train_file, request.dev_file, tokenizer, cfg, fields)
    return job, own_files_record(request, fields, "token_classification", job.labels)


def ner_job(train_file: str | os.PathLike[str], dev_file: str | os.PathLike[str], tokenizer: Any,
            cfg: FinetuneConfig, fields: Fields = NER_FIELDS) -> Job:
    """Read, check and encode both files; the dev set is scored with `metrics.entity_scores`."""
    from bertgpu.tasks import metrics as eval_metrics

    train_path, dev_path = Path(train_file), Path(dev_file)
    whole = read_sentences(train_path, fields)
    train = whole[:cfg.max_train_examples]
    dev = read_sentences(dev_path, fields)[:cfg.max_eval_examples]
    labels = tag_set(train_path, train)
    cut = (cfg.max_train_examples, whole) if cfg.max_train_examples is not None else None
    check_known(dev_path, dev, labels, cut)
    tag_ids = {t: i for i, t in enumerate(labels)}
    seq = cfg.max_seq_len or DEFAULT_MAX_SEQ_LEN
    train_enc, train_firsts = encode_sentences(tokenizer, train, tag_ids, seq)
    dev_enc, firsts = encode_sentences(tokenizer, dev, tag_ids, seq)
    dev_enc.token_targets.clear()  # kept out of the forward pass: eval needs logits only
    cut = sum(int((f == -2).any()) for f in firsts)
    if cut:
        warnings.warn(f"{dev_path}: {cut} of {len(dev)} sentences are longer than max_seq_len "
                      f"{seq} tokens; their words past it count as predicted O", stacklevel=2)
    _warn_tokenless(train_path, train, train_firsts, "their tags go unlearned")
    _warn_tokenless(dev_path, dev, firsts, "they count as predicted O")
    gold = [s.tags for s in dev]

    def score(outputs: dict[str, np.ndarray], folder: Path | None) -> dict[str, float]:
        predicted = word_predictions(outputs["logits"], firsts, labels)
        if folder is not None:
            _write_conll(folder / "predictions.conll", dev, predicted)
        return eval_metrics.entity_scores(gold, predicted)

    return Job("ner", "token_classification", len(labels), train_enc,
               [EvalSet("dev", dev_enc, score, truth=json.dumps(gold).encode())],
               lambda m: float(m["dev"]["f1"]), labels=labels)


def _write_conll(path: Path, dev: list[Sentence], predicted: list[list[str]]) -> None:
    """token gold predicted, one word per line, a blank line between sentences; tab-separated
    when a token holds a space ("New York" from a tab-separated file), so its columns stay
    three."""
    sep = "\t" if any(c.isspace() for s in dev for w in s.tokens for c in w) else " "
    lines = []
    for s, tags in zip(dev, predicted, strict=True):
        lines += [sep.join(row) for row in zip(s.tokens, s.tags, tags, strict=True)] + [""]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(lines), encoding="utf-8")
    os.replace(tmp, path)

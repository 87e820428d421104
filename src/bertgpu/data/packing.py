"""Worker side of `bertgpu prepare`: tokenize a chunk of pieces and turn it into sequences.

    init_worker("tok/", settings)                  # once per process (or in-process, 1 worker)
    result = process_chunk((index, pieces))         # {"train": {...}, "validation": {...}}

A chunk is a list of pieces from `split.SplitPlan` (``(sentences, joins, is_validation, chars)``),
at most a few hundred thousand characters. Everything here depends on the chunk alone (its
random generator is seeded from (seed, chunk index)), so chunks can run on any process in any
order and the output is the same.

- ``mlm``: each split's token stream, [SEP] where a new run of text begins (a new document, or
  a document resuming after a chunk of it went to the other split). The main process packs the
  streams into rows (`writer.Packer`); ``lead`` / ``trail`` tell it whether a run boundary falls
  before the first / after the last token of this chunk.
- ``mlm+nsp``: BERT's create_pretraining_data recipe (Devlin et al. 2018) per pseudo-document
  (the consecutive pieces of one document and split inside this chunk): per document a target
  length (seq_len-3, or with short_seq_prob a random shorter one), sentences accumulated into
  segments A and B, B replaced by a random span of another document of the chunk and split half
  of the time (nsp_label 1), ``[CLS] A [SEP] B [SEP]`` with token types 0/1. A chunk with a
  single document falls back to that document, as the original does after 10 misses.

With a whole-word segmenter every token also carries a word-start flag (`segment`).
"""

from __future__ import annotations

import numpy as np

from bertgpu.data.segment import load_segmenter, word_start_flags
from bertgpu.data.tokenizer import load_tokenizer

_STATE: dict = {}


def init_worker(tokenizer_dir: str, settings: dict) -> None:
    """Load the tokenizer (and segmenter) once per process; ``settings``: seed, objective, seq_len,
    short_seq_prob, cls, sep, segmenter (None or a name from `segment.SEGMENTERS`)."""
    tok = load_tokenizer(tokenizer_dir)
    tok.no_truncation()
    tok.no_padding()
    _STATE.clear()
    _STATE.update(settings)
    _STATE["encode"] = getattr(tok, "encode_batch_fast", tok.encode_batch)  # skips offsets (>=0.20)
    if settings.get("segmenter"):
        _STATE["encode"] = tok.encode_batch  # offsets are needed to align tokens with words
        _STATE["segment"] = load_segmenter(settings["segmenter"])
        table = np.zeros(tok.get_vocab_size(with_added_tokens=True), bool)
        for token, i in tok.get_vocab(with_added_tokens=True).items():
            table[i] = token.startswith("##")
        _STATE["continuation"] = table


def process_chunk(task: tuple[int, list[tuple]]) -> dict[str, dict]:
    """Tokenize one chunk of pieces and turn it into sequences, per split."""
    index, pieces = task
    rng = np.random.default_rng([_STATE["seed"], index])
    out: dict[str, dict] = {}
    for split, flag in (("train", False), ("validation", True)):
        if _STATE["objective"] == "mlm":
            out[split] = _mlm_stream([(p[0], p[1]) for p in pieces if p[2] == flag])
        else:
            docs: list[list[str]] = []
            for k, (sentences, joins, is_val, _) in enumerate(pieces):
                if is_val != flag:
                    continue
                if joins and k > 0:  # piece k-1 is its predecessor, the last pseudo-document here
                    docs[-1].extend(sentences)
                else:
                    docs.append(list(sentences))
            out[split] = _nsp_rows(docs, rng)
    return out


def _encode(texts: list[str]) -> tuple[list[list[int]], list[np.ndarray | None]]:
    """Token ids of each text and, with a segmenter, their word-start flags."""
    if not texts:
        return [], []
    encs = _STATE["encode"](texts, add_special_tokens=False)
    segment = _STATE.get("segment")
    if segment is None:
        return [e.ids for e in encs], [None] * len(encs)
    flags = [word_start_flags(e.ids, [o[0] for o in e.offsets], _STATE["continuation"], segment(t))
             for e, t in zip(encs, texts, strict=True)]
    return [e.ids for e in encs], flags


def _mlm_stream(pieces: list[tuple[list[str], bool]]) -> dict:
    """The split's token stream of this chunk: piece after piece, [SEP] at each run boundary.

    Joining sentences with a space tokenizes exactly like encoding them one by one (the BERT
    pre-tokenizer splits on whitespace), with far fewer Encoding objects; so a document cut into
    pieces gives the same tokens as the whole document.
    """
    ids_list, flag_list = _encode([" ".join(sentences) for sentences, _ in pieces])
    sep = np.array([_STATE["sep"]], np.int32)
    out: list[np.ndarray] = []
    flags: list[np.ndarray] = []
    lead = None  # a boundary before the first token of the chunk
    pending = False  # a boundary since the last token
    for (_, joins), ids, ws in zip(pieces, ids_list, flag_list, strict=True):
        pending = pending or not joins
        if not ids:
            continue
        if lead is None:
            lead = pending
        elif pending:
            out.append(sep)
            flags.append(np.ones(1, np.uint8))
        out.append(np.array(ids, np.int32))  # one C-level conversion per piece
        if ws is not None:
            flags.append(ws)
        pending = False
    stream = np.concatenate(out) if out else np.empty(0, np.int32)
    word_starts = (np.concatenate(flags) if flags else np.empty(0, np.uint8)) if "segment" in _STATE else None
    return {"stream": stream, "word_starts": word_starts, "lead": pending if lead is None else lead,
            "trail": pending}


def _nsp_rows(docs: list[list[str]], rng: np.random.Generator) -> dict:
    """Sentence-pair rows of a chunk (BERT's create_instances_from_document, once per document).

    With a segmenter each token travels as ``id * 2 + word_start`` through the pairing (which
    only moves tokens around) and is split again when the rows are written.
    """
    seq_len = _STATE["seq_len"]
    flat = [s for d in docs for s in d]
    ids_list, flag_list = _encode(flat)
    if "segment" in _STATE:
        ids_list = [(np.array(ids, np.int64) * 2 + ws).tolist() for ids, ws in zip(ids_list, flag_list, strict=True)]
    tokenized: list[list[list[int]]] = []
    k = 0
    for d in docs:
        sents = [s for s in ids_list[k : k + len(d)] if s]  # a sentence of control characters only has no tokens
        k += len(d)
        if sents:
            tokenized.append(sents)
    pairs: list[tuple[list[int], list[int], int]] = []
    for d in range(len(tokenized)):
        pairs.extend(_document_pairs(tokenized, d, rng, seq_len - 3, _STATE["short_seq_prob"]))
    return _rows(pairs, seq_len)


def _rows(pairs: list[tuple[list[int], list[int], int]], seq_len: int) -> dict:
    n = len(pairs)
    packed = "segment" in _STATE
    ids = np.zeros((n, seq_len), np.int64 if packed else np.int32)
    tts = np.zeros((n, seq_len), np.uint8)
    lengths = np.zeros(n, np.int32)
    labels = np.zeros(n, np.uint8)
    cls, sep = (_STATE["cls"] * 2 + 1, _STATE["sep"] * 2 + 1) if packed else (_STATE["cls"], _STATE["sep"])
    for r, (a, b, label) in enumerate(pairs):
        row = [cls, *a, sep, *b, sep]
        ids[r, : len(row)] = row
        tts[r, len(a) + 2 : len(row)] = 1
        lengths[r] = len(row)
        labels[r] = label
    out = {"ids": ids, "tt": tts, "lengths": lengths, "labels": labels, "word_starts": None}
    if packed:
        out["word_starts"] = (ids & 1).astype(np.uint8)
        out["ids"] = ids >> 1
    return out


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

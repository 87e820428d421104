"""Worker side of `bertgpu prepare`: the two stages that run on the worker processes.

    init_worker(tokenizer_json, settings)          # once per process (or in-process, 1 worker)
    encode_items(raw_batch)                         # stage 1: text -> tokens, per document part
    nsp_chunk((index, pieces))                      # stage 2 (mlm+nsp): tokens -> sentence pairs

Stage 1 turns a batch of raw parts (`corpus.iter_raw_documents`) into ``("part", Encoded,
first)``: wiki markup stripped, sentences split, tokens encoded (with a whole-word segmenter,
also a word-start flag per token, see `segment`). The main process then knows every part's
exact token count before it splits train from validation (`split`) and, for mlm, packs the
tokens into rows itself (`writer.Packer`).

Stage 2 (mlm+nsp) is BERT's create_pretraining_data recipe (Devlin et al. 2018) on a chunk of
pieces from `split.nsp_pieces`, per pseudo-document (the consecutive pieces of one document and
split in the chunk): per document a target length (seq_len-3, or with short_seq_prob a random
shorter one), sentences accumulated into segments A and B, B replaced by a random span of
another document of the chunk and split half of the time (nsp_label 1), ``[CLS] A [SEP] B
[SEP]`` with token types 0/1. A chunk of one document, or of few long ones, also draws B from
runs of the work unit's earlier documents that the main process sends with it
(`nsp_candidates`). "Another document" is another corpus document: the pseudo-documents
of a document that the validation split cut (its train sides around a held-out chunk, its
held-out chunks) are never each other's random B. A chunk whose split holds pieces of a single
document and no candidates falls back to that document, as the original does after 10 misses
(such rows are counted: ``same_document``, and `prepare` warns when they are many). The random
generator is seeded from (seed, chunk index), so the rows do not depend on which process made
them.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from bertgpu.data.corpus import convert_items
from bertgpu.data.segment import load_segmenter, word_start_flags
from bertgpu.errors import BertgpuError

_STATE: dict = {}
RANDOM_CAUSES = ("same_document", "one_sentence_document", "sentence_fills_target",
                 "last_sentence")
"""Counts of random-B rows in a chunk's result: whose B had to come from A's own document (the
chunk's split held no other); and of the rows whose A is one sentence, for which BERT's recipe
has no B that follows (always random), why: its document is that one sentence, the sentence
alone reached the target length (``seq_len - 3``, or a short target), or it is the last
sentence of its document, left over after the segment before."""


class Encoded(NamedTuple):
    """A document part after stage 1."""

    tokens: np.ndarray
    """(n,) int32: the part's token ids (its sentences joined by spaces: the same tokens with
    BERT's tokenizer; a part read as written is one "sentence", its text)."""
    word_starts: np.ndarray | None
    """(n,) uint8 word-start flags, with a whole-word segmenter."""
    bounds: np.ndarray | None
    """mlm+nsp: (sentences,) end of each sentence in ``tokens``."""
    chars: np.ndarray | None
    """mlm+nsp: (sentences,) characters of each sentence."""


def init_worker(tokenizer_json: str, settings: dict) -> None:
    """Load the tokenizer (serialized, `tokenizers.Tokenizer.to_str`) and segmenter once per
    process; ``settings``: seed, objective, seq_len, short_seq_prob, cls, sep, segmenter (None or
    a name from `segment.SEGMENTERS`)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer_json)
    tok.no_truncation()
    tok.no_padding()
    # "[MASK]", "[SEP]"... written in the corpus are text ("[", "mask", "]"), as in BERT's
    # create_pretraining_data: matched as added tokens, they put [PAD] inside attended rows,
    # [MASK] inputs without labels and fake document ends in the shards, whose special ids must
    # be the packer's alone. (Fine-tuning encodes like transformers' tokenizer: not here.)
    if not hasattr(tok, "encode_special_tokens"):  # tokenizers 0.19 added it
        import tokenizers

        raise BertgpuError(f"tokenizers {tokenizers.__version__}: cannot encode special tokens "
                           "written in the text as text; expected tokenizers 0.19 or newer")
    tok.encode_special_tokens = True
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


def encode_items(items: list[tuple]) -> list[tuple]:
    """Stage 1 on a batch of raw items: parts become ``("part", Encoded | None, first)`` (None:
    no sentences), or ``("no_tokens", None, first)`` when their text gave no token (only control
    or format characters: `corpus.settle_parts` counts no document and no text for them); file
    events pass through.

    mlm encodes each part's sentences joined by a space, which tokenizes exactly like encoding
    them one by one (the BERT pre-tokenizer splits on whitespace and drops it) with far fewer
    Encoding objects; mlm+nsp needs each sentence's tokens and encodes them one by one. A
    tokenizer whose tokens depend on whitespace (byte-level BPE, Metaspace) has its parts read
    as written, each one "sentence" whose text is the document's (`corpus.iter_piece_items`
    with ``as_written``; `prepare` refuses mlm+nsp for it), so the join changes nothing.
    """
    out = convert_items(items)
    parts = [k for k, item in enumerate(out) if item[0] == "part" and item[1]]
    nsp = _STATE["objective"] != "mlm"
    texts = [s for k in parts for s in out[k][1]] if nsp else [" ".join(out[k][1]) for k in parts]
    ids_list, flag_list = _encode(texts)
    i = 0
    for k in parts:
        kind, sentences, first = out[k]
        n = len(sentences) if nsp else 1
        ids = [np.array(x, np.int32) for x in ids_list[i : i + n]]
        flags = flag_list[i : i + n]
        i += n
        tokens = np.concatenate(ids) if n > 1 else ids[0]
        if len(tokens) == 0:  # only characters the normaliser removes (control, format)
            out[k] = ("no_tokens", None, first)
            continue
        word_starts = None if flags[0] is None else np.concatenate(flags) if n > 1 else flags[0]
        bounds = np.cumsum([len(x) for x in ids], dtype=np.int64) if nsp else None
        chars = np.array([len(s) for s in sentences], np.int64) if nsp else None
        out[k] = (kind, Encoded(tokens, word_starts, bounds, chars), first)
    return [(item[0], None, item[2]) if item[0] == "part" and not item[1] else item for item in out]


def nsp_chunk(task: tuple) -> dict[str, dict]:
    """Stage 2: the sentence-pair rows of one chunk of pieces, per split. ``task``: ``(index,
    pieces)``, or ``(index, pieces, carried)`` with ``carried`` per is_validation the random-B
    candidates of earlier chunks (`nsp_candidates`: ``(tokens, bounds, word_starts, document)``
    each) or None."""
    index, pieces = task[:2]
    carried = task[2] if len(task) > 2 else {}
    rng = np.random.default_rng([_STATE["seed"], index])
    out: dict[str, dict] = {}
    for split, flag in (("train", False), ("validation", True)):
        docs: list[list[list[int]]] = []
        owners: list[int] = []  # the corpus document each pseudo-document is a run of
        for k, (tokens, bounds, flags, _, joins, is_val, doc) in enumerate(pieces):
            if is_val != flag:
                continue
            sentences = _sentences(tokens, bounds, flags)
            if joins and k > 0:  # piece k-1 is its predecessor, the last pseudo-document here
                docs[-1].extend(sentences)
            else:
                docs.append(sentences)
                owners.append(doc)
        extra = [(_sentences(*c[:3]), c[3]) for c in carried.get(flag) or ()]
        out[split] = _nsp_rows(docs, owners, rng, extra)
    return out


def _sentences(tokens: np.ndarray, bounds: np.ndarray, flags: np.ndarray | None) -> list:
    values = tokens.astype(np.int64) * 2 + flags if flags is not None else tokens
    return [s.tolist() for s in np.split(values, bounds[:-1])]


def _nsp_rows(docs: list[list[list[int]]], owners: list[int], rng: np.random.Generator,
              extra: Sequence[tuple[list[list[int]], int]] = ()) -> dict:
    """Sentence-pair rows of a chunk (BERT's create_instances_from_document, once per document).

    ``owners``: the corpus document of each of ``docs``, in corpus order (non-decreasing).
    ``extra``: random-B candidates from other documents (`nsp_candidates`), (sentences, corpus
    document) each; with them a random B is drawn uniformly over the corpus documents (those of
    the chunk and of the candidates), then over that document's pseudo-documents or candidates,
    from a start with ``seq_len - 3`` tokens after it where there is one.
    With a segmenter each token travels as ``id * 2 + word_start`` through the pairing (which
    only moves tokens around) and is split again when the rows are written.
    """
    # control characters have no tokens
    kept = [([s for s in d if s], owner) for d, owner in zip(docs, owners, strict=True)]
    kept = [(sents, owner) for sents, owner in kept if sents]
    tokenized = [sents for sents, _ in kept]
    owned = [owner for _, owner in kept]
    max_tokens = _STATE["seq_len"] - 3
    kept_extra = [(sents, doc) for sents, doc in (([s for s in c if s], doc) for c, doc in extra)
                  if sents]
    carried = [(sents, _starts(sents, max_tokens)) for sents, _ in kept_extra]
    by_document: dict[int, list[int]] = {}  # (with candidates) what B is drawn over, by document
    if carried:
        for i, owner in [*enumerate(owned), *((len(owned) + k, doc) for k, (_, doc)
                                               in enumerate(kept_extra))]:
            by_document.setdefault(owner, []).append(i)
    pairs: list[tuple[list[int], list[int], int]] = []
    counts = dict.fromkeys(RANDOM_CAUSES, 0)
    for d in range(len(tokenized)):
        # A document's pseudo-documents are consecutive (pieces come in corpus order).
        own = (bisect.bisect_left(owned, owned[d]), bisect.bisect_right(owned, owned[d]))
        pairs.extend(_document_pairs(tokenized, d, own, rng, max_tokens,
                                     _STATE["short_seq_prob"], counts, carried,
                                     (by_document, owned[d]) if carried else None))
    rows = _rows(pairs, _STATE["seq_len"])
    rows.update(counts)
    return rows


def _starts(sentences: list[list[int]], max_tokens: int) -> int:
    """How many of a candidate's first sentences have ``max_tokens`` tokens from them on (at
    least 1): a B drawn from it starts at one of them, so that it is whole."""
    left = sum(map(len, sentences))
    n = 0
    for s in sentences:
        if left < max_tokens:
            break
        n += 1
        left -= len(s)
    return max(1, n)


def _rows(pairs: list[tuple[list[int], list[int], int]], seq_len: int) -> dict:
    n = len(pairs)
    packed = "segment" in _STATE
    ids = np.zeros((n, seq_len), np.int64 if packed else np.int32)
    tts = np.zeros((n, seq_len), np.uint8)
    lengths = np.zeros(n, np.int32)
    labels = np.zeros(n, np.uint8)
    cls, sep = ((_STATE["cls"] * 2 + 1, _STATE["sep"] * 2 + 1) if packed
                else (_STATE["cls"], _STATE["sep"]))
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
    docs: list[list[list[int]]], d: int, own: tuple[int, int], rng: np.random.Generator,
    max_tokens: int, short_seq_prob: float, counts: dict[str, int],
    carried: Sequence[tuple[list[list[int]], int]] = (),
    sources: tuple[dict[int, list[int]], int] | None = None
) -> list[tuple[list[int], list[int], int]]:
    """(A, B, nsp_label) pairs from document d; the random B comes from another of ``docs``
    outside ``own`` (the ``[first, end)`` of the pseudo-documents of d's corpus document) or
    one of ``carried`` (sentences, starts) when there is one: with ``sources`` (``carried``'s
    and ``docs``' indices by corpus document, and d's), uniformly over the other documents
    first (`_from_other_document`). ``counts`` (`RANDOM_CAUSES`) adds up why random rows were
    random."""
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
                if len(chunk) == 1:  # no B can follow: why, for the driver's warning
                    cause = ("one_sentence_document" if len(document) == 1
                             else "sentence_fills_target" if length >= target
                             else "last_sentence")
                    counts[cause] += 1
                pick = (_from_other_document(*sources, rng) if sources
                        else _other_document(len(docs), d, own, rng, len(carried)))
                counts["same_document"] += own[0] <= pick < own[1]
                other, starts = (carried[pick - len(docs)] if pick >= len(docs)
                                 else (docs[pick], len(docs[pick])))
                b: list[int] = []
                for j in range(int(rng.integers(0, starts)), len(other)):
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


def _from_other_document(by_document: dict[int, list[int]], mine: int,
                         rng: np.random.Generator) -> int:
    """A corpus document other than ``mine`` drawn uniformly (as BERT draws its random
    document), then one of its pseudo-documents or candidates (`by_document`'s indices):
    candidates are windows of text, and drawn one by one a long earlier document outweighed a
    neighbour in the chunk hundreds of times."""
    others = [doc for doc in by_document if doc != mine]
    if not others:
        return by_document[mine][0]
    group = by_document[others[int(rng.integers(0, len(others)))]]
    return group[int(rng.integers(0, len(group)))]


def _other_document(n: int, d: int, own: tuple[int, int], rng: np.random.Generator,
                    carried: int = 0) -> int:
    """A random one of ``n`` pseudo-documents outside ``own`` (d's corpus document) and of
    ``carried`` candidates (``n + k`` is candidate k), uniform; with none, another of d's
    (BERT's fallback), or d itself when it is alone.

    When every document is whole (``own`` is ``(d, d + 1)``) this is the draw it always was, so
    the rows of such corpora did not change when documents got their identity; likewise
    without candidates when they came.
    """
    if carried:
        others = n - (own[1] - own[0])
        r = int(rng.integers(0, others + carried))
        return n + r - others if r >= others else r if r < own[0] else r + own[1] - own[0]
    if n == 1:
        return d
    lo, hi = own
    if hi - lo == n:  # only pieces of d's document: any other of them
        lo, hi = d, d + 1
    r = int(rng.integers(0, n - (hi - lo)))
    return r if r < lo else r + (hi - lo)


def _truncate_pair(a: list[int], b: list[int], max_tokens: int,
                   rng: np.random.Generator) -> tuple[list[int], list[int]]:
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

"""The warnings of a finished `bertgpu prepare` (one line each) for a shard set that is complete
but not what the user expects: more than 5% of the tokens [UNK] (the tokenizer does not cover
the text), more than 90% of the NSP labels one class (and the commonest reason), many random next
segments taken from A's own document."""

from __future__ import annotations

import os
import warnings
from typing import Any

from bertgpu.data.manifest import Manifest
from bertgpu.data.tokenizer_folder import MAX_WORD_CHARS

UNK_WARN_SHARE = 0.05  # more [UNK] than this: the vocabulary does not cover the text
NSP_WARN_SHARE = 0.9  # one NSP label on more rows than this: the task teaches little
SAME_DOC_WARN_SHARE = 0.05  # random-next Bs from A's own document (chunks of pieces of one)
VAL_SAME_DOC_WARN_SHARE = 0.2  # the same in the validation split: its ~1% of the rows are noisier


def warn_about_result(records: list[dict[str, Any]], manifest: Manifest,
                       tokenizer_dir: str | os.PathLike) -> None:
    """One warning each for a shard set that is complete but not what the user expects."""
    tokens = manifest.counts["tokens"]
    unk = sum(r.get("unk_tokens", 0) for r in records)
    if tokens and unk > UNK_WARN_SHARE * tokens:
        warnings.warn(f"{unk / tokens:.0%} of the tokens are [UNK] ({unk} of {tokens}): the "
                      f"tokenizer {os.fspath(tokenizer_dir)} does not cover this text; expected a "
                      "tokenizer trained on similar text (bertgpu tokenizer --corpus ...), or, "
                      f"where it was, words of at most {MAX_WORD_CHARS} characters (BERT encodes "
                      "a longer one as one [UNK]: text without spaces, such as Thai, must be "
                      "split into words first)", stacklevel=2)
    rows = manifest.counts["sequences"]
    if manifest.objective != "mlm+nsp" or not rows:
        return
    random = sum(r.get("nsp_random", 0) for r in records)
    share = max(random, rows - random) / rows
    if share > NSP_WARN_SHARE:
        label, what = (1, "B random") if random * 2 > rows else (0, "B follows A")
        why = _why_random(records, manifest.seq_len) if label == 1 else ""
        warnings.warn(f"{share:.0%} of the NSP labels are {label} ({what}), {rows} rows{why}",
                      stacklevel=2)
    same = sum(r.get("nsp_same_document", 0) for r in records)
    if same > SAME_DOC_WARN_SHARE * rows:
        warnings.warn(f"{same} of {rows} NSP rows are labelled random with B from A's own "
                      "document: their chunk held pieces of a single document of its split (as "
                      "BERT falls back to); expected more documents per chunk (--chunk-docs, or "
                      "shorter documents)", stacklevel=2)
        return
    # The validation split alone: a hundredth of the rows, where a chunk's held-out side is
    # often pieces of one long document; its val_nsp_acc then scores some IsNext text as random.
    val_rows = sum(r.get("nsp_validation_rows", 0) for r in records)
    val_same = sum(r.get("nsp_validation_same_document", 0) for r in records)
    if val_same > VAL_SAME_DOC_WARN_SHARE * val_rows:
        warnings.warn(f"validation: {val_same} of its {val_rows} NSP rows are labelled random "
                      "with B from A's own document (its chunks held out pieces of one long "
                      "document), so val_nsp_acc scores text of A's own document as random; "
                      "expected a larger --validation-fraction (more documents held out) or "
                      "shorter documents",
                      stacklevel=2)


def _why_random(records: list[dict[str, Any]], seq_len: int) -> str:
    """Why most NSP labels are 1: the commonest reason an A of one sentence had no B to follow
    it (BERT's recipe then takes a random B), from the workers' counts."""
    counts = {cause: sum(r.get(f"nsp_{cause}", 0) for r in records)
              for cause in ("one_sentence_document", "sentence_fills_target", "last_sentence")}
    cause = max(counts, key=counts.get)  # type: ignore[arg-type]
    if cause == "sentence_fills_target" and counts[cause]:
        return (f": in {counts[cause]} rows A is one sentence that alone fills the {seq_len - 3} "
                f"tokens a pair holds (--seq-len {seq_len} less [CLS] and two [SEP]), so no "
                "next sentence fits; expected a longer --seq-len (or shorter sentences)")
    if cause == "last_sentence" and counts[cause]:
        return (f": in {counts[cause]} rows A is the last sentence of its document, left alone "
                "after the segment before it, so no next sentence exists; expected documents of "
                f"more sentences (or a longer --seq-len than {seq_len})")
    return (": documents of one sentence cannot give a next sentence; expected documents of "
            "several sentences")

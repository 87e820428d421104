"""The warnings of a finished `bertgpu prepare` (one line each) for a shard set that is complete
but not what the user expects: more than 5% of the tokens, or of the characters of a sample of
the corpus, [UNK] (the tokenizer does not cover the text), more than 90% of the NSP labels one
class (and the commonest reason), many random next segments taken from A's own document."""

from __future__ import annotations

import os
import warnings
from typing import Any

from bertgpu.data.manifest import Manifest
from bertgpu.data.tokenizer_folder import MAX_WORD_CHARS
from bertgpu.errors import BertgpuError

UNK_WARN_SHARE = 0.05  # more [UNK] than this: the vocabulary does not cover the text
NSP_WARN_SHARE = 0.9  # one NSP label on more rows than this: the task teaches little
SAME_DOC_WARN_SHARE = 0.05  # random-next Bs from A's own document (chunks of pieces of one)
VAL_SAME_DOC_WARN_SHARE = 0.2  # the same in the validation split: its ~1% of the rows are noisier
UNK_SAMPLE_CHARS = 1 << 18  # characters of the corpus encoded again to count [UNK] by characters
UNK_SAMPLE_FILES = 8  # ... read from the start of at most this many inputs, spread over them


def warn_about_result(records: list[dict[str, Any]], manifest: Manifest,
                       tokenizer_dir: str | os.PathLike) -> None:
    """One warning each for a shard set that is complete but not what the user expects."""
    tokens = manifest.counts["tokens"]
    unk = sum(r.get("unk_tokens", 0) for r in records)
    lost = chars = 0
    if unk and unk <= UNK_WARN_SHARE * tokens:  # few tokens, but maybe long runs of text each
        try:  # best effort: a sample that cannot be read (a remote store's own error) must not
            lost, chars = unk_characters(manifest, tokenizer_dir)  # fail a finished prepare
        except Exception:  # noqa: BLE001
            lost = chars = 0
    if unk > UNK_WARN_SHARE * tokens or lost > UNK_WARN_SHARE * chars:
        share = (f"{unk / tokens:.0%} of the tokens are [UNK] ({unk} of {tokens})" if not chars
                 else f"{lost / chars:.0%} of the text's characters are [UNK] ({lost} of the "
                 f"{chars} characters other than spaces of a sample of the corpus), though only "
                 f"{unk / tokens:.1%} of the tokens are ({unk} of {tokens})")
        warnings.warn(f"{share}: the tokenizer {os.fspath(tokenizer_dir)} does not cover this "
                      "text; expected a tokenizer trained on similar text (bertgpu tokenizer "
                      f"--corpus ...), or, where it was, words of at most {MAX_WORD_CHARS} "
                      "characters (BERT encodes a longer one as one [UNK]: text without spaces, "
                      "such as Thai, must be split into words first)", stacklevel=2)
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
        # A chunk of one document's pieces takes B from the unit's earlier documents too
        # (`nsp_candidates`): these are a unit's first chunks, closed by their characters before
        # a second document came (a larger --chunk-docs than the ~8 pieces a chunk then holds
        # changes nothing), or the chunks of a unit of one document.
        warnings.warn(f"{same} of {rows} NSP rows are labelled random with B from A's own "
                      "document: their chunk held pieces of a single document of its split and "
                      "no other document of that split came before it in its work unit (as BERT "
                      "falls back to); expected a corpus of more documents (a document of about "
                      "a million characters or more fills a chunk alone)", stacklevel=2)
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


def unk_characters(manifest: Manifest, tokenizer_dir: str | os.PathLike) -> tuple[int, int]:
    """(characters encoded as [UNK], characters other than whitespace) of a sample of the corpus:
    the first `UNK_SAMPLE_CHARS` / `UNK_SAMPLE_FILES` characters of at most `UNK_SAMPLE_FILES`
    inputs spread over ``manifest.inputs``, encoded again with their offsets; (0, 0) where none
    can be read.

    The shards' count of [UNK] tokens hides the text they stand for: BERT encodes a word longer
    than MAX_WORD_CHARS as ONE [UNK], so a corpus whose lines in Thai (no spaces) were 39% of its
    characters had 1.9% of its tokens [UNK]. The workers keep no offsets, hence this sample,
    read by the format detected from the files (`--format auto`: the format given is not in
    the manifest); a file that reads otherwise (a --text-field other than "text") is left out.
    """
    from bertgpu.data.compressed import read_errors
    from bertgpu.data.corpus import iter_document_parts
    from bertgpu.data.sources import local_or_url
    from bertgpu.data.tokenizer_folder import find_tokenizer_folder, load_tokenizer

    paths = [entry["path"] for entry in manifest.inputs]
    step = max(1, len(paths) / UNK_SAMPLE_FILES)
    picked = [paths[int(i * step)] for i in range(min(len(paths), UNK_SAMPLE_FILES))]
    budget = UNK_SAMPLE_CHARS // max(1, len(picked))
    sentences: list[str] = []
    for path in picked:
        left = budget
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for part, _ in iter_document_parts([local_or_url(path)]):
                    sentences.extend(part)
                    left -= sum(len(s) for s in part)
                    if left <= 0:
                        break
        except (BertgpuError, *read_errors()):
            continue  # (anything else: warn_about_result gives up on the sample)
    if not sentences:
        return 0, 0
    with warnings.catch_warnings():  # load_tokenizer's own warnings were given by prepare
        warnings.simplefilter("ignore")
        tokenizer = load_tokenizer(find_tokenizer_folder(tokenizer_dir) or tokenizer_dir)
    unk_id = manifest.special_tokens["unk"]
    tokenizer.no_truncation()
    tokenizer.no_padding()
    encodings = tokenizer.encode_batch(sentences, add_special_tokens=False)
    lost = sum(_letters(text[a:b]) for text, enc in zip(sentences, encodings, strict=True)
               for i, (a, b) in zip(enc.ids, enc.offsets, strict=True) if i == unk_id)
    return lost, sum(_letters(text) for text in sentences)


def _letters(text: str) -> int:
    """Characters of ``text`` other than whitespace."""
    return len(text) - sum(c.isspace() for c in text)


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

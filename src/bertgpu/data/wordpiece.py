"""Training a WordPiece vocabulary, deterministically: `bertgpu tokenizer`'s engine
(`data/tokenizer.py` writes the folder, `data/tokenizer_folder.py` reads it).

`copy_corpus` reads the corpus once, counting characters and words and copying the text for
the `tokenizers` trainer (`train_on_copy`); the initial alphabet and the "##c" pieces are chosen
here, so two runs give the same vocabulary (`_initial_vocabulary`). Characters other than CJK
ideographs are kept up to `limit_alphabet`, then CJK ideographs, most frequent first and never
beyond what `vocab_size` has room for (a warning names what was left out); words that can only
encode as [UNK] (a run of letters over MAX_WORD_CHARS) are left out of the training text.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

from bertgpu.data.textio import CJK_IDEOGRAPHS
from bertgpu.data.tokenizer_folder import MAX_WORD_CHARS, SPECIAL_TOKENS, _pipeline
from bertgpu.errors import BertgpuError

_CJK = CJK_IDEOGRAPHS  # split one by one by BERT's normaliser
_CJK_CHAR = re.compile(f"[{_CJK}]")
DROPPED_CHARS_WARN = 0.005
"""Characters left out of the alphabet above this share of the characters in words: a warning."""


@functools.cache
def _long_word() -> re.Pattern[str]:
    """A run of more than MAX_WORD_CHARS letters, digits and combining marks, CJK aside: inside
    one word of BERT's pre-tokenizer (they are neither whitespace nor punctuation). The marks
    count: Thai, Lao, Khmer and Burmese words are full of vowel and tone marks, which cut a run
    of letters alone into short pieces (a 165-character Thai word counted as none)."""
    marks, start = [], None
    for code in range(sys.maxunicode + 2):  # 0.2 s, once per process that trains a vocabulary
        is_mark = code <= sys.maxunicode and unicodedata.category(chr(code))[0] == "M"
        if is_mark and start is None:
            start = code
        elif not is_mark and start is not None:
            marks.append(f"{re.escape(chr(start))}-{re.escape(chr(code - 1))}")
            start = None
    # one class (an alternation was 5-25x slower on long strings of short runs)
    return re.compile(rf"(?:(?![_{_CJK}])[\w{''.join(marks)}]){{{MAX_WORD_CHARS + 1},}}")


LONG_RUNS_WARN = 0.01
"""Characters in runs of letters that can only be [UNK] above this share of the text: a warning."""


def _without_unknown_words(text: str, normalize: Callable[[str], str] = str) -> tuple[str, int]:
    """`text` without its runs of letters, digits and marks (CJK aside) longer than
    MAX_WORD_CHARS once normalised (`normalize`: the tokenizer's; stripping accents removes
    marks, and a Thai run of 115 characters is a word of 75), and how many characters those runs
    held.

    Such a run lies inside one word of BERT's pre-tokenizer (letters and digits are neither
    whitespace nor punctuation), a word that encodes as [UNK] whatever the vocabulary; the
    WordPiece trainer's time grows with the square of a word's length (one base64 blob or DNA
    string of 300 kB took it 108 s), for pieces no encoding uses. Only the lines with a longer
    whitespace-free stretch than that are touched (found by str.split, at C speed)."""
    words = text.split()
    if not words or max(map(len, words)) <= MAX_WORD_CHARS:
        return text, 0
    lines = text.split("\n")
    removed = 0

    def cut(m: re.Match[str]) -> str:
        nonlocal removed
        if len(normalize(m.group())) <= MAX_WORD_CHARS:
            return m.group()
        removed += len(m.group())
        return " "

    for i, line in enumerate(lines):
        parts = line.split()
        if parts and max(map(len, parts)) > MAX_WORD_CHARS:
            lines[i] = " ".join(_long_word().sub(cut, w) if len(w) > MAX_WORD_CHARS else w
                                for w in parts)
    return "\n".join(lines), removed


BATCH_CHARS = 1 << 18
"""Characters of sentences counted together (`_sentence_batches`; its words take about 15 times
their size): a one-line corpus arrives in 1 MiB pieces, each one "sentence", and 1000 of them
made a batch of 1 GB."""
NORMALIZE_CHARS = 1 << 16
"""Characters the normaliser gets in one call (`_normalized`): it keeps an alignment per byte,
about 58 times its input (a batch of 100 MB of text took 5.9 GB)."""
_CUT_WINDOW = 4096  # characters before a piece's end where `_piece_end` looks for a cut


def _sentence_batches(parts: Iterator[tuple[list[str], bool]], batch: int = 1000
                      ) -> Iterator[list[str]]:
    """The sentences of ``parts`` in batches of ``batch`` sentences or BATCH_CHARS characters,
    whichever comes first (the batches only bound memory: what is counted does not depend on
    them)."""
    buf: list[str] = []
    chars = 0
    for sentences, _ in parts:
        buf.extend(sentences)
        chars += sum(map(len, sentences))
        if len(buf) >= batch or chars >= BATCH_CHARS:
            yield buf
            buf, chars = [], 0
    if buf:
        yield buf


def _normalized(text: str, normalize: Callable[[str], str]) -> str:
    """``normalize(text)`` (BERT's normaliser), called on pieces of at most NORMALIZE_CHARS
    characters so that its memory does not grow with the text (a line can be megabytes).

    The result is the same: the normaliser maps character by character, except that NFD (accent
    stripping) reorders a run of combining marks, and a piece ends before a character that
    starts no such run (`_piece_end`)."""
    if len(text) <= NORMALIZE_CHARS:
        return normalize(text)
    pieces = []
    start = 0
    while start < len(text):
        end = _piece_end(text, start, start + NORMALIZE_CHARS)
        pieces.append(normalize(text[start:end]))
        start = end
    return "".join(pieces)


def _piece_end(text: str, start: int, end: int) -> int:
    """Where a piece of ``text`` from ``start`` ends, at or before ``end``: after the last space
    or newline in the `_CUT_WINDOW` characters before it, else before the last character there
    that the normaliser keeps and that decomposes to a starter first (NFD reorders nothing
    across it), else at ``end`` (a run of combining marks that long is no text)."""
    if end >= len(text):
        return len(text)
    low = max(start + 1, end - _CUT_WINDOW)
    space = max(text.rfind(" ", low, end), text.rfind("\n", low, end))
    if space >= 0:
        return space + 1
    for i in range(end, low - 1, -1):
        c = text[i]
        if (unicodedata.category(c)[0] != "C" and not unicodedata.combining(c)
                and not unicodedata.combining(unicodedata.normalize("NFD", c)[0])):
            return i
    return end


def _initial_vocabulary(batches: Iterator[list[str]], tokenizer, limit_alphabet: int,
                        copy: TextIO, vocab_size: int = 30522) -> tuple[list[str], list[str]]:
    """(alphabet, continuation pieces) the WordPiece trainer starts from, chosen deterministically;
    every sentence is also written to ``copy``, one per line (a long one cut at spaces,
    `_write_copy`), for the trainer to read back.

    Why: the `tokenizers` trainer (0.2x) numbers the "##c" pieces in the iteration order of a
    Rust HashMap of words, which is seeded at random in every process, and breaks ties between
    merges of equal count by those numbers; with more distinct characters than
    ``limit_alphabet`` it also drops characters of equal count in that random order. Two
    trainings on the same text then differ by a few merges. Here the same normaliser and
    pre-tokenizer see the text once; the alphabet is the ``limit_alphabet`` most frequent
    characters (ties by code point; CJK ideographs apart), as many as ``vocab_size`` has room
    for with their pieces (`_fit`), and the pieces are every "##c" of an alphabet character
    that occurs inside a word, sorted.
    Handed to the trainer as its initial alphabet and (temporary) special tokens, they hold the
    same ids in every run, so the merges are the same too.
    """
    chunks: Counter[str] = Counter()
    chars: Counter[str] = Counter()
    in_runs = 0  # characters left out in runs that can only be [UNK]
    normalize = functools.partial(_normalized, normalize=tokenizer.normalizer.normalize_str)
    for batch in batches:
        joined = "\n".join(batch)
        # The normaliser works character by character, so one call per batch equals one per line.
        text = normalize(joined)
        words = text.split()  # whitespace first (fast), punctuation per distinct chunk below
        if words and max(map(len, words)) > MAX_WORD_CHARS:  # rare: a word that can only be [UNK]
            joined, removed = _without_unknown_words(joined, normalize)
            in_runs += removed
            text = normalize(joined)
            words = text.split()
        _write_copy(copy, joined)
        chars.update(text)
        chunks.update(words)
    _warn_long_runs(in_runs, sum(chars.values()))
    in_words: set[str] = set()
    inside: set[str] = set()
    for chunk in chunks:
        for word, _ in tokenizer.pre_tokenizer.pre_tokenize_str(chunk):
            in_words.update(word)
            inside.update(word[1:])
    ranked = sorted(in_words, key=lambda c: (-chars[c], c))
    # CJK ideographs are words of their own to BERT (one per token, never "##"): they are not
    # an alphabet, and a Chinese corpus has thousands. `limit_alphabet` limits the other
    # characters; the vocabulary's room (--vocab-size less the specials) takes them first, then
    # the CJK ideographs, most frequent first. The trainer writes every alphabet character and
    # its "##c" whatever vocab_size says, so what does not fit is left out here: a vocabulary
    # never larger than asked (the model's embedding table is sized from it).
    wanted = [c for c in ranked if not _CJK_CHAR.match(c)][:limit_alphabet]
    room = vocab_size - len(SPECIAL_TOKENS)
    other, room = _fit(wanted, room, inside)
    cjk, room = _fit([c for c in ranked if _CJK_CHAR.match(c)], room, inside)
    alphabet = sorted(other + cjk)
    if ranked and not alphabet:
        cost = len(SPECIAL_TOKENS) + 1 + (ranked[0] in inside)
        raise BertgpuError(f"--vocab-size {vocab_size}: no room for any character of the corpus "
                           f"besides the {len(SPECIAL_TOKENS)} special tokens; expected at "
                           f"least {cost} (or {_needed(wanted, inside)} to keep every character "
                           f"--limit-alphabet {limit_alphabet} keeps)")
    trimmed = len(other) < len(wanted)
    _warn_dropped_characters(ranked, set(alphabet), chars, limit_alphabet, vocab_size,
                             (len(wanted), _needed(wanted, inside)) if trimmed else None)
    return alphabet, [f"##{c}" for c in alphabet if c in inside]


def _write_copy(copy: TextIO, text: str) -> None:
    """``text`` and a newline into the trainer's copy, a line over NORMALIZE_CHARS characters
    cut at spaces into lines: the trainer normalises a line at a time, at 58 times its size too
    (1 MiB lines took it 145 MB more), and a newline ends a word where a space did, so it counts
    the same words."""
    lines = text.split("\n")
    if max(map(len, lines)) <= NORMALIZE_CHARS:
        copy.write(text + "\n")
        return
    for line in lines:
        start = 0
        while len(line) - start > NORMALIZE_CHARS:
            end = line.rfind(" ", start + 1, start + NORMALIZE_CHARS)
            end = end if end >= 0 else line.find(" ", start + NORMALIZE_CHARS)  # a long word
            if end < 0:
                break
            copy.write(line[start:end] + "\n")
            start = end + 1
        copy.write(line[start:] + "\n")


def _warn_long_runs(in_runs: int, kept: int) -> None:
    """One warning when more than LONG_RUNS_WARN of the text is in runs of letters longer than
    MAX_WORD_CHARS: a script written without spaces (two thirds of a Thai corpus's lines were
    one [UNK] each, and `prepare` then blamed the tokenizer for the [UNK]s)."""
    share = in_runs / max(in_runs + kept, 1)
    if share > LONG_RUNS_WARN:
        warnings.warn(f"{share:.0%} of the text is in runs of letters longer than "
                      f"{MAX_WORD_CHARS} characters without a space or punctuation (a script "
                      "written without spaces, such as Thai, Lao, Khmer or Burmese, or data such "
                      "as base64): BERT encodes each run as one [UNK], so they were left out of "
                      "the vocabulary's training; expected text split into words first (Thai: "
                      "PyThaiNLP's word_tokenize)", stacklevel=3)


def _fit(ranked: list[str], room: int, inside: set[str]) -> tuple[list[str], int]:
    """The characters of ``ranked`` (most frequent first) that fit in ``room`` vocabulary
    entries, each taking one and one more for its "##c" when it occurs inside a word; the room
    left. A character too large for what is left is skipped and a later, smaller one may fit,
    so the vocabulary is filled to the size asked."""
    kept = []
    for c in ranked:
        cost = 1 + (c in inside)
        if cost <= room:
            kept.append(c)
            room -= cost
    return kept, room


def _needed(wanted: list[str], inside: set[str]) -> int:
    """Vocabulary entries the specials, ``wanted`` and their "##c" pieces take."""
    return len(SPECIAL_TOKENS) + len(wanted) + sum(c in inside for c in wanted)


def _warn_dropped_characters(ranked: list[str], kept: set[str], chars: Counter[str],
                             limit_alphabet: int, vocab_size: int,
                             needed: tuple[int, int] | None) -> None:
    """One warning when characters are left out of the alphabet (they encode as [UNK]): always
    when --vocab-size had no room for the characters --limit-alphabet keeps (``needed``: how
    many they are, and the vocabulary entries they take with the specials), otherwise when they
    are more than DROPPED_CHARS_WARN of the characters in words; naming the setting that left
    them out."""
    dropped = [c for c in ranked if c not in kept]
    total = sum(chars[c] for c in ranked)
    share = sum(chars[c] for c in dropped) / max(total, 1)
    if not dropped or (needed is None and share <= DROPPED_CHARS_WARN):
        return
    cjk = sum(1 for c in dropped if _CJK_CHAR.match(c))
    if needed is not None:
        n, size = needed
        why = (f"--vocab-size {vocab_size} is smaller than the {size} entries the alphabet "
               f"needs ({len(SPECIAL_TOKENS)} special tokens, {n} characters and "
               f"{size - n - len(SPECIAL_TOKENS)} ## pieces), so the most frequent characters "
               "that fit were kept")
        expected = (f"--vocab-size {size} or more to keep them (more for merged pieces), or a "
                    "smaller --limit-alphabet")
    else:
        why = (f"--limit-alphabet {limit_alphabet} keeps that many characters besides CJK "
               "ideographs" if cjk < len(dropped) else
               f"--vocab-size {vocab_size} has no room for more CJK ideographs")
        expected = "a larger --limit-alphabet or --vocab-size"
    warnings.warn(f"{len(dropped)} characters ({share:.1%} of the characters in words, e.g. "
                  f"{' '.join(dropped[:5])}) are not in the vocabulary and will encode as [UNK]: "
                  f"{why}; expected {expected}", stacklevel=3)


STRIPPED_LETTERS_WARN = 0.02
"""Letters past Latin, Greek and Cyrillic that stripping accents changes, above this share of
the letters: a warning."""


def warn_stripped_letters(sample: str) -> None:
    """One warning when stripping accents (the uncased default) changes more than
    STRIPPED_LETTERS_WARN of the letters of `sample` (the start of the corpus) outside Latin,
    Greek and Cyrillic, whose accents BERT's uncased models drop by design: kana lost their
    voicing marks (がっこう and かっこう became one word), Devanagari its vowel signs and nukta,
    and Hangul broke into jamo, silently."""
    letters = changed = 0
    seen: Counter[str] = Counter()
    for c in sample:
        category = unicodedata.category(c)
        if not (category[0] == "M" or c.isalpha()):
            continue
        letters += 1
        # Stripping removes the non-spacing marks (Mn; spacing vowel signs, Mc, stay), and a
        # variation selector (U+FE0F after an emoji) changes no letter.
        if _off_latin(c) and not _VARIATION_SELECTOR.match(c) if category == "Mn" else (
                category[0] != "M" and (d := unicodedata.normalize("NFD", c)) != c
                and _off_latin(d[0])):
            changed += 1
            seen[c] += 1
    if letters and changed > STRIPPED_LETTERS_WARN * letters:
        warnings.warn(f"stripping accents (--strip-accents; the default without --cased) changes "
                      f"{changed / letters:.0%} of the letters of this corpus outside Latin, "
                      f"Greek and Cyrillic (e.g. {' '.join(c for c, _ in seen.most_common(5))}): "
                      "kana lose their voicing marks (が becomes か), Indic scripts their vowel "
                      "signs, Hangul breaks into jamo; expected --strip-accents no (lower-cased, "
                      "marks kept) or --cased, as Google's multilingual BERT advises for such "
                      "scripts", stacklevel=3)


_VARIATION_SELECTOR = re.compile("[\ufe00-\ufe0f\U000e0100-\U000e01ef]")


def _off_latin(c: str) -> bool:
    """Whether `c` (a letter, the base of a decomposed letter, or a combining mark) is outside
    Latin, Greek and Cyrillic and their combining marks: Vietnamese (ệ), polytonic Greek (ἀ) and
    Yoruba (ẹ́) are Latin and Greek letters under their accents."""
    return not (c < "\u0530" or "\u1ab0" <= c <= "\u1aff" or "\u1dc0" <= c <= "\u1fff"
                or "\u20d0" <= c <= "\u20ff" or "\ufe20" <= c <= "\ufe2f")


def new_wordpiece(lowercase: bool, strip_accents: bool | None):
    """An untrained WordPiece tokenizer with BERT's pipeline (what `copy_corpus` normalises with
    and `train_on_copy` trains)."""
    from tokenizers import Tokenizer, models

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##",
                                     max_input_chars_per_word=MAX_WORD_CHARS))
    _pipeline(tok, lowercase, strip_accents, cls_id=2, sep_id=3)
    return tok


def copy_corpus(parts: Iterator[tuple[list[str], bool]], tok, copy_path: Path,
                limit_alphabet: int, vocab_size: int) -> tuple[list[str], list[str]]:
    """Read the corpus once, counting and copying its sentences to ``copy_path`` (the trainer's
    Rust reader then skips decompression and markup): (alphabet, continuation pieces), see
    `_initial_vocabulary`. An empty alphabet: no character of the corpus survives BERT's
    normaliser (only control or format characters), nothing to learn from."""
    with open(copy_path, "w", encoding="utf-8") as copy:
        return _initial_vocabulary(_sentence_batches(parts), tok, limit_alphabet, copy,
                                   vocab_size)


def train_on_copy(tok, copy_path: Path, alphabet: list[str], pieces: list[str], lowercase: bool,
                  strip_accents: bool | None, vocab_size: int, min_frequency: int):
    """Train the WordPiece model on the copy `copy_corpus` wrote; the trained tokenizer."""
    from tokenizers import trainers

    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS + pieces,
        limit_alphabet=len(alphabet),
        initial_alphabet=alphabet,
        continuing_subword_prefix="##",
        show_progress=False,
    )
    tok.train([str(copy_path)], trainer=trainer)
    tok = _without_added_pieces(tok, lowercase, strip_accents)
    for i, t in enumerate(SPECIAL_TOKENS):  # the trainer puts them first, in order; check it
        if tok.token_to_id(t) != i:
            raise RuntimeError(f"special token {t} got id {tok.token_to_id(t)}, expected {i}")
    return tok


def _without_added_pieces(trained, lowercase: bool, strip_accents: bool | None):
    """The trained vocabulary in a fresh tokenizer whose only added tokens are the five specials
    (the "##c" pieces were special tokens only to pin their ids during training)."""
    from tokenizers import AddedToken, Tokenizer, models

    vocab = trained.get_vocab(with_added_tokens=True)
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##",
                                     max_input_chars_per_word=MAX_WORD_CHARS))
    _pipeline(tok, lowercase, strip_accents, cls_id=2, sep_id=3)
    tok.add_special_tokens([AddedToken(t, special=True) for t in SPECIAL_TOKENS])
    return tok

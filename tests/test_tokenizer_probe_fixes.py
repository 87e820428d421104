"""Fixes from the tokenizer probe (tokenizer2): --vocab-size never exceeded by the alphabet,
--sample-bytes counting UTF-8 bytes, literal "[MASK]" & co. in the corpus encoded as text by
`prepare`, the whole-word note of `prepare`, and whole-word masking of a data folder whose
tokenizer is tokenizer.json alone."""

from __future__ import annotations

import gzip
import random
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from bertgpu.cli import main as cli_main
from bertgpu.data.corpus import CorpusStats
from bertgpu.data.prepare import prepare
from bertgpu.data.tokenizer import _document_parts, train_tokenizer
from bertgpu.data.tokenizer_folder import SPECIAL_TOKENS, load_tokenizer
from bertgpu.errors import BertgpuError

GREEK_CYRILLIC = ("abcdefghijklmnopqrstuvwxyzαβγδεζηθικλμνξοπρστυφχψωабвгдежзийклмнопрстуфхцчшщ"
                  "ъыьэюя")


def _multi_script(path: Path, lines: int = 300) -> Path:
    """Random words over 81 letters of three scripts (the probe's corpus, smaller)."""
    r = random.Random(0)
    text = "\n".join(" ".join("".join(r.choice(GREEK_CYRILLIC) for _ in range(r.randint(2, 8)))
                              for _ in range(12)) for _ in range(lines))
    path.write_text(text + "\n", encoding="utf-8")
    return path


def _vocab(folder: Path) -> list[str]:
    return (folder / "vocab.txt").read_text(encoding="utf-8").splitlines()


# --------------------------------------------------------------------------- --vocab-size


def test_vocab_size_below_the_alphabet_keeps_the_most_frequent_characters(tmp_path):
    """--vocab-size 50 on 81 characters that all occur inside words wrote 167 entries (5
    specials, 81 characters, 81 "##c"), silently; now exactly 50, the most frequent characters
    with their pieces, and a warning naming how many characters were left out and the size
    that keeps them all."""
    corpus = _multi_script(tmp_path / "multi.txt")
    with pytest.warns(UserWarning, match=r"--vocab-size 50 is smaller than the 167 entries") as w:
        out = train_tokenizer([corpus], tmp_path / "tok50", vocab_size=50)
    vocab = _vocab(out)
    assert len(vocab) == 50, len(vocab)
    assert load_tokenizer(out).get_vocab_size(with_added_tokens=True) == 50
    assert vocab[:5] == SPECIAL_TOKENS
    letters = [t for t in vocab[5:] if not t.startswith("##")]
    assert all(f"##{c}" in vocab for c in letters)  # a kept character has its piece
    # The dropped characters are the rarest ones (counted as the normaliser leaves them: "й"
    # loses its accent when lower-casing strips accents).
    text = load_tokenizer(out).normalizer.normalize_str(corpus.read_text(encoding="utf-8"))
    counts = Counter(text.replace(" ", "").replace("\n", ""))
    message = str(w[0].message)
    assert len(counts) == 81 and "--vocab-size 167 or more" in message, message
    assert message.startswith(f"{81 - len(letters)} characters"), message
    assert min(counts[c] for c in letters) >= max(counts[c] for c in counts if c not in letters)


def test_vocab_size_with_room_for_the_alphabet_is_unchanged(tmp_path):
    """A size with room for the alphabet gives the asked size and no alphabet warning; a size
    with room for no character at all is a one-line error naming the size needed."""
    corpus = _multi_script(tmp_path / "multi.txt")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = train_tokenizer([corpus], tmp_path / "tok300", vocab_size=300)
    assert len(_vocab(out)) == 300
    with pytest.raises(BertgpuError, match=r"--vocab-size 6: no room for any character .* "
                                           r"expected at least 7 \(or 167"):
        train_tokenizer([corpus], tmp_path / "tok6", vocab_size=6)
    assert not (tmp_path / "tok6").exists() and not (tmp_path / "tok6.tmp").exists()


# --------------------------------------------------------------------------- --sample-bytes


def _chinese(path: Path, docs: int = 1500) -> Path:
    """Documents of 4 lines of 30 random CJK characters (90 bytes of UTF-8 each)."""
    r = random.Random(1)
    chars = [chr(c) for c in range(0x4E00, 0x4E00 + 3000)]
    path.write_text("".join("".join("".join(r.choices(chars, k=30)) + "。\n" for _ in range(4))
                            + "\n" for _ in range(docs)), encoding="utf-8")
    return path


def _sample_size(path: Path, sample_bytes: int, fmt: str = "auto") -> int:
    """UTF-8 bytes of the text `bertgpu tokenizer --sample-bytes` trains on."""
    parts = _document_parts([path], fmt, "text", False, CorpusStats(), sample_bytes)
    return sum(len(s.encode("utf-8")) for sentences, _ in parts for s in sentences)


@pytest.mark.parametrize("compressed", [False, True])
def test_sample_bytes_counts_utf8_bytes_of_chinese(tmp_path, compressed):
    """--sample-bytes 60000 of a Chinese corpus read 3x as many bytes (it counted characters);
    now the sample's UTF-8 size is within a few percent of the asked bytes (windows of an
    uncompressed file), or at most the asked bytes and at least a third of them (every k-th
    document of a gzip stream, which halves when it passes the limit)."""
    path = _chinese(tmp_path / "zh.txt")
    asked = 60_000
    assert path.stat().st_size > 9 * asked
    if compressed:
        gz = tmp_path / "zh.txt.gz"
        gz.write_bytes(gzip.compress(path.read_bytes(), mtime=0))
        got = _sample_size(gz, asked)
        assert asked / 3 <= got <= 1.02 * asked, got
    else:
        got = _sample_size(path, asked)
        assert 0.95 * asked <= got <= 1.02 * asked, got


def test_sample_bytes_of_long_documents_is_cut_to_the_quota(tmp_path):
    """A corpus of 50 kB documents: each window of the sample took a whole part of a document
    (up to 64k characters) where its quota was a few kB, 100 kB asked read 3.4x that; the part
    that reaches the quota is cut there, between words."""
    r = random.Random(2)
    words = "alpha beta gamma delta epsilon zeta theta iota kappa lambda mu".split()
    path = tmp_path / "long.txt"
    path.write_text("".join(" ".join(r.choice(words) for _ in range(8000)) + "\n\n"
                            for _ in range(60)), encoding="utf-8")
    got = _sample_size(path, 100_000, "text")
    assert 0.95 * 100_000 <= got <= 1.02 * 100_000, got
    parts = _document_parts([path], "text", "text", False, CorpusStats(), 100_000)
    assert all(s.split()[-1] in words for sentences, _ in parts for s in sentences)


def test_tokenizer_cli_sample_bytes_of_chinese(tmp_path, monkeypatch):
    """The command line trains on about --sample-bytes bytes (the text the trainer reads)."""
    import bertgpu.data.wordpiece as wordpiece

    path = _chinese(tmp_path / "zh.txt")
    seen = {}
    copy_corpus = wordpiece.copy_corpus

    def spy(parts, tok, copy_path, *args):
        result = copy_corpus(parts, tok, copy_path, *args)
        seen["bytes"] = len(Path(copy_path).read_text(encoding="utf-8").replace("\n", "")
                            .encode("utf-8"))
        return result

    monkeypatch.setattr(wordpiece, "copy_corpus", spy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fewer pieces than asked: not the point here
        code = cli_main(["tokenizer", "--corpus", str(path), "--vocab-size", "3000",
                         "--sample-bytes", "50000", "--out", str(tmp_path / "tok")])
    assert code == 0
    assert 0.95 * 50_000 <= seen["bytes"] <= 1.02 * 50_000, seen


# --------------------------------------------------------------------------- literal specials

LITERAL = ["In BERT the input starts with [CLS] and segments end with [SEP].",
           "Padding positions hold [PAD] and the masked ones [MASK], unknown ones [UNK].",
           "Write [MASK] where the model should predict a word."]


@pytest.fixture(scope="module")
def literal(tmp_path_factory):
    """A one-document corpus that writes the special tokens literally, and a tokenizer trained
    on it (every character known: any [UNK] in the shards would be the text's "[UNK]")."""
    folder = tmp_path_factory.mktemp("literal")
    corpus = folder / "lit.txt"
    corpus.write_text("\n".join(LITERAL * 20) + "\n", encoding="utf-8")
    tok = train_tokenizer([corpus], folder / "tok", vocab_size=120, min_frequency=1)
    return corpus, tok


@pytest.mark.filterwarnings("ignore:.*NSP rows labelled random")  # (a one-document corpus)
@pytest.mark.parametrize("objective", ["mlm", "mlm+nsp"])
def test_literal_special_tokens_in_the_corpus_are_encoded_as_text(literal, tmp_path, objective):
    """"[PAD]", "[MASK]", "[SEP]"... written in the corpus became the special ids in the shards
    (a [PAD] inside an attended row, a [MASK] input without a label, a fake segment end); now
    they are "[", "mask", "]" as in BERT's create_pretraining_data, and the only special ids
    are the packer's: [CLS] first, [SEP] at the segment ends, nothing else."""
    corpus, tok = literal
    out = tmp_path / "data"
    prepare([corpus], tok, out, seq_len=32, objective=objective, workers=1,
            validation_fraction=0.0)
    ids = np.concatenate([np.load(p) for p in sorted(out.glob("train-*.input_ids.npy"))])
    lengths = np.concatenate([np.load(p) for p in sorted(out.glob("train-*.lengths.npy"))])
    t = load_tokenizer(tok)
    special = {name: t.token_to_id(name) for name in SPECIAL_TOKENS}
    for row, n in zip(ids, lengths, strict=True):
        row = row[:n].tolist()
        for name in ("[PAD]", "[UNK]", "[MASK]"):
            assert special[name] not in row, (name, row)
        assert row[0] == special["[CLS]"] and special["[CLS]"] not in row[1:], row
        seps = [i for i, x in enumerate(row) if x == special["[SEP]"]]
        # one document: mlm ends each row with [SEP]; mlm+nsp has [SEP] after A and after B
        assert seps[-1] == n - 1 and len(seps) == (1 if objective == "mlm" else 2), row
    text = t.decode(ids[lengths > 0][0].tolist(), skip_special_tokens=False)
    assert "[" in text and "]" in text


def test_fine_tuning_tokenization_still_matches_transformers(literal):
    """The fix is `prepare`'s alone: the tokenizer fine-tuning loads (`load_tokenizer`) still
    encodes like transformers' AutoTokenizer, which matches special tokens in the text."""
    transformers = pytest.importorskip("transformers")
    _, tok = literal
    ours = load_tokenizer(tok)
    theirs = transformers.AutoTokenizer.from_pretrained(str(tok))
    for text in LITERAL:
        assert ours.encode(text).ids == theirs(text)["input_ids"], text
    assert ours.token_to_id("[MASK]") in ours.encode(LITERAL[2]).ids


# --------------------------------------------------------------------------- whole words


def test_prepare_says_word_starts_need_whole_word_masking(literal, tmp_path, capsys):
    """--whole-word-segmenter jieba stored word starts that no shipped config uses (they are
    read only with data.whole_word_masking = true): prepare says so in one line."""
    pytest.importorskip("jieba")
    corpus, tok = literal
    code = cli_main(["prepare", "--corpus", str(corpus), "--tokenizer", str(tok), "--out",
                     str(tmp_path / "d"), "--seq-len", "32", "--workers", "1",
                     "--validation-fraction", "0", "--whole-word-segmenter", "jieba"])
    out = capsys.readouterr().out
    assert code == 0
    line = [x for x in out.splitlines() if "word starts" in x]
    assert len(line) == 1 and "data.whole_word_masking = true" in line[0], out


def test_whole_word_masking_with_a_tokenizer_json_only_folder(literal, tmp_path):
    """A tokenizer folder without vocab.txt passes `prepare`; whole-word masking then failed
    with "cannot read the vocabulary ([Errno 2] ...)". The "##" table now comes from
    tokenizer.json's vocabulary, the same as vocab.txt's."""
    from bertgpu.data.masking import Masker, MaskingConfig, continuation_table_from_vocab
    from bertgpu.data.shards import ShardSet

    corpus, tok = literal
    json_only = tmp_path / "tok"
    json_only.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (json_only / name).write_bytes((tok / name).read_bytes())
    prepare([corpus], json_only, tmp_path / "d", seq_len=32, workers=1, validation_fraction=0.0)
    shards = ShardSet(tmp_path / "d")
    assert not (shards.tokenizer_dir / "vocab.txt").exists()
    masker = Masker.from_shards(MaskingConfig(whole_word=True), shards)
    expected = continuation_table_from_vocab(tok / "vocab.txt")
    np.testing.assert_array_equal(masker._continuation, expected)
    rows = shards.get(range(len(shards)))
    _, labels = masker.mask_batch(rows["input_ids"], rows["lengths"], 0, np.zeros(len(shards)),
                                  np.arange(len(shards)))
    assert (labels != -100).any()


def test_pretraining_says_when_the_shards_word_starts_go_unused(tmp_path):
    """Shards prepared with --whole-word-segmenter trained without data.whole_word_masking: the
    start-up says the word starts go unused (prepare says so too, but a recipe may not)."""
    from types import SimpleNamespace

    from bertgpu.tasks.pretraining import PretrainData

    data = PretrainData.__new__(PretrainData)
    data.train = SimpleNamespace(has_word_starts=True, data_dir=tmp_path,
                                 manifest=SimpleNamespace(whole_word_segmenter="jieba"))
    note = data.whole_word_note(False)
    assert note == (f"{tmp_path}: the shards carry jieba word starts but data.whole_word_masking "
                    "is false: masking single tokens; expected --data.whole_word_masking true to "
                    "mask whole words")
    assert data.whole_word_note(True) is None
    data.train.has_word_starts = False
    assert data.whole_word_note(False) is None


def test_cjk_ranges_are_the_normalisers_own():
    # U+2B820-U+2B91F counted as ideographs (Google's ranges) where the tokenizers library's
    # BertNormalizer, which encodes the shards, keeps them in words: a line past 1 MiB was cut
    # inside a word there, and its shards held other ids than transformers gives.
    import re

    from tokenizers.normalizers import BertNormalizer

    from bertgpu.data.textio import CJK_IDEOGRAPHS

    norm = BertNormalizer(clean_text=False, handle_chinese_chars=True, strip_accents=False,
                          lowercase=False)
    ours = re.compile(f"[{CJK_IDEOGRAPHS}]")
    points = [c for c in range(0x2E80, 0x30000) if not 0xD800 <= c < 0xE000]
    split = {c for c in points if norm.normalize_str(chr(c)) != chr(c)}
    assert {c for c in points if ours.match(chr(c))} == split


def test_text_without_spaces_is_named_when_its_runs_can_only_be_unk(tmp_path):
    # Two thirds of a Thai corpus's lines were one [UNK] each (a run past 100 characters), left
    # out of the training silently; prepare then blamed the tokenizer for the [UNK]s.
    rng = random.Random(0)
    # consonants, and the vowel and tone marks that real Thai words are full of (a run of
    # letters alone stopped at each mark: real Thai text counted no run and gave no warning)
    thai = [chr(c) for c in [*range(0x0E01, 0x0E2F), 0x0E31, *range(0x0E34, 0x0E3B),
                             *range(0x0E47, 0x0E4F)]]
    corpus = tmp_path / "th.txt"
    corpus.write_text("".join("".join(rng.choice(thai) for _ in range(rng.randint(40, 200)))
                              + "\n" for _ in range(300)), encoding="utf-8")
    with pytest.warns(UserWarning, match=r"\d+% of the text is in runs of letters longer than "
                                         r"100 characters without a space .* Thai"):
        train_tokenizer([corpus], tmp_path / "th", vocab_size=300, lowercase=False)
    # one data blob among ordinary lines is left out without a word
    other = tmp_path / "en.txt"
    other.write_text("the cat sat on the mat .\n" * 2000 + "QUJD" * 60 + "\n", encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        train_tokenizer([other], tmp_path / "en", vocab_size=20)


def test_stripping_accents_off_latin_scripts_is_named(tmp_path):
    # Uncased (accents stripped) made がっこう and かっこう one word, silently.
    ja = tmp_path / "ja.txt"
    ja.write_text("がっこうへいきます。\nかっこういいですね。\nパンをたべます。\n" * 40,
                  encoding="utf-8")
    with pytest.warns(UserWarning, match=r"stripping accents \(--strip-accents; the default "
                                         r"without --cased\) changes \d+% of the letters .*"
                                         r"--strip-accents no"):
        train_tokenizer([ja], tmp_path / "ja", vocab_size=100)
    quiet = {"ja": dict(strip_accents=False), "ja2": dict(lowercase=False)}
    for name, kw in quiet.items():  # the settings the warning names keep the marks: no warning
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            warnings.filterwarnings("ignore", message="--vocab-size")
            train_tokenizer([ja], tmp_path / name / "tok", vocab_size=100, **kw)
    fr = tmp_path / "fr.txt"  # Latin and Greek accents: stripped by design, no warning
    fr.write_text("Café crème à la française, élève.\n" * 60 + "中文字。\n" * 20
                  + "Tiếng Việt là ngôn ngữ chính thức.\n" * 20 + "Ἐν ἀρχῇ ἦν ὁ λόγος.\n" * 20,
                  encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message="--vocab-size")
        train_tokenizer([fr], tmp_path / "fr", vocab_size=100)


def test_a_run_is_measured_as_the_normaliser_leaves_it(tmp_path):
    # A Thai word of 115 characters, 40 of them marks that the uncased default strips, is a word
    # of 75 to BERT: it was cut out of the training text (all 999 times) and counted as [UNK].
    from bertgpu.data.wordpiece import copy_corpus, new_wordpiece, warn_stripped_letters

    word = ("ที่นี่มีความสุขมาก" * 7)[:115]
    lines = [word + " ดี"] * 999 + ["x" * 150]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        copy_corpus(iter([(lines, False)]), new_wordpiece(True, None), tmp_path / "copy.txt",
                    1000, 30522)
    assert (tmp_path / "copy.txt").read_text(encoding="utf-8").count(word) == 999
    assert not any("runs of letters" in str(w.message) for w in seen)
    with warnings.catch_warnings():  # emoji's variation selector (U+FE0F) changes no letter
        warnings.simplefilter("error")
        warn_stripped_letters("Love this \u2764\ufe0f so much! Done \u2714\ufe0f\n" * 100)

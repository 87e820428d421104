"""WordPiece training: the folder loads in transformers' AutoTokenizer and encodes identically."""

from __future__ import annotations

import json
import shutil
import warnings

import pytest
from _text_fixtures import tokenizer_corpus, train_small_tokenizer

from bertgpu.cli import main as cli_main
from bertgpu.data.corpus import CorpusStats
from bertgpu.data.tokenizer import train_tokenizer
from bertgpu.data.tokenizer_folder import (
    SPECIAL_TOKENS,
    is_lowercase,
    load_tokenizer,
    special_token_ids,
    tokenizer_hash,
)
from bertgpu.errors import BertgpuError

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Crème brûlée, café au lait and a naïve résumé from Zürich.",
    "我爱自然语言处理",
    "MiXeD CaSe Python Keywords: LAMBDA, Yield, and [MASK] tokens.",
    "  spaces\tand\ncontrol\u0007 characters  ",
    "東京 is the capital; ümlaut ÅNGSTRÖM.",
]
PAIRS = [("What does the if statement do?", "It selects exactly one of the suites."),
         ("我爱", "Café")]


@pytest.fixture(scope="module")
def uncased(tmp_path_factory):
    return train_small_tokenizer(tmp_path_factory.mktemp("tok") / "uncased", lowercase=True)


@pytest.fixture(scope="module")
def cased(tmp_path_factory):
    return train_small_tokenizer(tmp_path_factory.mktemp("tok") / "cased", lowercase=False)


def test_folder_layout_and_special_tokens(uncased):
    assert sorted(p.name for p in uncased.iterdir()) == [
        "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "trained-from.json",
        "vocab.txt"]
    assert not uncased.with_name("uncased.tmp").exists()
    vocab = uncased.joinpath("vocab.txt").read_text(encoding="utf-8").splitlines()
    assert vocab[:5] == SPECIAL_TOKENS
    assert len(vocab) == load_tokenizer(uncased).get_vocab_size() <= 2000
    assert any(t.startswith("##") for t in vocab)
    config = json.loads(uncased.joinpath("tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "BertTokenizerFast"
    assert config["do_lower_case"] is True and config["strip_accents"] is None
    assert config["tokenize_chinese_chars"] is True and config["model_max_length"] == 512
    assert special_token_ids(uncased) == {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}


@pytest.mark.parametrize("which", ["uncased", "cased"])
def test_autotokenizer_encodes_exactly_like_load_tokenizer(which, request):
    from transformers import AutoTokenizer

    folder = request.getfixturevalue(which)
    hf = AutoTokenizer.from_pretrained(str(folder))
    ours = load_tokenizer(folder)
    for text in TEXTS:
        assert hf(text)["input_ids"] == ours.encode(text).ids, text
    for a, b in PAIRS:
        enc = ours.encode(a, b)
        ref = hf(a, b)
        assert ref["input_ids"] == enc.ids
        assert ref["token_type_ids"] == enc.type_ids
        first_sep = enc.ids.index(3)
        assert enc.type_ids == [0] * (first_sep + 1) + [1] * (len(enc.ids) - first_sep - 1)
    assert (hf.convert_tokens_to_ids(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
            == [0, 1, 2, 3, 4])


def test_chinese_split_char_by_char_and_case_handling(uncased, cased):
    tokens = load_tokenizer(uncased).encode("我爱自然语言处理").tokens
    assert tokens == ["[CLS]", *"我爱自然语言处理", "[SEP]"]
    low = load_tokenizer(uncased).encode("Café STATEMENT").tokens
    # lower-cased, accent stripped
    assert "".join(low).replace("##", "") == "[CLS]cafestatement[SEP]"
    keep = load_tokenizer(cased).encode("Café STATEMENT").tokens
    assert "é" in "".join(keep) and "S" in "".join(keep)
    assert is_lowercase(uncased) and not is_lowercase(cased)


@pytest.mark.parametrize(("lowercase", "strip", "expected"), [
    (False, True, "[CLS]CafeElan[SEP]"),  # cased, accents stripped
    (True, False, "[CLS]caféélan[SEP]"),  # lower-cased, accents kept
])
def test_strip_accents_apart_from_case_is_written_and_loaded(tmp_path, lowercase, strip,
                                                             expected):
    """Accent stripping that differs from BERT's default (strip as lower-case) must reach
    tokenizer_config.json: transformers and `load_tokenizer` build the normaliser from it, so a
    null there would encode "Café Élan" with the case's default instead of what was trained."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("Café Élan and the café of Élan.\n\nA naïve résumé in Zürich.\n"
                      "The quick brown fox jumps over the lazy dog.\n", encoding="utf-8")
    folder = train_tokenizer([corpus], tmp_path / "tok", vocab_size=100, lowercase=lowercase,
                             strip_accents=strip, min_frequency=1)
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["do_lower_case"] is lowercase and config["strip_accents"] is strip
    text = "Café Élan"
    trained = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text)
    assert "".join(trained.tokens).replace("##", "") == expected
    assert load_tokenizer(folder).encode(text).ids == trained.ids
    assert AutoTokenizer.from_pretrained(str(folder))(text)["input_ids"] == trained.ids
    # a folder of vocab.txt and the config alone: the settings come from the config only
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("vocab.txt", "tokenizer_config.json"):
        shutil.copy(folder / name, bare)
    assert load_tokenizer(bare).encode(text).ids == trained.ids
    assert AutoTokenizer.from_pretrained(str(bare))(text)["input_ids"] == trained.ids


def test_vocab_only_folder_loads_like_transformers(uncased, cased, tmp_path):
    from transformers import AutoTokenizer

    for src in (uncased, cased):
        folder = tmp_path / src.name
        folder.mkdir()
        shutil.copy(src / "vocab.txt", folder)
        shutil.copy(src / "tokenizer_config.json", folder)
        ours = load_tokenizer(folder)
        hf = AutoTokenizer.from_pretrained(str(folder))  # builds from vocab.txt, like ours
        for text in TEXTS:
            assert hf(text)["input_ids"] == ours.encode(text).ids, text
        assert ours.encode(*PAIRS[0]).ids == load_tokenizer(src).encode(*PAIRS[0]).ids
        assert tokenizer_hash(folder) == tokenizer_hash(src)
        assert special_token_ids(folder) == special_token_ids(src)


def test_hash_depends_on_vocab_and_normalisation(uncased, cased, tmp_path):
    copy = shutil.copytree(uncased, tmp_path / "copy")
    assert tokenizer_hash(copy) == tokenizer_hash(uncased)
    assert tokenizer_hash(cased) != tokenizer_hash(uncased)
    config = json.loads((copy / "tokenizer_config.json").read_text())
    config["do_lower_case"] = False
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    assert tokenizer_hash(copy) != tokenizer_hash(uncased)


def test_errors_name_the_folder(tmp_path, uncased):
    with pytest.raises(BertgpuError, match="nowhere"):
        load_tokenizer(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BertgpuError, match="empty: neither tokenizer.json nor vocab.txt"):
        special_token_ids(tmp_path / "empty")
    with pytest.raises(BertgpuError, match=r"holds a tokenizer trained with --vocab-size \d+ "
                                           r"\(asked 100\).*; expected a new output folder"):
        train_tokenizer([tokenizer_corpus(tmp_path / "c")], uncased, vocab_size=100)


def test_failed_training_leaves_no_output(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\n\xff\n")
    with pytest.raises(BertgpuError, match=r"bad.txt:2: invalid UTF-8"):
        train_tokenizer([bad], tmp_path / "tok", vocab_size=100)
    assert not (tmp_path / "tok").exists() and not (tmp_path / "tok.tmp").exists()


def test_cli_trains_and_reports_bad_input(tmp_path, capsys):
    corpus = tokenizer_corpus(tmp_path / "corpus")
    code = cli_main(["tokenizer", "--corpus", str(corpus), "--vocab-size", "500", "--cased",
                     "--out", str(tmp_path / "tok")])
    assert code == 0
    out = capsys.readouterr().out
    assert "tokenizer: vocab" in out and "from 1 file, " in out
    assert not is_lowercase(tmp_path / "tok")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    code = cli_main(["tokenizer", "--corpus", str(bad), "--out", str(tmp_path / "tok2")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "bad.jsonl:1: not valid JSON" in err
    assert err.startswith("bertgpu tokenizer: error:")


def test_training_twice_gives_byte_identical_folders(tmp_path):
    """The `tokenizers` trainer breaks ties between equal-count merges by ids it hands out in a
    randomly seeded hash order; `_initial_vocabulary` pins them (issue 11). Before that, two
    trainings in one process differed in vocab.txt and tokenizer.json."""
    corpus = tokenizer_corpus(tmp_path / "corpus")
    first = train_tokenizer([corpus], tmp_path / "a", vocab_size=1500, min_frequency=1,
                            limit_alphabet=60)
    second = train_tokenizer([corpus], tmp_path / "b", vocab_size=1500, min_frequency=1,
                             limit_alphabet=60)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    vocab = (first / "vocab.txt").read_text(encoding="utf-8").splitlines()
    singles = [t for t in vocab[5:] if len(t) == 1 and not "\u4e00" <= t <= "\u9fff"]
    assert len(singles) == 60  # limit_alphabet holds, ties at the cut broken the same way each time
    assert not (first.parent / "a.tmp").exists()


def test_words_that_encode_as_unk_are_left_out_of_training(tmp_path):
    """A run of letters longer than 100 characters (a base64 blob, a DNA string) is one word that
    encodes as [UNK] whatever the vocabulary; the WordPiece trainer's time grows with the square
    of its length (300 kB: 108 s, for pieces nothing uses). Training leaves such words out, so
    the vocabulary is the one of the corpus without them; a long line of Chinese, split per
    character, is kept."""
    corpus = tokenizer_corpus(tmp_path / "corpus")
    blob = tmp_path / "blob.txt"
    blob.write_text(corpus.read_text(encoding="utf-8") + "\n\n" + "xq" * 15_000 + "\n"
                    + "a" * 101 + " and " + "7" * 200 + "\n", encoding="utf-8")
    plain = train_tokenizer([corpus], tmp_path / "plain", vocab_size=600, min_frequency=1)
    with_blob = train_tokenizer([blob], tmp_path / "blob", vocab_size=600, min_frequency=1)
    assert (plain / "vocab.txt").read_bytes() == (with_blob / "vocab.txt").read_bytes()
    assert load_tokenizer(with_blob).encode("xq" * 60).tokens == ["[CLS]", "[UNK]", "[SEP]"]
    zh = tmp_path / "zh.txt"
    zh.write_text("天地玄黄宇宙洪荒" * 40 + "\n", encoding="utf-8")
    vocab = (train_tokenizer([zh], tmp_path / "zh", vocab_size=100, min_frequency=1)
             / "vocab.txt").read_text(encoding="utf-8").split()
    assert set("天地玄黄宇宙洪荒") <= set(vocab)


def test_a_chinese_vocabulary_keeps_its_characters(tmp_path, recwarn):
    """CJK ideographs are BERT's words, not an alphabet: --limit-alphabet's default 1000 cut a
    Chinese corpus of 1,424 characters to 1,000, and the missing ones (some seen 10 times)
    encoded as [UNK] while the warnings blamed the corpus. They are now kept as far as
    --vocab-size has room; characters the alphabet still leaves out are named in a warning."""
    chars = [chr(0x4E00 + 7 * i) for i in range(1400)]
    corpus = tmp_path / "zh.txt"
    corpus.write_text("\n\n".join("".join(chars[j:j + 20]) * 2 for j in range(0, 1400, 20))
                      + "\n", encoding="utf-8")
    vocab = set((train_tokenizer([corpus], tmp_path / "zh", vocab_size=4000) / "vocab.txt")
                .read_text(encoding="utf-8").split())
    assert set(chars) <= vocab
    assert not [w for w in recwarn if "characters" in str(w.message)]
    with pytest.warns(UserWarning, match=r"^400 characters \(28\.6% of the characters in words, "
                                         r"e\.g\. .*--vocab-size 1005 has no room for more CJK"):
        train_tokenizer([corpus], tmp_path / "small", vocab_size=1005)
    latin = tmp_path / "latin.txt"
    latin.write_text(" ".join(chr(0x100 + i) * 3 for i in range(200)) + "\n", encoding="utf-8")
    with pytest.warns(UserWarning, match=r"--limit-alphabet 50 keeps that many characters"):
        train_tokenizer([latin], tmp_path / "latin", vocab_size=2000, limit_alphabet=50,
                        lowercase=False)


def _hf_bert_folder(cased, folder, config=None, model_config=None):
    """The cased tokenizer's files under another tokenizer_config.json (None: none), and a
    config.json of ``model_config`` (a Hugging Face model folder)."""
    shutil.copytree(cased, folder)
    (folder / "tokenizer_config.json").unlink()
    if config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    if model_config is not None:
        (folder / "config.json").write_text(json.dumps(model_config))
    return folder


FOLDERS = [  # (tokenizer_config.json, config.json, whether AutoTokenizer lower-cases)
    ({"tokenizer_class": "BertTokenizerFast"}, None, True),  # do_lower_case unset: true
    ({"tokenizer_class": "BertTokenizerFast", "do_lower_case": True}, None, True),
    ({"tokenizer_class": "BertTokenizer", "do_lower_case": False}, None, False),
    ({"model_max_length": 512}, {"model_type": "bert"}, True),  # a model folder's class: BERT's
    ({"tokenizer_class": "PreTrainedTokenizerFast"}, None, False),  # tokenizer.json as it is
    (None, None, False),
]


def test_a_folder_encodes_as_autotokenizer_reads_its_config(cased, tmp_path):
    """transformers builds a BERT tokenizer's normaliser from tokenizer_config.json (do_lower_case
    defaults to true) whatever tokenizer.json says. `load_tokenizer` used to return tokenizer.json
    as it is: a cased tokenizer.json under a config without do_lower_case gave cased shards
    ('Paris') while the model's AutoTokenizer lower-cased ('p ##ar ##is'), and is_lowercase and
    tokenizer_hash described yet another encoding. Now all three follow transformers."""
    from transformers import AutoTokenizer

    for k, (config, model_config, lowercase) in enumerate(FOLDERS):
        folder = _hf_bert_folder(cased, tmp_path / f"hf{k}", config, model_config)
        hf = AutoTokenizer.from_pretrained(str(folder))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ours = load_tokenizer(folder)
        for text in [*TEXTS, "Paris and Berlin are Capital Cities. Café Über naïve."]:
            assert ours.encode(text).ids == hf(text)["input_ids"], (text, config)
        assert is_lowercase(folder) is lowercase, config
        assert [str(w.message) for w in caught if "normaliser" in str(w.message)] == (
            [f"{folder}: tokenizer.json's normaliser keeps case and keeps accents, but "
             "tokenizer_config.json (with BERT's defaults for what it does not set) lower-cases "
             "and strips accents; encoding as the config says, as transformers' AutoTokenizer "
             "does"] if lowercase else [])  # lower-casing: against the cased tokenizer.json
        same = tmp_path / f"same{k}"  # the same vocabulary, with a config that states the encoding
        shutil.copytree(cased, same)
        (same / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "BertTokenizerFast", "do_lower_case": lowercase}))
        assert tokenizer_hash(folder) == tokenizer_hash(same), config
        assert (tokenizer_hash(folder) == tokenizer_hash(cased)) is not lowercase


def test_a_config_setting_of_the_wrong_type_is_one_line_error(cased, tmp_path):
    """do_lower_case "false" (a string) was truthy: the folder lower-cased."""
    folder = _hf_bert_folder(cased, tmp_path / "hf", {"tokenizer_class": "BertTokenizerFast",
                                                       "do_lower_case": "false"})
    with pytest.raises(BertgpuError, match=r"tokenizer_config.json: do_lower_case is \"false\"; "
                                           "expected true or false$"):
        load_tokenizer(folder)


@pytest.mark.parametrize("sample_bytes", [None, 10**6])
def test_skip_bad_leaves_a_file_out_whole(tmp_path, sample_bytes):
    """A file skipped for a bad byte on line 5 used to have its first 4 lines trained on: the
    vocabulary held words found only there ('zebra', 'giraffe') and the summary counted its
    documents. It is left out whole, as prepare leaves it out: the vocabulary is the one of
    the other files alone."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_bytes(b"Zebra giraffe zebra giraffe.\n\nZebra giraffe again.\n\n"
                                   b"caf\xe9\n")
    good = tokenizer_corpus(tmp_path / "good")
    shutil.copy(good, corpus / "b.txt")
    stats = CorpusStats()
    folder = train_tokenizer([corpus], tmp_path / "tok", vocab_size=300, min_frequency=1,
                             skip_bad=True, stats=stats, sample_bytes=sample_bytes)
    alone = CorpusStats()
    reference = train_tokenizer([good], tmp_path / "alone", vocab_size=300, min_frequency=1,
                                stats=alone, sample_bytes=sample_bytes)
    assert (folder / "vocab.txt").read_bytes() == (reference / "vocab.txt").read_bytes()
    assert not {"zebra", "giraffe"} & set((folder / "vocab.txt").read_text().split())
    assert (stats.files, stats.documents) == (1, alone.documents)
    assert [(path, reason.split(": ", 1)[1]) for path, reason in stats.skipped] == [
        (str(corpus / "a.txt"), "invalid UTF-8 byte 0xe9 at byte offset 55; expected UTF-8 text")]


def test_a_corpus_of_control_characters_is_refused(tmp_path, capsys):
    """A corpus whose text is only control or format characters (BERT's normaliser removes them)
    used to give a vocabulary of the five special tokens, exit 0. Now one line, exit 2, no
    folder."""
    ctrl = tmp_path / "ctrl.txt"
    ctrl.write_bytes(b"\x01\x02\x03\n\n\x7f\x00\n")
    zw = tmp_path / "zw.jsonl"
    zw.write_text('{"text": "\\u200b"}\n{"text": "\\ufeff\\u200d"}\n')
    for corpus in (ctrl, zw):
        out = tmp_path / f"tok_{corpus.stem}"
        code = cli_main(["tokenizer", "--corpus", str(corpus), "--out", str(out)])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1, err
        assert err == (f"bertgpu tokenizer: error: {corpus}: no text (only control or format "
                       "characters, which BERT's normaliser removes); expected text to train "
                       "on\n")
        assert not out.exists() and not out.with_name(out.name + ".tmp").exists()


def _halves(path, lines=1500):
    """A corpus sorted by language: English lines, then as many Chinese lines."""
    import random

    rng = random.Random(0)
    en = "the quick brown fox jumps over the lazy dog while seven wizards hex bankers".split()
    zh = "北京是中国的首都上海是一个大城市我们今天去公园散步"
    text = "".join(" ".join(rng.choice(en) for _ in range(12)) + "\n" for _ in range(lines))
    text += "".join("".join(rng.choice(zh) for _ in range(30)) + "\n" for _ in range(lines))
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("compressed", [False, True])
def test_sample_bytes_is_spread_over_the_whole_file(tmp_path, compressed):
    """--sample-bytes used to read a file under 64 MB, and any compressed file, from its start:
    a file whose second half is Chinese gave a vocabulary without one Chinese character. Windows
    spread over the uncompressed file, and every k-th document of the gzip stream, reach the
    second half; the sample stays small, counts as one file and is the same on every run."""
    import gzip

    path = _halves(tmp_path / "halves.txt")
    if compressed:
        path = tmp_path / "halves.txt.gz"
        path.write_bytes(gzip.compress((tmp_path / "halves.txt").read_bytes(), mtime=0))
    vocabs = []
    for run in range(2):
        stats = CorpusStats()
        out = train_tokenizer([path], tmp_path / f"tok{run}", vocab_size=120, fmt="lines",
                              stats=stats, sample_bytes=40_000)
        vocabs.append((out / "vocab.txt").read_text(encoding="utf-8"))
        assert stats.files == 1 and 200 < stats.documents < 1500, stats
    assert vocabs[0] == vocabs[1]
    assert {"the", "fox"} <= set(vocabs[0].split())
    assert {"北", "京", "首", "都"} <= set(vocabs[0].split()), "no Chinese: the head alone"


def test_every_kth_document_keeps_a_spread_within_the_limit():
    """The read-through sampler of a compressed file: documents from the whole stream, evenly
    spaced, about ``limit`` characters (never more but for one document), then the end event;
    a lone document longer than the limit is cut."""
    from bertgpu.data.units import every_kth_document

    items = [("text", f"{d:09d}", True) for d in range(1, 101)] + [("end", "f", False)]
    out = list(every_kth_document(iter(items), 200))
    kept = [int(p) for _, p, _ in out[:-1]]
    assert out[-1] == ("end", "f", False)
    assert kept == list(range(8, 101, 8)), kept  # 12 documents of 9 characters, k = 8
    long = [("text", "x" * 50, d == 0) for d in range(10)] + [("end", "f", False)]
    assert len(list(every_kth_document(iter(long), 120))) == 3 + 1


def test_a_remote_compressed_file_is_sampled_from_its_start_not_downloaded_whole(tmp_path):
    """Reading a compressed file through (every k-th document) downloads all of it: a corpus of
    compressed shards in object storage, sampled to avoid exactly that, was fetched whole. A
    URL's compressed file is read from its start; a local one is still read through."""
    import gzip

    from bertgpu.data.units import sample_plan

    data = gzip.compress(b"one line of text\n" * 1000, mtime=0)
    local = tmp_path / "c.txt.gz"
    local.write_bytes(data)
    fsspec = pytest.importorskip("fsspec")
    with fsspec.open("memory://sample-start/c.txt.gz", "wb") as f:
        f.write(data)
    try:
        assert sample_plan(local, len(data), "lines", 100)[1] is True
        assert sample_plan("memory://sample-start/c.txt.gz", len(data), "lines", 100)[1] is False
    finally:
        fsspec.filesystem("memory").rm("/sample-start", recursive=True)


def _with_config(src, folder, **changes):
    """A copy of the tokenizer folder ``src`` with ``changes`` to its tokenizer_config.json."""
    shutil.copytree(src, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    config.update(changes)
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


@pytest.mark.parametrize("changes", [{"strip_accents": False},
                                     {"tokenize_chinese_chars": False},
                                     {"do_lower_case": False, "strip_accents": True}])
def test_hash_follows_every_normalisation_setting(uncased, tmp_path, changes):
    """Folders that differ only in one setting of the normaliser (the same vocab.txt and
    tokenizer.json) encode differently in transformers, so their hashes differ; an identical
    folder, or one that states the default it had (strip_accents null = as do_lower_case),
    hashes the same."""
    from transformers import AutoTokenizer

    text = "Café Élan über naïve 我爱自然语言处理 ÅNGSTRÖM"
    changed = _with_config(uncased, tmp_path / "changed", **changes)
    same = _with_config(uncased, tmp_path / "same", strip_accents=True)  # uncased's default
    assert tokenizer_hash(shutil.copytree(uncased, tmp_path / "copy")) == tokenizer_hash(uncased)
    hf = {f: AutoTokenizer.from_pretrained(str(f))(text)["input_ids"]
          for f in (uncased, changed, same)}
    assert hf[same] == hf[uncased] and tokenizer_hash(same) == tokenizer_hash(uncased)
    assert hf[changed] != hf[uncased]  # the independent reference: another encoding ...
    with pytest.warns(UserWarning, match="encoding as the config says"):
        assert load_tokenizer(changed).encode(text).ids == hf[changed]
    assert tokenizer_hash(changed) != tokenizer_hash(uncased)  # ... so another hash


def test_hash_follows_strip_accents_of_a_tokenizer_json_normaliser(uncased, tmp_path):
    """The same for a folder whose tokenizer.json normaliser is the encoding (a config that is
    not BERT's tokenizer class): strip_accents alone changes the hash."""
    folders = []
    for strip in (None, False):
        folder = _with_config(uncased, tmp_path / f"strip_{strip}",
                              tokenizer_class="PreTrainedTokenizerFast")
        data = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
        data["normalizer"]["strip_accents"] = strip  # None: as lowercase (True)
        (folder / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
        folders.append(folder)
    text = "Café Élan über naïve"
    ids = [load_tokenizer(folder).encode(text).ids for folder in folders]
    assert ids[0] != ids[1]  # another encoding ...
    assert tokenizer_hash(folders[0]) != tokenizer_hash(folders[1])  # ... so another hash

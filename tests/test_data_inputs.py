"""`bertgpu tokenizer` and `bertgpu prepare` on inputs a tester found mishandled: outputs that
would replace the current folder or land in a folder named like a URL, broken and symbolic links
in corpus folders, a dataset repository's card and licence beside its data, unreachable URLs,
--skip-bad that kept part of a skipped file, arguments that made useless outputs, and results
worth a warning ([UNK], NSP labels)."""

from __future__ import annotations

import json
import socket
import warnings

import numpy as np
import pytest
from _text_fixtures import CHINESE_NEWS, pydoc_documents, write_sentences

from bertgpu.cli import main as cli_main
from bertgpu.data.corpus import CorpusStats, iter_documents, resolve_inputs
from bertgpu.data.prepare import prepare
from bertgpu.data.tokenizer import train_tokenizer
from bertgpu.errors import BertgpuError


@pytest.fixture(scope="module")
def english(tmp_path_factory):
    """A tokenizer of English text alone (no CJK character in its vocabulary)."""
    folder = tmp_path_factory.mktemp("english")
    corpus = write_sentences(folder / "corpus.txt", pydoc_documents())
    return train_tokenizer([corpus], folder / "tok", vocab_size=400, min_frequency=1)


def _jsonl(docs: list[list[str]]) -> str:
    return "".join(json.dumps({"text": " ".join(d)}) + "\n" for d in docs)


def _one_error(capsys, argv: list[str]) -> str:
    code = cli_main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err


# --------------------------------------------------------------------------- outputs


@pytest.mark.parametrize("command", ["tokenizer", "prepare"])
def test_out_that_is_the_current_folder_or_holds_it_is_refused(english, tmp_path, monkeypatch,
                                                               capsys, command):
    """`--out .` gave a ValueError traceback (tokenizer) or replaced the current folder, leaving
    the shell in a deleted one (prepare)."""
    corpus = write_sentences(tmp_path / "corpus.txt", pydoc_documents(5))
    here = tmp_path / "empty"
    here.mkdir()
    monkeypatch.chdir(here)
    flags = (["--vocab-size", "100"] if command == "tokenizer"
             else ["--tokenizer", str(english), "--workers", "1"])
    for out in (".", "..", str(here), "sub/.."):
        err = _one_error(capsys, [command, "--corpus", str(corpus), *flags, "--out", out])
        assert f"bertgpu {command}: error: --out {out}: is " in err
    assert list(here.iterdir()) == [] and here.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "empty"]
    # a folder inside the current one is fine, also spelled with "..": sub/x/.. is sub
    assert cli_main([command, "--corpus", str(corpus), *flags, "--out", "sub/x/.."]) == 0
    assert (here / "sub").is_dir() and not (here / "sub" / "x").exists()


def test_tokenizer_refuses_a_url_output(tmp_path, monkeypatch, capsys):
    """`--out s3://b/tok` silently wrote a local folder ./s3:/b/tok."""
    corpus = write_sentences(tmp_path / "corpus.txt", pydoc_documents(5))
    monkeypatch.chdir(tmp_path)
    err = _one_error(capsys, ["tokenizer", "--corpus", str(corpus), "--out", "s3://b/tok"])
    assert "--out s3://b/tok: the tokenizer writes a local folder" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt"]


# --------------------------------------------------------------------------- inputs


def test_broken_link_in_a_corpus_folder_is_one_line_or_skipped(english, tmp_path, monkeypatch,
                                                                capsys):
    """A broken symbolic link in a folder gave FileNotFoundError from units.file_size, even with
    --skip-bad."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    write_sentences(folder / "a.txt", pydoc_documents(6))
    (folder / "gone.txt").symlink_to(tmp_path / "nowhere.txt")
    monkeypatch.chdir(tmp_path)
    for command in (["tokenizer", "--vocab-size", "100"], ["prepare", "--tokenizer", str(english),
                                                            "--workers", "1"]):
        err = _one_error(capsys, [*command, "--corpus", "corpus", "--out", "out"])
        assert "corpus/gone.txt: a broken symbolic link (to " in err and "nowhere.txt" in err
    code = cli_main(["prepare", "--corpus", "corpus", "--tokenizer", str(english), "--out",
                     "data", "--workers", "1", "--skip-bad"])
    assert code == 0
    assert "prepare: skipped corpus/gone.txt: a broken symbolic link" in capsys.readouterr().out
    m = json.loads((tmp_path / "data" / "manifest.json").read_text())
    assert [i["path"] for i in m["inputs"]] == ["corpus/a.txt"]
    assert [s["path"] for s in m["skipped_inputs"]] == ["corpus/gone.txt"]
    stats = CorpusStats()
    assert len(list(iter_documents(["corpus"], skip_bad=True, stats=stats))) == 6
    assert [p for p, _ in stats.skipped] == ["corpus/gone.txt"]
    with pytest.raises(BertgpuError, match=r"gone.txt: a broken symbolic link"):
        resolve_inputs(["corpus/gone.txt"])
    with pytest.raises(BertgpuError, match=r"gone.txt: a broken symbolic link"):
        resolve_inputs(["corpus/*.txt"])


def test_symlinked_subfolders_are_read_once_each(tmp_path):
    """os.walk without followlinks skipped a linked subfolder silently; a link to a parent must
    not loop."""
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "s.txt").write_text("Shared text.\n")
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    (corpus / "a.txt").write_text("Own text.\n")
    (corpus / "linked").symlink_to(shared, target_is_directory=True)
    (corpus / "sub" / "loop").symlink_to(corpus, target_is_directory=True)
    (corpus / "again").symlink_to(shared, target_is_directory=True)
    (corpus / "sub" / "b.txt").write_text("Sub text.\n")
    (corpus / "a_sub").symlink_to(corpus / "sub", target_is_directory=True)
    found = resolve_inputs([corpus])  # a folder reached twice: under its own name, else the first
    assert ([p.relative_to(corpus).as_posix() for p in found]
            == ["a.txt", "again/s.txt", "sub/b.txt"])
    assert list(iter_documents([corpus])) == [["Own text."], ["Shared text."], ["Sub text."]]


def test_unreachable_url_is_one_line(monkeypatch, tmp_path, english):
    """fsspec's ftp filesystem connects when it is made: an unknown host gave socket.gaierror."""
    fsspec = pytest.importorskip("fsspec")

    def unreachable(url, **kwargs):
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(fsspec.core, "url_to_fs", unreachable)
    with pytest.raises(BertgpuError, match=r"^ftp://nothing/here.txt: cannot reach \(gaierror: "):
        prepare(["ftp://nothing/here.txt"], english, tmp_path / "data")
    with pytest.raises(BertgpuError, match=r"^ftp://nothing/here.txt: cannot reach"):
        train_tokenizer(["ftp://nothing/here.txt"], tmp_path / "tok")


# --------------------------------------------------------------------------- --skip-bad


def _shards_listed(out) -> set[str]:
    m = json.loads((out / "manifest.json").read_text())
    return {f"{s['name']}.{k}.npy" for split in m["splits"].values() for s in split["shards"]
            for k in ("input_ids", "lengths")}


@pytest.mark.parametrize("unit_bytes", [None, 20_000])
def test_a_skipped_file_contributes_nothing(english, tmp_path, monkeypatch, unit_bytes):
    """--skip-bad said "skipped bad.jsonl:51" but kept the 50 documents before that line (and,
    read in parts, most of the file); the manifest listed the file in inputs by its relative
    path and in skipped_inputs by its absolute one."""
    docs = pydoc_documents()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "good.jsonl").write_text(_jsonl(docs[:10]))
    lines = _jsonl(docs[10:]).splitlines(keepends=True)
    (tmp_path / "bad.jsonl").write_text("".join(lines[:50]) + "{oops\n" + "".join(lines[50:]))
    kw = dict(workers=1, seq_len=64, validation_fraction=0)
    if unit_bytes:
        kw["unit_bytes"] = unit_bytes
    m = prepare(["good.jsonl", "bad.jsonl"], english, "data", skip_bad=True, **kw)
    alone = prepare(["good.jsonl"], english, "alone", **kw)
    assert m["counts"] == alone["counts"] and m["counts"]["documents"] == 10
    assert [i["path"] for i in m["inputs"]] == ["good.jsonl"]
    assert [s["path"] for s in m["skipped_inputs"]] == ["bad.jsonl"]
    at = sum(map(len, lines[:50]))
    where = "bad.jsonl:51" if unit_bytes is None else f"bad.jsonl (the line at byte {at})"
    assert m["skipped_inputs"][0]["reason"].startswith(f"{where}: not valid JSON")
    npy = {p.name for p in (tmp_path / "data").glob("*.npy")}
    assert npy == _shards_listed(tmp_path / "data")  # no shard of the skipped file left behind
    for name in npy:
        assert (np.load(tmp_path / "data" / name) == np.load(tmp_path / "alone" / name)).all()



def test_skip_bad_reasons_are_a_line_each_and_all_skipped_says_why(english, tmp_path, capsys):
    """tokenizer put every skipped file's reason inside its summary line (one line of any
    length: "from 1 files, 1 documents, 2 skipped (a: ...; b: ...)"); prepare printed a line
    each. With every file skipped, both said only "no documents read from the corpus"."""
    bad = [tmp_path / "bad1.txt", tmp_path / "bad2.txt"]
    for path, raw in zip(bad, (b"\xff\xfe bad\n", b"\xc3\x28 bad\n"), strict=True):
        path.write_bytes(raw)
    good = write_sentences(tmp_path / "good.txt", pydoc_documents(3))
    reasons = [f"{bad[0]}:1: invalid UTF-8 byte 0xff at byte offset 0; expected UTF-8 text",
               f"{bad[1]}:1: invalid UTF-8 byte 0xc3 at byte offset 0; expected UTF-8 text"]
    assert cli_main(["tokenizer", "--corpus", *map(str, bad), str(good), "--skip-bad",
                     "--out", str(tmp_path / "tok"), "--vocab-size", "200"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("tokenizer: vocab ") and " from 1 file, 3 documents, 2 skipped in " \
        in out[0], out
    assert out[1:] == [f"tokenizer: skipped {r}" for r in reasons]
    for command, extra in (("tokenizer", []), ("prepare", ["--tokenizer", str(english)])):
        err = _one_error(capsys, [command, "--corpus", *map(str, bad), "--skip-bad", "--out",
                                  str(tmp_path / "out"), *extra])
        assert err == (f"bertgpu {command}: error: no documents read from the corpus (2 files "
                       f"skipped by --skip-bad; the first: {reasons[0]}); expected text to "
                       f"{'train on' if command == 'tokenizer' else 'tokenize'}\n"), err
        assert not (tmp_path / "out").exists()

def test_line_errors_in_a_part_of_a_file_give_its_byte_offset(english, tmp_path):
    """A file larger than --unit-bytes named lines from the start of its part:
    `(part 6 of 10, from byte 480751):1`."""
    lines = _jsonl(pydoc_documents()).splitlines(keepends=True)
    at = sum(len(x.encode()) for x in lines[:60])
    (tmp_path / "big.jsonl").write_text("".join(lines[:60]) + '{"text": 5}\n' + "".join(lines[60:]))
    with pytest.raises(BertgpuError, match=rf"big.jsonl \(the line at byte {at}\): no string "
                       r"field 'text' \(its value is a number\)"):
        prepare([tmp_path / "big.jsonl"], english, tmp_path / "data", workers=1,
                unit_bytes=20_000)
    raw = b"".join(x.encode() for x in lines[:60]) + b"caf\xe9\n"
    (tmp_path / "big.txt").write_bytes(raw)
    with pytest.raises(BertgpuError, match=rf"big.txt \(the line at byte {at}\): invalid UTF-8 "
                       rf"byte 0xe9 at byte offset {at + 3}"):
        prepare([tmp_path / "big.txt"], english, tmp_path / "data", workers=1, unit_bytes=20_000,
                fmt="lines")


# --------------------------------------------------------------------------- arguments


@pytest.mark.parametrize("command, flags, message", [
    # 0 gave a vocabulary of the specials alone, -3 silently dropped characters
    ("tokenizer", ["--limit-alphabet", "0"], "--limit-alphabet 0: expected 1 or more"),
    ("tokenizer", ["--limit-alphabet", "-3"], "--limit-alphabet -3: expected 1 or more"),
    # reported "train 0" with exit 0 (pretrain refused it later)
    ("prepare", ["--validation-docs", "500"],
     "--validation-docs 500: the corpus has 20 documents and all of them were held out"),
    # 49,004 units for a 49 KB file
    ("prepare", ["--unit-bytes", "1"],
     "--unit-bytes 1: too small; expected 16384 (16 KiB) or more"),
    # 0 meant all cores while -1 was an error
    ("prepare", ["--workers", "0"], "--workers 0: expected 1 or more"),
    # every random B came from the document of A
    ("prepare", ["--objective", "mlm+nsp", "--chunk-docs", "1"],
     "--chunk-docs 1: mlm+nsp takes a random next segment from another document"),
    # mlm packs rows and draws no pairs: both were accepted and changed no byte (and a re-run
    # with another value was refused as "prepared with --short-seq-prob 0.1 (asked 0.2)")
    ("prepare", ["--short-seq-prob", "0.2"], "--short-seq-prob 0.2: only with --objective mlm+nsp"),
    ("prepare", ["--chunk-docs", "50"], "--chunk-docs 50: only with --objective mlm+nsp"),
    # said "no such tokenizer folder"
    ("prepare", ["--tokenizer", "{tok}/vocab.txt"],
     "vocab.txt: a file, not a tokenizer folder; expected the folder that holds it ({tok})"),
])
def test_arguments_that_made_useless_outputs_are_refused(english, tmp_path, capsys, command,
                                                         flags, message):
    corpus = write_sentences(tmp_path / "corpus.txt", pydoc_documents(20))
    argv = [command, "--corpus", str(corpus), "--out", str(tmp_path / "out")]
    argv += ["--workers", "1"] if command == "prepare" and "--workers" not in flags else []
    argv += ["--tokenizer", str(english)] if command == "prepare" else []
    err = _one_error(capsys, argv + [f.format(tok=english) for f in flags])
    assert f"bertgpu {command}: error: " in err and message.format(tok=english) in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt"]


def test_vocab_size_not_reached_is_a_warning(tmp_path, capsys):
    corpus = write_sentences(tmp_path / "corpus.txt", [["A tiny corpus.", "Of few words."]])
    code = cli_main(["tokenizer", "--corpus", str(corpus), "--vocab-size", "500", "--out",
                     str(tmp_path / "t")])
    err = capsys.readouterr().err
    assert code == 0 and err.count("\n") == 1
    assert err.startswith("bertgpu tokenizer: warning: --vocab-size 500: the corpus gave only ")
    # A few percent short (the README's own corpus gives 7,416 of 8,192) is no warning: the
    # summary line gives the size.
    got = len((tmp_path / "t" / "vocab.txt").read_text(encoding="utf-8").splitlines())
    assert cli_main(["tokenizer", "--corpus", str(corpus), "--vocab-size", str(got + 2),
                     "--out", str(tmp_path / "t2")]) == 0
    assert capsys.readouterr().err == ""


DATASET_CARD = ("---\nlicense: cc-by-sa-4.0\nconfigs:\n- config_name: default\n  data_files:\n"
                "  - split: train\n    path: data/train-*\n---\n\n# My dataset\n\nA sample.\n")


def _dataset_repo(root) -> list[str]:
    """A Hugging Face dataset repository's layout: its card, licence, citation and git
    attributes beside the data; returns the repository's files that are not data."""
    (root / "data").mkdir(parents=True)
    (root / "data" / "train-00000-of-00001.jsonl").write_text('{"text": "The river flows."}\n')
    repo_files = {"README.md": DATASET_CARD, ".gitattributes": "*.jsonl filter=lfs -text\n",
                  "LICENSE": "Permission is granted.\n", "CITATION.cff": "title: My dataset\n",
                  "data/README_zh.md": "# 数据\n", "LICENSE-MIT.txt": "MIT\n",
                  "Changelog": "v1: first.\n", "NOTICE.txt": "Notice.\n", "COPYING": "GPL\n"}
    for rel, text in repo_files.items():
        (root / rel).write_text(text)
    return sorted(repo_files)


def test_a_dataset_repositorys_card_and_licence_in_a_folder_are_not_corpus(tmp_path):
    """A folder holding a Hugging Face dataset repository (Parquet or JSONL beside README.md,
    the dataset card) made its YAML front matter the first training row: README*, LICENSE*, ...
    inside a folder are not read; named on the command line, they are."""
    repo = tmp_path / "ds"
    _dataset_repo(repo)
    (repo / "readmeish.txt").write_text("Read: the name is not README.\n")
    found = [p.relative_to(repo).as_posix() for p in resolve_inputs([repo])]
    assert found == ["data/train-00000-of-00001.jsonl", "readmeish.txt"]
    assert list(iter_documents([repo])) == [["The river flows."],
                                            ["Read: the name is not README."]]
    # a file given by name, or by a pattern, is always read
    assert resolve_inputs([repo / "README.md", str(repo / "LICEN*")]) == [
        repo / "README.md", repo / "LICENSE", repo / "LICENSE-MIT.txt"]
    assert list(iter_documents([repo / "LICENSE"])) == [["Permission is granted."]]
    (tmp_path / "card").mkdir()
    (tmp_path / "card" / "README.md").write_text(DATASET_CARD)
    with pytest.raises(BertgpuError, match=r"card: folder contains no corpus files \(hidden "
                                           r"files, README/LICENSE/.*are not read\)"):
        resolve_inputs([tmp_path / "card"])


def test_a_dataset_repositorys_card_in_a_url_folder_is_not_corpus(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    local = tmp_path / "ds"
    repo_files = _dataset_repo(local)
    memory = fsspec.filesystem("memory")
    for rel in [*repo_files, "data/train-00000-of-00001.jsonl"]:
        memory.pipe_file(f"/hfrepo31/{rel}", (local / rel).read_bytes())
    try:
        assert (resolve_inputs(["memory://hfrepo31/"])
                == ["memory:///hfrepo31/data/train-00000-of-00001.jsonl"])
        assert resolve_inputs(["memory://hfrepo31/README.md"]) == ["memory://hfrepo31/README.md"]
    finally:
        memory.rm("/hfrepo31", recursive=True)


# --------------------------------------------------------------------------- warnings


def test_text_the_vocabulary_does_not_cover_is_a_warning(english, tmp_path, capsys):
    """A Chinese corpus with an English tokenizer came out 93% [UNK] without a word."""
    corpus = tmp_path / "news.txt"
    corpus.write_text("\n".join(CHINESE_NEWS) + "\n", encoding="utf-8")
    code = cli_main(["prepare", "--corpus", str(corpus), "--format", "lines", "--tokenizer",
                     str(english), "--out", str(tmp_path / "zh"), "--workers", "1"])
    err = capsys.readouterr().err
    assert code == 0 and err.count("\n") == 1, err
    assert "bertgpu prepare: warning: " in err and "% of the tokens are [UNK]" in err
    assert f"the tokenizer {english} does not cover this text" in err
    english_text = write_sentences(tmp_path / "en.txt", pydoc_documents(10))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prepare([english_text], english, tmp_path / "en", workers=1)
    assert not [w for w in caught if "[UNK]" in str(w.message)]


def test_nsp_labels_of_one_class_are_a_warning(english, tmp_path):
    """Documents of one sentence give every NSP label 1 (there is no next sentence)."""
    corpus = tmp_path / "one.txt"
    corpus.write_text("".join(" ".join(d[:1]) + "\n\n" for d in pydoc_documents(40)))
    with pytest.warns(UserWarning, match=r"100% of the NSP labels are 1 \(B random\), \d+ rows: "
                                          r"documents of one sentence cannot give a next"):
        prepare([corpus], english, tmp_path / "nsp", objective="mlm+nsp", workers=1, seq_len=64)


def test_nsp_labels_all_random_because_of_seq_len_name_seq_len(english, tmp_path):
    """Documents of hundreds of sentences, each sentence longer than --seq-len 8 leaves to a
    pair (5 tokens): every A is one sentence with no next sentence that fits. The warning blamed
    "documents of one sentence"; the cause is --seq-len."""
    corpus = write_sentences(tmp_path / "long.txt", [
        [f"the {w} house number {i} stands here ." for i in range(100)]
        for w in ("red", "blue", "green", "black")])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prepare([corpus], english, tmp_path / "nsp", objective="mlm+nsp", workers=1, seq_len=8,
                validation_fraction=0)
    (message,) = [str(w.message) for w in caught if "NSP labels" in str(w.message)]
    assert message.startswith("100% of the NSP labels are 1 (B random), 400 rows: in ")
    assert ("rows A is one sentence that alone fills the 5 tokens a pair holds (--seq-len 8 "
            "less [CLS] and two [SEP]), so no next sentence fits; expected a longer --seq-len"
            in message)
    assert "documents of one sentence" not in message

"""A glob --corpus that can match the --out folder, or files inside it, is refused like a corpus
folder that holds the output: `check_apart` skipped a pattern (no path by that name exists), so
`tokenizer --corpus 'cc/**/*.txt' --out cc/sub/tk` and `prepare --corpus 'cc/*' --out cc/out`
were accepted and a re-run read the output's own vocab.txt, manifest.json and shards as corpus.
The tokenizer also checked only the paths given, not the files they resolved to, as prepare does.
"""

from __future__ import annotations

import pytest
from _text_fixtures import train_small_tokenizer

from bertgpu import fsutil
from bertgpu.cli import main as cli_main

TEXT = "".join(f"Sentence {i} of the tiny corpus is here.\nIt has a second line.\n\n"
               for i in range(30))


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_small_tokenizer(tmp_path_factory.mktemp("tok") / "tok", vocab_size=1000)


@pytest.fixture
def cc(tmp_path, monkeypatch):
    """cc/a.txt and cc/sub/b.txt, with the current folder beside cc (patterns are relative)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cc" / "sub").mkdir(parents=True)
    (tmp_path / "cc" / "a.txt").write_text(TEXT)
    (tmp_path / "cc" / "sub" / "b.txt").write_text(TEXT)
    return tmp_path / "cc"


def _files(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _tokenizer(corpus: str, out: str) -> list[str]:
    return ["tokenizer", "--corpus", corpus, "--vocab-size", "120", "--min-frequency", "1",
            "--out", out]


def _prepare(corpus: str, tok, out: str) -> list[str]:
    return ["prepare", "--corpus", corpus, "--tokenizer", str(tok), "--out", out,
            "--workers", "1", "--validation-fraction", "0"]


def _refused(argv, capsys, out: str, pattern: str) -> None:
    assert cli_main(argv) == 2, argv
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"{out}: overlaps the input {pattern} (--corpus)" in err, err


@pytest.mark.parametrize(("pattern", "out"), [
    ("cc/**/*.txt", "cc/sub/tk"),  # recursive: the output's vocab.txt would be read
    ("cc/*/*", "cc/tk"),  # the next components match the output's files
    ("cc/[rs]u?/**", "cc/sub/tk"),  # classes and ? as glob reads them
])
def test_tokenizer_refuses_a_glob_that_reaches_into_the_output(cc, capsys, pattern, out):
    before = _files(cc)
    _refused(_tokenizer(pattern, out), capsys, out, pattern)
    assert _files(cc) == before  # nothing written: no folder, no OUT.tmp


@pytest.mark.parametrize(("pattern", "out"), [
    ("cc/*", "cc/out"),  # the output folder itself is a match
    ("cc/**", "cc/sub/out"),
    ("file://{cc}/**/*.txt", "cc/out"),  # a file:// pattern is the local one
])
def test_prepare_refuses_a_glob_that_reaches_into_the_output(tok, cc, capsys, pattern, out):
    pattern = pattern.format(cc=cc)
    before = _files(cc)
    _refused(_prepare(pattern, tok, out), capsys, out, pattern.removeprefix("file://"))
    assert _files(cc) == before


def test_a_glob_beside_the_output_is_still_accepted(tok, cc, capsys):
    """`cc/*.txt` cannot match the folder cc/tok nor anything in it; a hidden output folder
    is passed over by `*` and `**` as glob passes over it."""
    assert cli_main(_tokenizer("cc/**/*.txt", "cc/sub/.tok")) == 0
    assert (cc / "sub" / ".tok" / "vocab.txt").is_file()
    assert cli_main(_tokenizer("cc/*.txt", "cc/tok")) == 0
    assert (cc / "tok" / "vocab.txt").is_file()
    assert cli_main(_prepare("cc/*.txt", cc / "tok", "cc/data")) == 0
    assert (cc / "data" / "manifest.json").is_file()
    assert cli_main(_prepare("cc/su?/*.txt", cc / "tok", "cc/shards")) == 0  # su? is not shards
    capsys.readouterr()


def test_tokenizer_checks_the_files_the_corpus_resolves_to(cc, capsys):
    """A corpus file that is a link into OUT.tmp (a killed run's scratch, removed and rewritten
    as the corpus is read) passed the tokenizer, which checked only the folder given; prepare
    refused it."""
    scratch = fsutil.make_scratch(cc.parent / "tk.tmp", cc.parent / "tk")
    (scratch / "corpus.txt").write_text(TEXT)
    (cc / "link.txt").symlink_to(scratch / "corpus.txt")
    assert cli_main(_tokenizer("cc", "tk")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "tk: overlaps the input cc/link.txt (--corpus)" in err, err
    assert not (cc.parent / "tk").exists()
    assert (scratch / "corpus.txt").read_text() == TEXT

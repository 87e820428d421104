"""A corpus whose text is all runs of letters or digits longer than the [UNK] limit (hex,
base64 without punctuation, a script without spaces) leaves nothing to train on: the error
names that cause, not control characters."""

from __future__ import annotations

import random

from bertgpu.cli import main
from bertgpu.data.tokenizer_folder import MAX_WORD_CHARS


def test_a_corpus_of_long_runs_names_the_runs(tmp_path, capsys):
    """It said "no text (only control or format characters, ...)" after the warning that 100 %
    of the text was in long runs and left out."""
    rng = random.Random(0)
    corpus = tmp_path / "hex.txt"
    corpus.write_text("\n".join(rng.randbytes(3 * MAX_WORD_CHARS).hex() for _ in range(20))
                      + "\n")
    out = tmp_path / "tok"
    assert main(["tokenizer", "--corpus", str(corpus), "--vocab-size", "300",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("bertgpu tokenizer: warning: 100% of the text is in runs")
    assert len(err) == 2 and err[1].startswith(f"bertgpu tokenizer: error: {corpus}: no text "
                                               "left to train on: all of it is in runs of "
                                               f"letters or digits longer than {MAX_WORD_CHARS}")
    assert "control" not in err[1] and "expected text split into words" in err[1]
    assert not out.exists() and not out.with_name("tok.tmp").exists()


def test_control_characters_beside_long_runs_keep_their_message(tmp_path, capsys):
    """What is left once the runs are cut is control characters: that message stays."""
    corpus = tmp_path / "mixed.txt"
    corpus.write_text("f" * (MAX_WORD_CHARS + 1) + "\n\n\x01\x02\x03\n")
    assert main(["tokenizer", "--corpus", str(corpus), "--out", str(tmp_path / "tok")]) == 2
    err = capsys.readouterr().err
    assert err.rstrip().endswith(f"{corpus}: no text (only control or format characters, which "
                                 "BERT's normaliser removes); expected text to train on")

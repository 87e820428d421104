"""Messages that said something other than the true problem, and a check that came too late,
from a bad-input probe of the CLI:

- `glue --predict-test` read a task's test file only when that task ran: a malformed
  SST-2/test.tsv stopped the command after CoLA had trained, though every task's files are read
  before the first trains.
- `glue --predict-test` named a task without a test file (RTE) among the submission's sources.
- `export FILE` said "no such run folder" of a file that is there.
- `tokenizer --sample-bytes 1` blamed the corpus for its 6-token vocabulary.
- `bench scaling --timeout-s 0` made OUT/runs and then failed its first point; `--precision
  fp64` and `--device tpu` were found by the first child, after runs/ and synthetic_data/.
- `finetune sst2 --n_best 5` (and classify, and SQuAD's other keys) was accepted and read by
  nothing, while --train-file, which GLUE does not read either, was refused.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import _tiny_init
import pytest
from _tiny_init import SPECIAL

from bertgpu.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

GLUE = Path(__file__).parent / "fixtures" / "glue"
FAST = ["--max_seq_len", "32", "--global_batch_size", "4", "--epochs", "1",
        "--max_train_examples", "8", "--max_eval_examples", "8", "--warmup_fraction", "0"]


@pytest.fixture
def tiny_init(tmp_path) -> Path:
    """A tiny random BERT whose vocabulary holds the words of the CoLA, SST-2 and RTE fixtures."""
    words = sorted({w for task in ("CoLA", "SST-2", "RTE") for p in (GLUE / task).glob("*.tsv")
                    for w in re.findall(r"[a-z0-9]+|[^\sa-z0-9]",
                                        p.read_text(encoding="utf-8").lower())})
    return _tiny_init.tiny_init(tmp_path / "init", [*SPECIAL, *words])


def _glue_copy(root: Path, *tasks: str) -> Path:
    for task in tasks:
        shutil.copytree(GLUE / task, root / task)
    return root


def _one_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2, argv
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_glue_predict_test_reads_every_test_file_before_the_first_task_trains(
        tmp_path, tiny_init, capsys):
    data = _glue_copy(tmp_path / "g", "CoLA", "SST-2")
    test = data / "SST-2" / "test.tsv"
    test.write_text(test.read_text(encoding="utf-8") + "x\n", encoding="utf-8")
    out = tmp_path / "out"
    assert main(["glue", "--init", str(tiny_init), "--data-dir", str(data), "--tasks", "cola",
                 "sst2", "--out", str(out), "--predict-test", *FAST]) == 2
    assert not (out / "CoLA").exists()  # nothing trained before the refusal
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{test}:4: 1 columns, expected 2" in err, err


def test_glue_submission_names_only_the_tasks_whose_files_it_holds(tmp_path, tiny_init,
                                                                   capsys):
    data = _glue_copy(tmp_path / "g", "CoLA", "RTE")  # RTE has no test file
    out = tmp_path / "out"
    assert main(["glue", "--init", str(tiny_init), "--data-dir", str(data), "--tasks", "cola",
                 "rte", "--out", str(out), "--predict-test", *FAST]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines()
                if x.startswith("GLUE submission:"))
    assert line.startswith("GLUE submission: 1 files (CoLA seed 1) -> "), line


def test_export_of_a_file_says_it_is_a_file(tmp_path, capsys):
    afile = tmp_path / "notes.txt"
    afile.write_text("mine")
    err = _one_error(capsys, ["export", str(afile), "--out", str(tmp_path / "x")])
    assert f"{afile}: is a file, not a run folder" in err, err
    assert "no such" not in err
    err = _one_error(capsys, ["export", str(tmp_path / "absent"), "--out", str(tmp_path / "x")])
    assert "absent: no such run folder" in err, err


def test_a_vocabulary_cut_short_by_sample_bytes_names_sample_bytes(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The quick brown fox jumps over the lazy dog.\n" * 200, encoding="utf-8")
    assert main(["tokenizer", "--corpus", str(corpus), "--vocab-size", "500",
                 "--sample-bytes", "1", "--out", str(tmp_path / "t")]) == 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "--vocab-size 500: the --sample-bytes 1 sample of the corpus gave only" in err, err
    assert "expected a larger --sample-bytes" in err and "larger or more varied corpus" not in err
    # a sample as large as the corpus is the corpus: then it is the corpus that is small
    assert main(["tokenizer", "--corpus", str(corpus), "--vocab-size", "500",
                 "--sample-bytes", "1000000", "--out", str(tmp_path / "t2")]) == 0
    err = capsys.readouterr().err
    assert "the corpus gave only" in err and "expected a larger or more varied corpus" in err, err


def test_bench_scaling_refuses_bad_run_options_before_writing(tmp_path, capsys, monkeypatch):
    """--timeout-s 0 made out/runs and then failed its first point ("no result within
    --timeout-s 0"); --precision fp64 and --device tpu were found by the first child, after
    runs/ and synthetic_data/ were written."""
    from bertgpu.bench import scaling

    def ran(*args, **kwargs):
        raise AssertionError("a point ran")

    monkeypatch.setattr(scaling, "_run_point", ran)
    out = tmp_path / "scaling"
    for flag, value, message in (("--timeout-s", "0", "expected a positive finite float"),
                                 ("--precision", "fp64", "invalid choice: 'fp64'"),
                                 ("--device", "tpu",
                                  "'tpu': expected auto, cpu, cuda, cuda:N or mps")):
        with pytest.raises(SystemExit) as e:
            main(["bench", "scaling", "--workers", "1", flag, value, "--out", str(out)])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert f"argument {flag}: {message}" in err, err
        assert not out.exists()


def test_a_sampled_compressed_corpus_names_sample_bytes_too(tmp_path, capsys):
    """A compressed file's stored size is not its text's: a 300 kB sample of 680 kB of text
    stored as 161 kB of gzip was taken for the whole corpus, and the warning asked for a larger
    corpus. A whole compressed corpus smaller than the sample still names the corpus."""
    import gzip

    text = "".join(f"Line {i % 50} says the quick brown fox jumps over the lazy dog.\n"
                   for i in range(12000))
    corpus = tmp_path / "c.txt.gz"
    corpus.write_bytes(gzip.compress(text.encode()))
    assert len(text) > 2 * 300_000 and corpus.stat().st_size < 300_000
    assert main(["tokenizer", "--corpus", str(corpus), "--vocab-size", "30000",
                 "--sample-bytes", "300000", "--out", str(tmp_path / "t")]) == 0
    err = capsys.readouterr().err
    assert "the --sample-bytes 300000 sample of the corpus gave only" in err, err
    assert main(["tokenizer", "--corpus", str(corpus), "--vocab-size", "30000",
                 "--sample-bytes", str(10 * len(text)), "--out", str(tmp_path / "t2")]) == 0
    err = capsys.readouterr().err
    assert "the corpus gave only" in err and "larger or more varied corpus" in err, err

"""Options the commands read late, or never, are checked before any work.

`bench quality` read --ft, --glue and --glue-tasks only after every recipe had pretrained for its
whole budget; `demo --steps 0` ran the recipe's default and `demo --seeds 1 1` counted one run
twice; `finetune <GLUE task>` trained on --data's files while given --train-file / --dev-file,
and `finetune squad` ignored --data beside both files; `bench scaling --predict-only` printed the
built-in cost model whatever --recipe or --data said. Each is now one line, exit 2, nothing
written, and the work (patched to fail here) never starts.
"""

from __future__ import annotations

from pathlib import Path

import _tiny_init
import pytest
from _shards import write_synthetic_shards

from bertgpu.bench import quality as bq
from bertgpu.cli import main
from bertgpu.errors import BertgpuError
from bertgpu.tasks.finetuning import JobRequest
from bertgpu.tasks.registry import task_module

GLUE = Path(__file__).parent / "fixtures" / "glue"


class WorkStarted(Exception):
    """Raised by the patched work: the checks let the command through to it."""


def _no_work(*_args, **_kwargs):
    raise WorkStarted


@pytest.fixture()
def quality(tmp_path: Path, monkeypatch) -> list[str]:
    """`bench quality` on a tiny shard set, its pretraining patched to raise WorkStarted."""
    monkeypatch.setattr(bq, "pretrain_all", _no_work)
    monkeypatch.setattr(bq, "shared_data", _no_work)
    data = write_synthetic_shards(tmp_path / "data")
    return ["bench", "quality", "--recipe", "configs/tiny.toml", "--data", str(data),
            "--tokens", "512", "--device", "cpu", "--out", str(tmp_path / "out")]


@pytest.mark.parametrize(("words", "message"), [
    (["--ft", "lr=-1"], "--ft: config: lr = -1.0: expected a positive number or none"),
    (["--ft", "lr"], "--ft 'lr': expected KEY=VALUE"),
    (["--ft", "lrr=1"], "--ft: command line: unknown key lrr"),
    (["--ft", "seed=3"], "--ft seed=3: the fine-tuning seeds are --seeds"),
    (["--glue", "NOWHERE"], "--glue NOWHERE: not a folder"),
    (["--glue", str(GLUE), "--glue-tasks", "sst3"], "unknown GLUE task 'sst3'"),
    (["--glue-tasks", "sst2"], "--glue-tasks: only with --glue DIR"),
])
def test_bench_quality_checks_finetuning_options_before_pretraining(
        quality: list[str], tmp_path: Path, capsys, words: list[str], message: str):
    """Each used to pretrain every recipe for the whole budget first (and again on a re-run)."""
    assert main([*quality, *words]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and err.count("\n") == 0
    assert not (tmp_path / "out").exists()


def test_bench_quality_glue_task_without_its_files(quality: list[str], tmp_path: Path, capsys):
    (tmp_path / "glue" / "CoLA").mkdir(parents=True)
    assert main([*quality, "--glue", str(tmp_path / "glue"), "--glue-tasks", "sst2"]) == 2
    assert "no train file for GLUE task SST-2" in capsys.readouterr().err
    assert main([*quality, "--glue", str(tmp_path / "glue")]) == 2  # none of the nine there
    assert "none of the tasks asked for has its files" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("words", [
    ["--ft", "epochs=1", "--ft", "max_seq_len=32", "--sets", "polarity"],
    ["--glue", str(GLUE), "--glue-tasks", "sst2", "rte", "--ft", "lr=1e-4"],
    ["--glue", str(GLUE)],
])
def test_bench_quality_good_finetuning_options_go_on_to_pretraining(quality: list[str],
                                                                     words: list[str]):
    with pytest.raises(WorkStarted):
        main([*quality, *words])


@pytest.fixture()
def demo_stages(monkeypatch):
    from bertgpu import demo

    monkeypatch.setattr(demo, "_run_stages", _no_work)


@pytest.mark.parametrize("flag", ["--steps", "--vocab-size"])
@pytest.mark.parametrize("steps", ["0", "-3"])
def test_demo_steps_must_be_positive(demo_stages, tmp_path: Path, capsys, steps: str, flag):
    """--steps 0 ran the recipe's default number of steps, -3 failed after the tokenizer and
    shards; --vocab-size 0 or -3 went on to the tokenizer."""
    with pytest.raises(SystemExit) as exit_:
        main(["demo", flag, steps, "--out", str(tmp_path / "demo")])
    assert exit_.value.code == 2
    assert f"argument {flag}: expected a positive finite int, found {steps}" in \
        capsys.readouterr().err
    assert not (tmp_path / "demo").exists()


def test_demo_refuses_a_seed_given_twice(demo_stages, tmp_path: Path, capsys):
    """A repeated seed counted one run twice: the table said "seed spread 0.0"."""
    assert main(["demo", "--seeds", "1", "1", "--out", str(tmp_path / "demo")]) == 2
    assert "--seeds 1 1: each seed once" in capsys.readouterr().err
    assert not (tmp_path / "demo").exists()
    with pytest.raises(WorkStarted):
        main(["demo", "--seeds", "1", "2", "--steps", "3", "--out", str(tmp_path / "demo")])


@pytest.mark.parametrize("flags", [["--train-file"], ["--dev-file"],
                                   ["--train-file", "--dev-file"]])
def test_finetune_glue_refuses_the_file_flags(tmp_path: Path, capsys, monkeypatch, flags):
    """They were ignored: results.json said the run trained on --data's train.tsv."""
    from bertgpu import finetune

    monkeypatch.setattr(finetune, "_run", _no_work)
    init = _tiny_init.tiny_init(tmp_path, _tiny_init.SPECIAL + "good bad movie".split())
    own = tmp_path / "own.tsv"
    own.write_text("sentence\tlabel\ngood\t1\n")
    words = [w for flag in flags for w in (flag, str(own))]
    assert main(["finetune", "sst2", "--data", str(GLUE), "--init", str(init),
                 "--out", str(tmp_path / "ft"), *words]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{', '.join(flags)}: only for finetune squad, classify and ner; finetune sst2 " \
           "reads its files under --data" in err and err.count("\n") == 0
    assert not (tmp_path / "ft").exists()


def test_finetune_squad_refuses_data_beside_both_files(tmp_path: Path):
    """--data was read by nothing when both files were given; with one file it gives the other."""
    squad = task_module("squad")
    train, dev = tmp_path / "train.json", tmp_path / "dev.json"
    with pytest.raises(BertgpuError, match=r"^finetune squad: --data with both --train-file and "
                                           r"--dev-file would be unused"):
        squad.check_request(JobRequest("squad", tmp_path, train_file=train, dev_file=dev))
    squad.check_request(JobRequest("squad", tmp_path, train_file=train))
    squad.check_request(JobRequest("squad", tmp_path, dev_file=dev))
    squad.check_request(JobRequest("squad", train_file=train, dev_file=dev))


@pytest.mark.parametrize(("words", "named"), [
    (["--recipe", "configs/bert-base.toml"], "--recipe"),
    (["--data", "NOWHERE"], "--data"),
    (["--recipe", "nope.toml", "--set", "model.hidden_size=64"], "--recipe, --set"),
])
def test_bench_scaling_predict_only_refuses_what_it_does_not_read(tmp_path: Path, capsys, words,
                                                                  named):
    """The table was always the built-in BERT-base/large cost model, whatever they said."""
    assert main(["bench", "scaling", "--predict-only", *words,
                 "--out", str(tmp_path / "out")]) == 2
    assert (f"{named}: not with --predict-only, whose table is the cost model of the built-in "
            "BERT-base and BERT-large") in capsys.readouterr().err
    assert main(["bench", "scaling", "--predict-only"]) == 0
    assert "BERT-large" in capsys.readouterr().out
    assert not (tmp_path / "out").exists()

"""`bertgpu pretrain`'s command line and inputs: one-line errors before any work, the recipe
found wherever it stands, the defaults said out loud, the run folder checked, a changed resume
recorded, notes for settings that do nothing."""

from __future__ import annotations

import argparse
import json
import os
import socket
from pathlib import Path

import pytest
from _shards import write_synthetic_shards

from bertgpu import cli, pretrain
from bertgpu.config.overrides import read_toml
from bertgpu.errors import BertgpuError
from bertgpu.train import run_folder

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "configs" / "tiny.toml")
SMALL = ["--model.vocab_size", "100", "--model.hidden_size", "32",
         "--model.intermediate_size", "64", "--model.max_position_embeddings", "64",
         "--train.global_batch_size", "8", "--impl.micro_batch_size", "4",
         "--train.eval_every_steps", "0", "--train.eval_sequences", "8", "--impl.num_workers", "0",
         "--train.log_every_steps", "1"]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return write_synthetic_shards(tmp_path_factory.mktemp("data") / "d", n_train=48, n_val=8,
                                  seq_len=32, vocab_size=100)


def _one_line_error(capsys, argv: list[str]) -> str:
    assert cli.main(argv) == 2, argv
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("bertgpu pretrain: error: "), err
    return err


def _parse(words: list[str]) -> argparse.Namespace:
    """The words as cli.py parses them for `bertgpu pretrain`."""
    parser = argparse.ArgumentParser(prog="bertgpu pretrain")
    pretrain.add_arguments(parser)
    cli._add_launch_arguments(parser)
    return pretrain.parse_arguments(parser, words)


def _train_steps(run: Path) -> list[int]:
    return [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if r["kind"] == "train"]


# 1. tracebacks -> one line ------------------------------------------------------------------


def test_no_out_and_no_arguments_are_one_line(shards: Path, tmp_path: Path, capsys) -> None:
    """Without --out (and with no argument at all) the run used to die on Path(None)."""
    err = _one_line_error(capsys, ["pretrain", TINY, "--data", str(shards)])
    assert "out is not set; give --out RUN_DIR" in err
    err = _one_line_error(capsys, ["pretrain"])
    assert "data.dir and out are not set" in err and "--data DIR" in err and "--out" in err
    err = _one_line_error(capsys, ["pretrain", TINY, "--data", str(shards), "--nproc", "2"])
    assert "out is not set" in err


def test_a_recipe_that_is_a_folder_or_not_utf8_is_one_line(shards: Path, tmp_path: Path,
                                                           capsys) -> None:
    folder = tmp_path / "cfg"
    folder.mkdir()
    err = _one_line_error(capsys, ["pretrain", str(folder), "--data", str(shards), "--out",
                                   str(tmp_path / "r")])
    assert f"{folder}: is a folder; expected a TOML config file" in err
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes(b"# caf\xe9\n[train]\nmax_steps = 3\n")
    err = _one_line_error(capsys, ["pretrain", str(latin1), "--data", str(shards), "--out",
                                   str(tmp_path / "r")])
    assert f"{latin1}: not UTF-8 text (byte 0xe9 at offset 5)" in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("device", ["mps", "cuda:99"])
def test_a_device_this_machine_lacks_is_one_line_before_anything_loads(
        shards: Path, tmp_path: Path, capsys, device) -> None:
    """mps used to fail inside model.to() with torch's RuntimeError; cuda:99 (no machine has
    it) is refused the same way, naming the setting, with and without --nproc."""
    import torch

    if device == "mps" and torch.backends.mps.is_available():
        pytest.skip("this machine has an MPS device")
    for launch in ([], ["--nproc", "2"]):
        err = _one_line_error(capsys, ["pretrain", TINY, "--data", str(shards), "--out",
                                       str(tmp_path / "r"), "--impl.device", device, *launch])
        assert f"config: impl.device = '{device}':" in err
        assert not (tmp_path / "r").exists()
    with pytest.raises(BertgpuError, match=r"impl.device = 'gpu': expected auto, cpu, cuda"):
        from bertgpu.config.schema import load_config

        load_config(None, ["--impl.device", "gpu"])


def test_check_device_with_gpus(monkeypatch) -> None:
    """The CUDA branch, on two simulated GPUs (the real ones are not needed to count)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    for ok in ("auto", "cpu", "cuda", "cuda:0", "cuda:1"):
        run_folder.check_device(ok)
    with pytest.raises(BertgpuError, match=r"^config: impl.device = 'cuda:2': 2 GPUs are visible; "
                                           r"expected cuda:N with N in \[0, 2\), or cuda$"):
        run_folder.check_device("cuda:2")
    with pytest.raises(BertgpuError, match=r"impl.device = 'mps': .* expected auto or cpu or cuda"):
        run_folder.check_device("mps")


# 2. the recipe wherever it stands -------------------------------------------------------------


def test_overrides_before_the_recipe_keep_their_values() -> None:
    """`--train.max_steps 2 RECIPE` used to take `2` as the recipe ("2: config file not
    found"), and so did `--init RUN ... --train.max_steps 2` at the end of a line without one."""
    args = _parse(["--train.max_steps", "2", TINY, "--data", "d", "--out", "o"])
    assert args.recipe == TINY and args.overrides == ["--train.max_steps=2"]
    assert (args.data, args.out) == ("d", "o")
    args = _parse(["--init", "run1", "--data", "d", "--out", "o", "--train.max_steps", "2"])
    assert args.recipe is None and args.init == "run1"
    assert args.overrides == ["--train.max_steps=2"]
    # a bool key stands alone before the recipe; a .toml word is never a value; negative numbers
    args = _parse(["--impl.compile", "configs/x", "--seed", "3", "--optim.lr", "-1"])
    assert args.recipe == "configs/x"
    assert args.overrides == ["--impl.compile", "--seed=3", "--optim.lr=-1"]
    args = _parse(["--logging.wandb_run_name", "x.toml", "--impl.compile", "false"])
    assert args.recipe == "x.toml"
    assert args.overrides == ["--logging.wandb_run_name", "--impl.compile=false"]
    with pytest.raises(BertgpuError, match=r"a.toml: a second positional argument after the "
                                           r"recipe x.toml"):
        _parse(["x.toml", "a.toml"])


def test_a_missing_recipe_says_what_was_taken_as_the_recipe(shards: Path, tmp_path: Path,
                                                            capsys) -> None:
    err = _one_line_error(capsys, ["pretrain", "tiny", "--data", str(shards), "--out",
                                   str(tmp_path / "r")])
    assert "tiny: recipe not found (the one argument that is neither an option nor an " in err


def test_a_run_with_its_override_before_the_recipe_trains(shards: Path, tmp_path: Path) -> None:
    run = tmp_path / "r"
    assert cli.main(["pretrain", "--train.max_steps", "2", TINY, "--data", str(shards),
                     "--out", str(run), *SMALL]) == 0
    assert _train_steps(run) == [1, 2]


# 3. no recipe: the defaults said out loud ----------------------------------------------------


def test_no_recipe_says_which_defaults_train_and_init_does_not(shards: Path, tmp_path: Path,
                                                               capsys) -> None:
    """A forgotten recipe used to start BERT-base (109.5 M parameters, 10,000 steps) without a
    word; now one line names the model, the steps and the batch, and where the recipes are."""
    run = tmp_path / "defaults"
    assert cli.main(["pretrain", "--data", str(shards), "--out", str(run), *SMALL,
                     "--model.num_hidden_layers", "1", "--model.num_attention_heads", "2",
                     "--train.max_steps", "1"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "no recipe" in line]
    assert len(notes) == 1, notes
    assert notes[0].startswith("bertgpu pretrain: warning: no recipe given: training the "
                               "built-in defaults, bert, ")
    assert "(L=1, H=32, A=2, V=100)" in notes[0]
    assert "for train.max_steps 1 at global batch 8" in notes[0]
    assert "tiny" in notes[0]
    # with --init the model is the init's: no note
    assert cli.main(["pretrain", "--init", str(run), "--data", str(shards), "--out",
                     str(tmp_path / "continued"), *SMALL[8:], "--train.max_steps", "1"]) == 0
    assert "no recipe" not in capsys.readouterr().err


# 4. --out: a new folder or a run folder -------------------------------------------------------


def test_a_non_empty_out_that_is_not_a_run_is_refused_before_any_work(
        shards: Path, tmp_path: Path, capsys) -> None:
    """A user's project folder and the shard set itself used to receive checkpoints/, hf/,
    tokenizer/ and metrics.jsonl; now one line, nothing written, with or without --nproc."""
    proj = tmp_path / "proj"
    (proj / "src").mkdir(parents=True)
    (proj / "README.md").write_text("x")
    before = sorted(p.name for p in shards.iterdir())
    for out, shown in ((proj, "README.md, src/"), (shards, "manifest.json")):
        for launch in ([], ["--nproc", "2"]):
            err = _one_line_error(capsys, ["pretrain", TINY, "--data", str(shards), "--out",
                                           str(out), *SMALL, "--train.max_steps", "1", *launch])
            assert f"{out}: a folder that is not a pretraining run (it holds {shown}" in err
            assert "expected a new or empty folder, or a run folder to resume" in err
    assert sorted(p.name for p in proj.iterdir()) == ["README.md", "src"]
    assert sorted(p.name for p in shards.iterdir()) == before


def test_check_run_folder_takes_new_empty_and_run_folders(tmp_path: Path) -> None:
    run_folder.check_run_folder(tmp_path / "new")
    (tmp_path / "empty").mkdir()
    run_folder.check_run_folder(tmp_path / "empty")
    for mark in run_folder.RUN_FILES:
        run = tmp_path / f"run_{mark}"
        run.mkdir()
        (run / mark).write_text("")
        run_folder.check_run_folder(run)
        (run / "results.json").write_text("{}")  # a fine-tuning's output is not a run
        with pytest.raises(BertgpuError, match="not a pretraining run"):
            run_folder.check_run_folder(run)


def test_a_run_folder_another_process_trains_in_is_refused_untouched(shards: Path,
                                                                      tmp_path: Path,
                                                                      capsys) -> None:
    """Two `bertgpu pretrain` into one --out interleaved checkpoints and metrics.jsonl: the second
    is refused in one line (also by the --nproc launcher, before it starts workers), and the
    folder the first left is taken again once its lock is released."""
    run = tmp_path / "r"
    args = ["pretrain", TINY, "--data", str(shards), "--out", str(run), *SMALL,
            "--train.max_steps", "1"]
    with run_folder.run_folder_lock(run):
        held = sorted(p.name for p in run.iterdir())
        for launch in ([], ["--nproc", "2"]):
            err = _one_line_error(capsys, [*args, *launch])
            assert (f"{run}: another bertgpu pretrain (pid {os.getpid()} on "
                    f"{socket.gethostname()}) is training in this run folder" in err), err
            assert sorted(p.name for p in run.iterdir()) == held == [run_folder.LOCK_FILE]
    run_folder.check_run_folder(run)  # a run that stopped before its config: still a run folder
    assert cli.main(args) == 0
    assert (run / "checkpoints").is_dir()


def test_a_run_refused_before_it_wrote_anything_leaves_no_folder(shards: Path, tmp_path: Path,
                                                                   capsys) -> None:
    """The run folder's lock file was all such a run left, in a folder that export, report and
    finetune then refused; an unwritable place is one line, not a PermissionError traceback."""
    run = tmp_path / "new" / "r"
    err = _one_line_error(capsys, ["pretrain", TINY, "--data", str(shards), "--out", str(run),
                                   *SMALL, "--model.vocab_size", "50"])
    assert "does not fit the model" in err
    assert not (tmp_path / "new").exists()
    (tmp_path / "file").write_text("")
    with pytest.raises(BertgpuError, match=r"file/r: cannot write the run folder here"):
        with run_folder.run_folder_lock(tmp_path / "file" / "r"):
            pass


# 5. resuming with other settings: said, and the earlier config kept ---------------------------


def test_a_resume_with_changed_settings_says_so_and_keeps_the_earlier_config(
        shards: Path, tmp_path: Path, capsys) -> None:
    run = tmp_path / "r"
    assert cli.main(["pretrain", TINY, "--data", str(shards), "--out", str(run), *SMALL,
                     "--train.max_steps", "2"]) == 0
    first = (run / "config.toml").read_text()
    capsys.readouterr()
    assert cli.main(["pretrain", TINY, "--data", str(shards), "--out", str(run), *SMALL,
                     "--train.max_steps", "3", "--optim.lr", "0.005",
                     "--train.global_batch_size", "16"]) == 0
    out = capsys.readouterr().out
    line = [x for x in out.splitlines() if "changed settings" in x]
    assert line == [f"{run}: resuming at step 2 with changed settings: optim.lr 0.005 (was "
                    "0.001), train.global_batch_size 16 (was 8), train.max_steps 3 (was 2) (the "
                    "earlier config.toml is kept as config.step_2.toml)"], out
    assert (run / "config.step_2.toml").read_text() == first
    assert "global_batch_size = 16" in (run / "config.toml").read_text()
    assert _train_steps(run) == [1, 2, 3]


def test_a_resume_with_the_same_settings_keeps_no_copy_and_a_second_change_keeps_both(
        tmp_path: Path, capsys) -> None:
    run = tmp_path / "r"
    run.mkdir()
    first, second, third = ("seed = 0\n[optim]\nlr = 0.001\n", "seed = 0\n[optim]\nlr = 0.002\n",
                            "seed = 0\n[optim]\nlr = 0.003\n")
    (run / "config.toml").write_text(first)
    run_folder.keep_config_history(run, first, 5)
    assert sorted(p.name for p in run.iterdir()) == ["config.toml"]
    assert capsys.readouterr().out == ""
    # resumed at step 5 with lr 0.002, stopped before step 6's checkpoint, resumed with 0.003
    for after in (second, third):
        run_folder.keep_config_history(run, after, 5)
        (run / "config.toml").write_text(after)
    assert (run / "config.step_5.toml").read_text() == first
    assert (run / "config.step_5.2.toml").read_text() == second
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"{run}: resuming at step 5 with changed settings: optim.lr 0.003 (was 0.002) (the "
        "earlier config.toml is kept as config.step_5.2.toml)")


def test_a_copied_run_folder_resumed_in_its_new_place_changes_no_setting(
        tmp_path: Path, capsys) -> None:
    """`cp -r run run2` and the same command with --out run2 listed "out run2 (was run)" as a
    changed setting and kept a config.step_N.toml for it: where the folder is trains nothing."""
    run = tmp_path / "run2"
    run.mkdir()
    (run / "config.toml").write_text('seed = 0\nout = "run"\n[optim]\nlr = 0.001\n')
    run_folder.keep_config_history(run, 'seed = 0\nout = "run2"\n[optim]\nlr = 0.001\n', 5)
    assert sorted(p.name for p in run.iterdir()) == ["config.toml"]
    assert capsys.readouterr().out == ""
    run_folder.keep_config_history(run, 'seed = 0\nout = "run2"\n[optim]\nlr = 0.002\n', 5)
    assert capsys.readouterr().out == (f"{run}: resuming at step 5 with changed settings: optim.lr "
                                       "0.002 (was 0.001) (the earlier config.toml is kept as "
                                       "config.step_5.toml)\n")


def test_the_same_shards_spelled_another_way_change_no_setting(tmp_path: Path, capsys,
                                                                monkeypatch) -> None:
    """`./work/data` or an absolute path for `work/data`: the same folder, no changed setting.
    Other shards (a resume with --allow-data-change) are still said and the config kept."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "work" / "data").mkdir(parents=True)
    (tmp_path / "work" / "other").mkdir()
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text('seed = 0\n[data]\ndir = "work/data"\n')
    same = str(tmp_path / "work" / "data")
    run_folder.keep_config_history(run, f'seed = 0\n[data]\ndir = "{same}"\n', 5)
    assert sorted(p.name for p in run.iterdir()) == ["config.toml"]
    assert capsys.readouterr().out == ""
    run_folder.keep_config_history(run, 'seed = 0\n[data]\ndir = "work/other"\n', 5)
    assert "changed settings: data.dir work/other (was work/data)" in capsys.readouterr().out


def test_config_toml_holds_the_values_the_run_used_and_auto_again_changes_nothing(
        shards: Path, tmp_path: Path, capsys) -> None:
    # It kept the placeholders: micro_batch_size = "auto", objective = "none", with_nsp = "none".
    run = tmp_path / "r"
    auto = ["--impl.micro_batch_size", "auto"]
    assert cli.main(["pretrain", TINY, "--data", str(shards), "--out", str(run), *SMALL, *auto,
                     "--train.max_steps", "2"]) == 0
    out = capsys.readouterr().out
    picked = int(out.split("micro_batch_size auto: ")[1].split("using ")[1].split()[0])
    text = (run / "config.toml").read_text()
    saved = read_toml(run / "config.toml")
    assert saved["impl"]["micro_batch_size"] == picked
    assert saved["data"]["objective"] == "mlm" and saved["train"]["with_nsp"] is False
    accumulation = 8 // picked
    assert text.splitlines()[0] == (f"# resolved for 1 device: global batch 8 = micro batch "
                                    f"{picked} x accumulation {accumulation} x 1 device")
    checkpoint = run / "checkpoints" / "step_2" / "config.toml"
    assert checkpoint.read_text() == text
    # The same command (one more step): nothing changed, whatever auto picks this time.
    assert cli.main(["pretrain", TINY, "--data", str(shards), "--out", str(run), *SMALL, *auto,
                     "--train.max_steps", "3"]) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if "changed settings" in x]
    assert line == [f"{run}: resuming at step 2 with changed settings: train.max_steps 3 (was 2) "
                    "(the earlier config.toml is kept as config.step_2.toml)"]


def test_auto_and_none_are_compared_as_given_not_as_resolved(tmp_path: Path, capsys) -> None:
    run = tmp_path / "r"
    run.mkdir()
    resolved = ('[data]\nobjective = "mlm"\n[train]\nwith_nsp = false\n'
                '[impl]\nmicro_batch_size = {}\n')
    asked = ('[data]\nobjective = "none"\n[train]\nwith_nsp = "none"\n'
             '[impl]\nmicro_batch_size = {}\n')
    (run / "config.toml").write_text(resolved.format(16))
    # auto picked 24 this time (more free memory): the same setting
    run_folder.keep_config_history(run, resolved.format(24), 5, asked.format('"auto"'))
    # a config.toml written before it held resolved values
    (run / "config.toml").write_text(asked.format('"auto"'))
    run_folder.keep_config_history(run, resolved.format(24), 5, asked.format('"auto"'))
    assert capsys.readouterr().out == "" and sorted(p.name for p in run.iterdir()) == [
        "config.toml"]
    # an explicit micro batch that differs is a changed setting
    (run / "config.toml").write_text(resolved.format(16))
    run_folder.keep_config_history(run, resolved.format(8), 5, asked.format(8))
    assert "impl.micro_batch_size 8 (was 16)" in capsys.readouterr().out


def test_device_compile_and_unpad_resolved_from_auto_are_not_changed_settings(
        tmp_path: Path, capsys) -> None:
    """config.toml holds what impl.device, compile and unpad `auto` resolved to; a resume that
    asks `auto` again, on another machine or from a folder written when config.toml kept "auto",
    changes no setting."""
    run = tmp_path / "r"
    run.mkdir()
    resolved = '[impl]\ndevice = "{}"\ncompile = {}\nunpad = {}\n'
    asked = '[impl]\ndevice = "auto"\ncompile = "auto"\nunpad = "auto"\n'
    (run / "config.toml").write_text(resolved.format("cpu", "false", "false"))
    run_folder.keep_config_history(run, resolved.format("cuda", "true", "true"), 5, asked)
    (run / "config.toml").write_text(asked)  # written before config.toml resolved them
    run_folder.keep_config_history(run, resolved.format("cpu", "false", "false"), 5, asked)
    assert capsys.readouterr().out == "" and sorted(p.name for p in run.iterdir()) == [
        "config.toml"]
    # asked explicitly otherwise than the run went: a changed setting
    (run / "config.toml").write_text(resolved.format("cpu", "false", "false"))
    run_folder.keep_config_history(run, resolved.format("cpu", "true", "false"), 5,
                                   '[impl]\ndevice = "auto"\ncompile = true\nunpad = "auto"\n')
    assert "impl.compile true (was false)" in capsys.readouterr().out


# 6. notes for settings that do nothing --------------------------------------------------------


def test_a_vocabulary_much_larger_than_the_shards_is_a_warning(shards: Path, tmp_path: Path,
                                                               capsys) -> None:
    """tiny.toml's 8,192 rows on a 2,000-token shard set trained without a word; the rows past
    the tokenizer's ids never appear in a batch. Up to 2x (padding, rounding) stays quiet."""
    words = ["pretrain", TINY, "--data", str(shards), *SMALL, "--train.max_steps", "1"]
    assert cli.main([*words, "--out", str(tmp_path / "big"), "--model.vocab_size", "256"]) == 0
    err = capsys.readouterr().err
    assert ("bertgpu pretrain: warning: model.vocab_size 256 is 2.6x the shard set's vocabulary "
            f"(100 tokens, {shards / 'manifest.json'}): its 156 other rows are never trained"
            ) in err, err
    assert err.count("never trained") == 1
    assert cli.main([*words, "--out", str(tmp_path / "ok"), "--model.vocab_size", "192"]) == 0
    assert "never trained" not in capsys.readouterr().err
    # from an init (its vocabulary, no tokenizer files): the advice was model.vocab_size 100,
    # which --init then refuses as a contradiction of its config.json
    init = tmp_path / "init"
    init.mkdir()
    for name in ("config.json", "model.safetensors"):
        (init / name).write_bytes((tmp_path / "big" / "hf" / name).read_bytes())
    train_words = SMALL[SMALL.index("--train.global_batch_size"):]
    adapt = str(Path(TINY).parent / "domain-adapt.toml")  # no [model]: the init's
    assert cli.main(["pretrain", adapt, "--data", str(shards), *train_words, "--train.max_steps",
                     "1", "--out", str(tmp_path / "cont"), "--init", str(init)]) == 0
    err = capsys.readouterr().err
    assert ("its 156 other rows are never trained; the shards were probably made with another "
            f"tokenizer than {init}'s: prepare them with the init's vocabulary") in err, err


# 7. command-line wording --------------------------------------------------------------------


def test_a_bad_bool_value_in_the_space_form_names_the_key_and_its_values(tmp_path: Path,
                                                                          capsys) -> None:
    """`--checkpoint.async_save maybe` after a recipe was "maybe: a second positional argument
    after the recipe" (the bool key refused the word, which then stood alone); it is now what
    `--checkpoint.async_save=maybe` says, wherever the recipe stands, and nothing is written."""
    out = tmp_path / "r"
    for words in (["--checkpoint.async_save", "maybe", TINY], [TINY, "--checkpoint.async_save",
                                                               "maybe"]):
        err = _one_line_error(capsys, ["pretrain", *words, "--data", "d", "--out", str(out)])
        assert err == ("bertgpu pretrain: error: --checkpoint.async_save maybe: expected true or "
                       "false"), err
    with pytest.raises(BertgpuError, match=r"^--impl.compile maybe: expected true or false or "
                                           r"auto$"):
        _parse([TINY, "--impl.compile", "maybe"])
    # two recipes stay two recipes, and a bool key still stands alone before a recipe file
    with pytest.raises(BertgpuError, match=r"a.toml: a second positional argument"):
        _parse([TINY, "--impl.compile", "a.toml"])
    assert _parse(["--impl.compile", TINY]).overrides == ["--impl.compile"]
    assert not out.exists()


def test_a_missing_sink_package_leaves_no_run_folder(shards: Path, tmp_path: Path, capsys,
                                                     monkeypatch) -> None:
    """--logging.tensorboard true without tensorboard installed: one line, and no run folder
    (config.toml and the tokenizer were written before the sinks started)."""
    import sys

    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import tensorboard -> ImportError
    run = tmp_path / "r"
    err = _one_line_error(capsys, ["pretrain", TINY, "--data", str(shards), "--out", str(run),
                                   *SMALL, "--train.max_steps", "1",
                                   "--logging.tensorboard", "true"])
    assert "tensorboard" in err and not run.exists(), err


def test_a_key_added_since_the_run_started_is_no_changed_setting(tmp_path, capsys):
    """A run resumed after an upgrade that added a setting: its config.toml lacks the key, which
    this version reads as its default, so the same command changes no setting (it said
    "schedule.decay_span after_warmup (was unset)"); the key at another value still does."""
    from bertgpu.config import render, schema
    from bertgpu.train import run_folder

    run = tmp_path / "run"
    run.mkdir()
    full = render.dump_toml(schema.load_config(None, []))
    assert "grace_s = " in full
    older = "\n".join(line for line in full.splitlines() if not line.startswith("grace_s = "))
    (run / "config.toml").write_text(older + "\n")
    run_folder.keep_config_history(run, full, 5)
    assert capsys.readouterr().out == "" and sorted(p.name for p in run.iterdir()) == [
        "config.toml"]
    other = full.replace("grace_s = ", "grace_s = 1", 1)  # e.g. 30.0 -> 130.0
    run_folder.keep_config_history(run, other, 5)
    assert "checkpoint.grace_s" in capsys.readouterr().out


def test_the_manifest_given_for_its_folder_says_so(shards: Path, tmp_path: Path,
                                                    capsys) -> None:
    """`--data DIR/manifest.json` said "DIR/manifest.json/manifest.json: no manifest.json
    found"; it names the file as a file and the folder to give."""
    err = _one_line_error(capsys, ["pretrain", TINY, "--data", str(shards / "manifest.json"),
                                   "--out", str(tmp_path / "r"), *SMALL])
    assert (f"{shards / 'manifest.json'}: a file, not a folder; expected the folder of a shard "
            f"set written by `bertgpu prepare` (its folder: {shards})") in err, err
    assert not (tmp_path / "r").exists()

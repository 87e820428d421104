"""What a probe of `bertgpu pretrain` found in its configuration:

1. configs/domain-adapt.toml without --init trained a randomly initialised BERT-base (109.5 M
   parameters) with no word: a continuation recipe now says `requires_init = true`, and without
   an init the command refuses in one line naming the recipe.
2. Resuming with another --seed said "expected the configured seed 5" (backwards: the run's 0 is
   what resumes), named no run folder and no way on, after the model was built, and
   --allow-data-change did not help: now one line before any work, naming the run, both seeds
   and what to do; --allow-data-change goes on in the new seed's order, as with other data.
3. A batch the devices do not divide said "choose a global batch that is a multiple of 96" for
   tiny's 32 on 3 devices: now the settings that divide (a micro batch that divides each
   device's share, the nearest multiples of the devices, or of micro batch x devices), before
   any worker starts. train.max_steps -5 said "0 or more", then 0 was refused: one rule now.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from _shards import write_synthetic_shards
from test_pretrain import TINY, _args  # the tiny run's flags

from bertgpu.cli import main
from bertgpu.config import schema
from bertgpu.config.sections import resolve_batch
from bertgpu.errors import BertgpuError

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return write_synthetic_shards(tmp_path_factory.mktemp("data") / "d", n_train=96, n_val=16,
                                  seq_len=32, vocab_size=100)


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert lines and lines[-1].startswith("bertgpu pretrain: error: "), err
    return lines[-1].removeprefix("bertgpu pretrain: error: ")


@pytest.fixture
def no_training(monkeypatch):
    """A refusal "before any work": training or launching workers fails the test."""
    from bertgpu import pretrain
    from bertgpu.train import launcher

    def fail(*args, **kwargs):
        raise AssertionError("started work before refusing")

    monkeypatch.setattr(pretrain, "run", fail)
    monkeypatch.setattr(launcher, "launch_local", fail)


# 1. a continuation recipe without --init --------------------------------------------------------

INIT_NEEDED = ("requires_init = true (the recipe continues pretrained weights) but no --init is "
               "given; expected --init PATH: a Hugging Face BERT / ModernBERT folder, or a bertgpu "
               "run or checkpoint folder")


@pytest.mark.parametrize("name", ["domain-adapt", "bert-base-phase2", "modern-base-8k"])
def test_a_continuation_recipe_refuses_to_start_without_init(name, shards, tmp_path, capsys,
                                                             no_training):
    recipe = str(CONFIGS / f"{name}.toml")
    assert schema.load_config(recipe).requires_init is True  # the recipe says so itself
    out = tmp_path / "run"
    for launch in ([], ["--nproc", "2"]):
        assert main(["pretrain", recipe, "--data", str(shards), "--out", str(out),
                     "--train.max_steps", "1", *launch]) == 2
        assert _error(capsys) == f"{recipe}: {INIT_NEEDED}"
        assert not out.exists()


def test_requires_init_is_a_setting_of_any_recipe(shards, tmp_path, capsys, no_training):
    """The key, not the file name: on the command line it names the command line, the other
    recipes do not carry it, and `--requires_init false` lets a continuation recipe train from
    random weights (the benchmark's twin)."""
    assert main(_args(shards, tmp_path / "r", "--requires_init", "true")) == 2
    assert _error(capsys) == f"command line: {INIT_NEEDED}"
    for recipe in sorted(CONFIGS.glob("*.toml")):
        required = recipe.stem in ("domain-adapt", "bert-base-phase2", "modern-base-8k")
        assert schema.load_config(str(recipe)).requires_init is required, recipe.name
    cfg = schema.load_config(str(CONFIGS / "domain-adapt.toml"), ["--requires_init", "false"])
    schema.check_start(cfg, str(CONFIGS / "domain-adapt.toml"), ["--requires_init=false"])
    assert "requires_init" in schema.help_text()


# 2. resuming with another seed ------------------------------------------------------------------


def test_a_resume_with_another_seed_names_the_run_both_seeds_and_the_ways_on(
        shards, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    assert main(_args(shards, run, "--train.max_steps", "2")) == 0
    capsys.readouterr()
    before = sorted(p.name for p in run.iterdir())
    metrics = (run / "metrics.jsonl").read_bytes()

    from bertgpu import pretrain

    real_run = pretrain.run
    monkeypatch.setattr(pretrain, "run", lambda *a, **k: pytest.fail("built before refusing"))
    for extra in (["--seed", "5"], ["--seed=5"]):
        assert main(_args(shards, run, "--train.max_steps", "4", *extra)) == 2
        assert _error(capsys) == (
            f"{run}: the run was trained with seed 0 and this command gives seed 5 (the seed "
            "orders and masks its samples); to resume it drop --seed or give --seed 0, for a new "
            "run give another --out, or pass --allow-data-change to go on in seed 5's order and "
            "masks")
    assert sorted(p.name for p in run.iterdir()) == before
    assert (run / "metrics.jsonl").read_bytes() == metrics

    # --allow-data-change: the seed is the data's order and masking, so it goes on, and the
    # resume lists the seed among the changed settings
    monkeypatch.setattr(pretrain, "run", real_run)
    assert main(_args(shards, run, "--train.max_steps", "4", "--seed", "5",
                      "--allow-data-change")) == 0
    out = capsys.readouterr().out
    assert re.search(r"resuming at step 2 with changed settings: seed 5 \(was 0\), "
                     r"train.max_steps 4 \(was 2\)", out), out
    # the run's seed is 5 now: the same command without --seed gives 0, and dropping nothing
    # would help, so the hint is --seed 5 alone
    monkeypatch.setattr(pretrain, "run", lambda *a, **k: pytest.fail("built before refusing"))
    assert main(_args(shards, run, "--train.max_steps", "6")) == 2
    assert _error(capsys) == (
        f"{run}: the run was trained with seed 5 and this command gives seed 0 (the seed orders "
        "and masks its samples); to resume it give --seed 5, for a new run give another --out, "
        "or pass --allow-data-change to go on in seed 0's order and masks")


def test_the_loader_names_both_seeds_and_takes_another_when_allowed(shards):
    from bertgpu.data.loaders import PretrainLoader
    from bertgpu.data.masking import MaskingConfig
    from bertgpu.data.shards import ShardSet

    train = ShardSet(shards, "train")
    state = PretrainLoader(train, MaskingConfig(), 8, 4, seed=0).state_dict() | {"position": 16}
    with pytest.raises(BertgpuError) as err:
        PretrainLoader(train, MaskingConfig(), 8, 4, seed=5).load_state_dict(state)
    assert str(err.value) == (
        "data loader state: seed: the state's samples were ordered and masked with seed 0, this "
        "loader's seed is 5; expected seed 0 to resume (another seed changes the sample order), "
        "or allow_seed_change to go on in this seed's order")
    allowed = PretrainLoader(train, MaskingConfig(), 8, 4, seed=5, allow_seed_change=True)
    allowed.load_state_dict(state)
    fresh = PretrainLoader(train, MaskingConfig(), 8, 4, seed=5)
    fresh.position = 16
    assert allowed.state_dict() == {"position": 16, "seed": 5}
    for a, b in zip(allowed.next_step(), fresh.next_step(), strict=True):
        assert all(torch.equal(a[k], b[k]) for k in ("input_ids", "labels"))


# 3. batch arithmetic and max_steps --------------------------------------------------------------


def test_a_batch_the_devices_do_not_share_is_refused_with_fixes_before_workers_start(
        shards, tmp_path, capsys, no_training):
    out = tmp_path / "o"
    base = ["pretrain", TINY, "--data", str(shards), "--out", str(out),
            "--model.vocab_size", "100", "--model.max_position_embeddings", "64"]
    assert main([*base, "--nproc", "3"]) == 2
    assert _error(capsys) == (
        "train.global_batch_size 32 is not divisible by impl.micro_batch_size 32 × 3 devices = "
        "96; expected a global batch that the 3 devices share equally (a multiple of 3) in whole "
        "micro batches, e.g. --train.global_batch_size 30 --impl.micro_batch_size 10, "
        "--train.global_batch_size 33 --impl.micro_batch_size 11, or a multiple of 96 for micro "
        "batch 32: --train.global_batch_size 96")
    assert main([*base, "--impl.micro_batch_size", "64"]) == 2
    assert _error(capsys) == (
        "train.global_batch_size 32 is not divisible by impl.micro_batch_size 64 × 1 device = 64; "
        "expected a micro batch that divides the 32 sequences per device, e.g. "
        "--impl.micro_batch_size 32, or a multiple of 64 for micro batch 64: "
        "--train.global_batch_size 64")
    assert not out.exists()


@pytest.mark.parametrize("batch", [1, 2, 7, 30, 32, 33, 96, 100, 250])
@pytest.mark.parametrize("micro", [1, 3, 8, 32, 64])
@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_every_suggested_batch_divides(batch, micro, world):
    try:
        resolve_batch(batch, micro, world)
        return
    except BertgpuError as e:
        message = str(e)
    fixes = message.partition("; expected ")[2]
    suggestions = re.findall(r"--train\.global_batch_size (\d+)(?: --impl\.micro_batch_size "
                             r"(\d+))?|--impl\.micro_batch_size (\d+)", fixes)
    suggestions += [(b, "", "") for b in re.findall(r" or (\d+)$", fixes)]
    assert len(suggestions) >= 2, message
    for g, m, only_micro in suggestions:
        g2, m2 = (batch, int(only_micro)) if only_micro else (int(g), int(m or micro))
        assert resolve_batch(g2, m2, world) >= 1, (message, g2, m2)


def test_max_steps_says_what_it_accepts():
    expected = (r"expected a positive integer \(0, no step limit, only with train.budget_hours "
                r"set\)$")
    for steps in ("-5", "0"):
        with pytest.raises(BertgpuError,
                           match=rf"^command line: train.max_steps = {steps}: {expected}"):
            schema.load_config(TINY, ["--train.max_steps", steps])
    budget = ["--train.budget_hours", "1"]
    with pytest.raises(BertgpuError, match=r"^command line: train.max_steps = -5: expected 0 "
                                           r"\(no step limit: train.budget_hours ends the run\) "
                                           r"or a positive integer$"):
        schema.load_config(TINY, ["--train.max_steps", "-5", *budget])
    assert schema.load_config(TINY, ["--train.max_steps", "0", *budget]).train.max_steps == 0
    assert schema.load_config(TINY, ["--train.max_steps", "1"]).train.max_steps == 1

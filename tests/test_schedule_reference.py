"""The learning rate of every optimizer step against the references, and what a run says and
writes about its schedule, batch and devices.

Step mode follows transformers' schedulers (`get_linear_schedule_with_warmup`,
`get_cosine_schedule_with_warmup`: the lr used by optimizer step k, 0-based, is lambda(k)) and
BERT's TF optimization.py (global_step from 0). The loop used to take step k at progress
(k + 1) / max_steps: one step ahead of both, so the last step of every run ran at min_lr (0 by
default) and a 1-step run trained nothing. A warm-up longer than the run was squeezed into it
and then dropped to min_lr on its last step.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from _shards import write_synthetic_shards
from _toy import ToyPretrain
from test_loop import ToyTask
from test_schedule import nvidia_poly_warmup_lr

from bertgpu import cli
from bertgpu.config import schema
from bertgpu.config.overrides import read_toml
from bertgpu.config.sections import (
    CheckpointSection,
    DistributedSection,
    ImplSection,
    LoggingSection,
    OptimSection,
    ScheduleSection,
    TrainSection,
)
from bertgpu.data.loaders import PretrainLoader
from bertgpu.data.masking import MaskingConfig
from bertgpu.data.shards import ShardSet
from bertgpu.telemetry.records import read_metrics
from bertgpu.train import loop as loop_mod
from bertgpu.train.checkpoint import load_resume
from bertgpu.train.distributed import DistInfo
from bertgpu.train.engine import build_engine
from bertgpu.train.schedule import FINETUNE, Schedule, lr_factor, warmup_note

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "configs" / "tiny.toml")
PEAK = 1e-3


def _loop(run_dir: Path, schedule: ScheduleSection, max_steps: int, crash_at: int | None = None,
          checkpoint_every: int = 0):
    torch.manual_seed(0)
    model, info = ToyPretrain(), DistInfo()
    train = TrainSection(max_steps=max_steps, global_batch_size=8, log_every_steps=1,
                         eval_every_steps=0)
    engine, timer = build_engine(model, info, lr=PEAK, train=train, optim=OptimSection(),
                                 impl=ImplSection(), dist=DistributedSection())
    return loop_mod.Loop(ToyTask(model, crash_at), model, engine, info, run_dir=run_dir,
                         train=train, schedule=schedule, peak_lr=PEAK,
                         checkpoint=CheckpointSection(every_steps=checkpoint_every),
                         dist=DistributedSection(), logging=LoggingSection(tensorboard=False),
                         comm_timer=timer, resume=load_resume(run_dir, info))


def _run_lrs(run_dir: Path, schedule: ScheduleSection, max_steps: int) -> tuple[list, list]:
    """(the lr of every optimizer step as the optimizer had it, the logged lr of every step)."""
    lp = _loop(run_dir, schedule, max_steps)
    applied: list[float] = []
    lp.engine.optimizer.register_step_pre_hook(
        lambda o, args, kwargs: applied.append(o.param_groups[0]["lr"]))
    assert lp.run().step == max_steps
    logged = [r["lr"] for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    return applied, logged


def _reference(kind: str, warmup: int, steps: int) -> list[float]:
    """transformers' lr for optimizer steps 0 .. steps - 1 (the one each step uses)."""
    make = {"linear": transformers.get_linear_schedule_with_warmup,
            "cosine": transformers.get_cosine_schedule_with_warmup}[kind]
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=PEAK)
    sched = make(opt, warmup, steps)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize("decay", ["linear", "cosine"])
@pytest.mark.parametrize("warmup", [{"warmup_steps": 3}, {"warmup_fraction": 0.25},
                                    {"warmup_steps": 0}])
def test_step_mode_lr_equals_transformers_at_every_step(tmp_path, decay, warmup):
    """12 steps, warm-up 3 (in steps or as 0.25 of the run) or none: every step's lr is
    transformers'. It was the next step's: steps 1-3 at 1/3, 2/3, 1 of the peak, step 12 at 0."""
    applied, logged = _run_lrs(tmp_path / "r", ScheduleSection(decay=decay, **warmup), 12)
    ref = _reference(decay, 3 if warmup.get("warmup_steps", 3) else 0, 12)
    assert applied == pytest.approx(ref, rel=1e-12, abs=1e-18)
    assert logged == pytest.approx(ref, rel=1e-5, abs=1e-12)  # metrics.jsonl: 6 digits
    assert applied[-1] > 0  # the last step trains


def test_a_one_step_run_without_warmup_trains_at_the_peak(tmp_path):
    """`--train.max_steps 1` ran its one step at progress 1, lr min_lr = 0: nothing learnt."""
    applied, _ = _run_lrs(tmp_path / "r", ScheduleSection(warmup_fraction=0.0), 1)
    assert applied == pytest.approx(_reference("linear", 0, 1)) == [PEAK]


def test_resume_continues_the_reference_lr_sequence(tmp_path):
    """Killed after step 6 with a checkpoint at 4, resumed: steps 5-12 take the lrs of the
    uninterrupted run, which are transformers'."""
    schedule = ScheduleSection(decay="cosine", warmup_steps=3)
    whole, _ = _run_lrs(tmp_path / "whole", schedule, 12)
    first = _loop(tmp_path / "r", schedule, 12, crash_at=6, checkpoint_every=4)
    with pytest.raises(KeyboardInterrupt):
        first.run()
    again = _loop(tmp_path / "r", schedule, 12, checkpoint_every=4)
    assert again.engine.step == 4
    resumed: list[float] = []
    again.engine.optimizer.register_step_pre_hook(
        lambda o, args, kwargs: resumed.append(o.param_groups[0]["lr"]))
    again.run()
    assert resumed == whole[4:]
    assert whole == pytest.approx(_reference("cosine", 3, 12), rel=1e-12, abs=1e-18)


def test_a_warmup_longer_than_the_run_keeps_its_pace_and_never_drops(tmp_path):
    """warmup_steps 50 in a 5-step run: lr = peak x k / 50 (transformers' too), not a 5-step
    ramp to 8e-4 then 0 on the last step."""
    applied, _ = _run_lrs(tmp_path / "r", ScheduleSection(warmup_steps=50), 5)
    assert applied == pytest.approx([PEAK * k / 50 for k in range(5)], rel=1e-12, abs=1e-18)
    assert applied == pytest.approx(_reference("linear", 50, 5), rel=1e-12, abs=1e-18)
    applied, _ = _run_lrs(tmp_path / "f", ScheduleSection(warmup_fraction=1.0), 5)
    assert applied == pytest.approx([PEAK * k / 5 for k in range(5)], rel=1e-12, abs=1e-18)
    assert applied == pytest.approx(_reference("linear", 5, 5), rel=1e-12, abs=1e-18)


@pytest.mark.parametrize("decay", ["linear", "cosine", "polynomial", "wsd", "constant"])
def test_a_warmup_of_the_whole_run_ends_at_the_peak(decay):
    """At progress 1 a warm-up of the whole run (or longer) is at 1 / warmup of the peak, for
    every decay: it fell to min_ratio."""
    assert lr_factor(1.0, 1.0, decay, min_ratio=0.1) == 1.0
    assert lr_factor(1.0, 10.0, decay, min_ratio=0.1) == pytest.approx(0.1)
    assert lr_factor(0.5, 10.0, decay, min_ratio=0.1) == pytest.approx(0.05)
    sched = Schedule(peak_lr=2.0, decay=decay, warmup_steps=50, max_steps=5, min_lr_ratio=0.1)
    assert sched.lr(1.0, 5) == pytest.approx(2.0 * 5 / 50)


def test_the_warmup_note_says_what_the_lr_does():
    """It said the lr "reaches optim.lr only at step 50" while it ramped over the 5 steps."""
    train = TrainSection(max_steps=5)
    note = warmup_note(ScheduleSection(warmup_steps=50), train, 1e-3)
    assert note == ("schedule.warmup_steps 50 >= train.max_steps 5: the warm-up takes the whole "
                    "run, with no decay: the lr rises from 0 by 2e-05 per step (the peak lr "
                    "0.001 / 50 steps) and the last step runs at 8e-05, 8% of the peak")
    note = warmup_note(ScheduleSection(warmup_fraction=1.0), train, 1e-3)
    assert note is not None and note.startswith("schedule.warmup_fraction 1 (train.max_steps "
                                                 "5): the warm-up takes the whole run")
    assert note.endswith("the last step runs at 0.0008, 80% of the peak")
    assert warmup_note(ScheduleSection(warmup_steps=4), train, 1e-3) is None
    assert warmup_note(ScheduleSection(warmup_fraction=0.5), train, 1e-3) is None
    # A warm-up exactly as long as the run also takes the whole run (the last step at 80%).
    note = warmup_note(ScheduleSection(warmup_steps=5), train, 1e-3)
    assert note is not None and note.startswith("schedule.warmup_steps 5 >= train.max_steps 5")
    assert note.endswith("the last step runs at 0.0008, 80% of the peak")
    budget = TrainSection(max_steps=5, budget_hours=1.0)
    assert warmup_note(ScheduleSection(warmup_steps=50), budget, 1e-3) is None


def test_the_default_polynomial_decay_is_transformers(tmp_path):
    """decay_span after_warmup (the default): transformers' get_polynomial_decay_schedule_with_
    warmup, power 0.5 and an end lr of 0.1 x the peak, at every step of a run."""
    schedule = ScheduleSection(decay="polynomial", power=0.5, min_lr_ratio=0.1, warmup_steps=3)
    applied, _ = _run_lrs(tmp_path / "r", schedule, 12)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=PEAK)
    sched = transformers.get_polynomial_decay_schedule_with_warmup(opt, 3, 12, lr_end=0.1 * PEAK,
                                                                   power=0.5)
    ref = []
    for _ in range(12):
        ref.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert applied == pytest.approx(ref, rel=1e-12, abs=1e-18)


def test_a_whole_run_decay_reaches_the_optimizer(tmp_path):
    """schedule.decay_span whole_run through the loop: every step's lr is NVIDIA's
    PolyWarmUpScheduler's (the loop passes the span on to its Schedule)."""
    schedule = ScheduleSection(decay="polynomial", power=0.5, warmup_fraction=0.25,
                               decay_span="whole_run")
    applied, _ = _run_lrs(tmp_path / "r", schedule, 12)
    ref = [nvidia_poly_warmup_lr(PEAK, 0.25, 12, 0.5, k) for k in range(12)]
    assert applied == pytest.approx(ref, rel=1e-12, abs=1e-18)
    assert applied[3] == pytest.approx(PEAK * 0.75 ** 0.5)  # no step at the peak: down at once


def test_a_one_step_run_inside_its_warmup_says_it_trains_nothing():
    """`--train.max_steps 1` (or a fine-tuning run of one step) with any warm-up ran its one step
    at lr 0, silently."""
    one = TrainSection(max_steps=1)
    assert warmup_note(ScheduleSection(warmup_fraction=0.01), one, 1e-3) == (
        "schedule.warmup_fraction 0.01 with train.max_steps 1: step 1 runs at lr 0, where the "
        "warm-up starts: the run trains nothing; give it more steps (train.max_steps) or no "
        "warm-up (schedule.warmup_fraction 0)")
    assert warmup_note(ScheduleSection(warmup_steps=4), one, 1e-3) == (
        "schedule.warmup_steps 4 with train.max_steps 1: step 1 runs at lr 0, where the warm-up "
        "starts: the run trains nothing; give it more steps (train.max_steps) or no warm-up "
        "(schedule.warmup_steps 0)")
    budget = TrainSection(max_steps=1, budget_hours=1.0)
    assert "step 1 runs at lr 0" in warmup_note(ScheduleSection(warmup_steps=4), budget, 1e-3)
    assert warmup_note(ScheduleSection(warmup_fraction=0.1), one, 1e-3, FINETUNE) == (
        "warmup_fraction 0.1 with a run of 1 step: step 1 runs at lr 0, where the warm-up starts: "
        "the run trains nothing; give it more steps (more epochs, or a smaller "
        "global_batch_size) or no warm-up (warmup_fraction 0)")
    assert warmup_note(ScheduleSection(warmup_fraction=0.0), one, 1e-3) is None
    assert warmup_note(ScheduleSection(warmup_steps=0, warmup_fraction=0.5), one, 1e-3) is None
    assert warmup_note(ScheduleSection(warmup_fraction=0.5), TrainSection(max_steps=2),
                       1e-3) is None  # step 2 runs at 0.5 / 0.5 of the peak: it trains


# --- recipes: the batch NVIDIA's lr was tuned at -------------------------------------------------


@pytest.mark.parametrize(("name", "batch"), [("bert-base", 4096), ("bert-large", 8192)])
def test_phase1_recipes_scale_nvidias_lr_from_its_batch(name, batch):
    """NVIDIA's phase 1 runs 6e-3 at 65,536 sequences (8192 per GPU x 8); the recipes declared
    6e-3 as tuned at their own batch, so sqrt scaling started 4x / 2.8x too high."""
    cfg = schema.load_config(str(ROOT / "configs" / f"{name}.toml"), [])
    o = cfg.optim
    assert (o.lr, o.reference_batch_size, o.lr_scaling, cfg.train.global_batch_size) == (
        6e-3, 65536, "sqrt", batch)
    peak = schema.scaled_lr(o.lr, batch, o.reference_batch_size, o.lr_scaling)
    assert peak == pytest.approx(6e-3 * math.sqrt(batch / 65536))


# --- what a run writes and says ---------------------------------------------------------------

SMALL = ["--model.vocab_size", "100", "--model.hidden_size", "32",
         "--model.intermediate_size", "64", "--model.max_position_embeddings", "64",
         "--train.eval_every_steps", "0", "--train.eval_sequences", "8", "--impl.num_workers", "0",
         "--train.log_every_steps", "1", "--checkpoint.every_steps", "0"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return write_synthetic_shards(tmp_path_factory.mktemp("data") / "d", n_train=24, n_val=8,
                                  seq_len=32, vocab_size=100)


def test_config_toml_holds_the_device_compile_and_unpad_the_run_used(shards, tmp_path, capsys):
    """They stayed "auto"; the file still re-runs as a recipe on the same machine."""
    run = tmp_path / "r"
    batch = ["--train.global_batch_size", "8", "--impl.micro_batch_size", "4"]
    assert cli.main(["pretrain", TINY, "--data", str(shards), "--out", str(run), *SMALL, *batch,
                     "--train.max_steps", "1"]) == 0
    impl = read_toml(run / "config.toml")["impl"]
    assert (impl["device"], impl["compile"], impl["unpad"]) == ("cpu", False, False)
    assert re.search(r"compute +cpu, fp32, eager, padded batches\n", capsys.readouterr().out)
    again = tmp_path / "again"
    assert cli.main(["pretrain", str(run / "config.toml"), "--data", str(shards), "--out",
                     str(again), "--train.max_steps", "1"]) == 0
    assert read_toml(again / "config.toml")["impl"] == impl
    # the same command on its own run folder changes no setting
    capsys.readouterr()
    assert cli.main(["pretrain", TINY, "--data", str(shards), "--out", str(run), *SMALL, *batch,
                     "--train.max_steps", "2"]) == 0
    out = capsys.readouterr().out
    assert [x for x in out.splitlines() if "changed settings" in x] == [
        f"{run}: resuming at step 1 with changed settings: train.max_steps 2 (was 1) (the "
        "earlier config.toml is kept as config.step_1.toml)"]


def test_a_global_batch_larger_than_the_split_is_said(shards, tmp_path, capsys):
    """48 sequences a step from a 24-sequence split: each twice per step, said in one line."""
    assert cli.main(["pretrain", TINY, "--data", str(shards), "--out", str(tmp_path / "r"),
                     *SMALL, "--train.global_batch_size", "48", "--impl.micro_batch_size", "24",
                     "--train.max_steps", "1"]) == 0
    notes = [x for x in capsys.readouterr().err.splitlines() if "global_batch_size" in x]
    assert notes == [f"bertgpu pretrain: warning: train.global_batch_size 48 > the 24 train "
                     f"sequences of {shards}: each step holds every sequence about 2.0 times "
                     "(with other masks)"]
    loader = PretrainLoader(ShardSet(shards), MaskingConfig(), 24, 8)
    assert loader.repeats_note() is None  # a batch the split fills: nothing to say


def test_the_word_starts_note_reaches_the_start_up(shards, tmp_path, capsys, monkeypatch):
    """`PretrainData.whole_word_note` (its text is tested in test_tokenizer_probe_fixes.py) is
    what the run says at start-up, given the run's data.whole_word_masking."""
    from bertgpu.tasks.pretraining import PretrainData

    asked = []
    monkeypatch.setattr(PretrainData, "whole_word_note",
                        lambda self, whole: asked.append(whole) or "the word starts go unused")
    assert cli.main(["pretrain", TINY, "--data", str(shards), "--out", str(tmp_path / "r"),
                     *SMALL, "--train.max_steps", "1"]) == 0
    notes = [x for x in capsys.readouterr().err.splitlines() if "word starts" in x]
    assert notes == ["bertgpu pretrain: warning: the word starts go unused"] and asked == [False]


def test_the_warmup_warning_of_a_run(shards, tmp_path, capsys):
    assert cli.main(["pretrain", TINY, "--data", str(shards), "--out", str(tmp_path / "r"),
                     *SMALL, "--train.global_batch_size", "8", "--impl.micro_batch_size", "8",
                     "--train.max_steps", "2", "--schedule.warmup_steps", "4"]) == 0
    notes = [x for x in capsys.readouterr().err.splitlines() if "warmup" in x]
    assert notes == ["bertgpu pretrain: warning: schedule.warmup_steps 4 >= train.max_steps 2: "
                     "the warm-up takes the whole run, with no decay: the lr rises from 0 by "
                     "0.00025 per step (the peak lr 0.001 / 4 steps) and the last step runs at "
                     "0.00025, 25% of the peak"]


def test_a_one_step_pretraining_run_says_it_trains_nothing(shards, tmp_path, capsys):
    run = tmp_path / "r"
    assert cli.main(["pretrain", TINY, "--data", str(shards), "--out", str(run), *SMALL,
                     "--train.max_steps", "1"]) == 0
    notes = [x for x in capsys.readouterr().err.splitlines() if "warm" in x]
    assert notes == ["bertgpu pretrain: warning: schedule.warmup_fraction 0.06 with "
                     "train.max_steps 1: step 1 runs at lr 0, where the warm-up starts: the run "
                     "trains nothing; give it more steps (train.max_steps) or no warm-up "
                     "(schedule.warmup_fraction 0)"]
    assert [r["lr"] for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"] == [0]


def test_a_one_step_finetuning_run_says_it_trains_nothing(tmp_path, capsys):
    """`finetune sst2 --epochs 1` on a set of one batch: one step at lr 0, an output identical to
    its init, and no word of it. Fine-tuning now gives pretraining's start-up warnings."""
    import _tiny_init
    from test_finetune import VOCAB, sst2_fixture

    init = _tiny_init.tiny_init(tmp_path, VOCAB)
    sst2_fixture(tmp_path / "SST-2", n_train=8, n_dev=4)
    assert cli.main(["finetune", "sst2", "--data", str(tmp_path / "SST-2"), "--init", str(init),
                     "--out", str(tmp_path / "ft"), "--epochs", "1", "--global_batch_size", "8",
                     "--max_seq_len", "32"]) == 0
    captured = capsys.readouterr()
    assert re.search(r"steps +1 \(1 epochs x 1\)", captured.out)
    notes = [x for x in captured.err.splitlines() if "warm" in x]
    assert notes == ["bertgpu finetune: warning: warmup_fraction 0.1 with a run of 1 step: step 1 "
                     "runs at lr 0, where the warm-up starts: the run trains nothing; give it "
                     "more steps (more epochs, or a smaller global_batch_size) or no warm-up "
                     "(warmup_fraction 0)"]


def test_a_resume_that_changes_the_decay_span_says_so(shards, tmp_path, capsys):
    """schedule.decay_span is a schedule setting like the others: config.toml holds it, and a
    resume that changes it names it and keeps the earlier config.toml."""
    run = tmp_path / "r"
    base = ["pretrain", TINY, "--data", str(shards), "--out", str(run), *SMALL,
            "--schedule.decay", "polynomial", "--schedule.power", "0.5"]
    assert cli.main([*base, "--train.max_steps", "2"]) == 0
    assert read_toml(run / "config.toml")["schedule"]["decay_span"] == "after_warmup"
    capsys.readouterr()
    assert cli.main([*base, "--train.max_steps", "3", "--schedule.decay_span", "whole_run"]) == 0
    out = capsys.readouterr().out
    assert [x for x in out.splitlines() if "changed settings" in x] == [
        f"{run}: resuming at step 2 with changed settings: schedule.decay_span whole_run (was "
        "after_warmup), train.max_steps 3 (was 2) (the earlier config.toml is kept as "
        "config.step_2.toml)"]
    assert read_toml(run / "config.toml")["schedule"]["decay_span"] == "whole_run"
    assert read_toml(run / "config.step_2.toml")["schedule"]["decay_span"] == "after_warmup"

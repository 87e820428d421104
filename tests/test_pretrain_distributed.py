"""`bertgpu pretrain --nproc 2` end to end on CPU (gloo): DP=2 equals DP=1 with accumulation 2,
resuming a world-size-2 checkpoint at world size 1, a collective budget stop; and the
[distributed] config section, every parameter getting a gradient, the comm timer."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
from _e2e import bertgpu_here
from _shards import write_synthetic_shards
from safetensors.torch import load_file

from bertgpu import pretrain
from bertgpu.cli import main
from bertgpu.config import schema
from bertgpu.config.render import dump_toml
from bertgpu.errors import BertgpuError
from bertgpu.telemetry.records import read_metrics
from bertgpu.train import distributed
from bertgpu.train.distributed import DistInfo

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "configs" / "tiny.toml")


def _overrides(data: Path, out: Path, *extra: str) -> list[str]:
    # Dropout 0 and a constant lr without warm-up: the runs below differ only in how the global
    # batch is spread over ranks and micro batches (and the lr does not depend on max_steps).
    return [
        "--data", str(data), "--out", str(out),
        "--model.vocab_size", "100", "--model.hidden_size", "32", "--model.intermediate_size", "64",
        "--model.max_position_embeddings", "64",
        "--model.hidden_dropout_prob", "0", "--model.attention_probs_dropout_prob", "0",
        "--train.global_batch_size", "8", "--impl.micro_batch_size", "4",
        "--train.log_every_steps", "1", "--train.eval_every_steps", "0",
        "--train.eval_sequences", "8", "--schedule.decay", "constant",
        "--schedule.warmup_steps", "0",
        "--impl.num_workers", "0", "--checkpoint.keep_last", "0", *extra,
    ]


def _cli(*args: str) -> subprocess.CompletedProcess:
    """`bertgpu ARGS` run by this process (`--nproc 2`: its launcher and workers are processes of
    their own), with WORLD_SIZE unset: _e2e.bertgpu_here."""
    return bertgpu_here(list(args))


def _train_records(run: Path) -> dict[int, dict]:
    return {r["step"]: r for r in read_metrics(run / "metrics.jsonl", drop_superseded=True)
            if r["kind"] == "train"}


def _assert_close_weights(a: Path, b: Path) -> None:
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-5, atol=2e-6, msg=k)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return write_synthetic_shards(tmp_path_factory.mktemp("data") / "d", n_train=96, n_val=16,
                                  seq_len=32, vocab_size=100)


@pytest.mark.timeout(240)
def test_nproc2_equals_one_process_with_accumulation_and_resumes_at_world_size_1(shards, tmp_path):
    # Reference: 1 process, accumulation 2, 6 steps, checkpoints at 3 and 6 (in-process).
    ref = tmp_path / "ref"
    assert main(["pretrain", TINY, *_overrides(shards, ref, "--train.max_steps", "6",
                                               "--checkpoint.every_steps", "3")]) == 0

    # `--nproc 2`: two gloo workers under the elastic launcher, accumulation 1, 3 steps.
    dp = tmp_path / "dp"
    proc = _cli("pretrain", TINY, "--nproc", "2", *_overrides(shards, dp, "--train.max_steps", "3",
                                                             "--checkpoint.every_steps", "3"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert ("accumulation steps             1" in proc.stdout
            and "devices                        2" in proc.stdout)
    state = torch.load(dp / "checkpoints" / "step_3" / "train_state.pt", weights_only=True)
    assert state["world_size"] == 2 and len(state["rng"]) == 2

    ref_steps, dp_steps = _train_records(ref), _train_records(dp)
    assert sorted(dp_steps) == [1, 2, 3]
    for s in (1, 2, 3):
        assert dp_steps[s]["loss"] == pytest.approx(ref_steps[s]["loss"], rel=1e-5)
        assert dp_steps[s]["grad_norm"] == pytest.approx(ref_steps[s]["grad_norm"], rel=1e-4)
        assert 0.0 <= dp_steps[s]["comm_share"] <= 1.0 and "comm_share" not in ref_steps[s]
    _assert_close_weights(dp / "checkpoints" / "step_3", ref / "checkpoints" / "step_3")
    end = [r for r in read_metrics(dp / "metrics.jsonl")
           if r["kind"] == "info" and r.get("event") == "end"]
    assert end[-1]["rank_step_min"] == end[-1]["rank_step_max"] == 3 and end[-1]["world_size"] == 2

    # Resume the world-size-2 run on 1 process: it continues with exactly the next samples.
    assert main(["pretrain", TINY, *_overrides(shards, dp, "--train.max_steps", "6",
                                               "--checkpoint.every_steps", "3")]) == 0
    dp_steps = _train_records(dp)
    assert sorted(dp_steps) == [1, 2, 3, 4, 5, 6]
    for s in (4, 5, 6):
        assert dp_steps[s]["loss"] == pytest.approx(ref_steps[s]["loss"], rel=1e-5)
    _assert_close_weights(dp / "checkpoints" / "step_6", ref / "checkpoints" / "step_6")
    _assert_close_weights(dp / "hf", ref / "hf")


@pytest.mark.timeout(180)
def test_budget_stop_on_two_ranks_is_collective(shards, tmp_path):
    run = tmp_path / "budget"
    proc = _cli("pretrain", TINY, "--nproc", "2",
                *_overrides(shards, run, "--train.max_steps", "0", "--train.budget_hours", "0.0003",
                            "--schedule.warmup_steps", "none", "--checkpoint.every_steps", "0"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    records = read_metrics(run / "metrics.jsonl")
    last_train = max(r["step"] for r in records if r["kind"] == "train")
    end = [r for r in records if r["kind"] == "info" and r.get("event") == "end"][-1]
    # Both ranks stopped at the same step (the min and max over ranks), the one rank 0 logged last.
    assert end["reason"] == "budget" and end["rank_step_min"] == end["rank_step_max"] == last_train
    ckpts = sorted((run / "checkpoints").glob("step_*"))
    assert [p.name for p in ckpts] == [f"step_{last_train}"]
    state = torch.load(ckpts[0] / "train_state.pt", weights_only=True)
    assert state["step"] == last_train and len(state["rng"]) == 2
    assert state["budget"]["elapsed_s"] >= 0.0003 * 3600
    assert (run / "hf" / "model.safetensors").exists()


@pytest.mark.timeout(180)
def test_fsdp_logs_no_straggler_fields(shards, tmp_path):
    # Under fsdp each rank's compute time includes its waits for the others (every layer's
    # all-gather): the fields read about 1.00x whatever the speeds, so they are left out.
    run = tmp_path / "fsdp"
    proc = _cli("pretrain", TINY, "--nproc", "2", "--distributed.strategy", "fsdp",
                *_overrides(shards, run, "--train.max_steps", "2", "--checkpoint.every_steps", "0"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    train = list(_train_records(run).values())
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        assert not {"slowest_rank", "slowest_vs_median", "rank_compute_s"} & set(r), r


@pytest.mark.timeout(60)
def test_nproc_is_validated_before_launching(shards, tmp_path, capsys):
    # 8 sequences cannot be split over 3 workers with micro batch 4: one error, no workers started.
    rc = main(["pretrain", TINY, "--nproc", "3",
               *_overrides(shards, tmp_path / "x", "--train.max_steps", "1")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "divisible" in err and "3 devices" in err, err
    rc = main(["pretrain", TINY, "--nproc", "zero",
               *_overrides(shards, tmp_path / "x", "--train.max_steps", "1")])
    assert rc == 2 and "--nproc" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


@pytest.mark.timeout(60)
def test_a_batch_two_devices_do_not_divide_takes_one_fix(shards, tmp_path, capsys, monkeypatch):
    # The probe: global 33 with micro 32 on 2 devices said "a multiple of impl.micro_batch_size
    # (32)", and 32 then said "... 32 x 2 devices = 64". The first message names 64 now, before
    # the launcher starts (--nproc 2) and in a worker (its WORLD_SIZE) alike.
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    for batch in ("33", "32"):
        rc = main(["pretrain", TINY, "--nproc", "2",
                   *_overrides(shards, tmp_path / "x", "--train.max_steps", "1",
                               "--train.global_batch_size", batch,
                               "--impl.micro_batch_size", "32")])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and len(err.splitlines()) == 1, err
        assert "impl.micro_batch_size 32 × 2 devices = 64" in err and "multiple of 64" in err, err
    monkeypatch.setenv("WORLD_SIZE", "2")  # a worker under torchrun
    rc = main(["pretrain", TINY, *_overrides(shards, tmp_path / "x", "--train.max_steps", "1",
                                             "--train.global_batch_size", "32",
                                             "--impl.micro_batch_size", "32")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "32 × 2 devices = 64" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "x").exists()


def test_nproc_strips_itself_and_children_do_not_relaunch(shards, tmp_path, monkeypatch):
    from bertgpu.train import launcher

    calls: list = []
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(launcher, "launch_local",
                        lambda n, argv, **kw: calls.append((n, argv)) or 0)
    args = _overrides(shards, tmp_path / "r", "--train.max_steps", "1")
    assert main(["pretrain", TINY, "--nproc", "2", *args]) == 0
    # --nproc is gone; everything else passes through (--data/--out as their --key=value form).
    assert len(calls) == 1 and calls[0][0] == 2
    child = calls[0][1]
    assert child[:2] == ["pretrain", TINY] and "--nproc" not in child
    from bertgpu.config.schema import load_config

    assert load_config(TINY, child[2:]) == load_config(TINY, args)
    # A child (WORLD_SIZE set by the launcher) trains instead of launching again.
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(pretrain, "run",
                        lambda cfg, **kw: calls.append("ran") or pretrain.RunResult(Path("."), 1))
    assert main(["pretrain", TINY, "--nproc", "2", *args]) == 0
    assert calls[1:] == ["ran"]


def test_distributed_config_section(tmp_path):
    cfg = schema.load_config(None,
                             ["--distributed.bucket_cap_mb", "50",
                              "--distributed.comm_hook", "bf16",
                              "--distributed.gradient_as_bucket_view", "false",
                              "--train.max_steps", "1"])
    assert (cfg.distributed.bucket_cap_mb, cfg.distributed.comm_hook) == (50, "bf16")
    assert cfg.distributed.gradient_as_bucket_view is False and cfg.distributed.measure_comm is True
    path = tmp_path / "c.toml"
    path.write_text(dump_toml(cfg))
    assert schema.load_config(path).distributed == cfg.distributed
    for bad, key in ((["--distributed.comm_hook", "zip"], "distributed.comm_hook"),
                     (["--distributed.bucket_cap_mb", "0"], "distributed.bucket_cap_mb")):
        with pytest.raises(BertgpuError, match=key):
            schema.load_config(None, bad)


@pytest.mark.parametrize("objective", ["mlm", "mlm+nsp"])
def test_every_trainable_parameter_gets_a_gradient(tmp_path, objective):
    data = write_synthetic_shards(tmp_path / "d", n_train=32, n_val=8, seq_len=32, vocab_size=100,
                                  objective=objective)
    cfg = schema.load_config(TINY, _overrides(data, tmp_path / "r", "--train.max_steps", "2"))
    trainer = pretrain.build(cfg, DistInfo())
    assert trainer.task.with_nsp == (objective == "mlm+nsp")
    named = {p: n for n, p in trainer.model.named_parameters() if p.requires_grad}
    in_optimizer = {p for g in trainer.engine.optimizer.param_groups for p in g["params"]}
    assert set(named) == in_optimizer  # every trainable parameter is updated
    seen: dict[str, bool] = {}

    def record(optimizer, args, kwargs):  # runs inside engine.train_step, before the update
        for p in in_optimizer:
            seen[named[p]] = p.grad is not None and bool(p.grad.abs().sum() > 0)

    trainer.engine.optimizer.register_step_pre_hook(record)
    res = trainer.engine.train_step(trainer.task.micro_batches(0), trainer.task.loss,
                                    trainer.task.counts)
    assert not res.skipped and seen and all(seen.values()), [n for n, ok in seen.items() if not ok]
    assert any("seq_relationship" in n for n in seen) == (objective == "mlm+nsp")


def test_comm_timer_measures_the_exposed_tail():
    timer = distributed.CommTimer(torch.device("cpu"))
    timer._ready, timer._done = [1.0, 2.0, 3.0], [2.5, 3.5, 3.25]
    assert timer.pop_step() == pytest.approx(0.5)  # last done 3.5 - last ready 3.0
    assert timer.pop_step() == 0.0  # a no_sync step (no hook call) adds nothing
    assert timer._ready == [] and timer._done == []

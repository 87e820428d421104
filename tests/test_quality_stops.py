"""Stops and re-runs of the fine-tuning step of `bertgpu bench quality` and stage 5 of `bertgpu
demo` (bench/downstream.py): a stop signal ends either command with one line and 128 + the
signal, and a re-run keeps the seeds that finished from the same init weights and settings while
redoing anything else. finetune_examples is replaced by a double that behaves as it does (a
finished run writes OUT/results.json, a stopped one leaves OUT.tmp and returns
{"preempted": True, ...}); one check runs the real thing."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from bertgpu.cli import main as cli_main

pytest.importorskip("gensim", reason="the demo's sets are gensim's test data")

SIGNALS = [(signal.SIGTERM, 143), (signal.SIGINT, 130)]


def _export(folder: Path, weights: bytes = b"weights-1") -> Path:
    """A stand-in HF export: what compare_downstream reads of it is its files' bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text('{"hidden_size": 32}\n', encoding="utf-8")
    (folder / "vocab.txt").write_text("[PAD]\n[UNK]\n", encoding="utf-8")
    (folder / "model.safetensors").write_bytes(weights)
    return folder


class FakeFinetune:
    """finetune_examples as it behaves, counting its runs: (init label, set, seed) per call."""

    def __init__(self, stop_seed: int | None = None, status: int = 143) -> None:
        self.calls: list[tuple[str, str, int]] = []
        self.stop_seed, self.status = stop_seed, status
        self.tmp_seen: list[bool] = []  # whether OUT.tmp was there when the run began

    def __call__(self, task, train, dev, init, out, *, config_from=None, name=None,
                 overrides=()):
        from bertgpu.fsutil import make_scratch

        out = Path(out)
        seed = int(overrides[list(overrides).index("--seed") + 1])
        self.calls.append((out.parent.parent.name, name, seed))
        work = out.with_name(out.name + ".tmp")
        self.tmp_seen.append(work.exists())
        if seed == self.stop_seed:
            if not work.exists():
                make_scratch(work, out)
            return {"preempted": True, "step": 25, "exit_status": self.status}
        out.mkdir(parents=True)
        (out / "results.json").write_text(json.dumps({
            "task": name, "init": str(init), "config_from": str(config_from) if config_from
            else None, "config": {"seed": seed}, "score": 70.0 + seed,
            "metrics": {"dev": {"accuracy": 70.0 + seed}}}), encoding="utf-8")
        return {"score": 70.0 + seed}


# --- a stop ends the command with one line and 128 + the signal ----------------------------------


def _bench_until_finetuning(monkeypatch, tmp_path: Path) -> None:
    """bench quality's tokenizer, shards and pretraining as done (they have their own tests)."""
    from bertgpu.bench import quality

    hf = _export(tmp_path / "runs" / "tiny" / "hf")
    monkeypatch.setattr(quality, "shared_data", lambda args, out, vocab: tmp_path / "data")
    monkeypatch.setattr(quality, "pretrain_all", lambda *a, **k: [
        {"kind": "pretrain", "name": "tiny", "run_dir": str(hf.parent)}])


@pytest.mark.parametrize(("signum", "status"), SIGNALS)
def test_a_stop_while_finetuning_ends_bench_quality_with_one_line(tmp_path, capsys, monkeypatch,
                                                                  signum, status):
    """It ended as "results.json: unreadable; did the fine-tuning run fail?", exit status 2."""
    from bertgpu import finetune

    _bench_until_finetuning(monkeypatch, tmp_path)
    monkeypatch.setattr(finetune, "finetune_examples", FakeFinetune(stop_seed=1, status=status))
    out = tmp_path / "out"
    assert cli_main(["bench", "quality", "--sets", "polarity", "--seeds", "0", "1",
                     "--out", str(out)]) == status
    err = capsys.readouterr().err
    work = out / "finetune" / "tiny" / "pretrained" / "polarity" / "seed_1.tmp"
    assert err.startswith(f"bertgpu bench quality: stopped by {signum.name} in the fine-tuning "
                          f"tiny/pretrained/polarity/seed_1 at step 25, in {work}; run the same "
                          "command again to go on")
    assert err.count("\n") == 1 and err.endswith("\n")
    assert not (out / "quality.jsonl").exists() and not (out / "quality.md").exists()


def test_a_stop_in_a_glue_run_ends_bench_quality_with_one_line(tmp_path, capsys, monkeypatch):
    """glue.run returns finetune's {"preempted": ...}: it was a KeyError ('tasks') traceback."""
    from bertgpu import glue

    _bench_until_finetuning(monkeypatch, tmp_path)
    monkeypatch.setattr(glue, "run", lambda *a, **k: {"preempted": True, "step": 7,
                                                        "exit_status": 130})
    out = tmp_path / "out"
    glue_dir = Path(__file__).parent / "fixtures" / "glue"  # checked before any work
    assert cli_main(["bench", "quality", "--glue", str(glue_dir), "--seeds", "0",
                     "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert err.startswith("bertgpu bench quality: stopped by SIGINT in the fine-tuning "
                          f"tiny/pretrained/glue at step 7, in {out / 'finetune' / 'tiny'}")
    assert err.count("\n") == 1


def test_the_demo_names_its_stage_for_a_stop_from_the_typed_exception(tmp_path, capsys,
                                                                       monkeypatch):
    """The stop reaches the demo as RunStopped, not through records it had to find: a stopped
    run that wrote no metrics.jsonl (stopped before its logger began) was an error, exit 2."""
    from bertgpu import demo, finetune, pretrain

    hf = _export(tmp_path / "hf")
    monkeypatch.setattr(demo, "_tokenizer_and_shards", lambda *a, **k: None)
    monkeypatch.setattr(pretrain, "run", lambda cfg: pretrain.RunResult(
        Path(cfg.out), 3, export_dir=hf))
    monkeypatch.setattr(demo, "_pretraining_table", lambda run_dir: "")
    monkeypatch.setattr(demo, "fill_mask", lambda hf_dir, sentences: [])
    monkeypatch.setattr(finetune, "finetune_examples", FakeFinetune(stop_seed=0, status=130))
    out = tmp_path / "demo"
    assert cli_main(["demo", "--out", str(out), "--seeds", "0"]) == 130
    work = out / "finetune" / "modern-tiny" / "pretrained" / "polarity" / "seed_0.tmp"
    assert capsys.readouterr().err == (
        "bertgpu demo: stopped by SIGINT in stage 5 (bertgpu finetune: the fine-tuning "
        f"modern-tiny/pretrained/polarity/seed_0 at step 25, in {work}); run the same bertgpu "
        "demo command again to resume: the stages done are kept\n")


# --- a re-run keeps what finished the same way, and redoes the rest ------------------------------


def _compare(monkeypatch, hf: Path, out: Path, fake: FakeFinetune, seeds=(0, 1),
             extra: list[str] | None = None) -> list[dict]:
    from bertgpu import finetune
    from bertgpu.bench.downstream import compare_downstream

    monkeypatch.setattr(finetune, "finetune_examples", fake)
    return compare_downstream({"tiny": hf}, ["polarity"], list(seeds), out, extra)


def test_a_finished_seed_of_the_same_run_is_kept(tmp_path, capsys, monkeypatch):
    """Each re-run redid every finished seed (shutil.rmtree of each run folder)."""
    hf, out = _export(tmp_path / "hf"), tmp_path / "ft"
    first = _compare(monkeypatch, hf, out, FakeFinetune())
    capsys.readouterr()
    again = FakeFinetune()
    rows = _compare(monkeypatch, hf, out, again)
    assert again.calls == []
    assert [r["scores"] for r in rows] == [r["scores"] for r in first] == [[70.0, 71.0]] * 2
    printed = capsys.readouterr().out
    assert printed.count("kept seed_0: finished before") == 2  # pretrained and its random twin
    assert printed.count("kept seed_1: finished before") == 2


def test_a_changed_init_export_redoes_the_runs_made_from_its_weights(tmp_path, monkeypatch):
    """Pretraining went further: the export's path is the same, its weights are not. The
    pretrained runs are redone; the random twin reads only its shape and tokenizer: kept."""
    hf, out = _export(tmp_path / "hf"), tmp_path / "ft"
    _compare(monkeypatch, hf, out, FakeFinetune())
    _export(hf, weights=b"weights-2")
    again = FakeFinetune()
    _compare(monkeypatch, hf, out, again)
    assert sorted(again.calls) == [("pretrained", "polarity", 0), ("pretrained", "polarity", 1)]


def test_changed_overrides_redo_the_runs_and_the_same_ones_keep_them(tmp_path, monkeypatch):
    hf, out = _export(tmp_path / "hf"), tmp_path / "ft"
    _compare(monkeypatch, hf, out, FakeFinetune(), extra=["--epochs", "1"])
    changed = FakeFinetune()
    _compare(monkeypatch, hf, out, changed, extra=["--epochs", "2"])
    assert len(changed.calls) == 4  # 2 inits x 2 seeds
    same = FakeFinetune()
    _compare(monkeypatch, hf, out, same, extra=["--epochs", "2"])
    assert same.calls == []


def test_a_results_json_without_its_record_is_redone(tmp_path, monkeypatch):
    """A finished run this code did not start (no OUT.run.json beside it): in doubt, redone."""
    hf, out = _export(tmp_path / "hf"), tmp_path / "ft"
    _compare(monkeypatch, hf, out, FakeFinetune(), seeds=(0,))
    (out / "tiny" / "pretrained" / "polarity" / "seed_0.run.json").unlink()
    again = FakeFinetune()
    _compare(monkeypatch, hf, out, again, seeds=(0,))
    assert again.calls == [("pretrained", "polarity", 0)]


def test_a_stopped_run_resumes_only_into_the_same_weights(tmp_path, monkeypatch):
    """finetune resumes OUT.tmp when its own identity matches, which names an export by its
    path: a stopped run from older weights was resumed into a run reported as the new export's."""
    from bertgpu.bench.downstream import RunStopped

    hf, out = _export(tmp_path / "hf"), tmp_path / "ft"
    with pytest.raises(RunStopped):
        _compare(monkeypatch, hf, out, FakeFinetune(stop_seed=0), seeds=(0,))
    same = FakeFinetune()
    _compare(monkeypatch, hf, out, same, seeds=(0,))  # the same weights: resumed
    assert same.tmp_seen[0] is True

    with pytest.raises(RunStopped):  # stopped again, then pretraining went further
        _compare(monkeypatch, hf, out / "b", FakeFinetune(stop_seed=0), seeds=(0,))
    _export(hf, weights=b"weights-2")
    other = FakeFinetune()
    _compare(monkeypatch, hf, out / "b", other, seeds=(0,))
    assert other.tmp_seen[0] is False  # started over


def test_the_real_finetuning_is_kept_on_a_rerun(tmp_path, monkeypatch, capsys, one_thread):
    """The real finetune_examples: what it records in results.json is what the re-run checks,
    so a finished seed is kept (a double that wrote other fields would hide a mismatch)."""
    from _tiny_init import SPECIAL, tiny_init

    from bertgpu import finetune
    from bertgpu.bench.downstream import compare_downstream
    from bertgpu.tasks.demo_sets import demo_tasks

    train, dev, _ = demo_tasks(0)["polarity"]
    words = sorted({w for e in train + dev for w in e.text_a.lower().split()})[:300]
    hf = tiny_init(tmp_path, SPECIAL + words)
    extra = ["--epochs", "1", "--max_seq_len", "16", "--global_batch_size", "80",
             "--device", "cpu"]
    first = compare_downstream({"tiny": hf}, ["polarity"], [0], tmp_path / "ft", extra)

    def not_again(*a, **k):
        raise AssertionError("a finished seed was fine-tuned again")

    monkeypatch.setattr(finetune, "finetune_examples", not_again)
    capsys.readouterr()
    rows = compare_downstream({"tiny": hf}, ["polarity"], [0], tmp_path / "ft", extra)
    assert [r["scores"] for r in rows] == [r["scores"] for r in first]
    assert capsys.readouterr().out.count("kept seed_0: finished before") == 2

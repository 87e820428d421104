"""What a probe of pretraining features in combination found (the FSDP optimizer state for
`--resume-optimizer` is tested in test_fsdp_e2e.py, beside its sharded reference runs):

1. `--out` inside the shard set's tokenizer/ copied that folder into itself until Python's
   recursion limit (a 2,500-line traceback), and left a tree 250 levels deep that broke every
   later run on the set; `--out` beside the shards was accepted, and the next `prepare
   --overwrite` of the set deleted the run without a word. A run inside an input is refused in
   one line, and `prepare --overwrite` refuses a shard set holding what it did not write.
2. A ModernBERT trained with FSDP exported `"architectures": ["FSDPModernBertForMaskedLM"]`
   (FSDP2 swaps in a subclass of that name).
3. `--init` from an NSP run into an MLM-only one dropped the pooler and the NSP head unlisted
   (the weights it initialised fresh were listed, the ones it left out not).
4. wsd in a run shorter than 1 / decay_fraction steps never decayed, without a word.
5. Shards of another objective named no way on; ModernBERT on NSP shards said "MLM-only data,
   objective mlm" was needed when `--train.with_nsp false` trains on them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _shards import write_synthetic_shards
from _text_fixtures import pydoc_documents, train_small_tokenizer, write_sentences
from test_pretrain import _args  # the tiny run's flags

from bertgpu import pretrain
from bertgpu.cli import main
from bertgpu.config import schema
from bertgpu.data.prepare import prepare
from bertgpu.errors import BertgpuError
from bertgpu.train.distributed import DistInfo

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "configs" / "tiny.toml")

pytestmark = pytest.mark.usefixtures("one_thread")


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err[-3000:]
    lines = err.strip().splitlines()
    assert lines and lines[-1].startswith("bertgpu pretrain: error: "), err[-3000:]
    return lines[-1]


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("inside", ["tokenizer/run", "run"])
def test_a_run_inside_its_shard_set_is_refused_and_the_set_left_alone(tmp_path, capsys, inside):
    data = write_synthetic_shards(tmp_path / "d", n_train=16, n_val=8, seq_len=32, vocab_size=100)
    before = _tree(data)
    assert main(_args(data, data / inside, "--train.max_steps", "1")) == 2
    line = _error(capsys)
    assert f"{data / inside}: lies inside {data} (--data), which the run reads" in line, line
    assert _tree(data) == before and not (data / inside).exists()


def test_a_run_inside_its_init_is_refused(tmp_path, capsys):
    data = write_synthetic_shards(tmp_path / "d", n_train=16, n_val=8, seq_len=32, vocab_size=100)
    assert main(_args(data, tmp_path / "a", "--train.max_steps", "1")) == 0
    capsys.readouterr()
    before = _tree(tmp_path / "a")
    assert main(_args(data, tmp_path / "a" / "b", "--train.max_steps", "1",
                      "--init", str(tmp_path / "a"))) == 2
    line = _error(capsys)
    assert f"{tmp_path / 'a' / 'b'}: lies inside {tmp_path / 'a'} (--init)" in line, line
    assert _tree(tmp_path / "a") == before


def test_prepare_overwrite_keeps_a_folder_it_did_not_write(tmp_path):
    tok = train_small_tokenizer(tmp_path / "tok", vocab_size=500)
    corpus = write_sentences(tmp_path / "c.txt", pydoc_documents(limit=6))
    out = tmp_path / "data"
    prepare([corpus], tok, out, workers=1, seq_len=64)
    (out / "run_in" / "checkpoints").mkdir(parents=True)
    (out / "run_in" / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(BertgpuError, match=r"a shard set that also holds run_in/, which prepare "
                                           r"did not write; replacing the set would delete it"):
        prepare([corpus], tok, out, workers=1, seq_len=32, overwrite=True)
    assert (out / "run_in" / "metrics.jsonl").read_text() == "{}\n"
    assert json.loads((out / "manifest.json").read_text())["seq_len"] == 64
    (out / "run_in" / "metrics.jsonl").unlink()
    (out / "run_in" / "checkpoints").rmdir()
    (out / "run_in").rmdir()
    prepare([corpus], tok, out, workers=1, seq_len=32, overwrite=True)  # its own files only
    assert json.loads((out / "manifest.json").read_text())["seq_len"] == 32


def test_an_fsdp_sharded_modernbert_exports_its_own_class_name():
    from torch.distributed.fsdp import FSDPModule

    from bertgpu.models import build
    from bertgpu.models.hf_export import hf_config

    fields = build.spec("modernbert").pretraining_config()
    model = build.build_model({**vars(fields), "vocab_size": 100, "hidden_size": 32,
                               "intermediate_size": 64, "num_hidden_layers": 1,
                               "num_attention_heads": 2}, "pretraining")
    own = type(model).__name__
    # what fully_shard does to the class (torch/distributed/fsdp/_fully_shard: FSDP<name>)
    model.__class__ = type(f"FSDP{own}", (FSDPModule, type(model)), {})
    assert hf_config(model)["architectures"] == ["ModernBertForMaskedLM"] == [own]


def test_init_lists_the_weights_it_leaves_out(tmp_path):
    nsp = write_synthetic_shards(tmp_path / "nsp", n_train=16, n_val=8, seq_len=32,
                                 vocab_size=100, objective="mlm+nsp")
    assert main(_args(nsp, tmp_path / "phase1", "--train.max_steps", "1")) == 0
    mlm = write_synthetic_shards(tmp_path / "mlm", n_train=16, n_val=8, seq_len=32,
                                 vocab_size=100)
    words = _args(mlm, tmp_path / "r", "--init", str(tmp_path / "phase1"))[2:]
    loop = pretrain.build(schema.load_config(TINY, words), DistInfo())
    rows = dict(loop.startup_rows)
    loop.task.close()
    assert rows["init: not used"] == (
        "4 weights this model has no place for: bert.pooler.dense.bias, bert.pooler.dense.weight, "
        "cls.seq_relationship.bias, cls.seq_relationship.weight")
    assert "init: initialised fresh" not in rows


def test_wsd_that_never_decays_is_said():
    from bertgpu.config.sections import ScheduleSection, TrainSection
    from bertgpu.train.schedule import Schedule, warmup_note

    wsd = ScheduleSection(decay="wsd", warmup_fraction=0.0)
    lrs = [Schedule(1.0, "wsd", max_steps=5).lr(k / 5, k) for k in range(5)]
    assert lrs == [1.0] * 5  # the decay of the last 10% of 5 steps falls after the last step
    note = warmup_note(wsd, TrainSection(max_steps=5), 1e-3)
    assert note is not None and note.startswith(
        "schedule.decay wsd with decay_fraction 0.1 and train.max_steps 5: the decay starts "
        "after the last step"), note
    assert "a larger schedule.decay_fraction" in note
    assert warmup_note(wsd, TrainSection(max_steps=11), 1e-3) is None  # step 10 decays
    assert Schedule(1.0, "wsd", max_steps=11).lr(10 / 11, 10) < 1.0
    assert warmup_note(ScheduleSection(decay="linear"), TrainSection(max_steps=5), 1e-3) is None


def test_shards_of_another_objective_name_the_ways_on(tmp_path, capsys):
    nsp = write_synthetic_shards(tmp_path / "nsp", n_train=16, n_val=8, seq_len=32,
                                 vocab_size=100, objective="mlm+nsp")
    assert main(_args(nsp, tmp_path / "r", "--data.objective", "mlm")) == 2
    line = _error(capsys)
    assert ("objective is 'mlm+nsp' but the config asks for data.objective 'mlm'; expected shards "
            "prepared with --objective mlm, or --data.objective none to train on these (with "
            "--train.with_nsp false, MLM alone on its sentence pairs)") in line, line
    modern = str(ROOT / "configs" / "modern-tiny.toml")
    small = ["--model.vocab_size", "100", "--model.max_position_embeddings", "64",
             "--train.max_steps", "1", "--train.global_batch_size", "8",
             "--impl.micro_batch_size", "8", "--train.eval_sequences", "8"]
    argv = ["pretrain", modern, "--data", str(nsp), "--out", str(tmp_path / "m"), *small,
            "--data.objective", "none"]
    assert main(argv) == 2
    line = _error(capsys)
    assert "MLM-only data" not in line and "expected --train.with_nsp false" in line, line
    assert main([*argv, "--train.with_nsp", "false"]) == 0  # the way it names trains

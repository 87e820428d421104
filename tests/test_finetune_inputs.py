"""`bertgpu finetune` on inputs that do not fit: sequences longer than the model's positions,
SQuAD v2.0 files given to squad, malformed GLUE rows, label names and heads of another task,
batch settings that do not divide, and an evaluation cut short by a stop signal.

Each error is one line naming the file or flag, raised before any training, and leaves no
OUT.tmp behind; each repair is checked end to end on the tiny random BERT of tests/_tiny_init.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import warnings
from pathlib import Path

import _tiny_init
import pytest
import torch
from _tiny_init import SPECIAL

from bertgpu.config.finetune import load_finetune_config
from bertgpu.errors import BertgpuError
from bertgpu.finetune import finetune

FIX = Path(__file__).parent / "fixtures"
GLUE = FIX / "glue"
SQUAD_V1 = FIX / "squad" / "dev-v1.1-sample.json"
SQUAD_V2 = FIX / "squad" / "dev-v2.0-sample.json"
VOCAB = SPECIAL + "the of a is in what who and to , . ? good bad".split()
QUICK = ["--epochs", "1", "--lr", "1e-3", "--global_batch_size", "4"]

pytestmark = pytest.mark.usefixtures("one_thread")


def bert_init(root: Path, positions: int = 128) -> Path:
    """A tiny BERT folder (HF layout, word-level vocab.txt) with `positions` position rows."""
    from bertgpu.models.bert.config import BertConfig
    from bertgpu.models.bert.model import BertForPreTraining
    from bertgpu.models.hf_export import save_pretrained

    if positions == 128:
        return _tiny_init.tiny_init(root, VOCAB)
    tok = _tiny_init.tiny_init(root, VOCAB).parent / "tok"
    cfg = BertConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=2, intermediate_size=64,
                     max_position_embeddings=positions)
    torch.manual_seed(0)
    return save_pretrained(BertForPreTraining(cfg, with_nsp=False), root / f"init{positions}",
                           tokenizer=tok)


def task_model(init: Path, folder: Path, labels: list[str]) -> Path:
    """A sequence classifier fine-tuned elsewhere: `init`'s encoder, a head of len(labels)
    classes named `labels` (what an MNLI or a classify export looks like)."""
    from bertgpu.models.hf_export import save_pretrained
    from bertgpu.models.hf_io import load_pretrained

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its fresh head
        model = load_pretrained(init, head="classification", num_labels=len(labels))
    model.id2label = dict(enumerate(labels))
    return save_pretrained(model, folder, tokenizer=init)


def leaves_nothing(out: Path) -> bool:
    return not out.exists() and not out.with_name(out.name + ".tmp").exists()


# --------------------------------------------------------------------------------------------
# 1. max_seq_len and the model's positions


def test_squad_default_length_is_capped_at_the_model_positions(tmp_path, capsys):
    """The README's `finetune squad` from a model with fewer positions than SQuAD's default 384:
    the windows are cut to the model's max_position_embeddings (the start-up table says so)."""
    init = bert_init(tmp_path, positions=48)
    out = tmp_path / "squad"
    res = finetune("squad", None, init, out, train_file=SQUAD_V1, dev_file=SQUAD_V1,
                   overrides=QUICK)
    assert res["max_seq_len"] == 48 and res["config"]["max_seq_len"] is None
    assert res["steps"] >= 1 and "f1" in res["metrics"]["dev"]
    shown = capsys.readouterr().out
    assert "max sequence length" in shown and "48 (the model's max_position_embeddings" in shown
    assert "doc stride" in shown


def test_a_doc_stride_given_is_used_or_refused_and_recorded(tmp_path, capsys, monkeypatch):
    """The probe's `finetune squad --doc_stride 100` from a 128-position model: SQuAD's 384
    tokens are capped at 128, whose windows hold 61 context tokens, and the 100 asked for was
    replaced by 30 without a word while results.json said 100. A value given is now used or
    refused in one line before anything loads; results.json's `doc_stride` is the one used."""
    from bertgpu.cli import main

    init = bert_init(tmp_path)
    out = tmp_path / "squad"
    files = {"train_file": SQUAD_V1, "dev_file": SQUAD_V1}
    loads = []
    with monkeypatch.context() as m:
        m.setattr("bertgpu.finetune.build_model", lambda *a, **k: loads.append(a))
        with pytest.raises(BertgpuError) as err:
            finetune("squad", None, init, out, overrides=[*QUICK, "--doc_stride", "100"], **files)
    assert str(err.value) == ("--doc_stride 100: not below the 61 context tokens of a window "
                              "(max_seq_len 128 - max_query_len 64 - 3 for [CLS] [SEP] [SEP]); "
                              "expected at most 60, or no --doc_stride (the default fits the "
                              "window)")
    assert not loads and leaves_nothing(out)
    # the command line refuses it before any worker starts (--nproc)
    assert main(["finetune", "squad", "--train-file", str(SQUAD_V1), "--dev-file", str(SQUAD_V1),
                 "--init", str(init), "--out", str(out), "--doc_stride", "100"]) == 2
    assert "--doc_stride 100: not below the 61" in capsys.readouterr().err
    assert leaves_nothing(out)

    res = finetune("squad", None, init, out, overrides=[*QUICK, "--doc_stride", "20"], **files)
    assert res["max_seq_len"] == 128 and res["doc_stride"] == 20 == res["config"]["doc_stride"]
    assert re.search(r"max sequence length +128 \(.*\), doc stride 20\n", capsys.readouterr().out)
    res = finetune("squad", None, init, tmp_path / "squad2", overrides=QUICK, **files)
    said = ("half of each question's window (the default 128 does not fit beside a question "
            "in 128 tokens)")
    assert res["doc_stride"] == said and res["config"]["doc_stride"] is None
    assert f"doc stride {said}" in capsys.readouterr().out
    # tasks without windows record none
    assert "doc_stride" not in finetune("rte", GLUE, init, tmp_path / "rte", overrides=QUICK)


def test_the_windows_are_cut_with_the_doc_stride_given(tmp_path):
    """The stride given is the one the windows are cut with, not only the one recorded: in 128
    tokens every context of the fixture fits one window, so any stride gave the same sequences.
    With 48-token windows and 16-token questions the contexts span several windows; the
    sequence counts are those of featurize with stride 20, which differ from those of half a
    window (14, the old silent replacement)."""
    from bertgpu.data.tokenizer_folder import load_tokenizer
    from bertgpu.tasks import squad

    init = bert_init(tmp_path)
    res = finetune("squad", None, init, tmp_path / "squad", train_file=SQUAD_V1,
                   dev_file=SQUAD_V1, overrides=[*QUICK, "--max_seq_len", "48",
                                                 "--max_query_len", "16", "--doc_stride", "20"])
    tok = load_tokenizer(init)
    tok.no_truncation()
    tok.no_padding()
    examples = squad.read_squad(SQUAD_V1)

    def count(stride: int, training: bool) -> int:
        return len(squad.featurize(examples, tok, max_seq_len=48, max_query_len=16,
                                   doc_stride=stride, is_training=training).input_ids)

    assert count(20, True) != count(14, True) and count(20, False) != count(14, False)
    assert res["doc_stride"] == 20
    assert res["train_sequences"] == count(20, True)
    assert res["eval_sequences"] == {"dev": count(20, False)}


def test_a_longer_max_seq_len_than_the_model_positions_is_refused_up_front(tmp_path, monkeypatch):
    init = bert_init(tmp_path)
    out = tmp_path / "ft"
    loads = []
    monkeypatch.setattr("bertgpu.finetune.build_model", lambda *a, **k: loads.append(a))
    with pytest.raises(BertgpuError) as err:
        finetune("sst2", GLUE, init, out, overrides=["--max_seq_len", "256"])
    msg = str(err.value)
    assert ("--max_seq_len 256: longer than the model's max_position_embeddings 128" in msg
            and str(init / "config.json") in msg and "\n" not in msg)
    with pytest.raises(BertgpuError, match="max_position_embeddings 128"):
        finetune("squad", None, init, out, train_file=SQUAD_V1, dev_file=SQUAD_V1,
                 overrides=["--max_seq_len", "129"])
    assert not loads and leaves_nothing(out)


def test_the_limit_of_a_modernbert_init_is_its_max_position_embeddings(tmp_path):
    from bertgpu.finetune import sequence_length
    from bertgpu.models import build
    from bertgpu.models.hf_export import save_pretrained

    tok = _tiny_init.tiny_init(tmp_path, VOCAB).parent / "tok"
    fields = {"model_type": "modernbert", "vocab_size": 64, "hidden_size": 32,
              "intermediate_size": 40, "num_hidden_layers": 2, "num_attention_heads": 4,
              "max_position_embeddings": 96, "pad_token_id": 0, "cls_token_id": 2,
              "sep_token_id": 3, "bos_token_id": 2, "eos_token_id": 3}
    modern = save_pretrained(build.build_model(fields, "masked_lm"), tmp_path / "modern",
                             tokenizer=tok)
    cfg = load_finetune_config()
    assert sequence_length(cfg, 384, str(modern), None)[0] == 96
    assert sequence_length(cfg, 64, str(modern), None) == (64, "the task's default")
    with pytest.raises(BertgpuError, match="--max_seq_len 97: .*max_position_embeddings 96"):
        sequence_length(load_finetune_config(None, ["--max_seq_len", "97"]), 128, str(modern),
                        None)
    # --init random takes the positions of --config-from
    assert sequence_length(cfg, 384, "random", str(modern))[0] == 96


def test_too_short_sequences_are_refused(tmp_path):
    with pytest.raises(BertgpuError, match=r"max_seq_len = 2.*at least 3 \(\[CLS\], a token"):
        load_finetune_config(None, ["--max_seq_len", "2"])
    assert load_finetune_config(None, ["--max_seq_len", "3"]).max_seq_len == 3
    init = bert_init(tmp_path)
    with pytest.raises(BertgpuError, match=r"--max_seq_len 4: too short for sentence pairs"):
        finetune("rte", GLUE, init, tmp_path / "ft", overrides=["--max_seq_len", "4"])
    assert leaves_nothing(tmp_path / "ft")


# --------------------------------------------------------------------------------------------
# 2. SQuAD v2.0 files given to squad (v1.1)


@pytest.mark.parametrize("which", ["train", "dev"])
def test_squad_v2_files_given_to_squad_are_refused_up_front(tmp_path, which):
    init = bert_init(tmp_path)
    files = {"train_file": SQUAD_V1, "dev_file": SQUAD_V1, f"{which}_file": SQUAD_V2}
    with pytest.raises(BertgpuError) as err:
        finetune("squad", None, init, tmp_path / "sq", overrides=QUICK, **files)
    msg = str(err.value)
    assert msg.startswith(f"{SQUAD_V2}: 2 questions without answers (is_impossible)")
    assert "use finetune squad2" in msg and "\n" not in msg
    assert leaves_nothing(tmp_path / "sq")


# --------------------------------------------------------------------------------------------
# 3. Malformed GLUE rows: --skip_malformed


def test_skip_malformed_is_a_finetune_option_that_reaches_the_reader(tmp_path):
    assert load_finetune_config(None, ["--skip_malformed", "true"]).skip_malformed
    assert load_finetune_config(None, ["--skip-malformed"]).skip_malformed
    assert not load_finetune_config().skip_malformed
    init = bert_init(tmp_path)
    with pytest.raises(BertgpuError) as err:  # QQP's train.tsv has a row of 4 columns
        finetune("qqp", GLUE, init, tmp_path / "qqp", overrides=QUICK)
    assert "train.tsv:5: 4 columns, expected 6" in str(err.value)
    assert "pass --skip_malformed true to skip such rows" in str(err.value)
    assert leaves_nothing(tmp_path / "qqp")
    with pytest.warns(UserWarning, match=r"train\.tsv: skipped 1 malformed rows .*read 4"):
        res = finetune("qqp", GLUE, init, tmp_path / "qqp",
                       overrides=[*QUICK, "--skip_malformed", "true"])
    assert res["train_sequences"] == 4 and res["config"]["skip_malformed"] is True


def test_bertgpu_glue_passes_skip_malformed_to_the_reader(tmp_path):
    from bertgpu import glue

    init = bert_init(tmp_path)
    with pytest.warns(UserWarning, match="skipped 1 malformed rows"):
        summary = glue.run(GLUE, init, tmp_path / "g", tasks=["qqp"],
                           overrides=[*QUICK, "--skip_malformed"])
    assert (tmp_path / "g" / "QQP" / "seed_1" / "results.json").is_file()
    assert "QQP" in json.dumps(summary)


# --------------------------------------------------------------------------------------------
# 4. A stop signal during an epoch's evaluation


def test_an_evaluation_cut_short_by_a_signal_is_done_after_the_resume(tmp_path, monkeypatch,
                                                                      no_faults):
    """SIGINT in the evaluation at the end of epoch 1: the preemption checkpoint holds that step,
    and the resumed run evaluates epoch 1 before training epoch 2 (results.json lists 1, 2, 3)."""
    from bertgpu.tasks.finetuning import FinetuneTask

    init = bert_init(tmp_path)
    out = tmp_path / "sst2"
    args = ("sst2", GLUE, init, out)
    overrides = ["--epochs", "3", "--global_batch_size", "2", "--max_seq_len", "32"]
    predict = FinetuneTask.predict_sharded

    def interrupted(self, data):  # the first forward pass of the first evaluation
        os.kill(os.getpid(), signal.SIGINT)  # the handler raises Preempted at once
        raise AssertionError("not interrupted")

    monkeypatch.setattr(FinetuneTask, "predict_sharded", interrupted)
    stopped = finetune(*args, overrides=overrides)
    assert stopped["preempted"] and stopped["exit_status"] == 130
    per_epoch = stopped["step"]
    assert per_epoch >= 1 and (out.with_name("sst2.tmp") / "checkpoints").is_dir()
    monkeypatch.setattr(FinetuneTask, "predict_sharded", predict)
    res = finetune(*args, overrides=overrides)
    assert [e["epoch"] for e in res["epochs"]] == [1, 2, 3]
    assert [e["step"] for e in res["epochs"]] == [per_epoch, 2 * per_epoch, 3 * per_epoch]
    train_s = [e["train_seconds"] for e in res["epochs"]]
    assert 0 <= train_s[0] <= train_s[1] <= train_s[2] and res["data_wait_seconds"] >= 0


# --------------------------------------------------------------------------------------------
# 5, 6. Label names and heads of another task


def test_label_names_are_the_tasks_never_the_inits(tmp_path):
    init = bert_init(tmp_path)
    polarity = task_model(init, tmp_path / "polarity", ["neg", "pos"])
    finetune("rte", GLUE, polarity, tmp_path / "rte", overrides=QUICK)
    cfg = json.loads((tmp_path / "rte" / "model" / "config.json").read_text())
    assert cfg["id2label"] == {"0": "entailment", "1": "not_entailment"}
    assert cfg["label2id"] == {"entailment": 0, "not_entailment": 1}
    finetune("mnli", GLUE, polarity, tmp_path / "mnli", overrides=QUICK)
    cfg = json.loads((tmp_path / "mnli" / "model" / "config.json").read_text())
    assert cfg["id2label"] == {"0": "entailment", "1": "neutral", "2": "contradiction"}
    finetune("stsb", GLUE, polarity, tmp_path / "stsb", overrides=QUICK)
    cfg = json.loads((tmp_path / "stsb" / "model" / "config.json").read_text())
    assert cfg["id2label"] == {"0": "LABEL_0"} and cfg["problem_type"] == "regression"


def test_a_head_of_another_size_is_initialised_fresh_the_encoder_checked(tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    init = bert_init(tmp_path)
    mnli = task_model(init, tmp_path / "mnli", ["entailment", "neutral", "contradiction"])
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*initialised fresh")
        res = finetune("rte", GLUE, mnli, tmp_path / "rte", overrides=QUICK)
    assert re.search(r"initialised fresh +classifier\.bias, classifier\.weight \(the "
                     r"checkpoint's are another task's head: classifier\.bias \(3,\) "
                     r"\(model \(2,\)\)", capsys.readouterr().out)
    assert res["steps"] >= 1
    # The encoder is still checked strictly.
    weights = load_file(mnli / "model.safetensors")
    weights["bert.encoder.layer.0.output.dense.weight"] = torch.zeros(32, 8)
    save_file(weights, mnli / "model.safetensors")
    with pytest.raises(BertgpuError, match=r"wrong shape .*layer\.0\.output\.dense\.weight"):
        finetune("rte", GLUE, mnli, tmp_path / "rte2", overrides=QUICK)
    assert leaves_nothing(tmp_path / "rte2")


# --------------------------------------------------------------------------------------------
# 7. Nothing half-written


def test_batch_settings_are_checked_before_the_model_loads(tmp_path, monkeypatch, capsys):
    from bertgpu.cli import main

    init = bert_init(tmp_path)
    out = tmp_path / "ft"
    monkeypatch.setattr("bertgpu.finetune.build_model",
                        lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(BertgpuError, match="^--global_batch_size 4 is not divisible by "
                                           "--micro_batch_size 8 x 1 device = 8"):
        finetune("sst2", GLUE, init, out,
                 overrides=["--global_batch_size", "4", "--micro_batch_size", "8"])
    assert leaves_nothing(out)
    assert main(["finetune", "sst2", "--data", str(GLUE), "--init", str(init), "--out", str(out),
                 "--global_batch_size", "6", "--micro_batch_size", "4"]) == 2
    err = capsys.readouterr().err
    assert "error: --global_batch_size 6 is not divisible" in err and "Traceback" not in err
    assert leaves_nothing(out)


def test_a_failure_during_training_leaves_no_work_folder(tmp_path, monkeypatch):
    from bertgpu.tasks.finetuning import FinetuneTask

    init = bert_init(tmp_path)
    out = tmp_path / "ft"

    def broken(self, step, train_loss):
        raise BertgpuError("scoring failed")

    monkeypatch.setattr(FinetuneTask, "evaluate", broken)
    with pytest.raises(BertgpuError, match="scoring failed"):
        finetune("sst2", GLUE, init, out, overrides=QUICK)
    assert leaves_nothing(out)


# --------------------------------------------------------------------------------------------
# 8. Messages


def test_folders_given_as_files_are_named(tmp_path):
    init = bert_init(tmp_path)
    folder = tmp_path / "c"
    folder.mkdir()
    for task in ("classify", "ner", "squad"):
        with pytest.raises(BertgpuError, match=f"^{folder}: is a folder, expected a .*file "
                                               r"\(--train-file\)"):
            finetune(task, None, init, tmp_path / "ft", train_file=folder, dev_file=SQUAD_V1)


def test_unknown_task_lists_every_task():
    from bertgpu.tasks.registry import task_module

    with pytest.raises(BertgpuError) as err:
        task_module("sqaud")
    msg = str(err.value)
    for name in ("cola", "wnli", "squad,", "squad2", "classify", "ner"):
        assert name in msg, name
    assert msg.endswith("did you mean squad?")


def test_predict_test_says_when_a_task_has_no_test_file(tmp_path):
    init = bert_init(tmp_path)
    with pytest.warns(UserWarning, match=r"--predict-test: no test file for GLUE RTE in .*; no "
                                         "RTE predictions are written"):
        finetune("rte", GLUE, init, tmp_path / "rte", overrides=QUICK, predict_test=True)
    assert not (tmp_path / "rte" / "submission").exists()


def test_constant_regression_labels_are_named_undefined(tmp_path):
    init = bert_init(tmp_path)
    train, dev = tmp_path / "train.csv", tmp_path / "dev.csv"
    train.write_text("text,label\ngood,1.0\nbad,0.0\ngood bad,0.5\nthe,0.2\n", encoding="utf-8")
    dev.write_text("text,label\ngood,2.0\nbad,2.0\n", encoding="utf-8")
    with pytest.warns(UserWarning, match=r"dev\.csv: every dev score is 2; Pearson and Spearman "
                                         "are undefined"):
        finetune("classify", None, init, tmp_path / "ft", train_file=train, dev_file=dev,
                 regression=True, overrides=QUICK)


def test_constant_stsb_dev_scores_are_named_undefined(tmp_path):
    from bertgpu.data.tokenizer_folder import load_tokenizer
    from bertgpu.tasks.glue import Example, get_task
    from bertgpu.tasks.glue_job import examples_job

    tok = load_tokenizer(bert_init(tmp_path).parent / "tok")
    same = [Example(str(i), "good", "bad", 2.0) for i in range(3)]
    with pytest.warns(UserWarning, match="GLUE STS-B dev split: every score is 2; Pearson"):
        examples_job(get_task("stsb"), same, [("dev", same)], tok, load_finetune_config(), "x")


def test_an_earlier_fine_tuning_at_out_is_named_before_it_is_replaced(tmp_path):
    """`finetune cola --out ow` after `finetune sst2 --out ow` replaced the SST-2 results without
    a word; it still replaces them (an earlier output of the same command), and says so first."""
    init = bert_init(tmp_path)
    out = tmp_path / "ow"
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.filterwarnings("ignore", message=".*initialised fresh")
        warnings.filterwarnings("ignore", message=".*trains nothing")  # 1 step, in its warm-up
        warnings.filterwarnings("ignore", message=".*training sequences: every step holds")
        finetune("sst2", GLUE, init, out, overrides=QUICK)  # (batch 4 > the 3 fixture rows)
    with pytest.warns(UserWarning, match=rf"ow: holds an earlier fine-tuning \(SST-2 from {init}\);"
                                         r" this run of CoLA replaces it when it ends"):
        finetune("cola", GLUE, init, out, overrides=QUICK)
    assert json.loads((out / "results.json").read_text())["task"] == "CoLA"


def test_the_same_finished_fine_tuning_again_does_nothing(tmp_path, capsys):
    """The same `finetune` command after it finished trained again from scratch and replaced
    its output ("holds an earlier fine-tuning ...; this run replaces it"), where pretrain,
    prepare, tokenizer and glue say it is done: a re-run script re-trained every fine-tune.
    Another setting, test predictions or --force train again."""
    from bertgpu.cli import main as cli_main

    init = bert_init(tmp_path)
    out = tmp_path / "ft"
    argv = ["finetune", "sst2", "--data", str(GLUE), "--init", str(init), "--out", str(out),
            *QUICK]
    assert cli_main(argv) == 0
    capsys.readouterr()
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    assert cli_main(argv) == 0
    assert capsys.readouterr().out == (f"SST-2: {out} already holds this fine-tuning (the same "
                                       "init, data and settings); nothing to do (--force trains "
                                       "it again)\n")
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == stamps
    for again in (["--seed", "1"], ["--predict-test"], ["--force"]):
        assert cli_main([*argv, *again]) == 0
        printed = capsys.readouterr()
        assert "nothing to do" not in printed.out and "SST-2: dev accuracy" in printed.out, again


def test_config_from_with_a_real_init_is_refused(tmp_path):
    """--config-from beside a real --init was ignored (the model and tokenizer came from
    --init) yet recorded, so that `glue` refused its own re-run without it."""
    from bertgpu.tasks.init_model import tokenizer_for

    with pytest.raises(BertgpuError, match=r"--config-from other: only with --init random .*"
                                           r"--init run brings its own model and tokenizer"):
        tokenizer_for("run", "other")

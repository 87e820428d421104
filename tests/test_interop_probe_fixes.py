"""Interoperability with transformers folders (probe export2):

1. a folder whose MLM decoder is its own (tie_word_embeddings false) is refused wherever an MLM
   head would load it (our decoder is the word embeddings), and loads for fine-tuning heads;
2. a model with one token type is refused in one line for tasks that encode pairs, instead of
   an IndexError mid-run;
3. `export --out` replaces only an earlier bertgpu export (marked in its config.json), never a
   folder transformers saved (model card, notes), nor an export older than the mark;
6. a fine-tuning output given as --init or to export points to its model/ folder."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch
from _tiny import TINY, tiny_batch
from _tiny_modern import TINY_MODERN

from bertgpu import cli
from bertgpu.errors import BertgpuError
from bertgpu.models.bert.config import BertConfig
from bertgpu.models.bert.model import BertForPreTraining
from bertgpu.models.build import build_model
from bertgpu.models.hf_export import EXPORT_MARK, is_model_folder, save_pretrained
from bertgpu.models.hf_io import load_init_weights, load_pretrained, resolve_checkpoint_folder
from bertgpu.tasks.finetuning import Encoded
from bertgpu.tasks.init_model import check_job_token_types

transformers = pytest.importorskip("transformers")

FIXTURES = Path(__file__).parent / "fixtures"
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


# --- 1. untied MLM decoder ----------------------------------------------------------------------


def _untied(folder: Path, arch: str, same: bool = False) -> Path:
    """A transformers MLM model saved with tie_word_embeddings false and a decoder of its own
    (`same`: a decoder equal to the word embeddings)."""
    torch.manual_seed(0)
    if arch == "bert":
        hf = transformers.BertForMaskedLM(transformers.BertConfig(**TINY,
                                                                  tie_word_embeddings=False))
        decoder = hf.cls.predictions.decoder.weight
    else:
        hf = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(
            **TINY_MODERN, tie_word_embeddings=False))
        decoder = hf.decoder.weight
    with torch.no_grad():
        if same:
            decoder.copy_(hf.get_input_embeddings().weight)
        else:
            decoder.normal_(0, 0.5)
    hf.save_pretrained(folder)
    assert json.loads((folder / "config.json").read_text())["tie_word_embeddings"] is False
    return folder


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_untied_decoder_is_refused_for_mlm_heads(tmp_path, arch):
    folder = _untied(tmp_path / "untied", arch)
    for head in ("masked_lm", "pretraining"):
        with pytest.raises(BertgpuError) as e:
            load_pretrained(folder, head=head)
        msg = str(e.value)
        assert msg.startswith(f"{folder / 'config.json'}: tie_word_embeddings is false"), msg
        assert "expected true" in msg and "\n" not in msg, msg
    # --init of continued pretraining (pretrain --init): the model has an MLM head
    fields = json.loads((folder / "config.json").read_text())
    model = build_model(fields, "masked_lm")
    with pytest.raises(BertgpuError, match="tie_word_embeddings is false"):
        load_init_weights(model, folder)


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_untied_decoder_is_irrelevant_to_fine_tuning_heads(tmp_path, arch):
    """Heads without the decoder load as before, and the encoder is transformers' own."""
    folder = _untied(tmp_path / "untied", arch)
    for head, labels in (("classification", 3), ("qa", None), ("token_classification", 3)):
        load_pretrained(folder, head=head, num_labels=labels)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours = load_pretrained(folder, head="base").eval()
    hf = transformers.AutoModel.from_pretrained(folder).eval()
    b = tiny_batch(0)
    kw = {"input_ids": b["input_ids"], "attention_mask": b["attention_mask"]}
    with torch.no_grad():
        mask = b["attention_mask"].bool()
        torch.testing.assert_close(ours(**kw).last_hidden_state[mask],
                                   hf(**kw).last_hidden_state[mask], atol=1e-5, rtol=1e-4)


def test_untied_flag_with_the_embeddings_as_decoder_still_loads(tmp_path):
    """Nothing is lost when the decoder equals the word embeddings: logits are transformers'."""
    folder = _untied(tmp_path / "same", "bert", same=True)
    ours = load_pretrained(folder, head="masked_lm").eval()
    hf = transformers.AutoModelForMaskedLM.from_pretrained(folder).eval()
    b = tiny_batch(0)
    kw = {"input_ids": b["input_ids"], "attention_mask": b["attention_mask"]}
    with torch.no_grad():
        torch.testing.assert_close(ours(**kw).prediction_logits, hf(**kw).logits,
                                   atol=1e-5, rtol=1e-4)


# --- 2. one token type, pair tasks ---------------------------------------------------------------


@pytest.fixture(scope="module")
def one_type(tmp_path_factory) -> Path:
    """A bertgpu-saved BERT with type_vocab_size 1 and a vocabulary of the fixtures' words."""
    root = tmp_path_factory.mktemp("one_type")
    words = sorted({w.lower() for p in (FIXTURES / "glue" / "SST-2").glob("*.tsv")
                    for line in p.read_text().splitlines()[1:] for w in line.split()})
    tok = root / "tok"
    tok.mkdir()
    (tok / "vocab.txt").write_text("\n".join(SPECIAL + words) + "\n", encoding="utf-8")
    (tok / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    cfg = BertConfig(vocab_size=len(SPECIAL) + len(words), hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=128,
                     type_vocab_size=1)
    torch.manual_seed(0)
    return save_pretrained(BertForPreTraining(cfg, with_nsp=False), root / "init", tokenizer=tok)


def test_squad_from_one_token_type_is_one_line(one_type, tmp_path, capsys):
    squad = FIXTURES / "squad" / "dev-v1.1-sample.json"
    out = tmp_path / "squad"
    assert cli.main(["finetune", "squad", "--train-file", str(squad), "--dev-file", str(squad),
                     "--init", str(one_type), "--out", str(out), "--epochs", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"{one_type / 'config.json'}: question answering" in err, err
    assert "expected type_vocab_size >= 2, found 1" in err, err
    assert not out.exists() and not Path(f"{out}.tmp").exists()


def test_pair_job_from_one_token_type_is_refused(one_type):
    """The check a pair task's data get once encoded (type 1 on the second text)."""
    single = Encoded([np.array([2, 7, 3])], [np.zeros(3, dtype=np.int64)])
    pairs = Encoded([np.array([2, 7, 3, 8, 3])], [np.array([0, 0, 0, 1, 1])])
    job = SimpleNamespace(name="MRPC", train=pairs, evals=[SimpleNamespace(data=single)],
                          predict_test=[])
    with pytest.raises(BertgpuError) as e:
        check_job_token_types(job, str(one_type), None)
    assert str(e.value) == (f"{one_type / 'config.json'}: task 'MRPC' (text pairs) needs token "
                            "types 0 to 1: expected type_vocab_size >= 2, found 1 (single-text "
                            "tasks work with this model)")
    check_job_token_types(SimpleNamespace(name="SST-2", train=single, evals=[], predict_test=[]),
                          str(one_type), None)  # single texts: nothing to refuse


def test_pair_task_from_one_token_type_is_one_line(one_type, tmp_path, capsys):
    """`finetune mrpc` (text pairs) from that model: the command stops before training."""
    out = tmp_path / "mrpc"
    assert cli.main(["finetune", "mrpc", "--data", str(FIXTURES / "glue"), "--init",
                     str(one_type), "--out", str(out), "--epochs", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"{one_type / 'config.json'}: task 'MRPC' (text pairs) needs token types" in err, err
    assert not out.exists() and not Path(f"{out}.tmp").exists()


def test_single_text_task_from_one_token_type_still_trains(one_type, tmp_path):
    out = tmp_path / "sst2"
    assert cli.main(["finetune", "sst2", "--data", str(FIXTURES / "glue"), "--init",
                     str(one_type), "--out", str(out), "--epochs", "1"]) == 0
    assert (out / "model" / "config.json").is_file()


# --- 3. export --out replaces only bertgpu's exports ---------------------------------------------


def _model() -> BertForPreTraining:
    torch.manual_seed(0)
    return BertForPreTraining(BertConfig(**TINY), with_nsp=False)


def test_export_refuses_a_transformers_folder_and_keeps_it(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    victim = tmp_path / "victim"
    torch.manual_seed(0)
    transformers.BertForMaskedLM(transformers.BertConfig(**TINY)).save_pretrained(victim)
    (victim / "README.md").write_text("# my model card")
    before = sorted(p.name for p in victim.iterdir())
    assert not is_model_folder(victim)
    capsys.readouterr()  # transformers' progress bar
    assert cli.main(["export", str(run), "--out", str(victim)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"{victim}: a folder that is not an earlier bertgpu export" in err, err
    assert "choose another --out, or remove this folder" in err, err
    with pytest.raises(BertgpuError, match="not an earlier bertgpu export"):
        save_pretrained(_model(), victim)
    assert sorted(p.name for p in victim.iterdir()) == before


def test_a_model_transformers_saved_from_an_export_is_not_an_export(tmp_path):
    """transformers keeps the mark in the config it re-saves, but adds transformers_version."""
    ours = save_pretrained(_model(), tmp_path / "ours")
    assert json.loads((ours / "config.json").read_text())[EXPORT_MARK] is True
    assert is_model_folder(ours)
    again = tmp_path / "again"
    transformers.AutoModelForMaskedLM.from_pretrained(ours).save_pretrained(again)
    assert json.loads((again / "config.json").read_text()).get(EXPORT_MARK) is True
    assert not is_model_folder(again)


def test_an_export_older_than_the_mark_is_refused(tmp_path):
    old = save_pretrained(_model(), tmp_path / "old")
    config = json.loads((old / "config.json").read_text())
    del config[EXPORT_MARK]  # what exports wrote before the mark
    (old / "config.json").write_text(json.dumps(config))
    assert not is_model_folder(old)
    with pytest.raises(BertgpuError, match=f"{old}: a folder that is not an earlier bertgpu"):
        save_pretrained(_model(), old)
    # ... except a run's own hf/ holding only export files (a resumed run ends by writing it)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.toml").write_text("seed = 0\n")
    old.rename(run / "hf")
    assert is_model_folder(run / "hf")
    (run / "hf" / "README.md").write_text("mine")
    assert not is_model_folder(run / "hf")


def test_re_export_into_an_export_replaces_it(tmp_path):
    first = save_pretrained(_model(), tmp_path / "out")
    again = save_pretrained(_model(), first)
    assert again == first and is_model_folder(first)


# --- 6. a fine-tuning output in place of a model --------------------------------------------------


def test_a_fine_tuning_output_points_to_its_model(tmp_path, capsys):
    out = tmp_path / "cls"
    save_pretrained(_model(), out / "model")
    (out / "results.json").write_text("{}")
    with pytest.raises(BertgpuError) as e:
        resolve_checkpoint_folder(out)
    assert f"expected its model folder {out / 'model'}" in str(e.value), str(e.value)
    assert cli.main(["export", str(out), "--out", str(tmp_path / "ex")]) == 2
    err = capsys.readouterr().err
    assert f"{out}: a fine-tuning output" in err and str(out / "model") in err, err


def test_an_export_given_to_export_says_what_it_is(tmp_path, capsys):
    """`bertgpu export RUN/hf` said "has no complete checkpoint under checkpoints/", as for an
    empty folder; a fine-tuning output already said that its model is in the HF layout."""
    hf = tmp_path / "run" / "hf"
    save_pretrained(_model(), hf)
    assert cli.main(["export", str(hf), "--out", str(tmp_path / "ex")]) == 2
    err = capsys.readouterr().err
    assert f"{hf}: an export, already in the Hugging Face layout" in err, err
    assert not (tmp_path / "ex").exists()


def test_a_fine_tuning_checkpoint_given_to_export_says_what_it_is(tmp_path, capsys):
    """A stopped fine-tuning run's checkpoint (or its OUT.tmp) warned "no tokenizer to export
    with it", then said "no config.json (expected ... a checkpoint folder ...)" of a checkpoint
    folder; nothing is written."""
    run = tmp_path / "cls.tmp"
    ckpt = run / "checkpoints" / "step_234"
    ckpt.mkdir(parents=True)
    for name in ("COMPLETE", "checksums.json", "model.safetensors", "train_state.pt"):
        (ckpt / name).write_text("")
    (ckpt / "finetune.json").write_text("{}")
    for given, what in ((ckpt, "a checkpoint"), (run, "the checkpoints of a run")):
        assert cli.main(["export", str(given), "--out", str(tmp_path / "ex")]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"bertgpu export: error: {given}: {what} of `bertgpu finetune`, "
                              "which writes its model in the Hugging Face layout to OUT/model"), err
        assert err.count("\n") == 1 and not (tmp_path / "ex").exists()

"""A whole-file checkpoint holds its weights in Hugging Face's layout (q, k and v apart, the
real vocabulary's rows), so transformers' `from_pretrained` loads a checkpoint folder as it loads
an export: before, it loaded BERT with freshly initialised query/key/value (our fused `qkv` was
an unexpected key) and only a load report said so. Resuming converts back, bitwise, from either
layout (checkpoints written before hold ours)."""

from __future__ import annotations

import json

import pytest
import torch
from _e2e import STEPS, e2e_shards, reference_run
from _tiny_modern import TINY_MODERN
from safetensors.torch import load_file

from bertgpu.errors import BertgpuError
from bertgpu.models.build import build_model
from bertgpu.models.hf_export import hf_config
from bertgpu.models.layout import hf_state_dict
from bertgpu.train import checkpoint as ckpt
from bertgpu.train.checkpointer import restore
from bertgpu.train.distributed import DistInfo
from bertgpu.train.full_checkpoints import FullCheckpoints
from bertgpu.train.optim import build_optimizer

TINY_BERT = dict(architecture="bert", vocab_size=100, hidden_size=32, num_hidden_layers=2,
                 num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
"""Vocabulary 100: 128 rows inside the model, so the padding is cut off in the file."""

CASES = {"bert": (TINY_BERT, "pretraining", "BertForPreTraining"),
         "modernbert": (dict(TINY_MODERN, architecture="modernbert"), "masked_lm",
                        "ModernBertForMaskedLM")}


def trained(arch: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A model after one optimizer step (moments in the state, weights away from their init)."""
    fields, head, _ = CASES[arch]
    torch.manual_seed(0)
    model = build_model(dict(fields), head)
    optimizer = build_optimizer(model, "adamw", lr=1e-2)
    ids = torch.randint(5, 99, (2, 12))
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids))["prediction_logits"]
    logits.float().square().mean().backward()
    optimizer.step()
    return model, optimizer


def save(model, optimizer, run_dir, background: bool = False):
    writer = FullCheckpoints(run_dir, DistInfo(), keep_last=1, background=background)
    files = {"config.json": json.dumps(hf_config(model))}
    path = writer.save(7, model, optimizer, {"step": 7}, files, background=background)
    writer.wait()
    return path or ckpt.checkpoint_dir(run_dir, 7)


@pytest.mark.parametrize("background", [False, True], ids=["in place", "background"])
@pytest.mark.parametrize("arch", sorted(CASES))
def test_transformers_loads_a_checkpoint_folder(arch, background, tmp_path):
    transformers = pytest.importorskip("transformers")
    model, optimizer = trained(arch)
    folder = save(model, optimizer, tmp_path / "run", background)
    expected = hf_state_dict(model)
    assert set(load_file(str(folder / "model.safetensors"))) == set(expected)
    hf = getattr(transformers, CASES[arch][2]).from_pretrained(folder).float()
    got = hf.state_dict()
    for key, value in expected.items():
        assert torch.equal(got[key], value.detach()), key  # query/key/value were random before


@pytest.mark.parametrize("arch", sorted(CASES))
def test_a_checkpoint_resumes_bitwise_from_either_layout(arch, tmp_path):
    model, optimizer = trained(arch)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    new_layout = save(model, optimizer, tmp_path / "new")
    # A checkpoint written before this change: the model's own layout (fused, padded).
    old_layout = ckpt.save_checkpoint(tmp_path / "old", 7, model.state_dict(),
                                      {"step": 7, "optimizer": optimizer.state_dict()})
    for path in (new_layout, old_layout):
        torch.manual_seed(1)  # other weights than the saved ones
        fresh = build_model(dict(CASES[arch][0]), CASES[arch][1])
        fresh_opt = build_optimizer(fresh, "adamw", lr=1e-2)
        weights, state = ckpt.load_checkpoint(path)
        restore(path, weights, state, fresh, fresh_opt)
        after = fresh.state_dict()
        assert after.keys() == before.keys()
        for key, value in before.items():
            assert torch.equal(after[key], value), (path.parent.parent.name, key)
        moments = fresh_opt.state_dict()["state"]
        for i, saved in optimizer.state_dict()["state"].items():
            assert torch.equal(moments[i]["exp_avg"], saved["exp_avg"])


def test_an_optimizer_state_of_another_layout_is_one_line(tmp_path):
    # A checkpoint from before q, k and v were fused: the weights convert, but its optimizer held
    # three parameters where the model has one, which torch refuses with a ValueError of its own.
    model, optimizer = trained("bert")
    groups = optimizer.state_dict()
    for group in groups["param_groups"]:
        group["params"] = [*group["params"], 10_000 + len(group["params"])]  # one more each
    path = ckpt.save_checkpoint(tmp_path / "old", 7, hf_state_dict(model),
                                {"step": 7, "optimizer": groups})
    fresh = build_model(dict(TINY_BERT), "pretraining")
    weights, state = ckpt.load_checkpoint(path)
    with pytest.raises(BertgpuError, match="its optimizer state does not match the configured "
                       "model .* --init PATH continues from its weights") as raised:
        restore(path, weights, state, fresh, build_optimizer(fresh, "adamw", lr=1e-2))
    assert str(path) in str(raised.value) and "\n" not in str(raised.value)


def test_a_pretraining_checkpoint_is_a_whole_transformers_folder(tmp_path_factory):
    """The tokenizer travels with each checkpoint of `bertgpu pretrain`: without it, transformers'
    AutoTokenizer made one of 5 tokens from the folder's config.json and a fill-mask pipeline
    on the checkpoint answered '' (every word [UNK])."""
    transformers = pytest.importorskip("transformers")
    run = reference_run(e2e_shards(tmp_path_factory), tmp_path_factory)
    last = ckpt.checkpoint_dir(run, STEPS)  # the end of the run: the weights of its hf/ export
    mine, exported = (transformers.AutoTokenizer.from_pretrained(f) for f in (last, run / "hf"))
    text = "w3 w17 w40 w8"
    assert len(mine) == len(exported) == 100
    assert mine(text)["input_ids"] == exported(text)["input_ids"]
    assert mine.unk_token_id not in mine(text)["input_ids"]
    masked = f"w3 w17 {mine.mask_token} w8"
    got, want = (transformers.pipeline("fill-mask", model=str(f), device="cpu")(masked)
                 for f in (last, run / "hf"))
    assert [(r["token_str"], round(r["score"], 6)) for r in got] == [
        (r["token_str"], round(r["score"], 6)) for r in want]
    assert all(r["token_str"] for r in got)


def test_moments_of_an_unpadded_vocabulary_are_one_line(tmp_path):
    # A ModernBERT checkpoint from before the vocabulary was padded: its weights convert (the
    # tables are padded on load) and torch's load_state_dict takes moments of V rows for the
    # padded parameters, to fail at the first step with a traceback of the optimizer's.
    model, optimizer = trained("modernbert")
    groups = optimizer.state_dict()
    table = next(i for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])
                 if p.shape[0] == 128)  # the padded token embedding
    moments = groups["state"][table]
    moments["exp_avg"] = moments["exp_avg"][:99].clone()
    path = ckpt.save_checkpoint(tmp_path / "old", 7, hf_state_dict(model),
                                {"step": 7, "optimizer": groups})
    fresh = build_model(dict(CASES["modernbert"][0]), "masked_lm")
    weights, state = ckpt.load_checkpoint(path)
    with pytest.raises(BertgpuError, match=r"its optimizer state does not match the configured "
                       r"model \(exp_avg of shape \(99, 32\) for a parameter of shape \(128, 32\)"):
        restore(path, weights, state, fresh, build_optimizer(fresh, "adamw", lr=1e-2))

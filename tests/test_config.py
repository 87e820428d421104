"""Config schema: TOML + overrides, typed parsing, helpful errors, TOML round trip, batch math."""

from __future__ import annotations

import dataclasses
import math

import pytest

from bertgpu.errors import BertgpuError
from bertgpu.train.config import (
    PretrainConfig,
    load_config,
    resolve_batch,
    resolve_with_nsp,
    scaled_lr,
    validate,
)
from bertgpu.train.overrides import apply_overrides, config_to_dict, dump_toml, format_help, tomllib


def write(tmp_path, text: str):
    path = tmp_path / "config.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_validate_and_every_field_has_help():
    validate(PretrainConfig())

    def walk(cls):
        for f in dataclasses.fields(cls):
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help text"
            if dataclasses.is_dataclass(f.type) or isinstance(f.default_factory, type):
                walk(f.default_factory)

    walk(PretrainConfig)
    text = format_help(PretrainConfig)
    assert "--train.max_steps" in text and "--optim.betas" in text and "[schedule]" in text


def test_model_section_has_hf_names():
    names = [f.name for f in dataclasses.fields(PretrainConfig().model)]
    assert names == [
        "architecture",
        "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
        "intermediate_size", "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob",
        "max_position_embeddings", "type_vocab_size", "initializer_range", "layer_norm_eps",
        "pad_token_id",
        # ModernBERT's (transformers' ModernBertConfig names)
        "hidden_activation", "norm_eps", "norm_bias", "attention_bias", "mlp_bias", "decoder_bias",
        "embedding_dropout", "attention_dropout", "mlp_dropout", "global_attn_every_n_layers",
        "local_attention", "global_rope_theta", "local_rope_theta", "initializer_cutoff_factor",
        "classifier_pooling",
    ]
    from bertgpu.models.bert import BertConfig
    from bertgpu.models.modernbert_config import ModernBertConfig

    hf_names = {f.name for cls in (BertConfig, ModernBertConfig) for f in dataclasses.fields(cls)}
    assert set(names) - hf_names == {"architecture"}


def test_toml_then_overrides(tmp_path):
    path = write(tmp_path, """
seed = 7
[train]
max_steps = 100
precision = "bf16"
[optim]
name = "lamb"
lr = 1e-3
betas = [0.9, 0.98]
[model]
hidden_size = 128
num_attention_heads = 2
""")
    cfg = load_config(path, ["--train.max_steps", "20", "--optim.lr=2e-3", "--seed", "3",
                             "--data", "shards/", "--out", "runs/x", "--optim.betas", "0.8,0.9",
                             "--schedule.warmup_steps", "5", "--train.budget_hours", "none",
                             "--train.compile"])
    assert cfg.seed == 3 and cfg.data.dir == "shards/" and cfg.out == "runs/x"
    assert cfg.train.max_steps == 20 and cfg.train.precision == "bf16"
    assert cfg.optim.name == "lamb" and cfg.optim.lr == 2e-3 and cfg.optim.betas == (0.8, 0.9)
    assert cfg.model.hidden_size == 128 and cfg.schedule.warmup_steps == 5
    assert cfg.train.budget_hours is None and cfg.train.compile is True
    assert isinstance(cfg.optim.lr, float) and isinstance(cfg.train.max_steps, int)


def test_toml_int_for_float_and_auto_micro_batch(tmp_path):
    cfg = load_config(write(tmp_path, '[optim]\nlr = 1\n[train]\nmicro_batch_size = "auto"\n'), [])
    assert cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)
    assert cfg.train.micro_batch_size == "auto"
    cfg = load_config(None, ["--train.micro_batch_size", "16"])
    assert cfg.train.micro_batch_size == 16


def test_unknown_key_suggests(tmp_path):
    with pytest.raises(BertgpuError, match=r"config.toml: unknown key train.max_stepz \(did you mean train.max_steps\?\)"):
        load_config(write(tmp_path, "[train]\nmax_stepz = 3\n"), [])
    with pytest.raises(BertgpuError, match=r"unknown key trainn.max_steps \(did you mean train.max_steps\?\)"):
        load_config(None, ["--trainn.max_steps", "3"])
    with pytest.raises(BertgpuError, match="unknown key colour"):
        load_config(write(tmp_path, 'colour = "blue"\n'), [])


@pytest.mark.parametrize(
    ("overrides", "pattern"),
    [
        (["--train.max_steps", "ten"], r"train.max_steps = ten: expected an integer"),
        (["--optim.lr", "fast"], r"optim.lr = fast: expected a number"),
        (["--train.compile", "maybe"], r"train.compile = maybe: expected true or false"),
        (["--optim.betas", "0.9"], r"optim.betas = 0.9: expected 2 comma-separated values"),
        (["--train.max_steps"], r"--train.max_steps needs a value"),
        (["stray"], r"unexpected argument 'stray'"),
        (["--train.precision", "fp8"], r"train.precision = 'fp8': expected one of fp32, bf16, fp16"),
        (["--train.global_batch_size", "100", "--train.micro_batch_size", "32"], r"multiple of train.micro_batch_size"),
        (["--model.num_attention_heads", "7"], r"model.hidden_size = 768: expected a multiple"),
        (["--optim.lr_scaling", "sqrt"], r"optim.reference_batch_size"),
        (["--train", "3"], r"train is a section"),
    ],
)
def test_bad_values_name_the_key(overrides, pattern):
    with pytest.raises(BertgpuError, match=pattern):
        load_config(None, overrides)


def test_toml_type_error_names_file_and_key(tmp_path):
    with pytest.raises(BertgpuError, match=r"config.toml: train.max_steps = \"many\": expected an integer"):
        load_config(write(tmp_path, '[train]\nmax_steps = "many"\n'), [])
    with pytest.raises(BertgpuError, match=r"config.toml: train.compile = 1: expected true or false"):
        load_config(write(tmp_path, "[train]\ncompile = 1\n"), [])
    with pytest.raises(BertgpuError, match=r"config.toml: invalid TOML"):
        load_config(write(tmp_path, "[train\n"), [])


def test_dump_toml_round_trip(tmp_path):
    cfg = load_config(None, ["--out", "runs/a", "--optim.betas", "0.9,0.98", "--schedule.warmup_fraction",
                             "none", "--schedule.warmup_steps", "10", "--train.budget_hours", "1.5",
                             "--data.dir", 'we"ird dir'])
    text = dump_toml(cfg)
    tomllib.loads(text)  # valid TOML
    path = write(tmp_path, text)
    again = load_config(path, [])
    assert again == cfg
    d = config_to_dict(cfg)
    assert d["optim"]["betas"] == [0.9, 0.98] and d["schedule"]["warmup_fraction"] is None


def test_generic_overrides_on_another_dataclass():
    @dataclasses.dataclass
    class Finetune:
        lr: float = 3e-5
        epochs: int = 3
        task: str | None = None

    ft = apply_overrides(Finetune(), ["--lr", "1e-4", "--epochs=2", "--task", "rte"], "finetune")
    assert (ft.lr, ft.epochs, ft.task) == (1e-4, 2, "rte")
    with pytest.raises(BertgpuError, match=r"finetune: unknown key epoch \(did you mean epochs\?\)"):
        apply_overrides(Finetune(), ["--epoch", "2"], "finetune")


def test_resolve_batch():
    assert resolve_batch(256, 32, 1) == 8
    assert resolve_batch(256, 32, 8) == 1
    assert resolve_batch(96, 8, 4) == 3
    with pytest.raises(BertgpuError, match=r"96 is not divisible by train.micro_batch_size 8 × 5 devices = 40"):
        resolve_batch(96, 8, 5)
    with pytest.raises(BertgpuError):
        resolve_batch(96, "auto", 1)


def test_scaled_lr():
    assert scaled_lr(1e-4, 1024, 256, "none") == 1e-4
    assert math.isclose(scaled_lr(1e-4, 1024, 256, "linear"), 4e-4)
    assert math.isclose(scaled_lr(1e-4, 1024, 256, "sqrt"), 2e-4)
    with pytest.raises(BertgpuError):
        scaled_lr(1e-4, 1024, None, "sqrt")


def test_resolve_with_nsp():
    assert resolve_with_nsp(None, "mlm+nsp") is True
    assert resolve_with_nsp(None, "mlm") is False
    assert resolve_with_nsp(False, "mlm+nsp") is False
    with pytest.raises(BertgpuError, match="no sentence pairs"):
        resolve_with_nsp(True, "mlm", "data/manifest.json")

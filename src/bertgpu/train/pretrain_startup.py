"""What `bertgpu pretrain` says at start-up: the table of a run (data, model, compute, the batch
arithmetic, the learning rate, the all-reduce or sharding) and, without a recipe, which defaults
train."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def defaults_note(cfg: Any) -> str:
    """The one line that says what a command without a recipe trains: the built-in defaults
    (BERT-base for 10,000 steps unless overridden), and which recipes there are."""
    import torch

    from bertgpu.config import overrides
    from bertgpu.models.build import build_model

    with torch.device("meta"):  # the parameter count, no memory
        model = build_model(overrides.config_to_dict(cfg.model), "pretraining", with_nsp=False)
    t = cfg.train
    steps = (f"train.max_steps {t.max_steps}" if not t.budget_hours
             else f"train.budget_hours {t.budget_hours}")
    folder = Path(__file__).resolve().parents[3] / "configs"
    names = sorted(p.stem for p in folder.glob("*.toml")) if folder.is_dir() else []
    recipes = f" (recipes in {folder}: {', '.join(names)})" if names else ""
    return (f"no recipe given: training the built-in defaults, {model_line(model, cfg.model)}, "
            f"for {steps} at global batch {t.global_batch_size} on impl.device "
            f"{cfg.impl.device}; give a recipe first, e.g. bertgpu pretrain configs/tiny.toml"
            f"{recipes}")


def startup_rows(cfg: Any, data: Any, model: Any, peak_lr: float, micro: int, accumulation: int,
                  info: Any) -> list[tuple[str, str]]:
    """The start-up table: data, model, the batch arithmetic, the learning rate, the all-reduce."""
    seq = data.train.seq_len
    t, s, d, o = cfg.train, cfg.schedule, cfg.distributed, cfg.optim
    return [
        ("run folder", str(cfg.out)),
        ("data",
         f"{data.dir} ({len(data.train):,} sequences x {seq} tokens, {data.train.objective})"),
        ("model", model_line(model, cfg.model)),
        ("masking", f"{cfg.data.mask_rate:.0%} of the tokens"
                    f"{whole_word_text(data.train) if cfg.data.whole_word_masking else ''} "
                    f"(validation {cfg.data.eval_mask_rate:.0%}"
                    f"{' of single tokens' if cfg.data.whole_word_masking else ''})"),
        ("compute", compute_text(cfg, info)),
        ("micro batch per device", str(micro)),
        ("accumulation steps", str(accumulation)),
        ("batch per device per step", str(micro * accumulation)),
        ("devices", str(info.world_size)),
        ("global batch (sequences/step)", str(t.global_batch_size)),
        ("tokens per step (at most)", f"{t.global_batch_size * seq:,}"),
        ("learning rate", f"{peak_lr:.3g} ({o.name}, lr_scaling {o.lr_scaling}, warm-up "
                          f"{warmup_text(cfg)}, {s.decay} decay)"),
        *([("gradient all-reduce", f"{info.backend}, once per step, buckets {d.bucket_cap_mb} MB, "
                                   f"comm hook {d.comm_hook}")]
          if info.world_size > 1 and d.strategy == "ddp" else []),
        *([("sharding", sharding_text(cfg, info))] if d.strategy == "fsdp" else []),
    ]


def whole_word_text(train: Any) -> str:
    """", whole words by ...": what says where words start (the shard set's
    `word_starts_source`), so a run shows which words it masks whole."""
    return f", whole words by {train.word_starts_source()}"


def compute_text(cfg: Any, info: Any) -> str:
    """Device, precision, compile (mode, CUDA graphs) and the attention layout, as resolved."""
    from bertgpu.config.sections import resolved_unpad

    impl, kind = cfg.impl, device_type(info)
    graphs = impl.cuda_graphs(kind)
    compiled = "eager"
    if impl.compile_on(kind):
        compiled = f"torch.compile ({impl.compile_mode}{', CUDA graphs' if graphs else ''})"
    unpad = resolved_unpad(impl.unpad, info.device, cfg.train.precision, graphs)
    static = ", MLM rows padded to one shape" if graphs else ""
    return (f"{info.device}, {cfg.train.precision}, {compiled}, "
            f"{'padding-free' if unpad else 'padded'} batches{static}")


def device_type(info: Any) -> str:
    """"cuda", "cpu", ... of the run's device ("cuda:1" -> "cuda")."""
    return str(info.device).split(":")[0]


def sharding_text(cfg: Any, info: Any) -> str:
    d = cfg.distributed
    ranks = f"{info.world_size} rank{'s' if info.world_size > 1 else ''}"
    mesh = (f"HSDP: {info.world_size // info.local_world_size} nodes x {info.local_world_size}"
            if d.shard_within_node else ranks)
    params = "bf16 all-gather, fp32 reduce" if cfg.train.precision == "bf16" else "fp32"
    return (f"fsdp (FSDP2) over {mesh}, per layer + root, {params}"
            f"{', CPU offload' if d.cpu_offload else ''}"
            f"{', checkpoints written in the background' if cfg.checkpoint.async_save else ''}")


def warmup_text(cfg: Any) -> str:
    s = cfg.schedule
    if s.warmup_steps is not None:
        return f"{s.warmup_steps} steps"
    return f"{(s.warmup_fraction or 0.0):.1%}"


def model_line(model: Any, c: Any) -> str:
    from bertgpu.models.shared import num_parameters

    return (f"{c.architecture}, {num_parameters(model) / 1e6:.1f} M parameters "
            f"(L={c.num_hidden_layers}, H={c.hidden_size}, A={c.num_attention_heads}, "
            f"V={c.vocab_size})")


def lamb_note(optim: Any, keys: tuple[str, str] = ("optim.name", "optim.weight_decay")
              ) -> str | None:
    """The start-up warning of LAMB with optim.weight_decay 0: LAMB's layer-wise trust ratio is
    applied to the groups with weight decay only (NVIDIA's FusedLAMB rule, train/optim.py), so
    every step is Adam's and the run is AdamW's under another name. `keys`: the command's names
    of the optimizer and the weight decay (fine-tuning's are flat: optimizer, weight_decay)."""
    if optim.name != "lamb" or optim.weight_decay != 0:
        return None
    name, decay = keys
    return (f"{name} lamb with {decay} 0: LAMB's trust ratio applies to the "
            "parameters with weight decay only (NVIDIA's FusedLAMB rule), so none gets it and "
            "every step is Adam's; expected a weight decay (BERT's recipes: 0.01), or "
            f"{name} adamw")

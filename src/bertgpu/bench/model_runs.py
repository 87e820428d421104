"""What `bench model` times: our model and transformers' on one grid point, every variant
(model x compile x padding) in one process, their timed steps interleaved.

`Models` holds both models of one architecture and size with identical weights (BERT: our
BertForPreTraining and transformers' with SDPA attention; ModernBERT: our ModernBertForMaskedLM
and transformers' with SDPA and its sparse MLM head), one optimizer each (AdamW, fused on CUDA)
and the compiled wrappers, made on first use (a wrapper shares its model's parameters). The
padded and unpadded variants of our model are the same module with `configure(unpad=...)` set
before each of its steps (the compiled wrapper keeps one graph for each).

`run_point` times the variants of one point: warm-up steps first (a compiled variant's compile
happens there, and its warm-up goes on, a few steps at most, until a step compiles nothing: a
CUDA-graph mode records in its second step), then `iters` rounds in which every variant takes
one step, the order reversed every other round. Forward, backward and the optimizer step are
timed apart (with a device synchronisation between them on CUDA). A row counts real
(non-padding) tokens, so padded and unpadded rows compare the work a user wants done; its ratios
are against transformers eager and compiled, and for an unpadded row against our padded row
with the same compile setting. `timed_compiles` counts timed steps during which torch compiled
(0 in a trustworthy row); `compile_s` is the time of the warm-up steps that compiled.
"""

from __future__ import annotations

import os
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from bertgpu.bench.batches import BERT_VOCAB, MODERN_SIZES, SIZES, make_batches
from bertgpu.telemetry.throughput import compile_events

ARCHS = ("bert", "modernbert")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_EXTRA_WARMUP = 4  # at most this many more warm-up steps while a compiled variant still compiles


@dataclass(frozen=True)
class Variant:
    """One row of a point: whose model, compiled or not, and (ours) padded or unpadded."""

    model: str  # "bertgpu" or "transformers" (always padded: it has no unpadding with SDPA)
    compile: bool
    padding: str = "padded"


class Models:
    """Ours and transformers' model of one architecture and size (see the module docstring)."""

    def __init__(self, arch: str, size: str, device: Any, names: list[str], grad_ckpt: bool,
                 seed: int, fused_qkv: bool = False, compile_mode: str = "default",
                 backend: str = "inductor") -> None:
        import torch

        from bertgpu.models.shared import ModelOptions
        from bertgpu.train.optim import build_optimizer

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import transformers

        self.arch, self.size = arch, size
        self.compile_mode, self.backend = compile_mode, backend
        self.transformers_version = transformers.__version__
        torch._dynamo.reset()  # the previous size's graphs: free them, and no cache limit hit
        torch.manual_seed(seed)
        ours = self._ours(ModelOptions(fused_qkv=fused_qkv, gradient_checkpointing=grad_ckpt))
        self.config = ours.config
        self.eager: dict[str, Any] = {}
        self.optimizers: dict[str, Any] = {}
        self._compiled: dict[str, Any] = {}
        for name in names:
            model = ours
            if name == "transformers":
                model = self._hf(transformers, ours)
                if grad_ckpt:
                    model.gradient_checkpointing_enable()
            self.eager[name] = model.to(device).train()
            self.optimizers[name] = build_optimizer(self.eager[name], "adamw", 1e-4)
        self.vocab = int(self.config.vocab_size)

    def _ours(self, options: Any) -> Any:
        from bertgpu.models.build import build_model

        if self.arch == "bert":
            fields = {"architecture": "bert", **SIZES[self.size], "vocab_size": BERT_VOCAB}
            model = build_model(fields, "pretraining")
        else:
            model = build_model({"architecture": "modernbert", **MODERN_SIZES[self.size]},
                                "masked_lm")
        model.configure(options)
        return model

    def _hf(self, transformers: Any, ours: Any) -> Any:
        """transformers' peer with our weights."""
        if self.arch == "bert":
            hf = transformers.BertForPreTraining(transformers.BertConfig(
                **SIZES[self.size], vocab_size=BERT_VOCAB, attn_implementation="sdpa"))
        else:
            fields = {**ours.config.to_dict(), "sparse_prediction": True}
            hf = transformers.ModernBertForMaskedLM(
                transformers.ModernBertConfig(**fields, attn_implementation="sdpa"))
        hf.load_state_dict(ours.state_dict())
        return hf

    def module(self, name: str, compiled: bool) -> Any:
        """The model to call: eager, or its compiled wrapper (one per model, static shapes: a new
        shape compiles a new graph rather than a dynamic one)."""
        import torch

        if not compiled:
            return self.eager[name]
        if name not in self._compiled:
            self._compiled[name] = torch.compile(self.eager[name], mode=self.compile_mode,
                                                 backend=self.backend, dynamic=False)
        return self._compiled[name]

    def compile_label(self, compiled: bool) -> str:
        if not compiled:
            return "off"
        return self.compile_mode if self.backend == "inductor" else f"{self.backend} backend"


class _Runner:
    """One variant: its module, optimizer, and the accumulated times of its timed steps."""

    def __init__(self, variant: Variant, models: Models, device: Any, autocast: Any) -> None:
        self.variant, self.device, self.autocast = variant, device, autocast
        self.model = models.module(variant.model, variant.compile)
        self.optimizer = models.optimizers[variant.model]
        self.ours = models.eager[variant.model] if variant.model == "bertgpu" else None
        self.times = {"fwd": 0.0, "bwd": 0.0, "opt": 0.0}
        self.steps = self.tokens = self.timed_compiles = 0
        self.compile_s = 0.0
        self.peak_bytes: int | None = None
        self.loss = float("nan")

    def _sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def step(self, batch: dict[str, Any], timed: bool) -> bool:
        """One training step; returns whether torch compiled during it."""
        import torch

        cuda = self.device.type == "cuda"
        if self.ours is not None:
            self.ours.configure(unpad=self.variant.padding == "unpadded")
        else:
            batch = {k: v for k, v in batch.items() if k != "batch_meta"}
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        events = compile_events()
        self._sync()
        t0 = time.perf_counter()
        with self.autocast():
            loss = self.model(**batch).loss
        self._sync()
        t1 = time.perf_counter()
        loss.backward()
        self._sync()
        t2 = time.perf_counter()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._sync()
        t3 = time.perf_counter()
        compiled = compile_events() != events
        self.loss = float(loss.detach())
        if not timed:
            self.compile_s += (t3 - t0) if compiled else 0.0
            return compiled
        self.timed_compiles += int(compiled)
        self.times["fwd"] += t1 - t0
        self.times["bwd"] += t2 - t1
        self.times["opt"] += t3 - t2
        self.steps += 1
        self.tokens += int(batch["attention_mask"].sum())
        if cuda:
            self.peak_bytes = max(self.peak_bytes or 0,
                                  torch.cuda.max_memory_allocated(self.device))
        return compiled


def _flops_per_token(config: Any, batches: list[dict[str, Any]], nsp: bool) -> tuple[float, float]:
    """Model FLOPs per real token of the batches (attention grows with each sequence's own
    length, so the per-sequence counts are weighted by their tokens) and the mean real length."""
    from bertgpu.telemetry.flops import flops_per_token_from_config

    lengths = [int(n) for b in batches for n in b["attention_mask"].sum(1).tolist()]
    masked = sum(int((b["labels"] != -100).sum()) for b in batches)
    tokens = sum(lengths)
    fraction = masked / max(tokens, 1)
    cache: dict[int, float] = {}
    total = 0.0
    for n in lengths:
        if n not in cache:
            cache[n] = flops_per_token_from_config(config, seq_len=max(n, 1),
                                                   mlm_fraction=fraction, with_nsp=nsp)
        total += n * cache[n]
    return total / max(tokens, 1), tokens / max(len(lengths), 1)


def run_point(models: Models, variants: list[Variant], micro_batch: int, seq_len: int,
              dtype: str, lengths: str, device: Any, iters: int, warmup: int, peak: float | None,
              seed: int, tokenizer: str | None = None, mask_rate: float = 0.15
              ) -> list[dict[str, Any]]:
    """Time `variants` on one point (see the module docstring); one row per variant."""
    import torch

    from bertgpu.telemetry.flops import mfu

    autocast = ((lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if dtype == "bf16"
                else nullcontext)
    nsp = models.arch == "bert"
    runners = [_Runner(v, models, device, autocast) for v in variants]
    batches = make_batches(max(2, min(iters, 4)), micro_batch, seq_len, models.vocab, lengths,
                           seed, device, mask_rate=mask_rate, nsp=nsp, tokenizer=tokenizer)
    for r in runners:
        compiled = r.variant.compile  # a compiled variant takes one warm-up step at least
        for i in range(warmup + _EXTRA_WARMUP if r.variant.compile else warmup):
            if i >= warmup and not compiled:
                break
            compiled = r.step(batches[i % len(batches)], timed=False)
    for i in range(iters):
        for r in (runners if i % 2 == 0 else runners[::-1]):  # alternate who goes first
            r.step(batches[i % len(batches)], timed=True)
    fpt, mean_length = _flops_per_token(models.config, batches, nsp)
    tps = {r.variant: r.tokens / max(sum(r.times.values()), 1e-12) for r in runners}
    hf_eager = tps.get(Variant("transformers", False))
    hf_compiled = tps.get(Variant("transformers", True))
    rows = []
    for r in runners:
        v, n = r.variant, max(r.steps, 1)
        padded = tps.get(Variant("bertgpu", v.compile, "padded"))
        rows.append(dict(
            bench="model", arch=models.arch, model=v.model, size=models.size,
            micro_batch=micro_batch, seq_len=seq_len, dtype=dtype, compile=v.compile,
            compile_mode=models.compile_label(v.compile), padding=v.padding, lengths=lengths,
            mean_length=round(mean_length, 1), mask_rate=mask_rate, iters=r.steps,
            fwd_ms=1e3 * r.times["fwd"] / n, bwd_ms=1e3 * r.times["bwd"] / n,
            opt_ms=1e3 * r.times["opt"] / n, step_ms=1e3 * sum(r.times.values()) / n,
            tokens_per_s=tps[v], mfu=mfu(tps[v], fpt, peak), flops_per_token=fpt,
            vs_hf_eager=tps[v] / hf_eager if hf_eager else None,
            vs_hf_compiled=tps[v] / hf_compiled if hf_compiled else None,
            unpadded_vs_padded=(tps[v] / padded if v.padding == "unpadded" and padded
                                else None),
            compile_s=round(r.compile_s, 2) if v.compile else None,
            timed_compiles=r.timed_compiles,
            mem_peak_gib=r.peak_bytes / 2**30 if r.peak_bytes is not None else None,
            loss=r.loss, transformers=models.transformers_version))
    del runners, batches
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


__all__ = ["ARCHS", "COMPILE_MODES", "Models", "Variant", "run_point"]

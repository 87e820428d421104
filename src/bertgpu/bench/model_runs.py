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
`block` steps in a row (1 on the CPU, 4 on CUDA), the order reversed every other round. A step
is timed as training runs it: on CUDA nothing waits for the device inside a block (no
synchronisation between forward, backward and the optimizer step, the loss read after the
block), so the host launches ahead and the device never idles for a sync the loop would not
make; the block's wall time (synchronised at both ends) gives tokens/s, CUDA events between the
phases give their split (fwd/bwd/opt ms, which add up to at most the step). On the CPU each
phase is timed by the clock. A row counts real
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
from bertgpu.config.sections import COMPILE_MODES
from bertgpu.telemetry.throughput import compile_events

ARCHS = ("bert", "modernbert")
# the dropout probabilities of each architecture's config that --dropout sets (the first is the
# one a row reports)
DROPOUTS = {"bert": ("hidden_dropout_prob", "attention_probs_dropout_prob"),
            "modernbert": ("mlp_dropout", "attention_dropout", "embedding_dropout")}
_EXTRA_WARMUP = 4  # at most this many more warm-up steps while a compiled variant still compiles


@dataclass(frozen=True)
class Variant:
    """One row of a point: whose model, compiled or not, and (ours) padded or unpadded."""

    model: str  # "bertgpu" or "transformers" (always padded: it has no unpadding with SDPA)
    compile: bool
    padding: str = "padded"
    mode: str = "default"  # torch.compile mode of a compiled variant (COMPILE_MODES)


class Models:
    """Ours and transformers' model of one architecture and size (see the module docstring)."""

    def __init__(self, arch: str, size: str, device: Any, names: list[str], grad_ckpt: bool,
                 seed: int, backend: str = "inductor", dropout: float | None = None) -> None:
        import torch

        from bertgpu.models.shared import ModelOptions
        from bertgpu.train.optim import build_optimizer

        self.arch, self.size = arch, size
        self.backend = backend
        # every dropout probability of both models, or None: each architecture's own
        self.overrides = {} if dropout is None else dict.fromkeys(DROPOUTS[arch], dropout)
        self.transformers_version: str | None = None  # ours alone: transformers not needed
        if "transformers" in names:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            import transformers

            self.transformers_version = transformers.__version__
        torch._dynamo.reset()  # the previous size's graphs: free them, and no cache limit hit
        torch.manual_seed(seed)
        ours = self._ours(ModelOptions(gradient_checkpointing=grad_ckpt))
        self.config = ours.config
        # what the rows ran with: the first of DROPOUTS[arch] stands for all of them
        self.dropout = float(getattr(self.config, DROPOUTS[arch][0]))
        self.eager: dict[str, Any] = {}
        self.optimizers: dict[str, Any] = {}
        self._compiled: dict[tuple[str, str], Any] = {}
        for name in names:
            model = ours
            if name == "transformers":
                model = self._hf(transformers, ours)
                if grad_ckpt:  # the newer name where it exists (the old one goes in v6)
                    getattr(model, "activation_checkpointing_enable",
                            model.gradient_checkpointing_enable)()
            self.eager[name] = model.to(device).train()
            self.optimizers[name] = build_optimizer(self.eager[name], "adamw", 1e-4)
        self.vocab = int(self.config.vocab_size)

    def _ours(self, options: Any) -> Any:
        from bertgpu.models.build import build_model

        if self.arch == "bert":
            fields = {"architecture": "bert", **SIZES[self.size], "vocab_size": BERT_VOCAB,
                      **self.overrides}
            model = build_model(fields, "pretraining")
        else:
            model = build_model({"architecture": "modernbert", **MODERN_SIZES[self.size],
                                 **self.overrides}, "masked_lm")
        model.configure(options)
        return model

    def _hf(self, transformers: Any, ours: Any) -> Any:
        """transformers' peer with our weights."""
        from bertgpu.models.layout import hf_state_dict

        if self.arch == "bert":
            hf = transformers.BertForPreTraining(transformers.BertConfig(
                **SIZES[self.size], vocab_size=BERT_VOCAB, attn_implementation="sdpa",
                **self.overrides))
        else:
            fields = {**ours.config.to_dict(), "sparse_prediction": True}
            hf = transformers.ModernBertForMaskedLM(
                transformers.ModernBertConfig(**fields, attn_implementation="sdpa"))
        hf.load_state_dict(hf_state_dict(ours))  # Hugging Face's names and shapes
        return hf

    def module(self, name: str, compiled: bool, mode: str = "default") -> Any:
        """The model to call: eager, or its compiled wrapper in torch.compile `mode` (one per model
        and mode, compiled as training compiles it: the metadata's varying lengths marked
        dynamic by `BatchMeta.to`; every batch of a point has the same shapes anyway)."""
        import torch

        if not compiled:
            return self.eager[name]
        if (name, mode) not in self._compiled:
            self._compiled[name, mode] = torch.compile(self.eager[name], mode=mode,
                                                       backend=self.backend)
        return self._compiled[name, mode]

    def compile_label(self, variant: Variant) -> str:
        if not variant.compile:
            return "off"
        if self.backend == "inductor":
            return variant.mode
        backend = f"{self.backend} backend"  # which may ignore the mode (eager does)
        return backend if variant.mode == "default" else f"{variant.mode}, {backend}"


class _Runner:
    """One variant: its module, optimizer, and the accumulated times of its timed steps."""

    def __init__(self, variant: Variant, models: Models, device: Any, autocast: Any) -> None:
        self.variant, self.device, self.autocast = variant, device, autocast
        self.model = models.module(variant.model, variant.compile, variant.mode)
        self.optimizer = models.optimizers[variant.model]
        self.ours = models.eager[variant.model] if variant.model == "bertgpu" else None
        self.times = {"fwd": 0.0, "bwd": 0.0, "opt": 0.0}
        self.wall_s = 0.0  # timed blocks, synchronised at both ends
        self.steps = self.tokens = self.timed_compiles = 0
        self.compile_s = 0.0
        self.peak_bytes: int | None = None
        self._loss: Any = None
        self._marks: list[Any] = []  # CUDA events of the timed steps: (start, fwd, bwd, opt)

    @property
    def loss(self) -> float:
        return float("nan") if self._loss is None else float(self._loss)

    def _sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _mark(self, stamps: list[Any]) -> None:
        import torch

        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            stamps.append(event)
        else:
            stamps.append(time.perf_counter())

    def step(self, batch: dict[str, Any], timed: bool, tokens: int) -> bool:
        """One training step; returns whether torch compiled during it. `tokens`: the batch's
        real tokens, counted on the host (a count of the device tensor would be a sync)."""
        if self.ours is not None:
            self.ours.configure(unpad=self.variant.padding == "unpadded")
        else:
            batch = {k: v for k, v in batch.items() if k != "batch_meta"}
        events = compile_events()
        stamps: list[Any] = []
        if not timed:
            self._sync()
        t0 = time.perf_counter()
        self._mark(stamps)
        with self.autocast():
            loss = self.model(**batch).loss
        self._mark(stamps)
        loss.backward()
        self._mark(stamps)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._mark(stamps)
        compiled = compile_events() != events
        # a copy: a CUDA-graph mode overwrites its outputs when a graph (this or another
        # variant's) replays, and the loss is read after the others' steps
        self._loss = loss.detach().clone()
        if not timed:
            self._sync()
            self.compile_s += (time.perf_counter() - t0) if compiled else 0.0
            return compiled
        self.timed_compiles += int(compiled)
        self._marks.append(stamps)
        self.steps += 1
        self.tokens += tokens
        return compiled

    def block(self, batches: list[tuple[dict[str, Any], int]]) -> None:
        """Timed steps back to back, the device synchronised before the first and after the
        last only."""
        import torch

        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        self._sync()
        t0 = time.perf_counter()
        for batch, tokens in batches:
            self.step(batch, timed=True, tokens=tokens)
        self._sync()
        self.wall_s += time.perf_counter() - t0
        for s in self._marks:  # phase split: events (ms) on CUDA, clock (s) on the CPU
            gaps = ([a.elapsed_time(b) / 1e3 for a, b in zip(s, s[1:], strict=False)] if cuda
                    else [b - a for a, b in zip(s, s[1:], strict=False)])
            for key, gap in zip(("fwd", "bwd", "opt"), gaps, strict=True):
                self.times[key] += gap
        self._marks.clear()
        if cuda:
            self.peak_bytes = max(self.peak_bytes or 0,
                                  torch.cuda.max_memory_allocated(self.device))


def _flops_per_token(config: Any, batches: list[dict[str, Any]], nsp: bool) -> tuple[float, float]:
    """Model FLOPs per real token of the batches (`flops_per_real_token`: each sequence counted at
    its own length, as fine-tuning counts its training set) and the mean real length."""
    from bertgpu.telemetry.flops import flops_per_real_token

    lengths = [int(n) for b in batches for n in b["attention_mask"].sum(1).tolist()]
    masked = sum(int((b["labels"] != -100).sum()) for b in batches)
    tokens = sum(lengths)
    fpt = flops_per_real_token(config, lengths, mlm_fraction=masked / max(tokens, 1),
                               with_nsp=nsp)
    return fpt, tokens / max(len(lengths), 1)


def run_point(models: Models, variants: list[Variant], micro_batch: int, seq_len: int,
              dtype: str, lengths: str, device: Any, iters: int, warmup: int, peak: float | None,
              seed: int, tokenizer: str | None = None, mask_rate: float = 0.15,
              peak_source: str | None = None) -> list[dict[str, Any]]:
    """Time `variants` on one point (see the module docstring); one row per variant. Its MFU is
    over `peak` TFLOP/s of one device (None: no MFU), which the row records beside it
    (`peak_tflops`, and `peak_source`: where that number came from)."""
    import torch

    from bertgpu.telemetry.flops import mfu

    autocast = ((lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if dtype == "bf16"
                else nullcontext)
    nsp = models.arch == "bert"
    runners = [_Runner(v, models, device, autocast) for v in variants]
    batches = make_batches(max(2, min(iters, 4)), micro_batch, seq_len, models.vocab, lengths,
                           seed, device, mask_rate=mask_rate, nsp=nsp, tokenizer=tokenizer)
    real = [int(b["attention_mask"].sum()) for b in batches]  # once, before any timing
    for r in runners:
        compiled = r.variant.compile  # a compiled variant takes one warm-up step at least
        for i in range(warmup + _EXTRA_WARMUP if r.variant.compile else warmup):
            if i >= warmup and not compiled:
                break
            compiled = r.step(batches[i % len(batches)], timed=False, tokens=real[i % len(real)])
    block = 4 if device.type == "cuda" else 1
    for i in range(iters):
        for r in (runners if i % 2 == 0 else runners[::-1]):  # alternate who goes first
            r.block([(batches[j % len(batches)], real[j % len(real)])
                     for j in range(i * block, (i + 1) * block)])
    fpt, mean_length = _flops_per_token(models.config, batches, nsp)
    tps = {r.variant: r.tokens / max(r.wall_s, 1e-12) for r in runners}
    hf_eager = tps.get(Variant("transformers", False))
    hf_default = tps.get(Variant("transformers", True))
    rows = []
    for r in runners:
        v, n = r.variant, max(r.steps, 1)
        padded = tps.get(Variant("bertgpu", v.compile, "padded", v.mode))
        # transformers compiled in the same mode, else in the default mode (the peer a user picks)
        hf_compiled = tps.get(Variant("transformers", True, "padded", v.mode)) or hf_default
        rows.append(dict(
            bench="model", arch=models.arch, model=v.model, size=models.size,
            micro_batch=micro_batch, seq_len=seq_len, dtype=dtype, compile=v.compile,
            compile_mode=models.compile_label(v), padding=v.padding, lengths=lengths,
            mean_length=round(mean_length, 1), mask_rate=mask_rate, iters=r.steps,
            fwd_ms=1e3 * r.times["fwd"] / n, bwd_ms=1e3 * r.times["bwd"] / n,
            opt_ms=1e3 * r.times["opt"] / n, step_ms=1e3 * r.wall_s / n,
            tokens_per_s=tps[v], mfu=mfu(tps[v], fpt, peak), peak_tflops=peak,
            peak_source=peak_source if peak is not None else None, flops_per_token=fpt,
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

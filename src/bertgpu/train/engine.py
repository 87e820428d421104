"""The one optimizer step shared by pretraining and fine-tuning.

`Engine.train_step(micro_batches, loss_fn, count_fn)` owns everything that must be exactly right
and is easy to get subtly wrong: gradient accumulation, loss normalisation over the whole step,
DDP synchronisation once per step, autocast, the fp16 loss scaler, clipping, and skipping
non-finite steps consistently on every rank.

Normalisation. `loss_fn` returns *summed* losses per term (e.g. MLM cross-entropy summed over
masked tokens) and `count_fn` the matching counts. The counts of all micro batches on all ranks
are summed *before* the first backward, and each micro batch contributes
``sum_k loss_sum[k] / total_count[k]`` to the gradient. Micro batches then carry their true weight
(a micro batch with 3 masked tokens weighs 3/N, not 1/k), so accumulation k x (B/k) equals one
batch B, and DP=2 equals DP=1 with accumulation 2 (the Megatron-LM convention of normalising by
the global number of tokens, rather than averaging per-micro-batch means).

DDP and FSDP average gradients over ranks, so the loss is multiplied by world_size before
backward (the sum the normalisation expects). FSDP's micro-steps before the last neither reduce
nor reshard (`sharding.accumulating`), and clipping takes the sharded gradients' global norm.

No host sync before the update. Whether a step is skipped is decided on the device: the summed
non-finite flags become a 0/1 `found_inf` that the optimizer's own kernels honour (torch's fused
AdamW, our LAMB: weights, moments and step counts stay as they were), and the fp16 scaler backs
off by the same flag. The loss, the grad norm and the flag reach the host afterwards (on CUDA
a pinned copy queued behind the update), read one step late, at the end of the next
`train_step`, or when first asked for (the loop's log line, evaluation, a checkpoint). Reading
a step applies its counters in order (skipped steps, the run of non-finite ones, the abort after
`max_nonfinite_steps`, the hook's reset): only their moment moves. On the CPU every step is
read at its end. An optimizer that cannot skip on the device (RAdam, a foreach AdamW) gets the
host's decision before its step.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from bertgpu.config.sections import (
    PRECISIONS,
    DistributedSection,
    ImplSection,
    OptimSection,
    TrainSection,
)
from bertgpu.errors import BertgpuError
from bertgpu.train import distributed, sharding
from bertgpu.train.readback import (
    PendingStep,
    StepNumbers,
    StepResult,
    TrainingDiverged,
    diverged_message,
)

Batch = Mapping[str, Any]
LossFn = Callable[[torch.nn.Module, Batch], Mapping[str, torch.Tensor]]
CountFn = Callable[[Batch], Mapping[str, Any]]


def _to_device(batch: Batch, device: torch.device) -> dict[str, Any]:
    """Tensors, and objects that move like them (the loader's `BatchMeta`), onto `device`;
    non_blocking pays off with pinned host memory (the loader pins on CUDA)."""
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            value = value.to(device, non_blocking=True) if value.device != device else value
        elif callable(getattr(value, "to", None)):
            value = value.to(device, non_blocking=True)
        out[key] = value
    return out


def make_grad_scaler(device_type: str) -> Any:
    """A `torch.amp.GradScaler` for `device_type`; BertgpuError where this torch cannot."""
    try:
        return torch.amp.GradScaler(device_type)
    except (AttributeError, TypeError, RuntimeError, ValueError) as exc:
        if device_type == "cuda":
            return torch.cuda.amp.GradScaler()
        raise BertgpuError(f"train.precision fp16: this torch ({torch.__version__}) has no loss "
                           f"scaler for {device_type}; use bf16 or fp32 ({exc})") from None


class Engine:
    """Owns AMP, accumulation, DDP/FSDP sync, clipping and skipping for one model + optimizer.

    `lr_fn()` gives the lr of the step about to be taken, set on every param group before
    `optimizer.step()`. `ddp=None` detects a DDP-wrapped model; an FSDP2-sharded one is always
    detected. `read_late` (default: on CUDA) reads a step's numbers at the end of the next step
    (module docstring); `on_skipped(step, in_row)` hears of every skipped step when it is read.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        precision: str = "fp32",
        device: str | torch.device = "cpu",
        grad_clip: float | None = 1.0,
        max_nonfinite_steps: int = 5,
        lr_fn: Callable[[], float] | None = None,
        ddp: bool | None = None,
        grads_are_bucket_views: bool = False,
        on_numerics_reset: Callable[[], None] | None = None,
        read_late: bool | None = None,
        stable_grads: bool = False,
    ) -> None:
        if precision not in PRECISIONS:
            raise BertgpuError(f"train.precision {precision!r}: expected one of "
                               f"{', '.join(PRECISIONS)}")
        self.model = model
        self.optimizer = optimizer
        self.precision = precision
        self.device = torch.device(device)
        self.grad_clip = grad_clip
        self.max_nonfinite_steps = max_nonfinite_steps
        self.lr_fn = lr_fn
        if ddp is None:
            from torch.nn.parallel import DistributedDataParallel

            ddp = isinstance(model, DistributedDataParallel)
        self.ddp = ddp
        self.sharded = sharding.is_sharded(model)
        # Gradients zeroed in place, never None, where they must stay one buffer: DDP's
        # gradient_as_bucket_view (.grad aliases the all-reduce buckets), and CUDA graphs (a
        # compiled backward's gradient lives in the graphs' pool, which the next replay
        # overwrites: copied out once, then zeroed in place; parameters without one keep None).
        self.set_grads_to_none = not (grads_are_bucket_views or stable_grads)
        self.stable_grads = stable_grads and not grads_are_bucket_views
        self._grads_to_copy = self.stable_grads  # until the first backward's are copied out
        # after a skipped step or an fp16 scale change: distributed.reset_comm_hook_state
        self.on_numerics_reset = on_numerics_reset
        self.on_skipped: Callable[[int, int], None] | None = None
        self.advice: dict[str, str] | None = None  # TrainingDiverged's keys (readback.py)
        self.read_late = self.device.type == "cuda" if read_late is None else read_late
        self.scaler = make_grad_scaler(self.device.type) if precision == "fp16" else None
        # Counters (saved in checkpoints): each has one meaning.
        self.step = 0  # train_step calls, skipped ones included
        self.micro_step = 0  # forward/backward passes on this rank
        self._skipped_steps = 0  # steps whose update was not applied
        self._nonfinite_in_row = 0  # consecutive skipped steps, any cause; abort at the maximum
        self._unread: list[PendingStep] = []  # steps the host has not applied yet, in order

    @property
    def skipped_steps(self) -> int:
        """Steps whose update was not applied (non-finite loss or gradients), read so far."""
        self.read_all()
        return self._skipped_steps

    @property
    def skipped_read(self) -> int:
        """`skipped_steps` of the steps read so far: reads none (a record of a step read)."""
        return self._skipped_steps

    @property
    def nonfinite_in_row(self) -> int:
        """Consecutive skipped steps up to the newest step (any cause)."""
        self.read_all()
        return self._nonfinite_in_row

    # -- autocast -------------------------------------------------------------------------------
    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The autocast context of this precision (a no-op for fp32); also usable for eval."""
        if self.precision == "fp32":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def _params(self) -> list[torch.nn.Parameter]:
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    def current_lr(self) -> float:
        return (float(self.lr_fn()) if self.lr_fn is not None
                else float(self.optimizer.param_groups[0]["lr"]))

    def skips_on_device(self) -> bool:
        """The optimizer honours `found_inf` (torch's fused kernels, our LAMB): a step is
        skipped without the host reading the flag first."""
        return bool(getattr(self.optimizer, "_step_supports_amp_scaling", False))

    # -- the step -------------------------------------------------------------------------------
    def train_step(
        self,
        micro_batches: Sequence[Batch],
        loss_fn: LossFn,
        count_fn: CountFn,
        signals: Mapping[str, float] | None = None,
    ) -> StepResult:
        """Forward/backward every micro batch, then one (collectively skipped or applied) update.

        `count_fn` must return the same keys on every rank (e.g. {"mlm": ..., "nsp": ...}), and
        every loss term returned by `loss_fn` needs a count of the same name; keys starting with
        "_" are extra scalars that are only summed and reported (e.g. "_mlm_correct").

        `signals` (the same keys on every rank) are summed over ranks in the count all-reduce the
        step does anyway and returned in `StepResult.signals`: the loop's preemption flag and
        rank 0's clocks travel there instead of in collectives of their own."""
        if not micro_batches:
            raise ValueError("train_step needs at least one micro batch")
        t0 = time.perf_counter()
        totals, signals_out = self._global_counts(micro_batches, count_fn, signals or {})
        divisors = {k: max(v, 1.0) for k, v in totals.items()}  # a term with no items adds 0
        term_sums, extras = self._accumulate(micro_batches, loss_fn, divisors)
        grad_norm = self._unscale_and_clip()
        keys, extra_keys = sorted(totals), sorted(extras)
        summed = self._reduce_terms(keys, term_sums, extra_keys, extras, grad_norm)
        # The summed flags are > 0 when the loss or the gradients were non-finite on any rank:
        # the same 0/1 on every rank, one policy wherever the cause.
        found_inf = (summed[len(keys) + len(extra_keys):].sum() > 0).to(self.device,
                                                                         torch.float32)
        lr = self.current_lr()
        self.step += 1
        vector = torch.cat([summed.to(self.device), grad_norm.reshape(1).double()])
        on_device = self.skips_on_device()
        scale = self._scale_tensor()  # fp16: the loss scale of this step (`StepNumbers`)
        vector = vector if scale is None else torch.cat([vector, scale])
        if on_device:
            self._apply(lr, found_inf)
            if scale is not None:  # and after it, for a compression hook
                vector = torch.cat([vector, self._scale_tensor()])
        pending = PendingStep(self.step, lr, vector, keys, extra_keys, divisors)
        if not on_device:  # the host decides before the update, as torch's non-fused optimizers
            numbers = pending.read()
            hooked = self.scaler is not None and self.on_numerics_reset is not None  # see _count
            before = self.scaler.get_scale() if hooked else None  # after: waits for the update
            self._apply(lr, found_inf, host_skip=numbers.skipped)
            numbers.scale_changed = hooked and self.scaler.get_scale() != before
        self._unread.append(pending)
        if not (self.read_late and on_device):
            self.read_all()
        elif self.on_numerics_reset is None:
            self._read_through(self.step - 1)  # its copy is queued behind this step's kernels
        return StepResult(lr=lr, counts={k: int(round(v)) for k, v in totals.items()},
                          step_s=time.perf_counter() - t0, micro_batches=len(micro_batches),
                          step=self.step, signals=signals_out,
                          read=lambda: self._numbers_of(pending))

    def _global_counts(self, micro_batches: Sequence[Batch], count_fn: CountFn,
                       signals: Mapping[str, float]
                       ) -> tuple[dict[str, float], dict[str, float]]:
        """Counts of all micro batches on all ranks, and the signals summed over ranks: one
        all-reduce of a small float64 vector, before any backward (host numbers only, without
        a process group)."""
        local: dict[str, float] = {}
        for mb in micro_batches:
            for key, value in count_fn(mb).items():
                local[key] = local.get(key, 0.0) + float(value)
        keys, signal_keys = sorted(local), sorted(signals)
        if not distributed.is_initialized():
            return {k: local[k] for k in keys}, {k: float(signals[k]) for k in signal_keys}
        vector = torch.tensor([local[k] for k in keys] + [float(signals[k]) for k in signal_keys],
                              dtype=torch.float64)
        summed = distributed.host_all_reduce_sum(vector).tolist()
        return (dict(zip(keys, summed[: len(keys)], strict=True)),
                dict(zip(signal_keys, summed[len(keys):], strict=True)))

    def _accumulate(self, micro_batches: Sequence[Batch], loss_fn: LossFn,
                    divisors: Mapping[str, float]
                    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Forward and backward of every micro batch, each weighted by the step's global counts;
        DDP all-reduces on the last micro batch only. Returns this rank's summed loss terms and
        extra sums (detached)."""
        self.optimizer.zero_grad(set_to_none=self.set_grads_to_none)
        # DDP and FSDP average over ranks; we want sums.
        loss_scale = float(distributed.get_world_size()) if self.ddp or self.sharded else 1.0
        term_sums: dict[str, torch.Tensor] = {}
        extras: dict[str, torch.Tensor] = {}
        n = len(micro_batches)
        for i, mb in enumerate(micro_batches):
            if self.sharded:
                sharding.accumulating(self.model, i < n - 1)
            sync = self.model.no_sync() if self.ddp and i < n - 1 else contextlib.nullcontext()  # type: ignore[operator]
            with sync:  # covers forward too: DDP reads the sync flag in forward
                batch = _to_device(mb, self.device)
                with self.autocast():
                    out = loss_fn(self.model, batch)
                loss = torch.zeros((), dtype=torch.float32, device=self.device)
                for key, value in out.items():
                    value32 = value.float()
                    if key.startswith("_"):
                        extras[key] = extras.get(key, 0.0) + value32.detach()
                        continue
                    if key not in divisors:
                        raise KeyError(f"loss_fn returned {key!r} but count_fn has no count for it")
                    loss = loss + value32 / divisors[key]
                    term_sums[key] = term_sums.get(key, 0.0) + value32.detach()
                scaled = loss * loss_scale
                if i == n - 1 and self.on_numerics_reset is not None:
                    self.read_all()  # a reset clears a hook's state before the backward runs it
                (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
            if self._grads_to_copy:
                self._copy_grads_out()
            self.micro_step += 1
        return term_sums, extras

    def _copy_grads_out(self) -> None:
        """Each .grad the first backward made, as a copy in ordinary memory (`stable_grads`)."""
        with torch.no_grad():
            for p in self._params():
                if p.grad is not None:
                    p.grad = p.grad.clone()
        self._grads_to_copy = False

    def _unscale_and_clip(self) -> torch.Tensor:
        """Unscale (fp16), then measure and clip the true gradient norm: clipping a scaled
        gradient would compare the threshold against a norm multiplied by the loss scale.
        Gradients in CPU memory get a float64 norm: torch's fp32 CPU norm of BERT-base's word
        embeddings runs 1.5% low. GPU reductions are tree-shaped: the fused fp32 path."""
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        max_norm = self.grad_clip if self.grad_clip and self.grad_clip > 0 else math.inf
        params = [p for p in self._params() if p.grad is not None]
        if not params:
            return torch.zeros((), device=self.device)
        grads = [p.grad for p in params]
        if grads[0].device.type == "cpu":  # the CPU, or fsdp's cpu_offload
            norms = [torch.linalg.vector_norm(g, dtype=torch.float64) for g in grads]
            norm = torch.linalg.vector_norm(torch.stack(norms))
        else:
            norm = torch.nn.utils.get_total_norm(grads)  # clip_grad_norm_'s own, fused
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
        # Sharded gradients (DTensors): a replicated DTensor, the global norm on every rank.
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        return norm.to(self.device)

    def _reduce_terms(self, keys: list[str], term_sums: Mapping[str, torch.Tensor],
                      extra_keys: list[str], extras: Mapping[str, torch.Tensor],
                      grad_norm: torch.Tensor) -> torch.Tensor:
        """One all-reduce for the loss terms, the extras and the non-finite flags (summing a flag
        is OR): a float64 vector that stays on the device. Packed by the count keys (the same on
        every rank), not by what this rank's loss_fn happened to return, so every rank
        all-reduces a vector of the same length."""
        zero = torch.zeros((), device=self.device)
        terms = [torch.as_tensor(term_sums.get(k, zero), device=self.device).reshape(())
                 for k in keys]
        local_loss = sum(terms, zero)
        packed = torch.stack(
            [x.double() for x in terms]
            + [torch.as_tensor(extras[k], device=self.device).reshape(()).double()
               for k in extra_keys]
            + [(~torch.isfinite(local_loss)).double(),
               (~torch.isfinite(grad_norm.float())).double()]
        )
        if not distributed.is_initialized():  # one process: the vector stays where it is
            return packed
        return distributed.all_reduce_sum(packed.to(distributed.collective_device()))

    def _apply(self, lr: float, found_inf: torch.Tensor, host_skip: bool | None = None) -> None:
        """The update with learning rate `lr`, made a no-op by `found_inf` (0-dim, 0 or 1) in the
        optimizer's kernels, or skipped by the host's `host_skip`; through the fp16 scaler, whose
        scale backs off by the same flag."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.scaler is not None:
            self._share_found_inf(found_inf)
            self.scaler.step(self.optimizer)  # a fused optimizer gets found_inf, others a check
            self.scaler.update()  # x backoff and growth interval restarted, or growth, on device
        elif host_skip is None:
            self.optimizer.found_inf, self.optimizer.grad_scale = found_inf, None  # type: ignore[attr-defined]
            try:
                self.optimizer.step()
            finally:
                del self.optimizer.found_inf, self.optimizer.grad_scale  # type: ignore[attr-defined]
        elif not host_skip:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=self.set_grads_to_none)

    def _share_found_inf(self, found_inf: torch.Tensor) -> None:
        """The scaler recorded this rank's own found_inf in `unscale_`; the step's decision is
        the global flag (loss or gradients, any rank), so that record becomes the flag: one
        device carries it, the others 0 (the scaler sums them)."""
        record = self.scaler._per_optimizer_states[id(self.optimizer)]["found_inf_per_device"]
        for i, found in enumerate(record.values()):
            if i == 0:
                found.copy_(found_inf)
            else:
                found.zero_()

    def _scale_tensor(self) -> torch.Tensor | None:
        """The fp16 loss scale as a (1,) float64 device tensor (no sync); None without one."""
        if self.scaler is None:
            return None
        return self.scaler._get_scale_async().detach().double().reshape(1).clone()

    # -- reading the steps' numbers -------------------------------------------------------------
    def read_all(self) -> None:
        """Read every step so far and apply its counters (may raise TrainingDiverged)."""
        self._read_through(self.step)

    def _read_through(self, step: int) -> None:
        while self._unread and self._unread[0].step <= step:
            pending = self._unread.pop(0)  # first: an abort must not be raised twice
            self._count(pending, pending.read())

    def _numbers_of(self, pending: PendingStep) -> StepNumbers:
        if any(p is pending for p in self._unread):
            self._read_through(pending.step)
        return pending.read()

    def _count(self, pending: PendingStep, numbers: StepNumbers) -> None:
        """One policy for every non-finite step, whatever its cause (loss or gradients, fp16 or
        bf16, any rank): the update was not applied anywhere and the fp16 scale backed off (in
        the step), it is counted, a compression hook's state is cleared, and
        `max_nonfinite_steps` in a row stop the run."""
        if not numbers.skipped:
            self._nonfinite_in_row = 0
            if numbers.scale_changed and self.on_numerics_reset is not None:
                self.on_numerics_reset()  # a hook's stored error is in the old scale's units
            return
        self._skipped_steps += 1
        self._nonfinite_in_row += 1
        if self.on_numerics_reset is not None:
            self.on_numerics_reset()
        if self._nonfinite_in_row >= self.max_nonfinite_steps and not numbers.calibrating:
            raise TrainingDiverged(diverged_message(self._nonfinite_in_row, pending.step, numbers,
                                                    pending.lr, self.precision, self.grad_clip,
                                                    self.advice), pending.step, numbers, pending.lr)
        if self.on_skipped is not None:
            self.on_skipped(pending.step, self._nonfinite_in_row)

    # -- checkpointing --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        self.read_all()  # a checkpoint must not lose a step the host has not read yet
        return {
            "step": self.step,
            "micro_step": self.micro_step,
            "skipped_steps": self._skipped_steps,
            "nonfinite_in_row": self._nonfinite_in_row,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
        }

    def state_later(self) -> Callable[[], dict[str, Any]]:
        """`state_dict()` of now, read when called (the preemption snapshot before every step:
        read now, the host would wait for the device). Valid until the next step is applied."""
        step, micro_step = self.step, self.micro_step
        def state() -> dict[str, Any]:
            if self.step != step:
                raise RuntimeError(f"the engine state of step {step} read at step {self.step}")
            return {**self.state_dict(), "micro_step": micro_step}
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._unread.clear()
        self.step = int(state["step"])
        self.micro_step = int(state.get("micro_step", 0))
        self._skipped_steps = int(state.get("skipped_steps", 0))
        self._nonfinite_in_row = int(state.get("nonfinite_in_row", 0))
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])


def build_engine(model: torch.nn.Module, info: distributed.DistInfo, *, lr: float,
                 train: TrainSection, optim: OptimSection, impl: ImplSection,
                 dist: DistributedSection
                 ) -> tuple[Engine, distributed.CommTimer | None]:
    """Optimizer, DDP or FSDP, and compile around `model` (already on its device), and the
    engine, from the config sections as they are; `lr` is the peak learning rate (after any
    batch scaling).

    DDP wraps first and torch.compile wraps DDP, the order PyTorch recommends: the compiled
    graph is split at DDP's bucket boundaries so gradient all-reduces overlap the backward.
    FSDP shards the model in place (`dist.strategy` "fsdp") and the optimizer is built after,
    over the sharded parameters; torch.compile then wraps the sharded model."""
    from bertgpu.train.optim import build_optimizer

    device = torch.device(info.device)
    if device.type == "cuda" and train.precision == "fp32":  # TF32 matmuls (MFU: its peak)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    sharded = dist.strategy == "fsdp"
    measure = info.distributed and dist.measure_comm and not sharded  # DDP's comm hook
    timer = distributed.CommTimer(device) if measure else None
    if sharded:  # the parameters become DTensor shards: the optimizer must see those
        train_model = sharding.wrap_model(model, info, dist, precision=train.precision)
    optimizer = build_optimizer(model, optim.name, lr, weight_decay=optim.weight_decay,
                                betas=tuple(optim.betas), eps=optim.eps)
    if not sharded:
        train_model = sharding.wrap_model(model, info, dist, timer=timer)
    is_ddp = train_model is not model
    hook_state = getattr(train_model, "comm_hook_state", None)
    if impl.compile_on(device.type):
        train_model = torch.compile(train_model, mode=impl.compile_mode)
    engine = Engine(train_model, optimizer, precision=train.precision, device=device,
                    stable_grads=impl.cuda_graphs(device.type),
                    grad_clip=train.grad_clip, max_nonfinite_steps=train.max_nonfinite_steps,
                    ddp=is_ddp, grads_are_bucket_views=is_ddp and dist.gradient_as_bucket_view,
                    on_numerics_reset=(lambda: distributed.reset_comm_hook_state(hook_state))
                    if hook_state is not None else None)
    return engine, timer


def seed_dropout(seed: int, rank: int) -> None:
    """Dropout noise differs per rank (different data, different noise), from (seed, rank)."""
    torch.manual_seed(seed * 1000003 + rank)


"""Optimizers: parameter groups (no weight decay on biases and norms), AdamW, RAdam, LAMB.

AdamW is torch's fused kernel on CUDA and CPU (one multi-tensor kernel for all parameters; on the
CPU 4.7x faster than the per-tensor loop at BERT-base, benchmarks/optim_step.py) and foreach
elsewhere; RAdam is torch's foreach. LAMB (You et al. 2019, "Large Batch Optimization for Deep
Learning: Training BERT in 76 minutes", Algorithm 2) is not in torch, so it is written here with
torch's multi-tensor kernels: a handful of launches per parameter group, not a few per tensor,
and its step compiles to one graph. The layer-wise trust ratio is what lets BERT train at batch
32k-64k, and NVIDIA's BERT recipe uses it for the same reason. As in that recipe (apex's
`multi_tensor_lamb` without `use_nvlamb`: "only apply to those with non-zero weight decay") and
Google's TF LAMB (`exclude_from_layer_adaptation`), the ratio scales only the decayed group: the
biases and LayerNorm weights take Adam's step. With the ratio, a bias that starts at 0 stays
pinned near 0: after step 1 each step's norm is lr * ||b||, so ||b|| grows (1 + lr)-fold a step
at most.

AdamW (fused) and LAMB honour `found_inf` / `grad_scale` on the device (torch's convention, set by
GradScaler and by the engine): a step with found_inf = 1 leaves weights, moments and step counts as
they were, so a non-finite step is skipped without the host reading a flag first.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from bertgpu.config.sections import OPTIMIZERS
from bertgpu.errors import BertgpuError

# Devices with torch's fused Adam kernels (and found_inf in them) in every torch we support.
FUSED_DEVICES = ("cuda", "cpu")


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two groups: decayed matrices, and undecayed biases / LayerNorm weights / any 1-D tensor.

    Decaying a bias or a norm gain pulls it towards 0, which is never what anyone wants (BERT's
    original code excludes "bias" and "LayerNorm"; we also exclude every 1-D parameter)."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:  # tied weights appear once
            continue
        seen.add(id(p))
        parts = name.lower().split(".")
        owner = parts[-2] if len(parts) > 1 else ""  # the module holding the parameter
        if p.ndim < 2 or parts[-1] == "bias" or "norm" in owner:
            no_decay.append(p)
        else:
            decay.append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def adam_direction(params: list[torch.Tensor], exp_avgs: list[torch.Tensor],
                   exp_avg_sqs: list[torch.Tensor], bc1: Any, bc2: Any, eps: float,
                   wd: float) -> list[torch.Tensor]:
    """r = m_hat / (sqrt(v_hat) + eps) + wd * w from the moments and the bias corrections, in six
    foreach passes: LAMB's way where no fused Adam kernel writes r (and the older LAMBs'
    in benchmarks/optim_step.py)."""
    denom = torch._foreach_div(exp_avg_sqs, bc2)
    torch._foreach_sqrt_(denom)
    torch._foreach_add_(denom, eps)
    updates = torch._foreach_div(exp_avgs, bc1)
    torch._foreach_div_(updates, denom)
    if wd != 0.0:
        torch._foreach_add_(updates, params, alpha=wd)
    return updates


def _on_fused_devices(params: Iterable[torch.Tensor]) -> bool:
    params = list(params)
    return bool(params) and all(p.device.type in FUSED_DEVICES for p in params)


def build_optimizer(
    model: torch.nn.Module,
    name: str,
    lr: float,
    weight_decay: float = 0.01,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-6,
    fused: bool | None = None,
) -> torch.optim.Optimizer:
    """The optimizer `name` ("adamw", "lamb", "radam") over `param_groups(model, weight_decay)`.

    `fused=None` picks torch's fused AdamW kernel where every parameter is on CUDA or the CPU,
    and foreach elsewhere."""
    groups = param_groups(model, weight_decay)
    params = [p for g in groups for p in g["params"]]
    betas = (float(betas[0]), float(betas[1]))
    if name == "adamw":
        use_fused = _on_fused_devices(params) if fused is None else fused
        kwargs: dict[str, Any] = {"fused": True} if use_fused else {"foreach": True}
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, **kwargs)
    if name == "radam":
        # Decoupled decay (AdamW-style) matches the other two; torch >= 2.2 has the flag.
        try:
            return torch.optim.RAdam(groups, lr=lr, betas=betas, eps=eps,
                                     decoupled_weight_decay=True)
        except TypeError:
            return torch.optim.RAdam(groups, lr=lr, betas=betas, eps=eps)
    if name == "lamb":
        return Lamb(groups, lr=lr, betas=betas, eps=eps)
    raise BertgpuError(f"optim.name {name!r}: expected one of {', '.join(OPTIMIZERS)}")


class Lamb(torch.optim.Optimizer):
    """LAMB, You et al. 2019, Algorithm 2, with bias correction and phi = identity.

    Per parameter tensor w (one "layer" in the paper) of a group with weight decay wd:
        m = b1 m + (1 - b1) g,   v = b2 v + (1 - b2) g^2
        r = m_hat / (sqrt(v_hat) + eps) + wd * w
        w = w - lr * ratio * r,   ratio = ||w|| / ||r||  (1 when either norm is 0, or wd = 0)
    The trust ratio makes the step size of each tensor proportional to its norm, which is
    what keeps very large batches stable. A group with wd = 0 (biases and norms, from
    `param_groups`) gets ratio 1, Adam's step, as NVIDIA's FusedLAMB (apex, `use_nvlamb=False`,
    the default its BERT recipe runs) and TF LAMB's `exclude_from_layer_adaptation`: the ratio
    would tie a bias's step to its own small norm. So with weight_decay 0 everywhere this is Adam.
    No gradient pre-normalisation: the engine clips the global grad norm before `step()`.

    m and v are Adam's moments and m_hat / (sqrt(v_hat) + eps) is Adam's step, so on CUDA and the
    CPU torch's fused multi-tensor Adam kernel computes both in one pass: run with lr -1 on an
    update buffer that holds wd * w, it advances m and v and leaves r in the buffer (`_updates`).
    That also gives GradScaler's contract for free: `grad_scale` divides the gradients inside the
    kernel and `found_inf` = 1 makes the kernel return before it writes anything. The step
    counts are 0-dim float32 tensors on the parameters' device (as torch's fused Adam keeps
    them), so a skipped step needs no host decision either.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
    ) -> None:
        if lr < 0.0:
            raise ValueError(f"invalid learning rate {lr}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"invalid betas {betas}")
        super().__init__(params,
                         {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        # GradScaler and the engine hand found_inf / grad_scale to step() where it can use them.
        self._step_supports_amp_scaling = _on_fused_devices(
            p for g in self.param_groups for p in g["params"])

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grad_scale = getattr(self, "grad_scale", None)
        found_inf = getattr(self, "found_inf", None)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            device = params[0].device
            found = found_inf.to(device, non_blocking=True) if found_inf is not None else None
            scale = grad_scale.to(device, non_blocking=True) if grad_scale is not None else None
            updates = self._updates(group, params, scale, found)
            # found = 1 (0-dim, 0 or 1): a zero learning rate, and the moments and counts the
            # kernel left as they were give a finite r, so the weights do not move either.
            lr = group["lr"] if found is None else group["lr"] * (1.0 - found)
            if group["weight_decay"] != 0.0:  # a Python float: no host sync, one graph
                self._apply_trust_ratio(params, updates, lr)
            else:
                self._apply_adam_step(params, updates, lr)
        return loss

    def _state(self, params: list[torch.Tensor]
               ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """The moments and step counts of `params`, created on first use. A step count saved as
        a Python int (checkpoints before the counts were tensors) or loaded onto the CPU by
        `load_state_dict` becomes a float32 tensor on the parameter's device."""
        exp_avgs, exp_avg_sqs, steps = [], [], []
        for p in params:
            state = self.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            step = state["step"]
            if not torch.is_tensor(step) or step.device != p.device or step.dtype != torch.float32:
                state["step"] = torch.as_tensor(step, dtype=torch.float32).to(p.device)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        return exp_avgs, exp_avg_sqs, steps

    def _updates(self, group: dict[str, Any], params: list[torch.Tensor],
                 grad_scale: torch.Tensor | None = None, found_inf: torch.Tensor | None = None
                 ) -> list[torch.Tensor]:
        """Advance the moments of `params` and return r = m_hat / (sqrt(v_hat) + eps) + wd * w,
        vectorised over the group."""
        beta1, beta2 = group["betas"]
        eps, wd = group["eps"], group["weight_decay"]
        grads = [p.grad for p in params]
        if any(g.is_sparse for g in grads):
            raise RuntimeError("Lamb does not support sparse gradients")
        exp_avgs, exp_avg_sqs, steps = self._state(params)
        torch._foreach_add_(steps, 1)
        if _on_fused_devices(params):
            # r in the same pass as the moments: torch's fused Adam kernel run on an update
            # buffer u that starts at wd * w (0 without decay), with lr -1, writes
            # u + m_hat / (sqrt(v_hat) + eps) = r into u and advances m and v. Fourteen passes
            # over the group's fp32 bytes for a decayed step (benchmarks/optim_step.py), not 28.
            if wd != 0.0:
                updates = torch._foreach_mul(params, wd)
            else:  # allocations, then one zeroing launch (not one per tensor)
                updates = [torch.empty_like(p) for p in params]
                torch._foreach_zero_(updates)
            torch._fused_adam_(updates, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False,
                               lr=-1.0, beta1=beta1, beta2=beta2, weight_decay=0.0, eps=eps,
                               maximize=False, grad_scale=grad_scale, found_inf=found_inf)
            if found_inf is not None:  # the kernel skipped (u stays finite): so does the count
                torch._foreach_sub_(steps, [found_inf] * len(steps))
            return updates
        # no fused kernel (and no found_inf: _step_supports_amp_scaling is False)
        if grad_scale is not None:
            grads = torch._foreach_div(grads, grad_scale)
        torch._foreach_lerp_(exp_avgs, grads, 1.0 - beta1)  # m = b1 m + (1-b1) g
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1.0 - beta2)
        # Bias corrections on the device from the group's count (every tensor of a group is
        # created and stepped together), in float64 where the device has it, as the host's
        # Python floats were (at least 1, as a count that skipped its first step reads 0).
        wide = torch.float32 if steps[0].device.type == "mps" else torch.float64
        t = steps[0].to(wide).clamp(min=1.0)
        bc1 = (1.0 - beta1 ** t).float()
        bc2 = (1.0 - beta2 ** t).float()
        return adam_direction(params, exp_avgs, exp_avg_sqs, bc1, bc2, eps, wd)

    @staticmethod
    def _apply_adam_step(params: list[torch.Tensor], updates: list[torch.Tensor],
                         lr: float | torch.Tensor) -> None:
        """w -= lr * r for every tensor: the undecayed group, no layer adaptation (apex's
        LAMBStage2 with decay 0); `lr` may be a 0-dim device tensor (0 on a skipped step).

        Multiply, then add, whether `lr` is a float (the host decided the skip) or a tensor
        (found_inf on the device): an add with alpha rounds differently, and the two ways of
        skipping must give bitwise the same weights (tests/test_device_skip.py)."""
        scale = (-lr).to(updates[0].dtype) if torch.is_tensor(lr) else -lr
        torch._foreach_mul_(updates, scale)
        torch._foreach_add_(params, updates)

    @staticmethod
    def _apply_trust_ratio(params: list[torch.Tensor], updates: list[torch.Tensor],
                           lr: float | torch.Tensor) -> None:
        """w -= lr * (||w|| / ||r||) * r for every tensor (ratio 1 when either norm is 0); `lr`
        may be a 0-dim device tensor (0 on a skipped step).

        All P tensors at once: two fused norm launches and one stacked (P,) vector of ratios on
        the device (no host sync). The multiply-add by a per-tensor 0-dim scale is torch's
        foreach slow path (one kernel per tensor, as in torch's capturable Adam), one pass where
        a multiply and then an add took two; the rest is fused.
        The per-tensor loop it replaces (kept in tests/test_optim.py as the reference) launched
        about ten kernels per tensor."""
        w_norms = torch.stack(torch._foreach_norm(params)).float()  # (P,)
        r_norms = torch.stack(torch._foreach_norm(updates)).float()  # (P,)
        ratios = torch.where((w_norms > 0) & (r_norms > 0), w_norms / r_norms,
                             torch.ones_like(w_norms))
        scales = (ratios * -lr).to(updates[0].dtype).unbind(0)  # P 0-dim tensors (views)
        torch._foreach_addcmul_(params, updates, scales)  # w += r * scale

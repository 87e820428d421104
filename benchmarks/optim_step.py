"""One optimizer step on BERT-base's parameters: the LAMB and AdamW variants side by side.

    python benchmarks/optim_step.py                      # CPU, BERT-base shapes, 5 rounds
    python benchmarks/optim_step.py --device cuda --rounds 50
    python benchmarks/optim_step.py --size tiny --rounds 3 --out results/optim_step.jsonl

The parameters are BertForPreTraining's at `--size` (base: 110 M in 206 tensors, the two groups
of train/optim.py's `param_groups`), the gradients fixed random numbers. Each round times one
step of every variant in turn (after one warm-up step each), so a busy machine slows them alike;
the table gives the median over rounds and its ratio to the oldest variant of the same
optimizer. On CUDA every step ends with a synchronize, so the times are the device's.

LAMB variants: `per-tensor` is the LAMB of commit e00e653 (foreach moments, then the trust ratio
and the update one tensor at a time, about ten small kernels per tensor), `foreach` the one of
a3fcc48 (stacked trust ratios, one multiply per tensor), `fused moments` the one of 55a6acc
(moments in torch's fused Adam kernel, step counts on the device, found_inf honoured, then six
foreach passes for r), `fused r` bertgpu's `Lamb` (the same kernel writes r itself into a buffer
that starts at wd * w, and the update is one multiply-add: about 14 passes over the decayed
group's bytes against 28). AdamW: torch's
`for-loop`, `foreach` and `fused` implementations (bertgpu builds the fused one on CUDA and CPU).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from typing import Any

import torch

from bertgpu.bench.batches import SIZES
from bertgpu.models.bert.config import BertConfig
from bertgpu.models.bert.model import BertForPreTraining
from bertgpu.train.optim import Lamb, adam_direction, param_groups


class ForeachLamb(Lamb):
    """bertgpu's LAMB as of a3fcc48: foreach moments with Python-int step counts, then stacked
    trust ratios (the `_apply_trust_ratio` both versions share)."""

    _step_supports_amp_scaling = False

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            updates = self._old_updates(group, params)
            # The undecayed group takes Adam's step, as today's Lamb (NVIDIA's rule): the rows
            # compare the same arithmetic, only its kernels differ.
            if group["weight_decay"] != 0.0:
                self._apply_trust_ratio(params, updates, group["lr"])
            else:
                self._apply_adam_step(params, updates, group["lr"])

    def _old_updates(self, group: dict[str, Any], params: list[torch.Tensor]
                     ) -> list[torch.Tensor]:
        beta1, beta2 = group["betas"]
        eps, wd = group["eps"], group["weight_decay"]
        grads = [p.grad for p in params]
        exp_avgs, exp_avg_sqs = [], []
        for p in params:
            state = self.state[p]
            if not state:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            state["step"] += 1
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
        step = self.state[params[0]]["step"]
        bc1, bc2 = 1.0 - beta1**step, 1.0 - beta2**step
        torch._foreach_lerp_(exp_avgs, grads, 1.0 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1.0 - beta2)
        return adam_direction(params, exp_avgs, exp_avg_sqs, bc1, bc2, eps, wd)


class PerTensorLamb(ForeachLamb):
    """bertgpu's LAMB as of e00e653: the trust ratio and the update one tensor at a time."""

    @staticmethod
    def _apply_trust_ratio(params: list[torch.Tensor], updates: list[torch.Tensor],
                           lr: Any) -> None:
        w_norms = torch._foreach_norm(params)
        r_norms = torch._foreach_norm(updates)
        for p, r, wn, rn in zip(params, updates, w_norms, r_norms, strict=True):
            wn32, rn32 = wn.float(), rn.float()
            ratio = torch.where((wn32 > 0) & (rn32 > 0), wn32 / rn32, torch.ones_like(wn32))
            p.add_(r * (ratio * -lr).to(r.dtype))


class FusedMomentsLamb(Lamb):
    """bertgpu's LAMB as of 55a6acc: the moments in torch's fused Adam kernel (lr 0), then r
    from them in six foreach passes."""

    def _updates(self, group: dict[str, Any], params: list[torch.Tensor],
                 grad_scale: Any = None, found_inf: Any = None) -> list[torch.Tensor]:
        beta1, beta2 = group["betas"]
        eps, wd = group["eps"], group["weight_decay"]
        grads = [p.grad for p in params]
        exp_avgs, exp_avg_sqs, steps = self._state(params)
        torch._foreach_add_(steps, 1)
        torch._fused_adam_(params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False,
                           lr=0.0, beta1=beta1, beta2=beta2, weight_decay=0.0, eps=1.0,
                           maximize=False, grad_scale=grad_scale, found_inf=found_inf)
        t = steps[0].double().clamp(min=1.0)
        bc1, bc2 = (1.0 - beta1**t).float(), (1.0 - beta2**t).float()
        return adam_direction(params, exp_avgs, exp_avg_sqs, bc1, bc2, eps, wd)


VARIANTS = {
    "lamb per-tensor (e00e653)": lambda g: PerTensorLamb(g, lr=1e-3),
    "lamb foreach (a3fcc48)": lambda g: ForeachLamb(g, lr=1e-3),
    "lamb fused moments (55a6acc)": lambda g: FusedMomentsLamb(g, lr=1e-3),
    "lamb fused r (now)": lambda g: Lamb(g, lr=1e-3),
    "adamw for-loop": lambda g: torch.optim.AdamW(g, lr=1e-3, foreach=False),
    "adamw foreach": lambda g: torch.optim.AdamW(g, lr=1e-3, foreach=True),
    "adamw fused (now)": lambda g: torch.optim.AdamW(g, lr=1e-3, fused=True),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="base", choices=sorted(SIZES))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    ap.add_argument("--out", default=None, help="append the rows as JSON lines")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    config = BertConfig(**SIZES[a.size])
    runs = {}
    for name, make in VARIANTS.items():  # a model each: the variants update their own weights
        model = BertForPreTraining(config).to(device)
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-3
        runs[name] = make(param_groups(model, 0.01))
        runs[name].step()  # warm-up: state, first-call costs
    n = sum(p.numel() for g in next(iter(runs.values())).param_groups for p in g["params"])
    tensors = sum(len(g["params"]) for g in next(iter(runs.values())).param_groups)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(a.rounds):
        for name, opt in runs.items():
            sync()
            t0 = time.perf_counter()
            opt.step()
            sync()
            times[name].append(time.perf_counter() - t0)
    print(f"{a.size}: {n / 1e6:.1f} M parameters in {tensors} tensors, {device}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}, {a.rounds} rounds")
    for name, ts in times.items():
        print(f"  {name:28s} {statistics.median(ts) * 1e3:9.1f} ms  (min {min(ts) * 1e3:.1f})")
    lamb_ref = statistics.median(times["lamb per-tensor (e00e653)"])
    adam_ref = statistics.median(times["adamw for-loop"])
    print("ratios (median time of the reference / the variant):")
    for name, ts in times.items():
        ref = lamb_ref if name.startswith("lamb") else adam_ref
        print(f"  {name:28s} {ref / statistics.median(ts):5.2f}x")
    if a.out:
        with open(a.out, "a", encoding="utf-8") as f:
            for name, ts in times.items():
                f.write(json.dumps({"bench": "optim_step", "size": a.size, "device": str(device),
                                    "variant": name, "median_s": statistics.median(ts),
                                    "times_s": ts, "threads": torch.get_num_threads(),
                                    "torch": torch.__version__,
                                    "host": platform.node()}) + "\n")


if __name__ == "__main__":
    main()

"""Parameter groups, optimizer construction, and LAMB against NVIDIA's update written by hand."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from bertgpu.errors import BertgpuError
from bertgpu.train.optim import Lamb, build_optimizer, param_groups


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embeddings = nn.Embedding(10, 4)
        self.dense = nn.Linear(4, 4)
        self.LayerNorm = nn.LayerNorm(4)
        self.decoder = nn.Linear(4, 10)
        self.decoder.weight = self.embeddings.weight  # tied, as BERT's MLM decoder


def test_param_groups_split():
    model = Toy()
    decay, no_decay = param_groups(model, 0.01)
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    ids = lambda ps: {id(p) for p in ps}  # noqa: E731
    assert ids(decay["params"]) == ids([model.embeddings.weight, model.dense.weight])
    assert ids(no_decay["params"]) == ids(
        [model.dense.bias, model.LayerNorm.weight, model.LayerNorm.bias, model.decoder.bias]
    )
    # A tied tensor appears once.
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


@pytest.mark.parametrize("name", ["adamw", "radam", "lamb"])
def test_weight_decay_skips_biases_and_norms(name):
    torch.manual_seed(0)
    model = Toy()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = build_optimizer(model, name, lr=0.1, weight_decay=0.5)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # only decay can move a parameter
    opt.step()
    after = dict(model.named_parameters())
    for n in ("dense.bias", "LayerNorm.weight", "LayerNorm.bias", "decoder.bias"):
        assert torch.equal(after[n], before[n]), n
    for n in ("dense.weight", "embeddings.weight"):
        assert after[n].norm() < before[n].norm(), n


def test_build_optimizer_kinds():
    model = Toy()
    assert isinstance(build_optimizer(model, "adamw", 1e-3), torch.optim.AdamW)
    radam = build_optimizer(model, "radam", 1e-3)
    assert isinstance(radam, torch.optim.RAdam)
    if "decoupled_weight_decay" in radam.defaults:
        assert radam.defaults["decoupled_weight_decay"] is True
    opt = build_optimizer(model, "lamb", 1e-3, betas=(0.9, 0.98), eps=1e-8)
    assert isinstance(opt, Lamb) and opt.param_groups[0]["betas"] == (0.9, 0.98)
    with pytest.raises(BertgpuError, match="optim.name"):
        build_optimizer(model, "sgd", 1e-3)


class ReferenceLamb:
    """LAMB as NVIDIA's BERT recipe runs it (apex's multi_tensor_lamb, use_nvlamb off), written
    out plainly in float64, one tensor at a time: `wds[i]` is tensor i's weight decay, and the
    trust ratio applies only where it is non-zero."""

    def __init__(self, params, wds, lr, b1, b2, eps):
        self.ws = [p.detach().clone().double() for p in params]
        self.ms = [torch.zeros_like(w) for w in self.ws]
        self.vs = [torch.zeros_like(w) for w in self.ws]
        self.wds, self.lr, self.b1, self.b2, self.eps, self.t = wds, lr, b1, b2, eps, 0

    def step(self, grads):
        self.t += 1
        b1, b2, t = self.b1, self.b2, self.t
        for i, g in enumerate(grads):
            g, w, wd = g.double(), self.ws[i], self.wds[i]
            self.ms[i] = b1 * self.ms[i] + (1 - b1) * g
            self.vs[i] = b2 * self.vs[i] + (1 - b2) * g * g
            m_hat = self.ms[i] / (1 - b1**t)
            v_hat = self.vs[i] / (1 - b2**t)
            r = m_hat / (v_hat.sqrt() + self.eps) + wd * w
            wn, rn = w.norm().item(), r.norm().item()
            ratio = wn / rn if wn > 0 and rn > 0 and wd != 0 else 1.0
            self.ws[i] = w - self.lr * ratio * r


def test_lamb_matches_hand_computed_steps():
    gen = torch.Generator().manual_seed(0)
    params = [
        nn.Parameter(torch.randn(3, 4, generator=gen)),
        nn.Parameter(torch.zeros(5)),  # zero norm: trust ratio 1
        nn.Parameter(torch.randn(2, 2, generator=gen) * 10),
    ]
    grads_per_step = [[torch.randn(p.shape, generator=gen) for p in params] for _ in range(3)]
    lr, b1, b2, eps, wd = 0.05, 0.9, 0.99, 1e-6, 0.1
    ref = ReferenceLamb(params, [wd] * len(params), lr, b1, b2, eps)
    for grads in grads_per_step:
        ref.step(grads)

    opt = Lamb(params, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    for grads in grads_per_step:
        for p, g in zip(params, grads, strict=True):
            p.grad = g.clone()
        opt.step()
    for p, e in zip(params, ref.ws, strict=True):
        torch.testing.assert_close(p.detach().double(), e, rtol=1e-5, atol=1e-6)
    # The zero-norm tensor moved (ratio 1, not 0) and every tensor moved by a trust-scaled step.
    assert params[1].detach().abs().sum() > 0


def test_lamb_matches_nvidia_lamb_on_both_groups():
    """A tiny BERT's two groups (decay 0.01 on matrices; none on biases, which start at 0, and
    LayerNorm weights): five steps against the reference, which takes the trust ratio only
    where the weight decay is non-zero, as apex's FusedLAMB does without use_nvlamb."""
    from _tiny import TINY, tiny_batch

    from bertgpu.models.bert.config import BertConfig
    from bertgpu.models.bert.model import BertForPreTraining

    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**TINY))
    groups = param_groups(model, 0.01)
    params = [p for g in groups for p in g["params"]]
    wds = [g["weight_decay"] for g in groups for _ in g["params"]]
    assert 0.0 in wds and 0.01 in wds
    lr, b1, b2, eps = 1e-2, 0.9, 0.999, 1e-6
    opt = Lamb(groups, lr=lr, betas=(b1, b2), eps=eps)
    ref = ReferenceLamb(params, wds, lr, b1, b2, eps)
    names = {id(p): n for n, p in model.named_parameters()}
    for step in range(5):
        model(**tiny_batch(step)).loss.backward()
        ref.step([p.grad for p in params])
        opt.step()
        opt.zero_grad(set_to_none=True)
        for p, w in zip(params, ref.ws, strict=True):
            torch.testing.assert_close(p.detach().double(), w, rtol=1e-5, atol=1e-6,
                                       msg=f"step {step}: {names[id(p)]}")


def test_lamb_moves_a_zero_bias_as_adam_does():
    """The bug: with the trust ratio on every tensor, a bias that starts at 0 takes one Adam step
    and then steps lr * ||b|| (a review measured 0.0312 -> 0.0341 over 200 steps at lr 4e-3,
    AdamW 0.419). Without decay, biases and norms take torch.optim.Adam's steps exactly, while
    the decayed matrix beside them keeps its trust ratio."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6), nn.LayerNorm(6), nn.Linear(6, 3))
    nn.init.zeros_(model[0].bias)
    groups = param_groups(model, 0.01)
    no_decay = groups[1]["params"]
    assert any(p is model[0].bias for p in no_decay)
    twins = [p.detach().clone().requires_grad_() for p in no_decay]
    lr, betas, eps = 1e-2, (0.9, 0.999), 1e-6
    lamb = Lamb(groups, lr=lr, betas=betas, eps=eps)
    adam = torch.optim.Adam(twins, lr=lr, betas=betas, eps=eps, weight_decay=0.0, foreach=False)
    gen = torch.Generator().manual_seed(3)
    for step in range(6):
        for p in model.parameters():  # a steady push plus noise, the same for both optimizers
            p.grad = torch.randn(p.shape, generator=gen) + 1.0
        for twin, p in zip(twins, no_decay, strict=True):
            twin.grad = p.grad.clone()
        lamb.step()
        adam.step()
        for twin, p in zip(twins, no_decay, strict=True):
            torch.testing.assert_close(p, twin, rtol=1e-6, atol=1e-7, msg=f"step {step}")
        if step == 0:
            first = model[0].bias.detach().norm().item()
    # Adam's steps add up (about lr per element per step); the trust ratio allowed (1 + lr)^5.
    assert model[0].bias.norm().item() > 3 * first


class PerTensorLamb(Lamb):
    """LAMB as it was before the foreach rewrite, kept as the reference: the same moments, then the
    trust ratio and the update one tensor at a time (the code it replaced, verbatim)."""

    @staticmethod
    def _apply_trust_ratio(params, updates, lr):  # type: ignore[override]
        w_norms = torch._foreach_norm(params)
        r_norms = torch._foreach_norm(updates)
        for p, r, wn, rn in zip(params, updates, w_norms, r_norms, strict=True):
            wn32, rn32 = wn.float(), rn.float()
            ratio = torch.where((wn32 > 0) & (rn32 > 0), wn32 / rn32, torch.ones_like(wn32))
            p.add_(r * (ratio * -lr).to(r.dtype))


def test_foreach_lamb_matches_the_per_tensor_lamb_on_bert():
    """The foreach LAMB against the per-tensor one it replaced, on a real model's parameter groups
    (weight decay and the trust ratio on matrices, a tied embedding; biases and norms take Adam's
    step in both), five steps with changing learning rates."""
    from _tiny import TINY, tiny_batch

    from bertgpu.models.bert.config import BertConfig
    from bertgpu.models.bert.model import BertForPreTraining

    torch.manual_seed(0)
    a = BertForPreTraining(BertConfig(**TINY))
    b = BertForPreTraining(BertConfig(**TINY))
    b.load_state_dict(a.state_dict())
    opt_a = build_optimizer(a, "lamb", 1e-2, weight_decay=0.01)
    opt_b = PerTensorLamb(param_groups(b, 0.01), lr=1e-2, betas=(0.9, 0.999), eps=1e-6)
    assert isinstance(opt_a, Lamb) and not isinstance(opt_a, PerTensorLamb)
    for step in range(5):
        for model, opt in ((a, opt_a), (b, opt_b)):
            for group in opt.param_groups:
                group["lr"] = 1e-2 * (step + 1) / 5
            model(**tiny_batch(step)).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
            torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6, msg=f"step {step}: {name}")
    for sa, sb in zip(opt_a.state.values(), opt_b.state.values(), strict=True):
        assert sa["step"] == sb["step"] == 5
        torch.testing.assert_close(sa["exp_avg_sq"], sb["exp_avg_sq"])


def test_lamb_state_dict_round_trip():
    torch.manual_seed(0)
    a, b = nn.Linear(3, 3), nn.Linear(3, 3)
    b.load_state_dict(a.state_dict())
    oa, ob = Lamb(a.parameters(), lr=0.01), Lamb(b.parameters(), lr=0.01)
    x = torch.randn(4, 3)
    a(x).sum().backward()
    oa.step()
    ob.load_state_dict(copy.deepcopy(oa.state_dict()))  # as if saved and loaded
    b.load_state_dict(a.state_dict())
    for m, o in ((a, oa), (b, ob)):
        o.zero_grad()
        m(x).pow(2).sum().backward()
        o.step()
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)


def lamb_run(grads, found=()):
    """A fresh LAMB over three decayed tensors (one of zero norm) and an undecayed one (Adam's
    step, no trust ratio) stepped on each of `grads` (a list of seeds); the steps in `found` get
    NaN gradients and found_inf = 1, as the engine and GradScaler set them."""
    gen = torch.Generator().manual_seed(1)
    params = [nn.Parameter(torch.randn(3, 4, generator=gen)), nn.Parameter(torch.zeros(5)),
              nn.Parameter(torch.randn(2, 2, generator=gen)), nn.Parameter(torch.zeros(3))]
    opt = Lamb([{"params": params[:3]}, {"params": params[3:], "weight_decay": 0.0}],
               lr=0.05, betas=(0.9, 0.99), weight_decay=0.1)
    assert opt._step_supports_amp_scaling  # the CPU has torch's fused Adam kernel
    for i, seed in enumerate(grads):
        gen = torch.Generator().manual_seed(seed)
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
            if i in found:
                p.grad[0] = float("nan")
        opt.found_inf = torch.tensor(float(i in found))
        opt.step()
        del opt.found_inf
    return params, opt


def test_lamb_found_inf_leaves_weights_moments_and_counts_as_they_were():
    """found_inf = 1 with NaN gradients moves nothing (weights, moments, step counts), on the
    first step (no state yet) and later; a run with skipped steps then equals the run without
    them, bitwise."""
    params, opt = lamb_run([0], found={0})
    assert all(torch.equal(p, q) for p, q in zip(params, lamb_run([])[0], strict=True))
    assert all(s["step"] == 0 and not s["exp_avg"].any() and not s["exp_avg_sq"].any()
               for s in opt.state.values())
    skipped, opt_a = lamb_run([10, 11, 12, 13, 14], found={0, 2, 3})
    plain, opt_b = lamb_run([11, 14])
    for p, q in zip(skipped, plain, strict=True):
        assert torch.equal(p, q) and p.isfinite().all()
    for sa, sb in zip(opt_a.state.values(), opt_b.state.values(), strict=True):
        assert all(torch.equal(sa[k], sb[k]) for k in ("step", "exp_avg", "exp_avg_sq"))
    assert all(s["step"] == 2 for s in opt_a.state.values())


def test_lamb_grad_scale_divides_the_gradients():
    """GradScaler's other half: scaled gradients with grad_scale give the unscaled step and
    moments (the step alone would not show it: LAMB's update hardly depends on the scale)."""
    torch.manual_seed(0)
    a, b = nn.Linear(4, 3), nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    oa, ob = Lamb(a.parameters(), lr=0.01), Lamb(b.parameters(), lr=0.01)
    x = torch.randn(5, 4)
    a(x).pow(2).sum().backward()
    (b(x).pow(2).sum() * 1024).backward()
    ob.grad_scale = torch.tensor(1024.0)
    oa.step()
    ob.step()
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=1e-6, atol=1e-7)
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(oa.state[pa][key], ob.state[pb][key])


def test_lamb_reads_step_counts_saved_as_ints():
    """Checkpoints written before the step counts were device tensors stored Python ints: they
    load and step on exactly as the tensors do."""
    torch.manual_seed(0)
    a, b = nn.Linear(3, 3), nn.Linear(3, 3)
    b.load_state_dict(a.state_dict())
    oa, ob = Lamb(a.parameters(), lr=0.01), Lamb(b.parameters(), lr=0.01)
    x = torch.randn(4, 3)
    a(x).sum().backward()
    oa.step()
    old = copy.deepcopy(oa.state_dict())
    for s in old["state"].values():
        s["step"] = int(s["step"])
    ob.load_state_dict(old)
    b.load_state_dict(a.state_dict())
    for m, o in ((a, oa), (b, ob)):
        o.zero_grad()
        m(x).pow(2).sum().backward()
        o.step()
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)
    assert all(s["step"].dtype == torch.float32 and s["step"] == 2 for s in ob.state.values())


def test_adamw_is_fused_on_the_cpu_and_matches_the_for_loop(one_thread):
    """build_optimizer picks torch's fused AdamW on the CPU as well (one kernel for all
    parameters, and found_inf honoured); it agrees with torch's plain per-tensor AdamW."""
    from _tiny import TINY, tiny_batch

    from bertgpu.models.bert.config import BertConfig
    from bertgpu.models.bert.model import BertForPreTraining

    torch.manual_seed(0)
    a = BertForPreTraining(BertConfig(**TINY))
    b = BertForPreTraining(BertConfig(**TINY))
    b.load_state_dict(a.state_dict())
    fused = build_optimizer(a, "adamw", 1e-3, weight_decay=0.01)
    assert fused.defaults["fused"] is True and fused._step_supports_amp_scaling
    plain = torch.optim.AdamW(param_groups(b, 0.01), lr=1e-3, betas=(0.9, 0.999), eps=1e-6,
                              foreach=False)
    for step in range(4):
        for model, opt in ((a, fused), (b, plain)):
            model(**tiny_batch(step)).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
            torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6, msg=f"step {step}: {name}")


def test_lamb_step_compiles_to_one_graph():
    """No host read and no Python decision on tensor values in LAMB's step: dynamo captures it
    whole (fullgraph), and a changing learning rate recompiles once, then stays dynamic."""
    import torch._dynamo.testing

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 4))
    opt = Lamb(param_groups(model, 0.01), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()  # the state exists, as after the first step of a run
    counter = torch._dynamo.testing.CompileCounter()
    step = torch.compile(opt.step, backend=counter, fullgraph=True)
    for i in range(4):
        for group in opt.param_groups:
            group["lr"] = 1e-3 * (i + 1)
        opt.found_inf = torch.tensor(float(i == 2))
        step()
    assert counter.frame_count <= 2 and counter.op_count > 0
    torch._dynamo.reset()


@pytest.mark.parametrize("name", ["adamw", "radam", "lamb"])
def test_build_optimizer_passes_the_configured_betas_and_eps_to_every_group(name):
    """optim.betas / optim.eps reach every parameter group (a dropped keyword falls back to the
    optimizer's own default silently)."""
    opt = build_optimizer(Toy(), name, 1e-3, betas=(0.8, 0.95), eps=1e-7)
    assert len(opt.param_groups) == 2
    for group in opt.param_groups:
        assert tuple(group["betas"]) == (0.8, 0.95)
        assert group["eps"] == 1e-7


def test_lamb_off_the_fused_devices_matches_the_reference(monkeypatch):
    """The foreach branch (devices without torch's fused Adam kernel, e.g. MPS) never ran on
    the CPU: with FUSED_DEVICES emptied, three steps on both groups equal the reference."""
    from bertgpu.train import optim

    monkeypatch.setattr(optim, "FUSED_DEVICES", ())
    gen = torch.Generator().manual_seed(1)
    params = [nn.Parameter(torch.randn(3, 4, generator=gen)),
              nn.Parameter(torch.randn(2, 2, generator=gen) * 10),
              nn.Parameter(torch.zeros(5))]
    wds = [0.1, 0.1, 0.0]
    lr, b1, b2, eps = 0.05, 0.8, 0.95, 1e-6
    opt = Lamb([{"params": params[:2], "weight_decay": 0.1},
                {"params": params[2:], "weight_decay": 0.0}], lr=lr, betas=(b1, b2), eps=eps)
    assert not opt._step_supports_amp_scaling  # the non-fused path is the one taken
    ref = ReferenceLamb(params, wds, lr, b1, b2, eps)
    for step in range(3):
        grads = [torch.randn(p.shape, generator=gen) for p in params]
        ref.step(grads)
        for p, g in zip(params, grads, strict=True):
            p.grad = g.clone()
        opt.step()
        for p, w in zip(params, ref.ws, strict=True):
            torch.testing.assert_close(p.detach().double(), w, rtol=1e-5, atol=1e-6,
                                       msg=f"step {step}")

"""The optimizer step: accumulation equivalence, clipping after unscale, skipping, lr."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from _toy import ToyPretrain, count_fn, cpu_fp16_available, loss_fn, make_batch, split

from bertgpu.train.engine import Engine, TrainingDiverged


def new_engine(model, **kw):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return Engine(model, opt, **kw)


@pytest.mark.parametrize("k", [2, 4])
def test_accumulation_equals_one_big_batch(k):
    torch.manual_seed(0)
    ref = ToyPretrain()
    acc = copy.deepcopy(ref)
    e_ref, e_acc = new_engine(ref), new_engine(acc)
    for step in range(4):
        batch = make_batch(8, seed=step)
        chunks = split(batch, k)
        assert len({count_fn(c)["mlm"] for c in chunks}) > 1  # micro batches weigh differently
        r1 = e_ref.train_step([batch], loss_fn, count_fn)
        r2 = e_acc.train_step(chunks, loss_fn, count_fn)
        assert r1.counts == r2.counts
        assert r1.loss == pytest.approx(r2.loss, rel=1e-6)
        assert r1.grad_norm == pytest.approx(r2.grad_norm, rel=1e-5)
        for key in ("mlm", "nsp"):
            assert r1.losses[key] == pytest.approx(r2.losses[key], rel=1e-6)
    for p1, p2 in zip(ref.parameters(), acc.parameters(), strict=True):
        torch.testing.assert_close(p1, p2, rtol=1e-5, atol=1e-6)
    assert e_acc.micro_step == 4 * k and e_acc.step == 4


def test_loss_is_normalised_by_step_totals():
    torch.manual_seed(0)
    model = ToyPretrain()
    batch = make_batch(6, seed=1)
    with torch.no_grad():
        out = model(batch["input_ids"], batch["labels"], batch["nsp_labels"])
    c = count_fn(batch)
    expected = out["mlm"].item() / c["mlm"] + out["nsp"].item() / c["nsp"]
    res = new_engine(model).train_step(split(batch, 3), loss_fn, count_fn)
    assert res.loss == pytest.approx(expected, rel=1e-6)
    assert res.counts == c and not res.skipped and res.step_s > 0 and res.micro_batches == 3


def test_lr_fn_is_applied():
    model = ToyPretrain()
    lrs = iter([0.5, 0.25])
    engine = new_engine(model, lr_fn=lambda: next(lrs))
    r = engine.train_step([make_batch(4, 0)], loss_fn, count_fn)
    assert r.lr == 0.5 and all(g["lr"] == 0.5 for g in engine.optimizer.param_groups)
    r = engine.train_step([make_batch(4, 1)], loss_fn, count_fn)
    assert r.lr == 0.25 and all(g["lr"] == 0.25 for g in engine.optimizer.param_groups)


def test_nonfinite_step_is_skipped_and_aborts_after_n():
    torch.manual_seed(0)
    model = ToyPretrain()
    engine = new_engine(model, max_nonfinite_steps=3)
    engine.train_step([make_batch(4, 0)], loss_fn, count_fn)  # create optimizer state
    poisoned = [make_batch(2, 1), {**make_batch(2, 2), "poison": torch.tensor(float("inf"))}]
    before = copy.deepcopy(model.state_dict())
    opt_before = copy.deepcopy(engine.optimizer.state_dict())

    r = engine.train_step(poisoned, loss_fn, count_fn)
    assert r.skipped and not math.isfinite(r.loss)
    assert engine.nonfinite_in_row == 1 and engine.skipped_steps == 1
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(p.grad is None for p in model.parameters())
    assert engine.optimizer.state_dict()["state"][0]["step"] == opt_before["state"][0]["step"]

    r = engine.train_step([make_batch(4, 3)], loss_fn, count_fn)  # a good step resets the run
    assert not r.skipped and engine.nonfinite_in_row == 0 and engine.skipped_steps == 1

    engine.train_step(poisoned, loss_fn, count_fn)
    engine.train_step(poisoned, loss_fn, count_fn)
    with pytest.raises(TrainingDiverged, match="3 steps in a row.*lower optim.lr"):
        engine.train_step(poisoned, loss_fn, count_fn)
    assert engine.skipped_steps == 4


def test_nan_gradient_is_skipped():
    model = ToyPretrain()
    engine = new_engine(model)

    def nan_grad_loss(model, batch):
        out = loss_fn(model, batch)
        # finite loss value, NaN gradient: sqrt'(0) * 0 = inf * 0
        return {"mlm": out["mlm"] + (model.mlm.weight[0, 0] * 0).sqrt() * 0, "nsp": out["nsp"]}

    w = model.mlm.weight.detach().clone()
    r = engine.train_step([make_batch(4, 0)], nan_grad_loss, count_fn)
    assert math.isfinite(r.loss) and not math.isfinite(r.grad_norm) and r.skipped
    assert torch.equal(model.mlm.weight, w) and engine.nonfinite_in_row == 1


@pytest.mark.skipif(not cpu_fp16_available(),
                    reason="this torch has no CPU fp16 autocast/GradScaler")
def test_fp16_clips_after_unscale():
    torch.manual_seed(0)
    model = ToyPretrain()
    clip = 1e-3
    opt = torch.optim.SGD(model.parameters(), lr=1.0)  # delta = -clipped gradient
    engine = Engine(model, opt, precision="fp16", grad_clip=clip)
    engine.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    batch = make_batch(4, 0)

    ref = copy.deepcopy(model)  # fp32 gradient norm for comparison
    out = loss_fn(ref, batch)
    c = count_fn(batch)
    (out["mlm"] / c["mlm"] + out["nsp"] / c["nsp"]).backward()
    true_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), math.inf).item()

    before = [p.detach().clone() for p in model.parameters()]
    r = engine.train_step([batch], loss_fn, count_fn)
    assert not r.skipped
    # The reported norm is the unscaled one (not x 1024) ...
    assert r.grad_norm == pytest.approx(true_norm, rel=2e-2)
    # ... and the update was clipped to `clip` in unscaled units.
    delta = torch.cat([(p.detach() - b).flatten()
                       for p, b in zip(model.parameters(), before, strict=True)])
    assert delta.norm().item() == pytest.approx(clip, rel=1e-3)
    state = engine.state_dict()
    assert state["scaler"]["scale"] == 2.0**10

    # Loading the state restores counters and the loss scale.
    other = Engine(copy.deepcopy(model), torch.optim.SGD(model.parameters(), lr=1.0),
                   precision="fp16")
    other.load_state_dict(state)
    assert other.step == 1 and other.scaler.get_scale() == 2.0**10


def test_cpu_grad_norm_and_clip_are_the_float64_norm():
    # torch's fp32 CPU norm of 2**20 equal values (a 8192 x 128 embedding table) runs 6e-4 low,
    # of BERT-base's 23 M word-embedding values 1.5% low: the logged grad_norm and the clip
    # must use the gradient's true norm.
    n, g = 1 << 20, 1e-3
    model = torch.nn.Module()
    model.weight = torch.nn.Parameter(torch.zeros(n))
    grad = torch.full((n,), g)  # d/dw sum(w * g): g in fp32 everywhere
    true_norm = float(grad.double().norm())  # the float64 reference
    engine = Engine(model, torch.optim.SGD(model.parameters(), lr=1.0), grad_clip=true_norm / 2)
    r = engine.train_step([{"x": torch.ones(1)}], lambda m, b: {"x": (m.weight * g).sum()},
                          lambda b: {"x": 1})
    assert r.grad_norm == pytest.approx(true_norm, rel=1e-9)
    # SGD with lr 1: the update is the gradient scaled by clip / (norm + 1e-6), torch's rule
    coef = (true_norm / 2) / (true_norm + 1e-6)
    torch.testing.assert_close(model.weight.detach(), -coef * grad, rtol=1e-6, atol=0.0)


def test_bf16_autocast_step_on_cpu():
    torch.manual_seed(0)
    model = ToyPretrain()
    r = new_engine(model, precision="bf16").train_step(split(make_batch(4, 0), 2),
                                                       loss_fn, count_fn)
    assert math.isfinite(r.loss) and not r.skipped


def test_state_dict_round_trip():
    engine = new_engine(ToyPretrain())
    engine.train_step([make_batch(2, 0)], loss_fn, count_fn)
    state = engine.state_dict()
    other = new_engine(ToyPretrain())
    other.load_state_dict(state)
    assert other.state_dict() == state


def test_extra_scalars_are_summed_not_backpropagated():
    model = ToyPretrain()

    def with_extras(model, batch):
        out = dict(loss_fn(model, batch))
        out["_sequences"] = torch.tensor(float(batch["input_ids"].shape[0]))
        return out

    r = new_engine(model).train_step(split(make_batch(6, 0), 3), with_extras, count_fn)
    assert r.extras == {"_sequences": 6.0} and set(r.losses) == {"mlm", "nsp"}


def test_build_engine_compiles_where_impl_compile_says():
    """impl.compile "auto" (the default) compiles on CUDA only: not here; true compiles here too
    (the wrapper is made; nothing is compiled before its first call)."""
    from bertgpu.config.sections import DistributedSection, ImplSection, OptimSection, TrainSection
    from bertgpu.train.distributed import DistInfo
    from bertgpu.train.engine import build_engine

    for impl, compiled in ((ImplSection(), False), (ImplSection(compile=True), True)):
        model = ToyPretrain()
        engine, _ = build_engine(model, DistInfo(), lr=1e-3, train=TrainSection(),
                                 optim=OptimSection(), impl=impl, dist=DistributedSection())
        assert (engine.model is not model) is compiled
        assert getattr(engine.model, "_orig_mod", model) is model


def test_build_engine_passes_the_compile_mode_and_keeps_grads_for_cuda_graphs(monkeypatch):
    """impl.compile_mode goes to torch.compile; a CUDA-graph mode gives the engine stable
    gradients on CUDA only (elsewhere those modes replay no graph)."""
    from bertgpu.config.sections import DistributedSection, ImplSection, OptimSection, TrainSection
    from bertgpu.train.distributed import DistInfo
    from bertgpu.train.engine import build_engine

    modes = []
    monkeypatch.setattr(torch, "compile", lambda m, **kw: modes.append(kw["mode"]) or m)
    for mode in ("default", "reduce-overhead", "max-autotune-no-cudagraphs"):
        impl = ImplSection(compile=True, compile_mode=mode)
        engine, _ = build_engine(ToyPretrain(), DistInfo(), lr=1e-3, train=TrainSection(),
                                 optim=OptimSection(), impl=impl, dist=DistributedSection())
        assert not engine.stable_grads and engine.set_grads_to_none  # the CPU: no graphs
    assert modes == ["default", "reduce-overhead", "max-autotune-no-cudagraphs"]
    graphs = [ImplSection(compile=c, compile_mode=m).cuda_graphs(d)
              for d in ("cuda", "cpu") for c in ("auto", False)
              for m in ("reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")]
    assert graphs == [True, True, False] + [False] * 9


class _PoolLinear(torch.autograd.Function):
    """x @ w.T whose backward hands out w's gradient in one reused buffer, as a CUDA graph
    hands out outputs in its memory pool; every forward first overwrites the buffer, as the
    next replay does."""

    @staticmethod
    def forward(ctx, x, w, pool):
        pool.fill_(float("nan"))
        ctx.save_for_backward(x, w)
        ctx.pool = pool
        return x @ w.t()

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        ctx.pool.copy_(g.t() @ x)
        return g @ w, ctx.pool[...], None


class _PoolModel(torch.nn.Module):
    def __init__(self, graphs: bool):
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(-1, 1, 12).reshape(4, 3))
        self.unused = torch.nn.Parameter(torch.ones(2))  # no gradient: never decayed by AdamW
        self.graphs = graphs
        self.pool = torch.zeros(4, 3)

    def forward(self, x):
        if self.graphs:
            return _PoolLinear.apply(x, self.w, self.pool)
        return x @ self.w.t()


def test_stable_grads_survive_a_cuda_graph_pool_overwritten_by_the_next_replay():
    """`stable_grads` (the CUDA-graph compile modes): the first backward's gradients are copied
    out of the pool and later ones added into them, so accumulation over micro batches gives
    the gradients of an ordinary backward; parameters without a gradient keep None."""
    def loss(model, batch):
        return {"mse": (model(batch["x"]) ** 2).sum()}

    def counts(batch):
        return {"mse": batch["x"].shape[0]}

    g = torch.Generator().manual_seed(0)
    batches = [[{"x": torch.randn(2, 3, generator=g)} for _ in range(3)] for _ in range(3)]
    ref, graphed = _PoolModel(graphs=False), _PoolModel(graphs=True)
    e_ref, e_graph = new_engine(ref), new_engine(graphed, stable_grads=True)
    grads = []
    for step in batches:
        r1, r2 = e_ref.train_step(step, loss, counts), e_graph.train_step(step, loss, counts)
        assert r1.grad_norm == r2.grad_norm and r1.loss == r2.loss
        grads.append(graphed.w.grad)
        assert graphed.unused.grad is None
    assert grads[0] is grads[1] is grads[2]  # one tensor, zeroed in place between steps
    torch.testing.assert_close(graphed.w, ref.w, rtol=0, atol=0)
    torch.testing.assert_close(graphed.unused, ref.unused, rtol=0, atol=0)


@pytest.mark.skipif(not cpu_fp16_available(),
                    reason="this torch has no CPU fp16 autocast/GradScaler")
def test_an_optimizer_that_skips_on_the_host_reads_no_loss_scale_after_its_update():
    """RAdam under fp16 gets the host's skip decision before its step (documented); reading the
    loss scale after the update too made the host wait for the update on every step, for a
    number that only a compression hook's reset reads."""
    torch.manual_seed(0)
    model = ToyPretrain()
    opt = torch.optim.RAdam(model.parameters(), lr=1e-3)
    engine = Engine(model, opt, precision="fp16")
    engine.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    events = []
    step, get_scale = opt.step, engine.scaler.get_scale
    opt.step = lambda *a, **k: events.append("update") or step(*a, **k)
    engine.scaler.get_scale = lambda: events.append("scale read") or get_scale()
    for i in range(3):
        assert not engine.train_step([make_batch(4, i)], loss_fn, count_fn).skipped
    assert events == ["update"] * 3
    # with a hook to reset, the change of scale is read around the update, as before
    engine.on_numerics_reset = lambda: None
    events.clear()
    engine.train_step([make_batch(4, 9)], loss_fn, count_fn)
    assert events == ["scale read", "update", "scale read"]


def test_with_a_hook_to_reset_the_previous_step_is_read_after_this_steps_forwards(monkeypatch):
    """A compression hook's state must be cleared (after a skipped step or a scale change)
    before the backward that runs the hook: the last micro batch's. Reading the previous step
    at the top of the step made the host wait for it before queueing any of this step's work."""
    from bertgpu.train import readback

    torch.manual_seed(0)
    model = ToyPretrain()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    events = []
    engine = Engine(model, opt, read_late=True, on_numerics_reset=lambda: events.append("reset"))
    assert engine.skips_on_device()
    model.register_forward_pre_hook(lambda m, a: events.append(f"forward {engine.step + 1}"))
    read = readback.PendingStep.read

    def logged_read(self):
        if not getattr(self, "_logged", False):
            self._logged = True
            events.append(f"read {self.step}")
        return read(self)

    monkeypatch.setattr(readback.PendingStep, "read", logged_read)
    for i in range(3):
        engine.train_step(split(make_batch(4, i), 2), loss_fn, count_fn)
    assert events == ["forward 1", "forward 1",
                      "forward 2", "forward 2", "read 1",
                      "forward 3", "forward 3", "read 2"]

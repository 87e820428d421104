"""A non-finite step skipped on the device and the step's numbers read late (train/engine.py):
the same weights, optimizer state, loss scale, counters and abort as the host's decision, and a
`train_step` that returns before anything of its own step is read back to the host.

On the CPU every read is free, so the engine reads at each step's end unless `read_late=True`
(its CUDA default), which these tests set to run the CUDA code path here. What the host reads is
seen through a TorchFunctionMode that records `.item()`, `.tolist()`, `float(t)`, `bool(t)`...
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from _toy import ToyPretrain, count_fn, cpu_fp16_available, loss_fn, make_batch, split
from torch.overrides import TorchFunctionMode

from bertgpu.train.engine import Engine, TrainingDiverged
from bertgpu.train.optim import build_optimizer

pytestmark = pytest.mark.usefixtures("one_thread")

READS = {"item", "tolist", "__bool__", "__float__", "__int__", "__index__", "numpy", "__array__",
         "__format__", "__repr__", "__str__"}


class HostReads(TorchFunctionMode):
    """Counts the tensor -> Python reads made while active."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in READS:
            self.n += 1
        return func(*args, **(kwargs or {}))


def nan_grad_loss(model, batch):
    """A finite loss with NaN gradients (sqrt'(0) * 0): only the gradient flag can catch it."""
    out = loss_fn(model, batch)
    return {"mlm": out["mlm"] + (model.mlm.weight[0, 0] * 0).sqrt() * 0, "nsp": out["nsp"]}


def inf_loss(model, batch):
    """A non-finite loss with finite gradients: only the loss flag can catch it."""
    out = loss_fn(model, batch)
    return {"mlm": out["mlm"] + float("inf"), "nsp": out["nsp"]}


POISON = {"poison": torch.tensor(float("inf"))}
# (micro batches, loss) per step: good, a non-finite loss on one micro batch, good, NaN
# gradients, a non-finite loss again, good, a non-finite loss with finite gradients, good twice.
SCRIPT = [([make_batch(4, 0)], loss_fn),
          ([make_batch(2, 1), {**make_batch(2, 2), **POISON}], loss_fn),
          (split(make_batch(6, 3), 2), loss_fn),
          ([make_batch(4, 4)], nan_grad_loss),
          ([{**make_batch(4, 5), **POISON}], loss_fn),
          ([make_batch(4, 6)], loss_fn),
          ([make_batch(4, 7)], inf_loss),
          ([make_batch(4, 8)], loss_fn),
          ([make_batch(4, 9)], loss_fn)]
SKIPPED = [False, True, False, True, True, False, True, False, False]


def engine_for(name: str, precision: str, on_device: bool, **kw) -> Engine:
    torch.manual_seed(0)
    model = ToyPretrain()
    opt = build_optimizer(model, name, lr=1e-2)
    assert getattr(opt, "_step_supports_amp_scaling", False)  # fused AdamW, LAMB: on the CPU too
    if not on_device:
        opt._step_supports_amp_scaling = False  # the host decides, as for a foreach AdamW
    engine = Engine(model, opt, precision=precision, **kw)
    if engine.scaler is not None:
        engine.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)
    assert engine.skips_on_device() is on_device
    return engine


def precisions() -> list[str]:
    return ["fp32", "fp16"] if cpu_fp16_available() else ["fp32"]


@pytest.mark.parametrize("precision", precisions())
@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_device_skip_and_late_reads_equal_the_host_decision(name, precision):
    """Six steps, three of them non-finite (loss or gradients): the weights, the optimizer state
    (moments, step counts), the fp16 scale and its growth tracker, the counters and every
    step's numbers are bitwise those of the host's decision before the update."""
    host = engine_for(name, precision, on_device=False)
    runs = {late: engine_for(name, precision, on_device=True, read_late=late)
            for late in (False, True)}
    results: dict[object, list] = {"host": [], False: [], True: []}
    for batches, fn in SCRIPT:
        before = copy.deepcopy(host.model.state_dict())
        for key, engine in (("host", host), *runs.items()):
            results[key].append(engine.train_step(batches, fn, count_fn))
        moved = any(not torch.equal(v, before[k]) for k, v in host.model.state_dict().items())
        assert moved is not results["host"][-1].skipped
    assert [r.skipped for r in results["host"]] == SKIPPED
    for late, engine in runs.items():
        for a, b in zip(results["host"], results[late], strict=True):
            assert (a.skipped, a.losses, a.extras, a.lr, a.counts) == (b.skipped, b.losses,
                                                                      b.extras, b.lr, b.counts)
            assert a.grad_norm == b.grad_norm or math.isnan(a.grad_norm) and math.isnan(b.grad_norm)
        assert engine.state_dict() == host.state_dict()  # counters and the scaler's state
        for (k, v), w in zip(host.model.state_dict().items(), engine.model.state_dict().values(),
                             strict=True):
            assert torch.equal(v, w), k
        ref, got = host.optimizer.state_dict()["state"], engine.optimizer.state_dict()["state"]
        assert ref.keys() == got.keys()
        for i in ref:
            for k in ref[i]:
                assert torch.equal(torch.as_tensor(ref[i][k]), torch.as_tensor(got[i][k])), (i, k)
    assert host.state_dict()["skipped_steps"] == 4 and host.state_dict()["nonfinite_in_row"] == 0
    if precision == "fp16":  # backed off four times, grown once after two good steps in a row
        assert host.scaler.get_scale() == 2.0**8 * 0.5**4 * 2


@pytest.mark.parametrize("precision", precisions())
@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_a_step_reads_nothing_of_its_own_until_asked(name, precision):
    """The update is queued without the host reading the loss, the grad norm or the flag: a
    step's numbers are read at the end of the next step (exactly one read there), or when asked
    for. (Reading at the step's own end, the CPU default, shows up here as reads.)"""
    engine = engine_for(name, precision, on_device=True, read_late=True)
    steps = [SCRIPT[0], SCRIPT[1], SCRIPT[2]]
    counts = {id(mb): count_fn(mb) for batches, _ in steps for mb in batches}
    res = []
    for i, (batches, fn) in enumerate(steps):
        with HostReads() as reads:
            res.append(engine.train_step(batches, fn, lambda mb: counts[id(mb)]))
        assert reads.n == (1 if i else 0), (i, reads.n)  # none of its own; the previous step's
        if i:
            with HostReads() as reads:
                assert res[i - 1].skipped is SKIPPED[i - 1]
            assert reads.n == 0  # read already, at the end of this step
    with HostReads() as reads:
        assert res[-1].skipped is SKIPPED[2] and math.isfinite(res[-1].loss)
    assert reads.n == 1
    assert engine.state_dict()["skipped_steps"] == 1


def test_late_counters_abort_and_checkpoint():
    """Counters are applied in step order when a step is read: the abort after
    max_nonfinite_steps comes at the first read of the step that reached it, and a checkpoint
    reads every step before it saves the counters."""
    engine = engine_for("lamb", "fp32", on_device=True, read_late=True, max_nonfinite_steps=2)
    skipped: list[tuple[int, int]] = []
    engine.on_skipped = lambda step, n: skipped.append((step, n))
    bad = [{**make_batch(4, 9), **POISON}]
    engine.train_step(SCRIPT[0][0], loss_fn, count_fn)
    engine.train_step(bad, loss_fn, count_fn)
    assert skipped == []  # step 2 is not read yet
    assert engine.state_dict()["skipped_steps"] == 1 and skipped == [(2, 1)]
    engine.train_step(bad, loss_fn, count_fn)  # step 3 is not read yet: no abort so far
    with pytest.raises(TrainingDiverged, match=r"2 steps in a row .*\(step 3, loss inf"):
        engine.train_step(SCRIPT[0][0], loss_fn, count_fn)  # reads step 3 at its end
    assert engine.state_dict()["skipped_steps"] == 2 and engine.step == 4


def test_a_compression_hook_is_reset_before_the_next_backward():
    """With a stateful hook (PowerSGD) a skipped step is read before the next step's first
    forward, so the hook never runs on the state the bad step left."""
    at: list[int] = []
    engine = engine_for("adamw", "fp32", on_device=True, read_late=True)
    engine.on_numerics_reset = lambda: at.append(engine.micro_step)
    engine.train_step(SCRIPT[1][0], loss_fn, count_fn)  # two micro batches, non-finite
    assert at == []
    engine.train_step(SCRIPT[0][0], loss_fn, count_fn)
    assert at == [2]


def test_state_dict_round_trip_after_late_reads():
    engine = engine_for("adamw", "fp32", on_device=True, read_late=True)
    for batches, fn in SCRIPT[:2]:
        engine.train_step(batches, fn, count_fn)
    state = copy.deepcopy(engine.state_dict())
    assert state["skipped_steps"] == 1 and state["nonfinite_in_row"] == 1
    other = engine_for("adamw", "fp32", on_device=True, read_late=True)
    other.load_state_dict(state)
    assert other.state_dict() == state and other.nonfinite_in_row == 1


def big_grad_loss(scale: float):
    """The toy's loss times `scale`: finite, with gradients that overflow fp16 once the loss
    scale times `scale` is large enough."""
    def loss(model, batch):
        out = loss_fn(model, batch)
        return {"mlm": out["mlm"] * scale, "nsp": out["nsp"]}
    return loss


@pytest.mark.skipif(not cpu_fp16_available(), reason="needs fp16 autocast on the CPU")
@pytest.mark.parametrize("on_device", [True, False])
def test_fp16_overflows_while_the_scaler_finds_its_level_are_not_divergence(on_device):
    """torch's GradScaler starts at 65536 and halves per overflowing step: a run whose gradients
    overflowed its first five steps, its loss finite, was stopped as diverged
    (max_nonfinite_steps 5) one halving before it would have trained. Those skips are counted
    and said, not fatal, while the scale is 1 or more; gradients that overflow even below that
    still stop the run."""
    engine = engine_for("adamw", "fp16", on_device=on_device, max_nonfinite_steps=5)
    engine.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    loss = big_grad_loss(2.0**10)  # overflows until the scale is about 2**5
    results = [engine.train_step([make_batch(4, i)], loss, count_fn) for i in range(14)]
    skipped = [r.skipped for r in results]
    assert skipped[:6] == [True] * 6 and not skipped[-1], skipped
    assert engine.skipped_steps == sum(skipped) and math.isfinite(results[0].loss)
    engine = engine_for("adamw", "fp16", on_device=on_device, max_nonfinite_steps=5)
    engine.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4)
    with pytest.raises(TrainingDiverged, match="steps in a row"):  # at scale 0.5: 5 in a row
        for i in range(30):
            engine.train_step([make_batch(4, i)], big_grad_loss(1e30), count_fn).read()
    assert engine.skipped_steps == 6  # 16, 8, 4, 2, 1 calibrating, then 0.5

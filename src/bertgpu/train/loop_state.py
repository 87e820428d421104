"""What `train/loop.Loop` builds while a run lasts: its result (`LoopResult`) and what it
accumulates between log lines, evaluations and rebalancings (`LogWindow`); what differs per
rank in a checkpoint: the RNG states and a compression hook's state (`rank_states`,
`restore_rank_states`); and the warning of a run resumed with another length
(`length_change_note`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertgpu.train import distributed
from bertgpu.train.balance import RankTimes
from bertgpu.train.engine import StepResult


@dataclass
class LoopResult:
    step: int
    preempted: bool = False
    stop_reason: str = "max_steps"
    last_eval: dict[str, Any] = field(default_factory=dict)
    export_dir: Path | None = None
    tokens_seen: int = 0
    sequences_seen: int = 0
    train_s: float = 0.0
    """Time spent in training steps (data included; evaluation and checkpoints excluded)."""
    data_s: float = 0.0
    """The part of `train_s` spent waiting for `task.micro_batches` (host-side batch building)."""
    exit_status: int = 0
    """128 + the stop signal when preempted (143 for SIGTERM, 130 for SIGINT), else 0."""


LossMark = tuple[float, float, tuple[StepResult, int] | None]
"""`LogWindow.loss_mark()`: the loss sum, its sequences and the newest step's unread loss."""


def loss_state(mark: LossMark | None) -> dict[str, float] | None:
    """What a checkpoint holds of the training loss since the last evaluation (the newest step's
    included), from a `LogWindow.loss_mark()`; None without one."""
    if mark is None:
        return None
    loss_sum, loss_n, unread = mark
    if unread is not None and not unread[0].skipped:
        loss_sum, loss_n = loss_sum + unread[0].loss * unread[1], loss_n + unread[1]
    return {"loss_sum": loss_sum, "loss_n": loss_n}


class LogWindow:
    """What the loop accumulates between log lines, evaluations and rebalancings, on this rank."""

    def __init__(self, world: int, rank: int, log_every: int) -> None:
        from bertgpu.telemetry import flops
        from bertgpu.telemetry.throughput import Throughput, compile_events

        flops.peak_and_source(None)  # a bad BERTGPU_PEAK_TFLOPS: refused now, not at the first log

        # Rates over the last log interval of steps that neither compiled nor were the first;
        # the compile steps' time is reported apart (telemetry/throughput.py).
        self.throughput = Throughput(window=log_every, n_devices=world,
                                     compile_events=compile_events, skip_first=True)
        # Loop time (data + step), time waiting for data, exposed all-reduce time of the log
        # window; evaluation and checkpoint writes fall outside it on purpose.
        self.window_s = self.data_s = self.comm_s = 0.0
        self.log_times = RankTimes(world, rank)  # compute time per rank, for the straggler fields
        self.balance_times = RankTimes(world, rank)  # ... and for load balancing
        self.loss_sum = self.loss_n = 0.0  # training loss since the last evaluation, by sequences
        self.unread: tuple[StepResult, int] | None = None  # the newest step's, read one step late
        self.evaluated_at: int | None = None
        self.last: StepResult | None = None  # the newest completed step's
        self.logged_at: int | None = None  # the step of the newest train record
        # a train record whose host numbers are taken, written once its step is read
        self.later: tuple[StepResult, dict[str, Any]] | None = None

    def unlogged(self) -> StepResult | None:
        """The newest completed step when it has no train record yet (however the run ends,
        its last steps are logged)."""
        return self.last if self.last is not None and self.last.step != self.logged_at else None

    def add_step(self, data_s: float, step_s: float, comm_s: float, local_sequences: int,
                 compiled: bool = False) -> None:
        self.window_s += data_s + step_s
        self.data_s += data_s
        self.comm_s += comm_s
        if compiled:  # a compile is no measure of this rank's speed: 25 s against 0.1 s steps
            return  # read as a straggler 400x slower, and the balancer gave it 1 row of 32
        # This rank's compute: the step minus what it waited for the others (exposed all-reduce).
        self.log_times.add(step_s - comm_s, local_sequences)
        self.balance_times.add(step_s - comm_s, local_sequences)

    def add_loss(self, res: StepResult | None, sequences: int = 0) -> None:
        """A step's loss joins the mean at the next step (the engine has read it by then without
        waiting on the device) or in `train_loss`; skipped steps do not count."""
        if self.unread is not None and not self.unread[0].skipped:
            self.loss_sum += self.unread[0].loss * self.unread[1]
            self.loss_n += self.unread[1]
        self.unread = (res, sequences) if res is not None else None

    def loss_mark(self) -> LossMark:
        """The training loss so far, the newest step's still unread (read only if a checkpoint
        needs it: `loss_state`)."""
        return (self.loss_sum, self.loss_n, self.unread)

    def load_loss_state(self, state: dict[str, float] | None) -> None:
        """The training loss since the last evaluation as a checkpoint holds it (`loss_state`).
        Resumed runs used to start it from zero, so the interrupted epoch's `train_loss` was
        the mean of the steps after the resume only."""
        if state:
            self.loss_sum, self.loss_n = float(state["loss_sum"]), float(state["loss_n"])

    def train_loss(self, reset: bool = True) -> float | None:
        """Mean training loss since the last evaluation (weighted by sequences); reset unless
        `reset` is False (an evaluation reads it first and resets it once it completed)."""
        self.add_loss(None)
        mean = self.loss_sum / self.loss_n if self.loss_n > 0 else None
        if reset:
            self.loss_sum = self.loss_n = 0.0
        return mean

    def evaluated(self, step: int) -> None:
        """An evaluation at `step` completed: the loss window starts again, and the rates
        start after it."""
        self.train_loss()
        self.evaluated_at = step
        self.throughput.reset()


def eval_pending(state: dict[str, Any], step: int, every: int) -> bool:
    """A checkpoint of `step` (its `state`) was written before the evaluation due at that
    step completed: a stop signal cut it short. The resumed run does it first; it used to be
    lost. (Checkpoints written before `evaluated_at` was saved are taken as evaluated.)"""
    return (bool(every) and step > 0 and step % every == 0 and "evaluated_at" in state
            and state["evaluated_at"] != step)


def device_mfu(engine: Any, flops_per_token: float | None, world: int,
               tokens_per_s: float) -> float | None:
    """Model FLOPs utilisation of all devices, on devices with a known peak: BERTGPU_PEAK_TFLOPS
    on any device (it was ignored off CUDA), else a GPU's table entry (TF32's for fp32)."""
    import torch

    from bertgpu.telemetry import flops

    if not flops_per_token:
        return None
    dtype = flops.RUN_PEAK_DTYPE[engine.precision]
    name = torch.cuda.get_device_name(engine.device) if engine.device.type == "cuda" else None
    peak = flops.peak_tflops(name, dtype)
    return flops.mfu(tokens_per_s, flops_per_token, peak, n_devices=world) if peak else None


def rank_states(engine: Any, rng: tuple[Any, ...] | None = None
                ) -> tuple[list[Any], list[Any] | None]:
    """Collective, for a checkpoint: every rank's RNG state (as `checkpoint.capture_rng` took it:
    `rng`, else now), and on rank 0 every rank's PowerSGD state (None on the other ranks and
    without a stateful compression hook). The hook's state is per rank (each rank's residual is
    what compressing its own gradient lost), as large as the gradient: it goes to rank 0 only.
    It is the state now even for a preemption's snapshot: a step aborted by a stop signal ran no
    hook (its checks come before its last micro-step, whose backward calls the hook)."""
    from bertgpu.train.checkpoint import rng_state

    rngs = distributed.gather_objects(rng_state(rng))
    keeper = distributed.comm_hook_of(engine.model)
    if keeper is None:
        return rngs, None
    engine.read_all()  # a skipped step read late (CUDA) resets the hook first
    return rngs, distributed.gather_to_main(keeper.state_dict())


def restore_rank_states(state: dict[str, Any], engine: Any, info: Any, seed: int) -> None:
    """This rank's RNG and PowerSGD states from a checkpoint's `state` (`rank_states`'), when it
    was written at this world size. At another one the data order and masks continue exactly
    (they depend on the global position only), dropout noise restarts from (seed, rank, step),
    and PowerSGD starts afresh, which rank 0 says in one line."""
    import torch

    from bertgpu.train.checkpoint import set_rng_state

    rngs, step = state.get("rng") or [], engine.step
    if len(rngs) == info.world_size:
        set_rng_state(rngs[info.rank])
    else:
        torch.manual_seed(seed * 1000003 + info.rank + 7919 * step)
    keeper = distributed.comm_hook_of(engine.model)
    saved = state.get("comm_hook")
    if keeper is None:
        return
    if saved is not None and len(saved) == info.world_size:
        keeper.load_state_dict(saved[info.rank])
    elif info.is_main:
        found = (f"the PowerSGD state of {len(saved)} ranks, not {info.world_size}" if saved
                 else "no PowerSGD state")
        print(f"distributed.comm_hook powersgd: the checkpoint of step {step} holds {found}; "
              "PowerSGD starts afresh (uncompressed for 10 steps, then without the error "
              "feedback from before the resume)", flush=True)


def length_change_note(state: dict[str, Any], checkpoint: Path, schedule: Any, step: int,
                       progress: float, budget_s: float | None) -> str | None:
    """The start-up warning of a run resumed at `step` with another length than the one its
    checkpoint (`state`, in folder `checkpoint`) was trained for: train.max_steps in step mode,
    train.budget_hours in budget mode (or a switch between the two). The lr is a function of
    progress (step / max_steps, or the budget clock / budget), so the progress at the resumed
    step jumps and the lr with it: a run finished at step 1000 of 1000 (lr near 0) and given 2000
    resumes at progress 0.5, back at a high lr. Maybe what the user wants, never silently: the
    warning names the old and the new value, and the progress and lr of the next step under each;
    for a finished run, whose next step never ran, the "from" lr is that of its last step (the
    old schedule's lr at progress 1, 0 under a linear decay, is an lr no step ran at).
    `schedule`, `progress` and `budget_s` are the resumed run's (`budget_s` None in step mode).
    None when the length is the same, or when the checkpoint does not say what it was (one
    written before it stored max_steps, without a config.toml)."""
    clock = state.get("budget") or None  # {"elapsed_s", "budget_s"} of a budget run
    old_budget = float(clock["budget_s"]) if clock else None
    old_steps = state["max_steps"] if "max_steps" in state else _config_max_steps(checkpoint)
    if old_budget is not None or budget_s is not None:
        if old_budget == budget_s:
            return None
        knob = f"train.budget_hours {_hours(old_budget)} -> {_hours(budget_s)}"
    elif old_steps is None or int(old_steps) == schedule.max_steps:
        return None
    else:
        knob = f"train.max_steps {old_steps} -> {schedule.max_steps}"
    from bertgpu.train.schedule import progress_from_steps

    if clock:
        before = min(float(clock["elapsed_s"]) / float(clock["budget_s"]), 1.0)
    elif old_steps is not None:
        before = progress_from_steps(step, int(old_steps))
    else:
        return None  # a step run's checkpoint that does not say its max_steps
    old = _old_schedule(checkpoint, dataclasses.replace(
        schedule, max_steps=int(old_steps or 0), budget_mode=old_budget is not None))
    head = (f"{knob}: the lr schedule is re-stretched to the new length, so at step {step} its "
            f"progress goes from {before:.1%} to {progress:.1%} and the lr")
    tail = "; give the old value to go on with the schedule as it was"
    new_lr = schedule.lr(progress, step)
    if before < 1.0:  # the old run gave step + 1 this lr (it may have taken it before a stop)
        return (f"{head} of step {step + 1} jumps from {old.lr(before, step):.3g} to "
                f"{new_lr:.3g}{tail}")
    last = _last_lr(state, old, step, int(old_steps or 0), clock is not None)
    if last is None:  # a budget run's sharded checkpoint: its last step's progress is unknown
        return (f"{head} of step {step + 1} is {new_lr:.3g}, after the old run ended its "
                f"schedule{tail}")
    return (f"{head} jumps from {last:.3g} (step {step}'s, the last the old run took) to "
            f"{new_lr:.3g} (step {step + 1}'s){tail}")


def _last_lr(state: dict[str, Any], old: Any, step: int, old_steps: int,
             budget: bool) -> float | None:
    """The lr of step `step`, the last a finished run took: its old schedule's at the progress
    before that step in step mode; in budget mode (that progress is a clock the checkpoint does
    not keep) the lr its optimizer state holds, set for that step, where the state is in
    `state` (not in a sharded checkpoint)."""
    from bertgpu.train.schedule import progress_from_steps

    if not budget:
        return old.lr(progress_from_steps(step - 1, old_steps), step - 1)
    groups = (state.get("optimizer") or {}).get("param_groups") or [{}]
    lr = groups[0].get("lr")
    return float(lr) if isinstance(lr, (int, float)) and not isinstance(lr, bool) else None


def _old_schedule(checkpoint: Path, schedule: Any) -> Any:
    """`schedule` (the resumed run's, at the checkpoint's length) with the lr settings the
    checkpoint's steps ran under, from its config.toml: the peak lr (scaled to its global batch
    as the run scaled it), warm-up, decay and min_lr_ratio. The warning's "from" lr is then the
    one the old run logged, also when the resume changes the lr too (it took the new peak lr to
    the old progress, an lr no step ran at). `schedule` as it is without such a config.toml (a
    fine-tuning checkpoint: a resume of one changes no lr setting)."""
    from bertgpu.config import schema

    path = checkpoint / "config.toml"
    if not path.is_file():
        return schedule
    try:
        cfg = schema.load_config(str(path), [], check_batch=False)
        s, optim = cfg.schedule, cfg.optim
        peak = schema.scaled_lr(optim.lr, cfg.train.global_batch_size,
                                optim.reference_batch_size, optim.lr_scaling)
    except Exception:  # noqa: BLE001 - not loadable by this version: the resumed run's settings
        return schedule
    return dataclasses.replace(schedule, peak_lr=peak, decay=s.decay,
                               warmup_fraction=s.warmup_fraction or 0.0,
                               warmup_steps=s.warmup_steps, min_lr_ratio=s.min_lr_ratio,
                               power=s.power, decay_fraction=s.decay_fraction,
                               decay_span=s.decay_span)


def _hours(budget_s: float | None) -> str:
    return "none" if budget_s is None else f"{budget_s / 3600:g}"


def _config_max_steps(checkpoint: Path) -> int | None:
    """train.max_steps of the checkpoint's config.toml (a pretraining checkpoint written before
    the state stored it); None without one."""
    from bertgpu.config.overrides import read_toml
    from bertgpu.errors import BertgpuError

    try:
        value = read_toml(checkpoint / "config.toml").get("train", {}).get("max_steps")
    except BertgpuError:
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None

"""`bertgpu watch`: a live terminal view of a running (or finished) run, from its files.

    bertgpu watch runs/base                 # redraws every 2 s as the run writes; Ctrl-C to leave
    bertgpu watch runs/base --once          # one frame, then exit (scripts, logs, cron mail)
    ssh node7 -t bertgpu watch /scratch/runs/base

It reads what the run writes anyway: ``metrics.jsonl`` (loss, learning rate, tokens/s and MFU
over the last log interval of steps that did not compile, the seconds spent compiling,
evaluations, the per-rank step times), ``gpu.jsonl`` and ``gpu.nodeN.jsonl`` (the GPU monitor's
samples) and ``config.toml`` (model, batch, length of the run), following each file as it grows.
It needs nothing but a terminal, so it works over ssh, and it never touches the run. A
fine-tuning run in progress writes to ``OUT.tmp/``; ``bertgpu watch OUT`` finds it there, and
follows it into ``OUT`` when it finished (the folder is renamed then). A
folder with none of a run's files (config.toml, checkpoints/, metrics.jsonl, results.json) is
refused, naming the runs it holds (``bertgpu watch runs`` for ``runs/base``); an empty one (only
hidden files: a run in its first seconds) is waited for, as is one not made yet in a folder that
exists (``bertgpu pretrain ... --out OUT &; bertgpu watch OUT``; not with ``--once``).

The progress line gives the step of ``train.max_steps`` and the share done. For a run with a
wall-clock budget (``train.budget_hours``) the share is the larger of the steps' and the
budget's (then said "of the budget"; all of it once the run ended on its budget), and the ETA is
whichever of the steps and the budget runs out first. The budget's part comes from the budget
clock the run stops on (``budget_elapsed_s`` and ``budget_left_s`` of the last train record),
not from ``elapsed_s``, the wall-clock time shown as "elapsed" (the newest record's, so a
finished run's counts its final evaluation, checkpoint and export, as ``bertgpu report``'s wall
time does), which counts what that clock leaves out (a first evaluation, for one); records
without them (an older bertgpu) fall back on it.

The status line says how a run ended from its ``end`` record (finished; stopped by a signal, by
divergence or by an error, without an ETA), and the live view then prints its last frame and
exits; an error after which ``--max-restarts`` may restart the job is followed on while its
launcher runs. A run killed without one (SIGKILL, out of memory) is told apart on the host it ran
on: the ``start`` record names the host and pid of its process, and a process that is gone is
said so, unless the record names a ``--max-restarts`` launcher that is still there to start the
job again (watch_liveness.py): then it is followed on, as after an error. A run that ended and
is started again (a larger ``train.max_steps``, a preempted run re-run) is said to be resuming
from when its new process holds the run folder, and followed on; ``config.toml`` is read again
when it changes (the new length).
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertgpu.errors import BertgpuError, Terminated
from bertgpu.report.inputs import finetune_task
from bertgpu.telemetry.console import duration, si
from bertgpu.telemetry.records import (
    JsonlFollower,
    describe_end,
    drop_superseded_records,
    run_end,
    run_start,
)
from bertgpu.telemetry.run_folders import not_made_yet, resolve, wait_for
from bertgpu.watch_liveness import (
    gone_before_first_record,
    restart_awaited,
    resuming,
    writer_gone,
)

_BLOCKS = "▁▂▃▄▅▆▇█"
_GPU_HISTORY = 40  # samples per GPU kept for its utilisation sparkline
_EVAL_SKIP = ("step", "kind", "time", "elapsed_s")


def sparkline(values: list[float], width: int = 40) -> str:
    """Values as block characters, ``width`` at most (the mean of each bucket when there are
    more values); non-finite values are left blank."""
    if not values:
        return ""
    n = len(values)
    if n > width:
        buckets = [values[i * n // width:(i + 1) * n // width] for i in range(width)]
        values = [_mean(b) for b in buckets]
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return " " * len(values)
    lo, hi = min(finite), max(finite)
    scale = (len(_BLOCKS) - 1) / (hi - lo) if hi > lo else 0.0
    return "".join(_BLOCKS[round((v - lo) * scale)] if math.isfinite(v) else " " for v in values)


def _mean(xs: list[float]) -> float:
    finite = [x for x in xs if math.isfinite(x)]
    return sum(finite) / len(finite) if finite else float("nan")


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


@dataclass
class RunState:
    """What the view knows of a run, updated from the records its files gain."""

    folder: Path
    config: dict[str, Any] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)
    gpus: dict[tuple[str, int], deque[dict[str, Any]]] = field(default_factory=dict)
    followers: dict[str, JsonlFollower] = field(default_factory=dict)
    config_stamp: int | None = None  # config.toml's mtime when `config` was read

    def poll(self) -> None:
        """Read what the files gained since the last poll."""
        self._follow_rename()
        self._read_config()
        new = self._follow("metrics.jsonl")
        if self.followers["metrics.jsonl"].reset:
            self.records = []
        if new:
            self.records = drop_superseded_records(self.records + new)
        for path in sorted(self.folder.glob("gpu*.jsonl")):
            label = path.name[len("gpu."):-len(".jsonl")] if path.name != "gpu.jsonl" else ""
            for rec in self._follow(path.name):
                if isinstance(rec.get("gpu"), int):
                    key = (label, rec["gpu"])
                    self.gpus.setdefault(key, deque(maxlen=_GPU_HISTORY)).append(rec)

    def _read_config(self) -> None:
        """config.toml, again whenever it changes: a run resumed with a larger train.max_steps
        writes its new length there (read once, the view went on with the old: step 25 / 20)."""
        from bertgpu.config.overrides import read_toml

        path = self.folder / "config.toml"
        try:
            stamp = path.stat().st_mtime_ns
        except OSError:
            return
        if stamp == self.config_stamp:
            return
        try:
            self.config, self.config_stamp = read_toml(path), stamp
        except BertgpuError:
            pass  # being written (read at the next poll), or not ours: the view does without it

    def _follow_rename(self) -> None:
        """A fine-tuning run's OUT.tmp, gone: once finished it is OUT (fsutil.replace_dir), and
        the view moves there, each file read on from where it was. Watching the vanished folder
        read nothing more, not even the end record, and took the run for killed once its process
        had exited. Only to the metrics file it was reading: an OUT holding another one is not
        this run."""
        name = self.folder.name
        if not name.endswith(".tmp") or self.folder.exists():
            return
        final = self.folder.with_name(name.removesuffix(".tmp"))
        metrics = self.followers.get("metrics.jsonl")
        if metrics is None or not metrics.move_to(final / "metrics.jsonl"):
            return
        self.folder = final
        for file, follower in self.followers.items():
            follower.path = final / file

    def _follow(self, name: str) -> list[dict[str, Any]]:
        if name not in self.followers:
            self.followers[name] = JsonlFollower(self.folder / name)
        return self.followers[name].poll()

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("kind") == kind]

    def last_update(self) -> float | None:
        """Unix time of the newest write to any file the view follows."""
        times = []
        for name in self.followers:
            try:
                times.append((self.folder / name).stat().st_mtime)
            except OSError:
                continue
        return max(times) if times else None


def _section(config: dict[str, Any], name: str) -> dict[str, Any]:
    value = config.get(name)
    return value if isinstance(value, dict) else {}


def _max_steps(state: RunState) -> float | None:
    """``train.max_steps`` of config.toml, else of the start record (a fine-tuning run's steps
    come from its epochs); None when not set (a budget run)."""
    steps = _num(_section(state.config, "train").get("max_steps"))
    if not steps:
        start = run_start(state.records)
        steps = _num(start.get("max_steps")) if start is not None else None
    return steps or None


def eta_s(state: RunState) -> float | None:
    """Seconds left: by steps (``train.max_steps`` at the recent step rate) and by budget (the
    last train record's ``budget_left_s``, else ``train.budget_hours`` minus its elapsed_s),
    whichever ends the run first."""
    train = state.of_kind("train")
    if not train:
        return None
    last = train[-1]
    step, elapsed = _num(last.get("step")), _num(last.get("elapsed_s"))
    t = _section(state.config, "train")
    left = []
    max_steps = _max_steps(state)
    recent = [r for r in train[-10:] if _num(r.get("elapsed_s")) is not None]
    if max_steps and step is not None and len(recent) >= 2:
        ds = recent[-1]["step"] - recent[0]["step"]
        dt = recent[-1]["elapsed_s"] - recent[0]["elapsed_s"]
        if ds > 0 and dt > 0:
            left.append(max(max_steps - step, 0) * dt / ds)
    budget, budget_left = _num(t.get("budget_hours")), _num(last.get("budget_left_s"))
    if budget_left is not None:  # the budget clock's: the one the run stops on
        left.append(max(budget_left, 0.0))
    elif budget and elapsed is not None:
        left.append(max(budget * 3600 - elapsed, 0.0))
    return min(left) if left else None


def budget_share(state: RunState) -> float | None:
    """The share of ``train.budget_hours`` used, in [0, 1]: by the budget clock of the last
    train record (``budget_elapsed_s`` of elapsed plus left; else its elapsed_s over the
    budget), and 1 once the run ended on its budget; None without a budget."""
    budget = _num(_section(state.config, "train").get("budget_hours"))
    if not budget:
        return None
    end = run_end(state.records)
    if end is not None and end.get("reason") == "budget":
        return 1.0
    train = state.of_kind("train")
    last = train[-1] if train else {}
    used, left = _num(last.get("budget_elapsed_s")), _num(last.get("budget_left_s"))
    if used is not None and left is not None and used + left > 0:
        return min(used / (used + left), 1.0)
    elapsed = _num(last.get("elapsed_s"))
    return min(elapsed / (budget * 3600), 1.0) if elapsed is not None else 0.0


def ended(state: RunState) -> str | None:
    """The status of a run that is over: its end record's, or, for a run started on this host
    whose process is gone without writing one, that; None while it may still be running, or be
    started again by its ``--max-restarts`` launcher (watch_liveness)."""
    end = run_end(state.records)
    if end is not None:
        if _restart_awaited(state) is not None or _resuming(state) is not None:
            return None
        return describe_end(end, _max_steps(state))
    if not state.records:
        return gone_before_first_record(state.folder)
    pid = writer_gone(state.records)
    if pid is None or _restart_awaited(state) is not None:
        return None
    return f"stopped (process {pid} is gone; no end record: killed or crashed)"


def _restart_awaited(state: RunState) -> str | None:
    """watch_liveness.restart_awaited of the run the view follows."""
    return restart_awaited(state.records, state.last_update())


def _resuming(state: RunState) -> str | None:
    """watch_liveness.resuming of a run whose newest record is its end record: a process holds
    its folder again (an extension's start-up: watch said "finished" and left)."""
    end = run_end(state.records)
    return resuming(state.folder, end) if end is not None else None


def _status(state: RunState, now: float) -> str:
    over = ended(state) or _restart_awaited(state) or _resuming(state)
    if over is not None:
        return over
    updated = state.last_update()
    if updated is None:
        return "waiting for the first record"
    quiet = now - updated
    if quiet > 600:
        return f"no new record for {duration(quiet)} (stopped, or a long evaluation)"
    return f"running (updated {duration(max(quiet, 0))} ago)"


def _model_line(config: dict[str, Any]) -> str | None:
    m, t = _section(config, "model"), _section(config, "train")
    if "hidden_size" not in m:
        return None
    line = (f"{m.get('num_hidden_layers', '?')} layers x {m['hidden_size']} hidden, "
            f"{m.get('num_attention_heads', '?')} heads")
    if "global_batch_size" in t:
        line += f"; global batch {t['global_batch_size']}, {t.get('precision', '?')}"
    return line


def _series(records: list[dict[str, Any]], key: str) -> list[float]:
    return [v if (v := _num(r.get(key))) is not None else float("nan")
            for r in records if key in r]


def _progress_lines(state: RunState, now: float, width: int) -> list[str]:
    train = state.of_kind("train")
    lines = []
    if not train:
        return ["no train records yet"]
    last = train[-1]
    total = _max_steps(state)
    where = f"step {last['step']:,}"
    if total:
        where += f" / {total:,.0f}"
    step_share = last["step"] / total if total else None
    budget = budget_share(state)
    if budget is not None and (step_share is None or budget > step_share):
        where += f" ({budget:.1%} of the budget)"
    elif step_share is not None:
        where += f" ({step_share:.1%})"
    parts = [where]
    # The newest record's clock, of any kind: a finished run's end record (or a checkpoint or
    # preemption record after it), not its last train record's, which leaves out the final
    # evaluation, checkpoint and export (bertgpu report's wall time counts them too).
    elapsed = next((e for r in reversed(state.records)
                    if (e := _num(r.get("elapsed_s"))) is not None), None)
    if elapsed is not None:
        parts.append(f"elapsed {duration(elapsed)}")
    stopped = ended(state) or _restart_awaited(state) or _resuming(state)
    eta = eta_s(state) if stopped is None else None  # a run that stopped (or starts) has none
    if eta is not None:
        parts.append(f"ETA {duration(eta)}")
    if _num(last.get("tokens_seen")) is not None:
        parts.append(f"tokens {si(last['tokens_seen'])}")
    lines.append("  ·  ".join(parts))
    spark_w = max(10, width - 30)
    for key, label, fmt in (("loss", "loss", "{:.4f}"), ("lr", "lr", "{:.2e}")):
        ys = _series(train, key)
        if ys:  # the last value as logged: nan when the run's last logged step had none
            lines.append(f"{label:<5} {fmt.format(ys[-1]):>10}  {sparkline(ys, spark_w)}")
    rate = []
    if _num(last.get("tokens_per_s")) is not None:
        per = _num(last.get("tokens_per_s_per_device"))
        rate.append(f"tok/s {si(last['tokens_per_s'])}"
                    + (f" ({si(per)} per device)" if per and per != last["tokens_per_s"] else ""))
    for key, text in (("mfu", "MFU {:.1%}"), ("step_time_s", "step {:.3g} s"),
                      ("mem_peak_gib", "mem {:.2f} GiB"), ("data_wait_share", "data wait {:.0%}"),
                      ("comm_share", "comm {:.0%}")):
        if _num(last.get(key)) is not None:
            rate.append(text.format(last[key]))
    compiled = _num(last.get("compile_s"))
    if compiled:  # the seconds of the steps that compiled: the rates above leave them out
        n = _num(last.get("compile_steps"))
        rate.append(f"compile {compiled:.1f} s" + (f" ({n:.0f} steps)" if n and n > 1 else ""))
    if rate:
        lines.append("  ·  ".join(rate))
    if _num(last.get("slowest_rank")) is not None:
        ratio = _num(last.get("slowest_vs_median"))
        lines.append(f"slowest rank {last['slowest_rank']:.0f}"
                     + (f" ({ratio:.2f}x the median compute time of the other ranks)"
                        if ratio else ""))
    return lines


def _eval_line(state: RunState) -> str | None:
    evals = state.of_kind("eval")
    if not evals:
        return None
    last = evals[-1]
    values = [f"{k} {v:.2%}" if k.endswith("_acc") else f"{k} {v:.4g}"
              for k, v in last.items() if k not in _EVAL_SKIP and _num(v) is not None]
    return f"last eval @ step {last.get('step')}: " + "  ·  ".join(values)


def _gpu_table(state: RunState) -> Any:
    from rich.table import Table

    table = Table(box=None, pad_edge=False, header_style="bold")
    for col, justify in (("gpu", "left"), ("name", "left"), ("util", "right"),
                         ("util trend", "left"), ("temp", "right"), ("power", "right"),
                         ("memory", "right"), ("SM clock", "right"), ("throttle", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for (label, index), samples in sorted(state.gpus.items()):
        s = samples[-1]
        name = f"{label}:{index}" if label else str(index)
        if s.get("lost"):
            table.add_row(name, str(s.get("name", "")), "lost", "", "", "", "", "",
                          str(s.get("error", "")))
            continue

        def fmt(key: str, text: str, s: dict[str, Any] = s) -> str:
            return text.format(s[key]) if _num(s.get(key)) is not None else ""

        power = fmt("power_w", "{:.0f}")
        if power and _num(s.get("power_limit_w")) is not None:
            power += f"/{s['power_limit_w']:.0f}"
        mem = fmt("mem_used_gib", "{:.1f}")
        if mem and _num(s.get("mem_total_gib")) is not None:
            mem += f"/{s['mem_total_gib']:.0f}"
        table.add_row(name, str(s.get("name", "")), fmt("util_pct", "{:.0f}%"),
                      sparkline(_series(list(samples), "util_pct"), 20),
                      fmt("temp_c", "{:.0f}C"), power + (" W" if power else ""),
                      mem + (" GiB" if mem else ""), fmt("sm_clock_mhz", "{:.0f} MHz"),
                      " ".join(s.get("throttle") or []))
    return table


def render(state: RunState, now: float | None = None, width: int = 100) -> Any:
    """One frame of the view (a rich renderable)."""
    from rich.console import Group
    from rich.text import Text

    now = time.time() if now is None else now
    parts: list[Any] = [Text(f"bertgpu watch  {state.folder}  ·  {_status(state, now)}",
                             style="bold")]
    task = finetune_task(state.folder, state.records) if not state.config else ""
    parts += [Text(line, style="dim")  # a pretraining run's model (config.toml), a fine-tune's task
              for line in (_model_line(state.config), task and f"fine-tuning {task}") if line]
    parts += [Text(line) for line in _progress_lines(state, now, width)]
    evaluation = _eval_line(state)
    if evaluation:
        parts.append(Text(evaluation))
    if state.gpus:
        parts.append(_gpu_table(state))
    return Group(*parts)


MAX_INTERVAL_S = 86400
LOG_WIDTH = 160  # columns of a frame written to a file or a pipe (COLUMNS overrides)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR",
                        help="run folder (of bertgpu pretrain, or the OUT of bertgpu finetune)")
    parser.add_argument("--once", action="store_true",
                        help="print one frame and exit (no live redraw)")
    parser.add_argument("--interval", type=float, default=2.0,
                        help="seconds between redraws (default: 2)")


def main(args: argparse.Namespace) -> int:
    from rich.console import Console

    if not 0 < args.interval <= MAX_INTERVAL_S:  # nan and inf included (sleep raised on them)
        raise BertgpuError(f"--interval: found {args.interval}, expected a positive number of "
                           f"seconds up to {MAX_INTERVAL_S}")
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=LOG_WIDTH)  # a log or a pipe: no screen to fit (rich takes 80)
    if not args.once and not_made_yet(args.run_dir):
        try:
            wait_for(args.run_dir, args.interval, console)
        except Terminated:  # SIGTERM: the command line's "stopped by SIGTERM", exit 143
            raise
        except KeyboardInterrupt:  # as leaving the live view
            return 0
    state = RunState(resolve(args.run_dir))
    state.poll()
    if args.once or ended(state) is not None:  # a run that is over: its last frame
        console.print(render(state, width=console.width))
        return 0
    if not console.is_terminal:  # a pipe or a log: a frame per change, not one at the end
        return _frames(state, console, args.interval)
    from rich.live import Live

    try:
        with Live(render(state, width=console.width), console=console, auto_refresh=False,
                  screen=False) as live:
            while ended(state) is None:  # until the run ends: then its last frame stays
                time.sleep(args.interval)
                state.poll()
                live.update(render(state, width=console.width), refresh=True)
    except Terminated:  # SIGTERM (a scheduler, `timeout`): exit 143 as every command does
        raise
    except KeyboardInterrupt:  # Ctrl-C, the way to leave a live view: not an error
        pass
    return 0


def _frames(state: RunState, console: Any, interval: float) -> int:
    """The live view where there is no screen to redraw (`watch RUN > log`, a pipe): a frame
    each time the run logged something or began to wait for a ``--max-restarts`` restart (a
    killed rank 0 logs nothing more: its wait was not shown), until it ends. rich's live view
    printed nothing there until the run ended (its one frame, or none if the watch was stopped
    first)."""
    shown = None
    try:
        while True:
            seen = (len(state.records), ended(state) is not None,
                    _restart_awaited(state) is not None)
            if seen != shown:
                console.print(render(state, width=console.width))
                console.file.flush()
                shown = seen
            if seen[1]:
                return 0
            time.sleep(interval)
            state.poll()
    except Terminated:
        raise
    except KeyboardInterrupt:
        return 0

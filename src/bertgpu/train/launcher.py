"""`--nproc N`: a command re-run as N local workers under PyTorch's elastic launcher, with one
clear last line about how it ended.

    launch_local(2, ["pretrain", "configs/tiny.toml", "--data", "d", "--out", "r"],
                 max_restarts=1,
                 resume_hint=lambda: "re-running the same command resumes from step 40")

The launcher (`python -m torch.distributed.run --standalone`) runs in a session of its own, so
that a stop signal that reaches this process (Ctrl-C in a terminal, `kill`, a scheduler's
SIGTERM) is forwarded to it exactly once. torch's agent passes it on to each worker's process
group (a worker and its loader processes; a scheduler that signals every process reaches them
twice, and they count it once), which end within `checkpoint.grace_s` (train/preemption.py; the
agent kills them 30 s later), and this process exits 143 (130 for SIGINT) saying so. A stop
signal that reaches only torch's agent, or only one worker (every rank then stops at the same
safe point), ends the same way: that exit status, the workers' stop line without torch's
traceback or failure report, and no restart (`stop_signal`).

With `max_restarts`, a failed job is started again, up to that many times, and resumes from the
newest good checkpoint. The restart is a fresh launcher (a new rendezvous, new ports) rather than
torch's in-place worker restart: on CPU the gloo group of a restarted attempt fails to connect
about three times in four (torch 2.13, a plain two-rank script shows it too), a fresh launch
does not. Each attempt sees its number in BERTGPU_RESTART_COUNT, and, while another may follow,
this process in BERTGPU_RESTART_BY (`bertgpu watch` waits for the restart, after a worker's
error as after a rank 0 killed without an end record). When the job fails for good, the
launcher's report is followed by one line naming the rank that died and of what (read from that
report), and how to resume. A job that failed of bad input (a worker's
one-line error, exit status 2) is not restarted, and ends with that line alone.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from bertgpu.telemetry.records import RESTART_BY_ENV, process_started

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


RESTART_ENV = "BERTGPU_RESTART_COUNT"
# RESTART_BY_ENV ("PID STARTED" of this process while another attempt may follow) is named by
# rank 0's start record (records.launcher_fields) and a worker's error end record
# (train/run_end.py), so that `bertgpu watch` waits for the restart while this process lives,
# instead of ending at the error, or at rank 0 killed without an end record.


def launcher_command(nproc: int, argv: list[str], log_dir: str) -> list[str]:
    """The torch elastic launcher's command line for `python -m bertgpu ARGV` on `nproc` workers;
    ``log_dir``: where it keeps each rank's error file (for its failure report)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(nproc), "--log-dir", log_dir, "-m", "bertgpu", *argv]


def launch_local(nproc: int, argv: list[str], max_restarts: int = 0,
                 resume_hint: Callable[[], str | None] | None = None) -> int:
    """Run the launcher (again after a failure, up to `max_restarts` times), pass its output
    through, forward stop signals; returns the exit status (0, 128 + the signal when stopped by
    one: 143 for SIGTERM, 130 for SIGINT; else the launcher's). A stop is a stop wherever the
    signal landed: here, on the launcher or on one worker (`stop_signal`); it is never
    restarted. The caller must strip its own `--nproc` from `argv` so the children (which see
    WORLD_SIZE) do not launch again."""
    name = f"bertgpu {argv[0]}" if argv else "bertgpu"
    _warn_oversubscribed(name, nproc)
    for attempt in range(max_restarts + 1):
        with _restart_by(attempt < max_restarts):
            rc, tail, received = _launch_once(nproc, argv, attempt)
        if rc == 0:
            return 0
        hint = ((resume_hint() if resume_hint else None)
                or "re-running the same command resumes from its newest checkpoint")
        stopped_by = received[0] if received else stop_signal(rc, tail, name)
        if stopped_by is not None:
            sig = signal.Signals(stopped_by).name
            code = failure_exit_code(tail)
            if code is not None and code not in _STOP_EXITS:
                # a worker crashed while the job stopped: its report is above, and not a stop
                print(f"{name}: {describe_failure(tail)} while stopping on {sig}; {hint}",
                      file=sys.stderr, flush=True)
            elif not _said_stop(tail, name):  # a worker's line already said how the run stopped
                print(f"{name}: stopped by {sig}; {hint}", file=sys.stderr, flush=True)
            return 128 + stopped_by
        if failure_exit_code(tail) == USER_ERROR_EXIT:
            # bad input: the worker's one-line error says it all, and a restart would meet it again
            return USER_ERROR_EXIT
        if attempt < max_restarts:
            print(f"{name}: {describe_failure(tail)}; restart {attempt + 1} of {max_restarts}: "
                  f"{hint.replace('re-running the same command resumes', 'resuming')}",
                  file=sys.stderr, flush=True)
            continue
        print(f"{name}: {describe_failure(tail)}; {hint}", file=sys.stderr, flush=True)
    return rc


@contextmanager
def _restart_by(may_restart: bool) -> Iterator[None]:
    """RESTART_BY_ENV in this process's environment, which the launcher and its workers inherit,
    while one attempt runs: naming this process when a restart may follow, else unset (one left
    by a command that started this one is not this job's)."""
    outer = os.environ.pop(RESTART_BY_ENV, None)
    if may_restart:
        started = process_started(os.getpid())
        os.environ[RESTART_BY_ENV] = f"{os.getpid()} {'-' if started is None else started}"
    try:
        yield
    finally:
        os.environ.pop(RESTART_BY_ENV, None)
        if outer is not None:
            os.environ[RESTART_BY_ENV] = outer


_STOP_EXITS = {code for sig in STOP_SIGNALS for code in (128 + sig, -sig)}
"""A worker's exit status after a stop signal: 128 + it from train/preemption.py, minus it when
the signal killed the worker before its handler was installed."""
_AGENT_SIGNAL = re.compile(r"Received (?:Signals\.)?(\w+) death signal|Got termination signal: "
                           r"(?:Signals\.)?(\w+)$")
"""torch's agent's log line on a signal: "Received 15 death signal, shutting down workers" (or
"Got termination signal: 15" in its exit barrier); it then stops the workers and raises
SignalException, whose last line `_SIGNAL_EXCEPTION` reads."""
_SIGNAL_EXCEPTION = re.compile(r"SignalException: Process \d+ got signal: (?:Signals\.)?(\w+)$")


def _said_stop(lines: list[str], name: str) -> bool:
    """A worker printed the run's stop line (train/preemption.py: "bertgpu pretrain: SIGTERM:
    wrote a preemption checkpoint ...; re-running ...", or "...: second SIGTERM: ..."; before
    the run, train/distributed.py: "bertgpu pretrain: SIGINT: interrupted during distributed
    set-up"): the launcher's own line would repeat it."""
    said = _stop_line(name)
    return any(said.match(line) for line in lines)


def _stop_line(name: str) -> re.Pattern[str]:
    """The stop line of command `name` (its signal in group 1)."""
    return re.compile(rf"^{re.escape(name)}: (?:second )?(SIG[A-Z0-9]+): ")


def _signal_of(line: str, *patterns: re.Pattern[str]) -> int | None:
    """The stop signal that `line` names where one of `patterns` finds a signal ("15",
    "SIGTERM" or "Signals.SIGTERM"), or None."""
    for pattern in patterns:
        if m := pattern.search(line.rstrip("\n")):
            text = next(group for group in m.groups() if group)
            try:
                number = int(text) if text.isdigit() else int(signal.Signals[text])
            except (KeyError, ValueError):
                continue
            if number in STOP_SIGNALS:
                return number
    return None


def stop_signal(rc: int, lines: list[str], name: str) -> int | None:
    """The stop signal that ended a failed launcher run when this process forwarded none, read
    from its exit status and the last lines of its stderr; None when the job failed.

    - The launcher was signalled: it died of the signal (before torch's handlers were in place),
      or torch's agent logged it and raised SignalException (it stops the workers first).
    - A worker was: the first failure in torch's failure report exited 143/130 (or died of the
      signal). Every rank stops at the same safe point when one of them got the signal
      (train/preemption.py), and whichever exits first makes torch's agent close the others
      and report a failure. A report whose first failure is anything else is a failure, even
      when rank 0 then printed a stop line: the agent closes the workers left with SIGTERM.
    - No report, and a worker printed the run's stop line."""
    if rc < 0 and -rc in STOP_SIGNALS:
        return -rc
    for line in reversed(lines):
        if (number := _signal_of(line, _AGENT_SIGNAL, _SIGNAL_EXCEPTION)) is not None:
            return number
    code = failure_exit_code(lines)
    if code is not None:
        return (code - 128 if code > 0 else -code) if code in _STOP_EXITS else None
    said = _stop_line(name)
    return next((number for line in lines if (number := _signal_of(line, said)) is not None),
                None)


def _launch_once(nproc: int, argv: list[str], attempt: int) -> tuple[int, list[str], list[int]]:
    """One launcher run: (exit status, last lines of its stderr, stop signals received)."""
    # Without --log-dir, torch makes a torchelastic_* folder per run and never removes it.
    # (A worker that outlives the launcher and still writes there must not turn a finished run's
    # exit status into a cleanup error.)
    with tempfile.TemporaryDirectory(prefix="bertgpu-launch-", ignore_cleanup_errors=True) as logs:
        return _run_launcher(launcher_command(nproc, argv, logs), attempt, worker_threads(nproc))


def _warn_oversubscribed(name: str, nproc: int) -> None:
    """One line when more CPU processes than cores are asked for on a machine without CUDA:
    they share the cores and each step takes longer than with fewer (`bench finetune-scaling`
    refuses the same)."""
    import torch

    cores = os.cpu_count() or 1
    if nproc > cores and not torch.cuda.is_available():
        print(f"{name}: warning: --nproc {nproc} on {cores} CPU cores: the processes share "
              f"them, one thread each, and train slower than {cores} would; expected at most "
              f"{cores} on a CPU", file=sys.stderr, flush=True)


def worker_threads(nproc: int) -> dict[str, str]:
    """OMP_NUM_THREADS for `nproc` local workers when the user set none: this machine's cores
    shared among them. (torch's launcher would set 1 and print a banner about it on every run.)"""
    if "OMP_NUM_THREADS" in os.environ:
        return {}
    return {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // max(nproc, 1)))}


def _run_launcher(command: list[str], attempt: int,
                  extra_env: dict[str, str] | None = None) -> tuple[int, list[str], list[int]]:
    """Run `command` (the launcher) in a session of its own, its stderr passed through, stop
    signals forwarded to its process group."""
    env = {**os.environ, **(extra_env or {}), RESTART_ENV: str(attempt)}
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, env=env,
                            start_new_session=True, text=True, errors="replace", bufsize=1,
                            preexec_fn=_end_with_parent(os.getpid()))
    received: list[int] = []

    def forward(signum: int, frame: object) -> None:
        received.append(signum)
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass

    previous = {}
    for sig in STOP_SIGNALS:
        try:
            previous[sig] = signal.signal(sig, forward)
        except ValueError:  # not the main thread: signals go to the launcher's group directly
            pass
    try:
        tail = _pass_through(proc.stderr, stopping=lambda: bool(received))  # type: ignore[arg-type]
        rc = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return rc, tail, received


def _end_with_parent(parent: int) -> Callable[[], None] | None:
    """For the launcher's process (Linux): SIGTERM when this process dies, however it dies. The
    launcher runs in a session of its own, so a `kill -9` of this process left it and its workers
    training on; a re-run of the command then started a second job on the same run folder. A
    SIGTERM is a stop signal like a scheduler's: every worker stops within its grace."""
    if not sys.platform.startswith("linux"):
        return None

    def set_parent_death_signal() -> None:
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # this process died before the call took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return set_parent_death_signal


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)(: |$)")
_STOP_EXCEPTIONS = ("SignalException", "KeyboardInterrupt")
"""The launcher's own exceptions for a stop signal: torch's, and Python's for a Ctrl-C that came
while the launcher was still importing torch."""
_CHAINED = ("During handling", "The above exception")  # Python's lines between chained tracebacks
_SHUTDOWN_LOG = re.compile(r"\] (Sending process \d+ closing signal|failed \(exitcode: |Unable to "
                           r"shutdown process)")
"""torch's agent's log lines as it closes the workers once one has ended: they lead into its
traceback and failure report."""
_USER_ERROR = re.compile(r"^bertgpu [\w -]+: error: ")
USER_ERROR_EXIT = 2  # what a command returns for bad input (a BertgpuError, an argparse error)


def _pass_through(stream: Iterable[str], keep: int = 400,
                  stopping: Callable[[], bool] = lambda: False) -> list[str]:
    """Copy the launcher's stderr to ours line by line; return the last `keep` lines.

    Once a stop signal was forwarded (`stopping()`) or torch's agent logged one ("Received 15
    death signal"), the launcher's own traceback for it (torch's SignalException: the launcher
    ends by raising it; KeyboardInterrupt, when Ctrl-C came while it was starting) is left out,
    with the tracebacks chained to it ("During handling of the above exception ..."): the
    workers' lines saying how they stopped, and this process's last line, say it all. Lines of
    workers that arrive in the middle of that traceback pass through at once; any other
    traceback is shown whole. torch's ChildFailedError traceback and failure report (the last
    thing the launcher prints), with its log lines about closing the workers just before, are
    shown only when the report's first failure is not a stop (exit status 143 or 130: a worker
    that got the signal itself, `stop_signal`).

    Once a worker printed a command's one-line error (``bertgpu finetune: error: ...``: bad input,
    which every rank finds), the rest is held back until the launcher ends. If the job then failed
    of that error (its first failure exited with status 2), only the error lines not yet shown are
    printed: the same line from every rank, torch's log lines, its traceback and its failure report
    would bury the one line that matters. Otherwise the held lines are shown as they came."""
    out = _Output(keep, stopping)
    after_error: list[str] = []  # lines after a worker's error line
    errors_shown: set[str] = set()
    holding = False
    for line in stream:
        if holding:
            after_error.append(line)
            continue
        out.feed(line)
        if _USER_ERROR.match(line) and out.idle():
            errors_shown.add(line)
            holding = True
    if holding:
        if failure_exit_code(after_error) == USER_ERROR_EXIT:
            for line in dict.fromkeys(after_error):
                if _USER_ERROR.match(line) and line not in errors_shown:
                    out.show([line])
            out.tail.extend(after_error)  # kept for describe_failure, not shown
            return list(out.tail)
        for line in after_error:
            out.feed(line)
    out.finish()
    return list(out.tail)


class _Output:
    """The launcher's stderr on its way to ours, for `_pass_through`: each line is shown (it
    goes to our stderr) or kept (only in `tail`, which describe_failure reads)."""

    def __init__(self, keep: int, stopping: Callable[[], bool]) -> None:
        self.tail: deque[str] = deque(maxlen=keep)
        self.stopping = stopping
        self.held: list[str] = []  # a traceback being read, with the lines that led into it
        self.waiting: list[str] = []  # lines that the next one decides about: torch's log lines
        #     about closing the workers, the blank and "During handling" lines after a traceback
        self.chain: str | None = None  # "shown" or "dropped": the traceback just ended; one
        #     chained to it goes the same way (a stop's second one used to show its header)
        self.report: list[str] | None = None  # torch's ChildFailedError and all after it
        self.agent_stopped = False  # torch's agent logged a stop signal

    def show(self, lines: list[str]) -> None:
        for line in lines:
            sys.stderr.write(line)
            self.tail.append(line)
        sys.stderr.flush()

    def idle(self) -> bool:
        """Nothing held back."""
        return not (self.held or self.waiting or self.report is not None)

    def feed(self, line: str) -> None:
        if self.report is not None:
            self.report.append(line)
            return
        if _signal_of(line, _AGENT_SIGNAL) is not None:
            self.agent_stopped = True
        if self.held:
            if line[:1].isspace() or not line.strip() \
                    or line.startswith((*_CHAINED, "Traceback (most recent call last)")):
                self.held.append(line)
            elif _EXCEPTION_LINE.match(line):
                self._end_traceback(line)
            else:
                self.show([line])  # a worker's line in the middle of the traceback
            return
        if line.startswith("Traceback (most recent call last)"):
            chained = any(waiting.startswith(_CHAINED) for waiting in self.waiting)
            self.held, self.waiting = [*self.waiting, line], []
            self.chain = self.chain if chained else None
            return
        if _SHUTDOWN_LOG.search(line) \
                or (self.chain and (not line.strip() or line.startswith(_CHAINED))):
            self.waiting.append(line)
            return
        self.show(self.waiting)
        self.waiting, self.chain = [], None
        self.show([line])

    def _end_traceback(self, line: str) -> None:
        block, self.held = [*self.held, line], []
        exception = line.split(":")[0].strip()
        if self.chain == "shown":
            self.show(block)
        elif exception.endswith(_STOP_EXCEPTIONS) and (self.stopping() or self.agent_stopped):
            self.tail.extend(block)
            self.chain = "dropped"
        elif exception.endswith("ChildFailedError"):
            self.report = block  # its failure report follows: `finish` decides
        else:
            self.show(block)
            self.chain = "shown"

    def finish(self) -> None:
        """The stream ended: what is still held back is shown or kept."""
        if self.report is not None:
            if failure_exit_code(self.report) in _STOP_EXITS:
                self.tail.extend(self.report)
            else:
                self.show(self.report)
        if self.chain == "dropped" and all(not line.strip() or line.startswith(_CHAINED)
                                           for line in self.waiting):
            self.tail.extend(self.waiting)
        else:
            self.show(self.waiting)
        self.show(self.held)  # a traceback the stream ended inside


_ROOT = re.compile(r"Root Cause \(first observed failure\)")
_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_SIGNAL = re.compile(r"Signal \d+ \((SIG[A-Z0-9]+)\)")


def failure_exit_code(lines: list[str]) -> int | None:
    """The exit status of the job's first failed worker, from the launcher's failure report (its
    "Root Cause" block), or None when there is none."""
    start = next((i for i, line in enumerate(lines) if _ROOT.search(line)), None)
    if start is None:
        return None
    code = next((m.group(1) for line in lines[start:start + 12] if (m := _EXIT.search(line))),
                None)
    return int(code) if code is not None else None


def describe_failure(lines: list[str]) -> str:
    """"rank 1 died of SIGKILL (exit code -9)" from the launcher's failure report (its "Root Cause"
    block), or a general sentence when there is none."""
    start = next((i for i, line in enumerate(lines) if _ROOT.search(line)), None)
    if start is None:
        return "the workers failed (the launcher's report is above)"
    rank = code = sig = None
    for line in lines[start:start + 12]:
        rank = rank or (m.group(1) if (m := _RANK.search(line)) else None)
        code = code or (m.group(1) if (m := _EXIT.search(line)) else None)
        sig = sig or (m.group(1) if (m := _SIGNAL.search(line)) else None)
    who = f"rank {rank}" if rank is not None else "a worker"
    if sig is not None:
        return f"{who} died of {sig} (exit code {code})"
    return f"{who} failed with exit code {code} (its error is above)"

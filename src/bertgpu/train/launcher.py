"""`--nproc N`: a command re-run as N local workers under PyTorch's elastic launcher, with one
clear last line about how it ended.

    launch_local(2, ["pretrain", "configs/tiny.toml", "--data", "d", "--out", "r"],
                 max_restarts=1,
                 resume_hint=lambda: "re-running the same command resumes from step 40")

The launcher (`python -m torch.distributed.run --standalone`) runs in a session of its own, so
that a stop signal that reaches this process (Ctrl-C in a terminal, `kill`, a scheduler's
SIGTERM) is forwarded to the launcher's whole process group exactly once: the workers and their
loader processes see it, end within `checkpoint.grace_s` (train/preemption.py; torchrun forwards
the signal to its workers again, which they count once, and kills them 30 s later), and this
process exits 143 (130 for SIGINT) saying so.

With `max_restarts`, a failed job is started again, up to that many times, and resumes from the
newest good checkpoint. The restart is a fresh launcher (a new rendezvous, new ports) rather than
torch's in-place worker restart: on CPU the gloo group of a restarted attempt fails to connect
about three times in four (torch 2.13, a plain two-rank script shows it too), a fresh launch
does not. Each attempt sees its number in BERTGPU_RESTART_COUNT. When the job fails for good,
the launcher's report is followed by one line naming the rank that died and of what (read from
that report), and how to resume. A job that failed of bad input (a worker's one-line error, exit
status 2) is not restarted, and ends with that line alone.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
from collections import deque
from collections.abc import Callable, Iterable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


RESTART_ENV = "BERTGPU_RESTART_COUNT"


def launcher_command(nproc: int, argv: list[str], log_dir: str) -> list[str]:
    """The torch elastic launcher's command line for `python -m bertgpu ARGV` on `nproc` workers;
    ``log_dir``: where it keeps each rank's error file (for its failure report)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(nproc), "--log-dir", log_dir, "-m", "bertgpu", *argv]


def launch_local(nproc: int, argv: list[str], max_restarts: int = 0,
                 resume_hint: Callable[[], str | None] | None = None) -> int:
    """Run the launcher (again after a failure, up to `max_restarts` times), pass its output
    through, forward stop signals; returns the exit status (0, 128 + the signal when stopped by
    one: 143 for SIGTERM, 130 for SIGINT; else the launcher's). The caller must strip its own
    `--nproc` from `argv` so the children (which see WORLD_SIZE) do not launch again."""
    name = f"bertgpu {argv[0]}" if argv else "bertgpu"
    for attempt in range(max_restarts + 1):
        rc, tail, received = _launch_once(nproc, argv, attempt)
        if rc == 0:
            return 0
        hint = ((resume_hint() if resume_hint else None)
                or "re-running the same command resumes from its newest checkpoint")
        if received:
            if not _said_stop(tail, name):  # a worker's line already said how the run stopped
                print(f"{name}: stopped by {signal.Signals(received[0]).name}; {hint}",
                      file=sys.stderr, flush=True)
            return 128 + received[0]
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


def _said_stop(lines: list[str], name: str) -> bool:
    """A worker printed the run's stop line (train/preemption.py: "bertgpu pretrain: SIGTERM:
    wrote a preemption checkpoint ...; re-running ...", or "...: second SIGTERM: ..."; before
    the run, train/distributed.py: "bertgpu pretrain: SIGINT: interrupted during distributed
    set-up"): the launcher's own line would repeat it."""
    said = re.compile(rf"^{re.escape(name)}: (second )?SIG[A-Z0-9]+: ")
    return any(said.match(line) for line in lines)


def _launch_once(nproc: int, argv: list[str], attempt: int) -> tuple[int, list[str], list[int]]:
    """One launcher run: (exit status, last lines of its stderr, stop signals received)."""
    # Without --log-dir, torch makes a torchelastic_* folder per run and never removes it.
    # (A worker that outlives the launcher and still writes there must not turn a finished run's
    # exit status into a cleanup error.)
    with tempfile.TemporaryDirectory(prefix="bertgpu-launch-", ignore_cleanup_errors=True) as logs:
        return _run_launcher(launcher_command(nproc, argv, logs), attempt, worker_threads(nproc))


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
_USER_ERROR = re.compile(r"^bertgpu [\w -]+: error: ")
USER_ERROR_EXIT = 2  # what a command returns for bad input (a BertgpuError, an argparse error)


def _pass_through(stream: Iterable[str], keep: int = 400,
                  stopping: Callable[[], bool] = lambda: False) -> list[str]:
    """Copy the launcher's stderr to ours line by line; return the last `keep` lines.

    Once a stop signal was forwarded (`stopping()`), the launcher's own traceback for it (torch's
    SignalException: the launcher ends by raising it; KeyboardInterrupt, when Ctrl-C came while it
    was starting) is left out: the workers' lines saying how
    they stopped, and this process's last line, say it all. Lines of workers that arrive in the
    middle of that traceback pass through at once; any other traceback is shown whole.

    Once a worker printed a command's one-line error (``bertgpu finetune: error: ...``: bad input,
    which every rank finds), the rest is held back until the launcher ends. If the job then failed
    of that error (its first failure exited with status 2), only the error lines not yet shown are
    printed: the same line from every rank, torch's log lines, its traceback and its failure report
    would bury the one line that matters. Otherwise the held lines are shown as they came."""
    tail: deque[str] = deque(maxlen=keep)
    held: list[str] = []  # a traceback being read, not yet shown
    after_error: list[str] = []  # lines after a worker's error line
    errors_shown: set[str] = set()

    def show(lines: list[str]) -> None:
        for line in lines:
            sys.stderr.write(line)
            tail.append(line)
        sys.stderr.flush()

    def feed(line: str) -> None:
        nonlocal held
        if held:
            if line[:1].isspace() or line.startswith(("During handling", "The above exception",
                                                      "Traceback (most recent call last)")) \
                    or not line.strip():
                held.append(line)
                return
            if _EXCEPTION_LINE.match(line):
                block, held = [*held, line], []
                if not (line.split(":")[0].strip().endswith(_STOP_EXCEPTIONS) and stopping()):
                    show(block)
                else:
                    tail.extend(block)  # kept for describe_failure, not shown
                return
            show([line])  # a worker's line in the middle of the traceback
            return
        if line.startswith("Traceback (most recent call last)"):
            held = [line]
            return
        show([line])

    holding = False
    for line in stream:
        if holding:
            after_error.append(line)
            continue
        feed(line)
        if _USER_ERROR.match(line) and not held:
            errors_shown.add(line)
            holding = True
    if holding:
        if failure_exit_code(after_error) == USER_ERROR_EXIT:
            for line in dict.fromkeys(after_error):
                if _USER_ERROR.match(line) and line not in errors_shown:
                    show([line])
            tail.extend(after_error)  # kept for describe_failure, not shown
            return list(tail)
        for line in after_error:
            feed(line)
    show(held)  # a traceback the stream ended inside
    return list(tail)


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

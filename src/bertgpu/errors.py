"""The one exception users see.

Every problem with the user's input (a file, a flag, a config key) raises `BertgpuError` with a
single line that names the file (and line or field) and what was expected. The command line
turns it into `bertgpu: error: ...` and exit status 2, without a traceback.
"""


class BertgpuError(Exception):
    """A user-facing error whose message is one line: where, what was found, what was expected."""


_RAISED_IN_WORKER = "bertgpu.errors.BertgpuError: "


def one_line(exc: BaseException) -> str:
    """A BertgpuError's line. One raised in a DataLoader worker comes back from torch as "Caught
    BertgpuError in DataLoader worker process 1." and the worker's whole traceback, which ends
    in the line itself."""
    text = str(exc)
    if "\nOriginal Traceback" in text:
        last = text.rstrip().splitlines()[-1]
        if last.startswith(_RAISED_IN_WORKER):
            return last[len(_RAISED_IN_WORKER):]
    return text


def from_network(exc: BaseException | None) -> bool:
    """Whether ``exc`` was raised from a ConnectionError or a TimeoutError (the one-line errors
    of an unreadable file are raised from what the read raised): a store's failure, not bad
    input, which --skip-bad must not leave out as a bad file."""
    while exc is not None:
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class Terminated(KeyboardInterrupt):
    """SIGTERM (`kill`, a scheduler's time limit) to a command that is not training: raised in the
    main thread so that it stops as Ctrl-C stops it (a half-written output removed, `prepare`'s
    finished work units kept for a re-run, pool workers ended) and says so in one line, exit 143.
    A training loop catches SIGTERM itself while it runs (train/preemption.py)."""


# The command the user ran ("bertgpu glue"), set by the command line while it runs: the lines a
# stop prints name it, not the job inside it (glue runs finetune's loop). None outside the CLI.
running_command: str | None = None

"""The `bertgpu` command line: picks a subcommand and hands over to its module. No logic here.

Each command module defines::

    def add_arguments(parser: argparse.ArgumentParser) -> None: ...
    def main(args: argparse.Namespace) -> int: ...

and, if it takes dotted config overrides (`--train.max_steps 10`), `ACCEPTS_OVERRIDES = True`;
the unparsed `--a.b value` / `--a.b=value` words then arrive as `args.overrides` (a list of str).
A module whose positional argument may stand among the overrides defines
`parse_arguments(parser, words) -> argparse.Namespace` (with `overrides`), used instead.
Only the chosen module is imported, so `bertgpu --help` stays fast. A `BertgpuError`, or the
file system refusing a path (`place_error`), ends the command with one line and exit status 2.

A command that trains (`LAUNCHES_WORKERS = True`) gets `--nproc N|auto` and `--max-restarts N`
here, once for all of them: without WORLD_SIZE in the environment and N > 1, its
`check_before_launch(args, N)` validates the arguments once, then the same command line (minus
those two flags) is re-run as N processes under PyTorch's elastic launcher; the children see
WORLD_SIZE and train.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import importlib
import os
import shutil
import signal
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import NoReturn

from bertgpu import __version__, errors
from bertgpu.errors import BertgpuError, Terminated
from bertgpu.stops import HungUp, stop_signal

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "tokenizer": ("bertgpu.data.tokenizer",
                  "train a WordPiece vocabulary (AutoTokenizer-loadable)"),
    "prepare": ("bertgpu.data.prepare", "stream raw text into token shards with a manifest"),
    "pretrain": ("bertgpu.pretrain",
                 "pretrain BERT (MLM or MLM+NSP) or ModernBERT on 1 or N devices"),
    "export": ("bertgpu.export",
               "a run's checkpoint as a Hugging Face model folder with its tokenizer"),
    "finetune": ("bertgpu.finetune", "fine-tune on one GLUE task, SQuAD v1.1/v2.0, or your own "
                 "classification or NER data"),
    "glue": ("bertgpu.glue", "fine-tune on GLUE tasks x seeds and write the GLUE-dev table"),
    "bench": ("bertgpu.bench", "throughput, MFU and scaling benchmarks"),
    "report": ("bertgpu.report", "markdown report with tables and plots of runs and evaluations"),
    "watch": ("bertgpu.watch",
              "live terminal view of a run: loss, speed, ETA, GPUs (--once: one frame)"),
    "demo": ("bertgpu.demo", "the whole pipeline, tiny, offline, on a CPU in minutes"),
}


def _top_help() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = [
        f"bertgpu {__version__}: pretrain and fine-tune BERT on the hardware you have.",
        "",
        "usage: bertgpu COMMAND [options]   (bertgpu COMMAND --help for its options)",
        "",
        "commands:",
    ]
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The `bertgpu` command: ARGV, or the program's arguments (then a stop signal while the
    interpreter winds down exits at once with 128 + its number, see `_late_stops_exit`)."""
    status = _main(list(sys.argv[1:] if argv is None else argv))
    if argv is None:
        _late_stops_exit()
    return status


_LATE_STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _late_stops_exit() -> None:
    """A stop signal after the command returned, while the interpreter winds down (a second or
    so after a training run: threads, torch's modules), exits with the command's status, as the
    README promises of a second signal: it used to meet the default action once Python had put
    it back, and the process died of SIGTERM (-15) or SIGINT after its preemption checkpoint
    was written and said (SIGHUP, a closed terminal, likewise). Until the exit handlers run,
    such a signal exits at once with 128 + its number; after them (Python resets its handlers
    to the default then) it is ignored for the last moments of the shutdown, which end with the
    command's status."""
    def exit_now(signum: int, frame: object) -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(128 + signum)

    def ignore_from_now() -> None:
        with contextlib.suppress(ValueError):
            for signum in _LATE_STOPS:
                signal.signal(signum, signal.SIG_IGN)

    with contextlib.suppress(ValueError):  # (not the main thread)
        for signum in _LATE_STOPS:
            if signal.getsignal(signum) is not signal.SIG_IGN:
                signal.signal(signum, exit_now)
        atexit.register(ignore_from_now)


def _main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(_top_help())
        return 0
    if argv[0] == "--version":
        print(f"bertgpu {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        say(f"bertgpu: error: unknown command {name!r}; one of: {', '.join(COMMANDS)}")
        return 2
    outer, errors.running_command = errors.running_command, f"bertgpu {name}"
    module = None
    try:
        # the command's module is imported inside: a stop while it imports torch (seconds)
        # printed a KeyboardInterrupt traceback (SIGINT) or died without a line (SIGTERM)
        with _warnings_as_lines(f"bertgpu {name}"), _sigterm_stops():
            module, parser, launches = _parser(name)
            try:
                return _run(module, parser, name, rest, launches)
            except SystemExit as exc:  # argparse's error, said by OneLineParser
                if exc.code and getattr(parser, "said", None):
                    _tell_other_ranks(module, parser.said, rest)
                raise
    except BertgpuError as exc:
        say(f"bertgpu {name}: error: {errors.one_line(exc)}")
        _tell_other_ranks(module, errors.one_line(exc), rest)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM / SIGHUP (`_sigterm_stops`)
        sig = stop_signal(exc)
        say(f"bertgpu {name}: " + ("interrupted" if sig == signal.SIGINT
                                   else f"stopped by {sig.name}"))
        return 128 + sig
    except BrokenPipeError:
        # the reader of our output went away (`bertgpu prepare ... | head -1`): stop quietly, as
        # a tool killed by SIGPIPE does, and keep the interpreter from failing on the final flush
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except OSError as exc:
        stop = _stop_behind(exc) if exc.errno in (errno.EIO, errno.EPIPE) else None
        if stop is not None:  # a stop whose own message could not be written: a closed
            sig = stop_signal(stop)  # terminal (EIO); any other error says what it was
            say(f"bertgpu {name}: " + ("interrupted" if sig == signal.SIGINT
                                       else f"stopped by {sig.name}"))
            return 128 + sig
        line = place_error(exc, rest)
        if line is None:  # not the user's file system saying no: a bug, keep its traceback
            raise
        say(f"bertgpu {name}: error: {line}")
        _tell_other_ranks(module, line, rest)
        return 2
    finally:
        errors.running_command = outer


def _tell_other_ranks(module: ModuleType | None, line: str, argv: list[str]) -> None:
    """A rank of a multi-node job (torchrun's variables set) whose command stops before it
    joined the process group (a bad option value on one node, a recipe that does not parse
    there, a start-up check of the command's own) gives the others its `line`, once it said
    it (train/rank_agreement.hand_over; they stopped only at distributed.timeout_minutes,
    and the line used to come only after the hand-over's wait). For a command whose ranks all
    meet at start-up (`STARTUP_SHARED`); the timeout is the config's once it was read, else the
    command line's --distributed.timeout_minutes when it parses."""
    if not getattr(module, "STARTUP_SHARED", False) or "WORLD_SIZE" not in os.environ:
        return
    try:  # a stop in the wait ends it (stop_ends_setup); one before, here, with its line
        from bertgpu.train.rank_agreement import hand_over, typed_timeout

        hand_over(line, typed_timeout(argv))
    except KeyboardInterrupt as exc:
        sig = stop_signal(exc)
        say(f"{errors.running_command}: " + ("interrupted" if sig == signal.SIGINT
                                              else f"stopped by {sig.name}"))
        raise SystemExit(128 + sig) from None


def _stop_behind(exc: BaseException) -> KeyboardInterrupt | None:
    """The stop (Ctrl-C, SIGTERM, SIGHUP) an error was raised while handling, if any: a
    command's message after SIGHUP fails to reach the closed terminal it was written to."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _parser(name: str) -> tuple[ModuleType, argparse.ArgumentParser, bool]:
    """Command `name`'s module, its parser, and whether it launches workers (`--nproc`)."""
    module_name, text = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = OneLineParser(prog=f"bertgpu {name}", description=text)
    module.add_arguments(parser)
    launches = getattr(module, "LAUNCHES_WORKERS", False)
    if launches:
        _add_launch_arguments(parser)
    return module, parser, launches


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser, whose errors are one line as every other error of bertgpu's (argparse
    printed its whole usage first: up to 16 lines, the error last); the options are --help's."""

    said: str | None = None
    """The error line (without the program's name), for the other ranks of a job."""

    def error(self, message: str) -> NoReturn:
        self.said = f"{message} (the options: {self.prog} --help)"
        say(f"{self.prog}: error: {self.said}")
        self.exit(2)


def say(line: str, stream=None) -> None:
    """`line` and its newline in one write (stderr by default). `print` writes them apart, and
    with PYTHONUNBUFFERED (common in CI and containers) each is its own system call: the ranks of
    a job, which share the launcher's pipe and find the same bad input at once, then interleaved
    as "...error: Xbertgpu tokenizer: error: X\n\n", one line the launcher could not take apart."""
    stream = sys.stderr if stream is None else stream
    try:
        stream.write(line + "\n")
        stream.flush()
    except OSError:  # a terminal closed under us (SIGHUP: EIO): there is no one to tell
        pass


def _run(module: ModuleType, parser: argparse.ArgumentParser, name: str, rest: list[str],
         launches: bool) -> int:
    """Parse the arguments, then launch N workers or run the command here."""
    parse = getattr(module, "parse_arguments", None)
    if parse is not None:
        args = parse(parser, rest)
    elif getattr(module, "ACCEPTS_OVERRIDES", False):
        args, unknown = parser.parse_known_args(rest)
        args.overrides = unknown
    else:
        args = parser.parse_args(rest)
    if launches and args.max_restarts < 0:
        raise BertgpuError(f"--max-restarts {args.max_restarts}: expected 0 or more")
    if launches and args.nproc is not None and "WORLD_SIZE" not in os.environ:
        from bertgpu.train import distributed, launcher

        n = distributed.resolve_nproc(args.nproc)
        module.check_before_launch(args, n)
        if n > 1:
            hint = getattr(module, "resume_hint", None)
            return launcher.launch_local(n, [name, *strip_launch_flags(rest)],
                                         max_restarts=args.max_restarts,
                                         resume_hint=(lambda: hint(args)) if hint else None)
    if launches and args.max_restarts:  # only the launcher restarts, and none was started
        why = ("under torchrun (give torchrun's own --max-restarts)" if "WORLD_SIZE" in os.environ
               else "without --nproc" if args.nproc is None
               else f"with --nproc {args.nproc}, which runs one process here")
        warnings.warn(f"--max-restarts {args.max_restarts} is ignored {why}; restarts need "
                      "--nproc N with N > 1", stacklevel=1)
    return int(module.main(args) or 0)


_PACKAGE = Path(__file__).resolve().parent


@contextlib.contextmanager
def _warnings_as_lines(prog: str) -> Iterator[None]:
    """While a command runs, a warning raised by bertgpu's own code prints as one line,
    ``bertgpu finetune: warning: MESSAGE``, instead of Python's two (the file and line, then the
    source line that called): the message already names the file or folder it is about; in a job
    of several processes, on rank 0 alone. Others' warnings (torch, transformers) keep Python's
    form."""
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if not Path(filename).resolve().is_relative_to(_PACKAGE):
            return shown(message, category, filename, lineno, file, line)
        if os.environ.get("RANK", "0") != "0":
            return  # every rank reads the same data: rank 0 says it once (it was said N times)
        say(f"{prog}: warning: {message}", sys.stderr if file is None else file)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown


_RAISED = {signal.SIGTERM: Terminated, signal.SIGHUP: HungUp}
"""The stop signals that raise in the main thread while a command runs (SIGINT raises
KeyboardInterrupt by Python's own handler)."""


def _raise_stop(signum: int, frame: object) -> None:
    """The handler of `_sigterm_stops`."""
    raise _RAISED[signal.Signals(signum)]()


def _hangup_default_in_child() -> None:
    """A forked child (a `prepare` pool worker, a loader worker) gets SIGHUP's default action
    back, as before SIGHUP raised: a closed terminal signals the whole foreground group, and the
    parent's handler raised in every worker, a traceback each. (Pool workers put SIGTERM's
    default back themselves; loader workers ignore both.)"""
    if signal.getsignal(signal.SIGHUP) is _raise_stop:
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGHUP, signal.SIG_DFL)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_hangup_default_in_child)


@contextlib.contextmanager
def _sigterm_stops() -> Iterator[None]:
    """SIGTERM raises `Terminated`, SIGHUP (a closed terminal) `HungUp`, in the main thread while
    the command runs: it stops as Ctrl-C does, cleaning up as Ctrl-C does, in one line, with exit
    status 143 (129 for SIGHUP). Before, their default action ended `prepare` or `glue` at once:
    no line, `OUT.tmp` and the lock file left, and pool workers writing to a parent that was gone
    printed tracebacks. Not in a distributed worker (WORLD_SIZE set: the launcher or torchrun
    reports the stop once), and not for a signal ignored (SIGHUP under nohup) or handled already;
    a training loop and the launcher put their own handlers in while they run and these back
    after."""
    previous = {}
    try:
        if "WORLD_SIZE" not in os.environ:
            for signum in _RAISED:
                if signal.getsignal(signum) is signal.SIG_DFL:
                    previous[signum] = signal.signal(signum, _raise_stop)
    except ValueError:  # not the main thread (a test calling main from a thread)
        pass
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


# What the user's file system may answer about a path the user chose (an --out on a read-only
# mount, a full quota, a path through a file), with what to do about it. Any other OSError (a bad
# file descriptor, an argument we got wrong, a file of our own gone missing) is a bug in bertgpu
# and keeps its traceback; so does one without a path, which a user could not act on.
_NO_PERMISSION = ("expected a place this user may write (or a file it may read): check the "
                  "owner and mode of the folder, or choose another path")
PLACE_ERRORS: dict[int, str] = {
    errno.EACCES: _NO_PERMISSION,
    errno.EPERM: _NO_PERMISSION,
    errno.EROFS: "expected a place on a writable file system: choose another path",
    errno.ENOSPC: "free space on that file system or choose another path, then re-run",
    errno.EDQUOT: "free space within the quota or choose another path, then re-run",
    errno.ENOTDIR: "a part of this path is a file; expected folders up to its last part",
    errno.EISDIR: "expected a file here, not a folder",
    errno.ENAMETOOLONG: "the path is too long for the file system; expected a shorter one",
    errno.ELOOP: "the path's symbolic links loop; expected links that end in a file or folder",
    errno.EIO: "the storage failed to read or write (a failing disk or network mount); check it "
               "and re-run",
    errno.ESTALE: "a network mount lost this path (stale file handle); remount or re-run",
}


def place_error(exc: OSError, argv: list[str] = ()) -> str | None:
    """One line for an OSError about a user's path (`PATH: STRERROR; WHAT TO DO`), or None when
    the error is not one (see PLACE_ERRORS). Commands that write an --out check that it is a
    folder, not that this user may write there, and they write through scratch folders, mkdir,
    lock files and libraries in many places: catching the file system's answer once here covers
    them all. The path shown is the one that failed (`OUT.tmp` for a scratch folder beside OUT).
    shutil's copytree collects its files' errors into one without an errno: the first is said."""
    failed = exc.args[0] if isinstance(exc, shutil.Error) and exc.args else None
    if isinstance(failed, list) and failed and len(failed[0]) == 3:
        src, dst, why = failed[0]
        return f"{dst}: {why} (copying {src}; {len(failed)} file(s) not copied)"
    if exc.errno is None:  # not the file system's answer
        return None
    said = exc.strerror or os.strerror(exc.errno)
    if exc.filename is None:  # a write to an open file (a full disk mid-run) names no path
        out = _typed_out(argv) if exc.errno in _NO_PATH_NEEDED else None
        if out is None:
            return None
        return f"{out}: {said} (writing this output or a file beside it); {PLACE_ERRORS[exc.errno]}"
    where = os.fsdecode(exc.filename)
    if exc.errno == errno.ENOENT and exc.filename2 is None and _on_the_way(where, argv):
        return (f"{where}: {said}; the file system refuses to create this folder (a virtual file "
                "system such as /proc?): choose another path")
    if exc.errno not in PLACE_ERRORS:
        return None
    if exc.filename2 is not None:  # rename, link: both ends named
        where += f" -> {os.fsdecode(exc.filename2)}"
    return f"{where}: {said}; {PLACE_ERRORS[exc.errno]}"


_NO_PATH_NEEDED = (errno.ENOSPC, errno.EDQUOT, errno.EIO)
"""What the file system may answer of a write without naming a path: said of the --out."""


def _typed_out(argv: list[str]) -> str | None:
    """The --out the user typed (``--out X`` or ``--out=X``), or None."""
    for i, arg in enumerate(argv):
        if arg == "--out" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--out="):
            return arg.partition("=")[2]
    return None


def _on_the_way(where: str, argv: list[str]) -> bool:
    """Whether WHERE is a folder on the way to a path the user typed (the path itself, one of
    its parents, or a scratch or lock file beside it: `OUT.tmp`): no such file there is the file
    system refusing to make it (`--out /proc/x/run`), while a file of our own gone missing stays
    a bug with its traceback."""
    target = Path(os.path.abspath(where))
    for arg in argv:
        typed = arg.partition("=")[2] if arg.startswith("--") else arg
        if typed and not typed.startswith("-") and "://" not in typed:
            path = Path(os.path.abspath(typed))
            if (target == path or target in path.parents
                    or (target.parent == path.parent and target.name.startswith(path.name + "."))):
                return True
    return False


LAUNCH_FLAGS = ("--nproc", "--max-restarts")


def _add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nproc", default=None,
                        help="worker processes on this machine: N, or auto (every visible GPU); "
                             "starts torch's elastic launcher for you (default: one process, "
                             "no launcher)")
    parser.add_argument("--max-restarts", type=int, default=0,
                        help="with --nproc: restart the workers up to N times after a failure "
                             "(each restart resumes from the newest checkpoint) (default: 0)")


def strip_launch_flags(argv: list[str]) -> list[str]:
    """`argv` without `--nproc X` / `--max-restarts X` (or their `=X` forms), for the children."""
    out, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word in LAUNCH_FLAGS:
            skip = True
        elif not word.startswith(tuple(f + "=" for f in LAUNCH_FLAGS)):
            out.append(word)
    return out


if __name__ == "__main__":
    raise SystemExit(main())

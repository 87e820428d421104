"""The stop signal behind a KeyboardInterrupt that ends a command: Ctrl-C (SIGINT), `kill` or a
scheduler (SIGTERM: `errors.Terminated`), or a closed terminal (SIGHUP: `HungUp`).

Outside a training loop the command line turns SIGTERM and SIGHUP into these exceptions
(cli.py), so that each stop runs the cleanup a Ctrl-C runs (a scratch folder removed, a lock
given back) and ends in one line with exit status 128 + the signal.
"""

from __future__ import annotations

import signal

from bertgpu.errors import Terminated


class HungUp(Terminated):
    """SIGHUP (the terminal closed) to a command that is not training. A Terminated, so every
    `except Terminated` that cleans up after SIGTERM cleans up after it too; only the line and
    the exit status (129) say SIGHUP. Its default action killed the command silently, leaving
    `OUT.tmp` and `OUT.bertgpu-lock` behind."""


def stop_signal(exc: KeyboardInterrupt) -> signal.Signals:
    """The signal that `exc` stands for: SIGHUP, SIGTERM or SIGINT (a plain Ctrl-C)."""
    if isinstance(exc, HungUp):
        return signal.SIGHUP
    return signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT

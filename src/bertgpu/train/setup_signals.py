"""A stop signal while a process joins its process group ends the process at once.

`torch.distributed.init_process_group` waits in C++ (the store, gloo's connections), where
Python's signal handlers never run; `stop_ends_setup` covers that wait.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator

_STOPS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def stop_ends_setup(rank: int) -> Iterator[None]:
    """While this process joins the process group, a stop signal (Ctrl-C, SIGTERM) ends it at
    once: one line on rank 0 ("bertgpu pretrain: SIGINT: interrupted during distributed
    set-up", which the launcher does not repeat), exit status 128 + the signal; nothing is
    written before the group exists. init_process_group waits in C++ (the store, gloo's
    connections), where Python's handlers never run: a rank whose peer had left on the same
    Ctrl-C waited there until torchrun killed it 30 s later, and each rank printed its own line.
    A thread woken through the signal wakeup fd (as in train/preemption.py) ends the process
    instead. Main thread only; a signal already ignored stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    # The fd first, the handlers (Python's, so that the fd gets the signal) next, and back in
    # the reverse order: a signal in between is seen by one or the other, never lost.
    wakeup = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    previous = {sig: signal.signal(sig, lambda signum, frame: None) for sig in _STOPS
                if signal.getsignal(sig) is not signal.SIG_IGN}
    argv = sys.argv  # a worker runs `python -m bertgpu COMMAND ...`
    ours = len(argv) > 1 and "bertgpu" in argv[0] and argv[1].isidentifier()
    title = f"bertgpu {argv[1]}" if ours else "bertgpu"

    from bertgpu.locks import release_held

    def watch() -> None:
        with contextlib.suppress(OSError):
            while data := reader.recv(64):  # end-of-file: the set-up ended
                for signum in (s for s in data if s in previous):
                    what = "interrupted" if signum == signal.SIGINT else "stopped"
                    if rank == 0:
                        with contextlib.suppress(OSError):  # stderr gone: end all the same
                            os.write(2, f"{title}: {signal.Signals(signum).name}: {what} "
                                        "during distributed set-up\n".encode())
                    release_held()  # os._exit skips the lock's finally
                    os._exit(128 + signum)

    watcher = threading.Thread(target=watch, name="bertgpu-setup-signals", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        signal.set_wakeup_fd(wakeup)
        writer.close()  # the watcher reads what is left, then end-of-file
        watcher.join(timeout=5)
        reader.close()

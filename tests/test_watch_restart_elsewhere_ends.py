"""`watch` of a --max-restarts job whose launcher runs on another host waits for its restart for
10 minutes after the error's end record, then reports the error: it waited for ever when that
launcher gave up (another rank's bad input, the launcher killed), where it had said
"stopped (error ...)"."""

from __future__ import annotations

import os
import time

from test_watch_waits_for_a_restart import _failed_attempt, alive  # noqa: F401 (a fixture)

from bertgpu.watch import RunState, ended


def test_a_launcher_elsewhere_that_restarts_nothing_ends_the_watch(tmp_path, alive):  # noqa: F811
    log = _failed_attempt(tmp_path / "r5", host="another-node")
    state = RunState(tmp_path / "r5")
    state.poll()
    assert ended(state) is None  # just written: a restart may come
    old = time.time() - 11 * 60
    os.utime(log, (old, old))
    status = ended(state)  # old code: None for ever
    assert status is not None and status.startswith("stopped (error at step 24"), status

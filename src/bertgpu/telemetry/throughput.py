"""Throughput over the steps that did the work a user is waiting for, and compile time apart.

A compiled model spends its first step (and a recompiled one the step that recompiles, and a
CUDA-graph mode the step that records the graph) compiling: 20-30 s for BERT-base on an H100,
against 0.1 s for a steady step. A rate window that contains such a step shows a fraction of the
real speed for as many log lines as the window is long, and a user concludes the tool is slow.
So `Throughput` keeps such steps out of its window and adds their wall time to ``compile_s``;
it also keeps the first step of the process out when nothing compiled (cold caches, the caching
allocator growing, lazy initialisation), so the first logged interval is already honest.

Whether a step compiled is read from torch's own record of compile work
(`compile_events`): ``torch._dynamo.utils.compilation_time_metrics`` gains an entry for every
timed compile phase, whichever backend: dynamo's frame compile, AOTAutograd's backward compiled
lazily during the first backward, inductor's kernel compiles and runtime autotuning, and the
recording of a CUDA graph tree ("reduce-overhead", "max-autotune"; its warm-up run happens in
the step that compiled). Nothing here imports torch: a process that never imported dynamo has
compiled nothing.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable

# Timed regions that torch enters on every call of a compiled function, not only when it
# compiles (a guard check agreed across ranks); they must not mark a step as compiling.
_RUNTIME_KEYS = frozenset({"guard_collective"})


def compile_events() -> int:
    """How many compile phases torch has timed in this process so far (0 before dynamo is
    imported). Only its changes mean something: a step during which it grew compiled."""
    utils = sys.modules.get("torch._dynamo.utils")
    metrics = getattr(utils, "compilation_time_metrics", None)
    if not isinstance(metrics, dict):
        return 0
    return sum(len(v) for k, v in list(metrics.items()) if k not in _RUNTIME_KEYS)


class Throughput:
    """Rates over the last ``window`` measured steps; compile steps apart.

    Call ``update`` once per optimizer step with that step's totals over *all* devices: its
    sequences and their real tokens. Padding is not counted, even where the model computed on it:
    the rate is of the work a user wants done, as `bench model` counts it, and MFU's FLOPs per
    token are per real token to match (`flops.flops_per_real_token`). A step's time is the time
    since the previous ``update`` (or construction, or ``reset``).

    - ``compile_events``: a counter of compile work (`compile_events` above); a step during which
      it changed is a compile step: its time goes to ``compile_s`` (``compile_steps`` counts
      them) and not into the window. None: every step is measured.
    - ``skip_first``: the first step after construction is kept out of the window too (as
      ``warmup_s``) when it did not compile.

    ``reset()`` forgets the window and starts timing from now (after an evaluation or a
    checkpoint, which are not training time); compile work done before it (an evaluation that
    compiled its own graph) is not counted. Rates are ``{}`` until a measured step.
    """

    def __init__(
        self,
        window: int = 20,
        n_devices: int = 1,
        clock: Callable[[], float] = time.perf_counter,
        *,
        compile_events: Callable[[], int] | None = None,
        skip_first: bool = False,
    ) -> None:
        if window < 1:
            raise ValueError("Throughput: window must be >= 1")
        if n_devices < 1:
            raise ValueError("Throughput: n_devices must be >= 1")
        self.window = window
        self.n_devices = n_devices
        self._clock = clock
        self._events = compile_events
        self._skip = skip_first
        self.tokens = 0
        self.sequences = 0
        self.steps = 0
        self.compile_s = 0.0
        self.compile_steps = 0
        self.warmup_s = 0.0
        # (seconds, tokens, sequences, steps) of each measured update in the window
        self._window: deque[tuple[float, int, int, int]] = deque(maxlen=window)
        self._mark = 0.0
        self._seen = 0
        self.reset()

    def reset(self) -> None:
        """Forget the window (not the cumulative counts) and start measuring from now."""
        self._window.clear()
        self._seen = self._events() if self._events is not None else 0
        self._mark = self._clock()

    def _compiled(self) -> bool:
        if self._events is None:
            return False
        seen, self._seen = self._seen, self._events()
        # A count that fell was cleared (torch._dynamo.reset()): compiled if it grew again.
        return self._seen > seen or (self._seen < seen and self._seen > 0)

    def update(self, tokens: int, sequences: int, steps: int = 1) -> bool:
        """Record that ``steps`` steps covering ``tokens`` / ``sequences`` have finished now;
        whether they compiled."""
        now = self._clock()
        dt, self._mark = now - self._mark, now
        self.tokens += int(tokens)
        self.sequences += int(sequences)
        self.steps += int(steps)
        compiled = self._compiled()
        if compiled:
            self.compile_s += dt
            self.compile_steps += int(steps)
        elif self._skip:
            self.warmup_s += dt
        else:
            self._window.append((dt, int(tokens), int(sequences), int(steps)))
        self._skip = False
        return compiled

    def rates(self) -> dict[str, float]:
        """``tokens_per_s``, ``tokens_per_s_per_device``, ``sequences_per_s``,
        ``sequences_per_s_per_device``, ``steps_per_s``, ``step_time_s``; ``{}`` before the first
        measured update (or when no time has passed)."""
        dt = sum(w[0] for w in self._window)
        if not self._window or dt <= 0:
            return {}
        tokens_per_s = sum(w[1] for w in self._window) / dt
        sequences_per_s = sum(w[2] for w in self._window) / dt
        steps_per_s = sum(w[3] for w in self._window) / dt
        out = {
            "tokens_per_s": tokens_per_s,
            "tokens_per_s_per_device": tokens_per_s / self.n_devices,
            "sequences_per_s": sequences_per_s,
            "sequences_per_s_per_device": sequences_per_s / self.n_devices,
            "steps_per_s": steps_per_s,
        }
        if steps_per_s > 0:
            out["step_time_s"] = 1.0 / steps_per_s
        return out

    def compile_fields(self) -> dict[str, float | int]:
        """``compile_s`` (wall seconds of the steps that compiled, this process),
        ``compile_steps``, and ``rate_steps`` (the steps the rates were measured over, the
        window's: fewer than the log interval after a process's first step or an evaluation;
        after a compile mid-run the window reaches back into the interval before): the keys a
        train record carries beside the rates."""
        return {"compile_s": self.compile_s, "compile_steps": self.compile_steps,
                "rate_steps": sum(w[3] for w in self._window)}


__all__ = ["Throughput", "compile_events"]

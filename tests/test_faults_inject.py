"""testing/faults.py: the BERTGPU_FAULTS parser and each helper (kill, non-finite, delay, ENOSPC on
the n-th write, a crash between renames), first attempt only, nothing when unset."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time

import pytest

from bertgpu.errors import BertgpuError
from bertgpu.testing import faults
from bertgpu.testing.faults import Trigger

pytestmark = pytest.mark.usefixtures("no_faults")


def test_parse_the_documented_example():
    plan = faults.parse("kill_rank=1@step=3,enospc_write=2,nonfinite_rank=0@step=4,"
                        "delay_rank=1:0.05")
    assert plan.kill == [Trigger(rank=1, first=3, last=3)]
    assert plan.nonfinite == [Trigger(rank=0, first=4, last=4)]
    assert plan.delay == [Trigger(rank=1, first=0, last=None, seconds=0.05)]
    assert plan.enospc_writes == {2} and plan.kill_replaces == set()


def test_parse_ranges_repeats_and_spaces():
    plan = faults.parse(" nonfinite_rank=0@step=4-6 , nonfinite_rank=1@step=9-, kill_replace=2,"
                        "enospc_write=1,enospc_write=7,delay_rank=0:2@step=5")
    assert plan.nonfinite == [Trigger(0, 4, 6), Trigger(1, 9, None)]
    assert plan.kill_replaces == {2} and plan.enospc_writes == {1, 7}
    assert plan.delay == [Trigger(0, 5, 5, 2.0)]
    assert faults.parse("") == faults.Plan()


@pytest.mark.parametrize("spec, words", [
    ("explode=1", "unknown fault 'explode'"),
    ("kill_rank", "no '='"),
    ("kill_rank=1", r"a step is required \(@step=S\)"),
    ("kill_rank=x@step=3", "'x' is not a whole number"),
    ("kill_rank=-1@step=3", "-1 is below 0"),
    ("nonfinite_rank=0@when=3", "unknown qualifier 'when=3'"),
    ("nonfinite_rank=0@step=5-3", "3 is below 5"),
    ("delay_rank=1", "RANK:SECONDS"),
    ("delay_rank=1:-2", "RANK:SECONDS"),
    ("delay_rank=1:soon", "RANK:SECONDS"),
    ("enospc_write=0", "0 is below 1"),
])
def test_parse_errors_are_one_line_naming_the_item(spec, words):
    with pytest.raises(BertgpuError, match=words) as err:
        faults.parse(spec)
    msg = str(err.value)
    assert (msg.startswith(f"BERTGPU_FAULTS: item {spec!r}") and "\n" not in msg
            and "expected" in msg)


def test_trigger_hits():
    t = Trigger(rank=1, first=3, last=5)
    assert [s for s in range(8) if t.hits(1, s)] == [3, 4, 5]
    assert not t.hits(0, 4) and not t.hits(1, None)
    assert Trigger(rank=0, first=2, last=None).hits(0, 10**9)
    assert Trigger(rank=0).hits(0, None)  # no @step: every step, and callers without one


def test_unset_does_nothing(tmp_path):
    assert faults.active() is None
    f = tmp_path / "x"
    f.write_bytes(b"1234")
    faults.maybe_kill(0, 0)
    faults.delay(0, 0)
    faults.check_write(f)
    faults.between_renames()
    assert not faults.nonfinite(0, 0) and f.read_bytes() == b"1234"


def test_nonfinite_by_rank_and_step(monkeypatch):
    monkeypatch.setenv(faults.ENV, "nonfinite_rank=0@step=4,nonfinite_rank=1@step=6-")
    hits = [(r, s) for r in (0, 1) for s in range(9) if faults.nonfinite(r, s)]
    assert hits == [(0, 4), (1, 6), (1, 7), (1, 8)]


def test_first_attempt_only(monkeypatch):
    monkeypatch.setenv(faults.ENV, "nonfinite_rank=0@step=4")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert faults.active() == faults.Plan() and not faults.nonfinite(0, 4)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    assert faults.nonfinite(0, 4)
    monkeypatch.setenv("BERTGPU_RESTART_COUNT", "2")  # a restart by bertgpu's own launcher
    assert not faults.nonfinite(0, 4)


def test_delay_sleeps_on_its_rank_only(monkeypatch):
    monkeypatch.setenv(faults.ENV, "delay_rank=1:0.2,delay_rank=0:0.2@step=3")
    t = time.perf_counter()
    faults.delay(0, 1)
    faults.delay(2, 3)
    assert time.perf_counter() - t < 0.15
    for rank, step in ((1, 1), (1, None), (0, 3)):
        t = time.perf_counter()
        faults.delay(rank, step)
        assert time.perf_counter() - t >= 0.2, (rank, step)


def test_enospc_on_the_nth_write_cuts_the_file(monkeypatch, tmp_path):
    monkeypatch.setenv(faults.ENV, "enospc_write=3")
    files = []
    for i in range(1, 5):
        f = tmp_path / f"f{i}"
        f.write_bytes(b"x" * 100)
        files.append(f)
        if i == 3:
            with pytest.raises(OSError) as err:
                faults.check_write(f)
            assert err.value.errno == errno.ENOSPC and err.value.filename == str(f)
        else:
            faults.check_write(f)
    assert [f.stat().st_size for f in files] == [100, 100, 50, 100]
    faults.reset()  # the counter starts again with a fresh plan
    faults.check_write(files[0])
    assert faults.active().writes == 1


def test_bad_variable_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(faults.ENV, "kill_rank=1@stp=3")
    with pytest.raises(BertgpuError, match="unknown qualifier 'stp=3'"):
        faults.maybe_kill(1, 3)


def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != "TORCHELASTIC_RESTART_COUNT"}
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True,
                          text=True, timeout=60)


def test_maybe_kill_sends_sigkill_at_its_step_only():
    code = ("from bertgpu.testing import faults\n"
            "for step in range(6):\n"
            "    faults.maybe_kill(0, step)\n"
            "    faults.maybe_kill(1, step)\n"
            "    print('alive', step, flush=True)\n")
    proc = _run(code, {faults.ENV: "kill_rank=1@step=3"})
    assert proc.returncode == -9
    assert proc.stdout.split("\n")[:-1] == ["alive 0", "alive 1", "alive 2"]
    assert "SIGKILL rank 1 at step 3" in proc.stderr
    restarted = _run(code, {faults.ENV: "kill_rank=1@step=3", "TORCHELASTIC_RESTART_COUNT": "1"})
    assert restarted.returncode == 0 and "alive 5" in restarted.stdout


def test_between_renames_kills_on_the_nth_replacement():
    code = ("from bertgpu.testing import faults\n"
            "for i in range(3):\n"
            "    faults.between_renames()\n"
            "    print('replaced', i + 1, flush=True)\n")
    proc = _run(code, {faults.ENV: "kill_replace=2"})
    assert proc.returncode == -9 and proc.stdout.split() == ["replaced", "1"]
    assert "between the renames of folder replacement 2" in proc.stderr

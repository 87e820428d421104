"""SIGHUP from a terminal that closed: every write to it fails with EIO. A review found that a
command's own stop message (prepare's "the work units finished so far are kept ...") then
raised OSError inside the stop's handling, and the command line's error line failed the same
way: exit status 1 and a traceback, not the 129 of a stop."""

from __future__ import annotations

import errno
import io

from bertgpu import cli
from bertgpu.stops import HungUp


class _ClosedTerminal(io.StringIO):
    def write(self, text: str) -> int:
        raise OSError(errno.EIO, "Input/output error")


def _stopped_then_cannot_say(*args, **kwargs):
    try:
        raise HungUp()
    except KeyboardInterrupt:
        raise OSError(errno.EIO, "Input/output error") from None


def test_a_stop_whose_message_cannot_be_written_still_ends_as_the_stop(monkeypatch):
    monkeypatch.setattr(cli, "_run", _stopped_then_cannot_say)
    monkeypatch.setattr("sys.stderr", _ClosedTerminal())
    assert cli.main(["report", "x"]) == 129


def test_the_stop_line_on_a_terminal_that_works(monkeypatch, capsys):
    monkeypatch.setattr(cli, "_run", _stopped_then_cannot_say)
    assert cli.main(["report", "x"]) == 129
    assert capsys.readouterr().err == "bertgpu report: stopped by SIGHUP\n"


def test_another_error_while_stopping_is_still_said(monkeypatch, capsys):
    """A disk that filled up while a stop cleaned up is an error the user must see, not a stop
    (the review: `bertgpu prepare: interrupted` hid 'No space left on device')."""
    def full_disk_while_stopping(*args, **kwargs):
        try:
            raise KeyboardInterrupt()
        except KeyboardInterrupt:
            raise OSError(errno.ENOSPC, "No space left on device", "/tmp/out/x") from None

    monkeypatch.setattr(cli, "_run", full_disk_while_stopping)
    assert cli.main(["report", "x"]) == 2
    assert "No space left on device" in capsys.readouterr().err

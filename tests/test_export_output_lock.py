"""One export at a time writes an --out (locks.output_lock, as for finetune, glue, prepare and
tokenizer): two exports into one --out shared OUT.tmp and removed each other's, leaving the
config.json of one beside the model.safetensors of the other, both saying done, or one failed
with "cannot write OUT: No such file or directory (needs about ...)"."""

from __future__ import annotations

import os
import socket

import pytest
from _export_run import tiny_run

from bertgpu.cli import main as cli
from bertgpu.locks import output_lock


@pytest.fixture
def run(tmp_path):
    return tiny_run(tmp_path / "run", steps=(3, 6))


def test_an_export_into_an_out_being_written_is_refused_in_one_line(run, tmp_path, capsys):
    out = tmp_path / "conc"
    with output_lock(out, "bertgpu export"):
        assert cli(["export", str(run), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"bertgpu export: error: {out}: another bertgpu export (pid {os.getpid()} on "
        f"{socket.gethostname()}) is writing this output; wait for it to end or stop it, or give "
        "another --out\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # nothing written, no lock left


def test_a_second_export_while_the_first_writes_leaves_the_first_whole(run, tmp_path, capsys,
                                                                       monkeypatch):
    """The second export starts while the first has its scratch folder (deterministically: from
    inside the first's make_scratch)."""
    import json

    from bertgpu.models import hf_export

    out = tmp_path / "conc"
    second: list[int | None] = []
    real = hf_export.make_scratch

    def make_scratch(scratch, output):
        if not second:  # the first export's: the second starts now, and is the only one
            second.append(None)
            second[0] = cli(["export", str(run), "--out", str(out), "--step", "3"])
        return real(scratch, output)

    monkeypatch.setattr(hf_export, "make_scratch", make_scratch)
    assert cli(["export", str(run), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert second == [2]
    assert "another bertgpu export" in captured.err
    assert captured.out == f"exported {run} (step 6) -> {out}\n"
    assert json.loads((out / "config.json").read_text())["bertgpu_export"] is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conc", "run"]

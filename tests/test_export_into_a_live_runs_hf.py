"""`bertgpu export RUN --out RUN/hf` while RUN is training: the run writes RUN/hf itself at its
end, without export's output lock, and the two would share hf.tmp (the race of two exports into
one --out). It is refused in one line naming the run; once the run is over it exports."""

from __future__ import annotations

import os

from _export_run import tiny_run

from bertgpu.cli import main
from bertgpu.train import run_folder


def test_an_export_into_a_training_runs_hf_is_refused(tmp_path, capsys):
    run = tiny_run(tmp_path / "run", steps=(3,))
    with run_folder.run_folder_lock(run):  # a pretraining holds it while it trains
        assert main(["export", str(run), "--out", str(run / "hf")]) == 2  # old code: 0
        err = capsys.readouterr().err
        assert f"another bertgpu pretrain (pid {os.getpid()} on" in err, err
        assert not (run / "hf").exists()
    assert main(["export", str(run), "--out", str(run / "hf")]) == 0
    assert (run / "hf" / "model.safetensors").is_file()

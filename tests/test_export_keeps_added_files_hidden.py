"""An earlier export that also holds a folder or a hidden file (a hub clone's .gitattributes, an
eval/ folder) is refused naming that entry: it was refused as "not an earlier bertgpu export (no
config.json marked bertgpu_export ...)", whose config.json was marked."""

from __future__ import annotations

import pytest
from _export_run import tiny_run

from bertgpu.cli import main


@pytest.mark.parametrize("entry", [".gitattributes", "eval"])
def test_an_export_with_a_folder_or_hidden_file_beside_it_is_refused_by_name(tmp_path, capsys,
                                                                             entry):
    run, out = tiny_run(tmp_path / "run", steps=(3,)), tmp_path / "hf"
    assert main(["export", str(run), "--out", str(out)]) == 0
    (out / "README.md").write_text("card")
    if entry == "eval":
        (out / entry).mkdir()
    else:
        (out / entry).write_text("*.safetensors filter=lfs\n")
    capsys.readouterr()
    assert main(["export", str(run), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"an earlier bertgpu export, but it also holds {entry} (a folder or hidden file" in err
    assert (out / "README.md").read_text() == "card" and (out / entry).exists()

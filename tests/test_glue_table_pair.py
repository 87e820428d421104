"""glue_results.json and glue_results.md never disagree: a stop between their renames left the
new json (which `bertgpu report` reads) beside the old md. The md is now removed before the json
is renamed, and the next `glue` writes a missing md from the json."""

from __future__ import annotations

import json

import pytest
from test_glue_stop_keeps_finished_work import _glue, tiny_init  # noqa: F401 (a fixture)

from bertgpu import finetune
from bertgpu import glue as glue_cmd

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_table_files_never_disagree(tmp_path, tiny_init, monkeypatch):  # noqa: F811
    """A stop between the renames of glue_results.json and .md left the new json beside the
    old md; the md is now gone until the json is in place, and the next glue writes it."""
    out = tmp_path / "glue"
    assert _glue(tiny_init, out) == 0
    summary = json.loads((out / "glue_results.json").read_text())
    summary["average"] = 12.5
    real, renamed = glue_cmd.os.replace, []

    def replace(src, dst):
        if renamed:
            raise KeyboardInterrupt  # the stop after the first rename
        renamed.append(dst)
        real(src, dst)

    monkeypatch.setattr(glue_cmd.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        glue_cmd.write_table(summary, out)
    monkeypatch.undo()
    json_now = json.loads((out / "glue_results.json").read_text())
    md = out / "glue_results.md"
    # old code: the new json, the old md (average not 12.5)
    assert json_now["average"] == 12.5 and not md.exists()

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(finetune, "finetune", stopped)  # the next glue, stopped in seed 2
    assert _glue(tiny_init, out, "--seeds", "1", "2") == 130
    assert md.read_text() == glue_cmd.render_markdown(json_now) and "| 12.5 |" in md.read_text()

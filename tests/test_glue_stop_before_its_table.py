"""A first `glue --predict-test` stopped after it wrote its submission (OUT/submission/ and
submission.zip) and before its table (glue_results.json and .md): the same command refused the
folder, as holding a submission "no earlier `bertgpu glue` wrote". It was its own: the same
command now finishes it (no run trained again), while a submission glue did not write is
still refused and left as it is."""

from __future__ import annotations

import zipfile

import pytest
from test_glue_probe_fixes import tiny_init  # noqa: F401 (a fixture)
from test_glue_stop_keeps_finished_work import _glue, _seeds_trained

from bertgpu import glue

pytestmark = pytest.mark.usefixtures("one_thread")


def _stop(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize("cut", ["write_table", "zip"])
def test_a_stop_between_the_submission_and_the_table_is_finished(tmp_path, tiny_init,  # noqa: F811
                                                                 monkeypatch, capsys, cut):
    out = tmp_path / "glue"
    with monkeypatch.context() as m:
        if cut == "write_table":  # after submission/ and submission.zip
            m.setattr(glue, "write_table", _stop)
        else:  # after submission/, before submission.zip
            m.setattr(zipfile.ZipFile, "write", _stop)
        assert _glue(tiny_init, out, "--predict-test") == 130
    assert (out / "submission").is_dir() and not (out / "glue_results.json").exists()
    capsys.readouterr()

    seeds = _seeds_trained(monkeypatch)
    assert _glue(tiny_init, out, "--predict-test") == 0, capsys.readouterr().err  # old: 2
    assert seeds == []
    assert (out / "glue_results.json").is_file() and (out / "glue_results.md").is_file()
    assert (out / "submission" / "SST-2.tsv").is_file() and (out / "submission.zip").is_file()
    assert "no earlier `bertgpu glue`" not in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == [
        "SST-2", "glue_results.json", "glue_results.md", "submission", "submission.zip"]


def test_a_submission_glue_did_not_write_is_still_refused(tmp_path, tiny_init,  # noqa: F811
                                                           capsys):
    out = tmp_path / "glue"
    (out / "submission").mkdir(parents=True)
    (out / "submission" / "SST-2.tsv").write_text("index\tprediction\n0\t1\n", encoding="utf-8")
    assert _glue(tiny_init, out, "--predict-test") == 2
    assert "which no earlier `bertgpu glue` wrote here" in capsys.readouterr().err
    assert sorted(p.name for p in out.rglob("*")) == ["SST-2.tsv", "submission"]

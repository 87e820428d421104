"""A demo holds the lock of its --out (`OUT.bertgpu-lock`, beside it) while it runs: a second
demo into the same folder, with --fresh or without, is refused in one line. A `--fresh` demo
started while another ran deleted the first's folder, which then failed on a misleading
"D/run/hf: no tokenizer files"."""

from __future__ import annotations

import argparse

import pytest

from bertgpu import demo
from bertgpu.errors import BertgpuError
from bertgpu.locks import output_lock


def _args(out, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    return parser.parse_args(["--out", str(out), "--seeds", "0", *extra])


@pytest.fixture
def stages(monkeypatch):
    """The demo's stages replaced by a record of the folder they were given."""
    ran = []
    monkeypatch.setattr(demo, "_check_transformers", lambda: None)
    monkeypatch.setattr(demo, "_run_stages", lambda args, out, begun: ran.append(out) or 0)
    return ran


def _a_demo_folder(out):
    (out / "tokenizer").mkdir(parents=True)
    (out / "tokenizer" / "vocab.txt").write_text("[PAD]\n")


@pytest.mark.parametrize("fresh", [["--fresh"], []])
def test_a_second_demo_into_a_running_demos_folder_is_refused(tmp_path, stages, fresh):
    out = tmp_path / "demo"
    _a_demo_folder(out)
    with output_lock(out, "bertgpu demo"):  # the first demo, running
        with pytest.raises(BertgpuError, match=r"another bertgpu demo \(pid \d+ on .*\) is "
                                               "writing this output"):
            demo.main(_args(out, *fresh))
    assert (out / "tokenizer" / "vocab.txt").is_file()
    assert stages == []


def test_the_demos_lock_lets_its_own_stages_lock_their_folders_and_goes_with_it(tmp_path,
                                                                                 monkeypatch):
    """The demo's lock is its folder's, beside it: the stages' locks (tokenizer/, data/, inside
    it) are others, and taken as before; none is left when the demo ends."""
    out = tmp_path / "demo"
    _a_demo_folder(out)
    took = []

    def stages(args, folder, begun):
        with output_lock(folder / "tokenizer", "bertgpu tokenizer"):
            took.append(folder)
        return 0

    monkeypatch.setattr(demo, "_check_transformers", lambda: None)
    monkeypatch.setattr(demo, "_run_stages", stages)
    assert demo.main(_args(out, "--fresh")) == 0
    assert took == [out]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo"]

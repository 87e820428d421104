"""The same fine-tuning command again, after the run finished at its --out, says there is
nothing to do before it loads the tokenizer or encodes any data (tasks/request_key.py): it
tokenized the whole dataset first (minutes for MNLI or SQuAD) and only then found the run
finished. A run that differs (a setting, a data file) still encodes and trains."""

from __future__ import annotations

import json

import pytest
from test_finetune import FAST, sst2_fixture, tiny_init

import bertgpu.data.tokenizer_folder as tokenizer_folder
from bertgpu.finetune import finetune
from bertgpu.tasks import glue_job

pytestmark = pytest.mark.usefixtures("one_thread")

ARGS = [*FAST, "--epochs", "1"]


def _no_encoding(monkeypatch):
    def refused(*args, **kwargs):
        raise AssertionError("encoded the data of a finished run")

    monkeypatch.setattr(tokenizer_folder, "load_tokenizer", refused)
    monkeypatch.setattr(glue_job, "build_job", refused)


def test_a_finished_run_is_seen_before_its_data_is_encoded(tmp_path, monkeypatch, capsys):
    init = tiny_init(tmp_path)
    data = sst2_fixture(tmp_path / "SST-2", n_train=16, n_dev=8)
    out = tmp_path / "ft"
    first = finetune("sst2", data, init, out, overrides=ARGS)
    capsys.readouterr()

    with monkeypatch.context() as m:
        _no_encoding(m)
        again = finetune("sst2", data, init, out, overrides=ARGS)  # old code: AssertionError
    assert again == first
    said = capsys.readouterr().out
    assert f"SST-2: {out} already holds this fine-tuning" in said and "nothing to do" in said


def test_a_run_that_differs_is_encoded_and_trained(tmp_path, monkeypatch, capsys):
    init = tiny_init(tmp_path)
    data = sst2_fixture(tmp_path / "SST-2", n_train=16, n_dev=8)
    out = tmp_path / "ft"
    finetune("sst2", data, init, out, overrides=ARGS)
    built = []
    build_job = glue_job.build_job
    monkeypatch.setattr(glue_job, "build_job", lambda *a: built.append(1) or build_job(*a))
    # the same words, another order: other data, so another run
    dev = data / "dev.tsv"
    lines = dev.read_text(encoding="utf-8").splitlines()
    dev.write_text("\n".join([lines[0], *reversed(lines[1:])]) + "\n", encoding="utf-8")
    with pytest.warns(UserWarning, match="holds an earlier fine-tuning"):
        finetune("sst2", data, init, out, overrides=ARGS)
    with pytest.warns(UserWarning, match="holds an earlier fine-tuning"):
        third = finetune("sst2", data, init, out, overrides=[*ARGS, "--seed", "7"])
    assert len(built) == 2 and "nothing to do" not in capsys.readouterr().out
    assert third["config"]["seed"] == 7
    assert json.loads((out / "results.json").read_text())["config"]["seed"] == 7

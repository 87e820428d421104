"""A finished fine-tuning whose results.json has no request_key (an older bertgpu's) or another
one (a run on another number of processes) is found by its run_key once the data is encoded;
that run now writes its request_key into results.json, so the next run of the same command says
there is nothing to do before it encodes anything. It was never written back: every later run
encoded the whole dataset first (minutes for MNLI or SQuAD)."""

from __future__ import annotations

import json

import pytest
from test_finetune import sst2_fixture, tiny_init
from test_finetune_finished_before_encoding import ARGS, _no_encoding

from bertgpu.finetune import finetune
from bertgpu.tasks import glue_job

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("earlier", ["none", "another"])
def test_the_fallback_records_the_request_key(tmp_path, monkeypatch, capsys, earlier):
    init = tiny_init(tmp_path)
    data = sst2_fixture(tmp_path / "SST-2", n_train=16, n_dev=8)
    out = tmp_path / "ft"
    first = finetune("sst2", data, init, out, overrides=ARGS)
    path = out / "results.json"
    recorded = json.loads(path.read_text(encoding="utf-8"))
    assert recorded["request_key"] == first["request_key"]
    if earlier == "none":
        del recorded["request_key"]
    else:
        recorded["request_key"] = "0" * 64
    path.write_text(json.dumps(recorded, indent=2) + "\n", encoding="utf-8")
    capsys.readouterr()

    built = []
    build_job = glue_job.build_job
    with monkeypatch.context() as m:
        m.setattr(glue_job, "build_job", lambda *a: built.append(1) or build_job(*a))
        second = finetune("sst2", data, init, out, overrides=ARGS)  # found by its run_key
    assert built == [1] and "nothing to do" in capsys.readouterr().out
    now = json.loads(path.read_text(encoding="utf-8"))
    assert now == first == second  # the key back, nothing else changed
    assert list(now) == list(first)  # in its place
    assert not (out / "results.json.tmp").exists()

    with monkeypatch.context() as m:
        _no_encoding(m)
        third = finetune("sst2", data, init, out, overrides=ARGS)  # old code: AssertionError
    assert third == first and "nothing to do" in capsys.readouterr().out

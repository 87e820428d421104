"""results.json's "best" of epochs tied on the dev score is the earliest of them (the first to
reach that score: stopping there would have cost the fewest steps). A probe that picked the
latest found no test failing."""

from __future__ import annotations

import json

import _tiny_init
import pytest
from test_finetune_best_epoch import FAST, VOCAB, _given_scores, _glue

from bertgpu.finetune import finetune

pytestmark = pytest.mark.usefixtures("one_thread")


def test_tied_best_epochs_name_the_earliest(tmp_path, monkeypatch):
    init = _tiny_init.tiny_init(tmp_path, VOCAB)
    _given_scores(monkeypatch, {"accuracy": [75.0, 80.0, 80.0]})
    out = tmp_path / "ft"
    res = finetune("sst2", _glue(tmp_path / "glue"), init, out, overrides=FAST)
    assert json.loads((out / "results.json").read_text()) == res
    assert [e["score"] for e in res["epochs"]] == pytest.approx([75.0, 80.0, 80.0])
    assert res["best"]["epoch"] == 2 and res["best"]["score"] == pytest.approx(80.0)

"""A reset connection while prepare plans its work units (reading a corpus file's first bytes to
tell whether it is compressed, before it is cut in parts) is one line naming the file and the
network failure, and nothing is written. It was the store's traceback."""

from __future__ import annotations

import pytest
from test_prepare_store_failures_keep_units import (  # noqa: F401 (fixtures: tok, corpus)
    _FlakyStore,
    _prepare,
    corpus,
    tok,
)

from bertgpu.data.units import is_compressed
from bertgpu.errors import BertgpuError, from_network

pytest.importorskip("fsspec")


def test_a_reset_connection_while_planning_is_one_line(tok, corpus, tmp_path,  # noqa: F811
                                                       capsys, monkeypatch):
    monkeypatch.setattr(_FlakyStore, "fails", "b.txt")  # b.txt is cut in parts: read first
    assert _prepare(tok, str(tmp_path / "data"), f"flaky://{corpus}") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "b.txt: cannot read" in err and "Connection reset by peer" in err, err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_the_planning_error_is_known_as_the_network_s(corpus, monkeypatch):  # noqa: F811
    """(from_network: a store's failure, which --skip-bad does not take for a bad file)"""
    monkeypatch.setattr(_FlakyStore, "fails", "b.txt")
    with pytest.raises(BertgpuError) as info:
        is_compressed(f"flaky://{corpus}/b.txt")
    assert from_network(info.value)

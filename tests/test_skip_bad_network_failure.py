"""`prepare --skip-bad` does not leave out a file that could not be read for the network (a
reset connection): that is the store failing, not bad input. It was skipped as a bad file and
the set sealed without it (a probe: 100 of 300 documents, and "nothing to do" on every re-run);
now the run stops with one line and keeps its finished units, as without --skip-bad."""

from __future__ import annotations

from test_prepare_store_failures_keep_units import (  # noqa: F401 (fixtures)
    _FlakyStore,
    _records,
    bucket,
    corpus,
    tok,
)

from bertgpu.cli import main as cli_main


def test_skip_bad_stops_at_a_reset_connection_and_keeps_the_units(tok, corpus, bucket,  # noqa: F811
                                                                    capsys, monkeypatch):
    from bertgpu.data import prepare

    open_engine = prepare.open_engine

    def armed(*args, **kwargs):  # the units planned (b.txt's first bytes read): now it fails
        monkeypatch.setattr(_FlakyStore, "fails", "b.txt")
        return open_engine(*args, **kwargs)

    monkeypatch.setattr(prepare, "open_engine", armed)
    code = cli_main(["prepare", "--corpus", f"flaky://{corpus}", "--tokenizer", str(tok),
                     "--out", f"memory://{bucket}/data", "--seq-len", "64", "--unit-bytes",
                     "20000", "--workers", "1", "--skip-bad"])
    err = capsys.readouterr().err
    assert code == 2, err  # old code: 0, the set sealed without b.txt
    assert "b.txt: cannot read ([Errno 104] Connection reset by peer)" in err, err
    assert "kept" in err and "skipped" not in err, err
    assert _records(f"{bucket}/data")

"""prepare --engine ray (issue 27): the same bytes as the local engine on a local 2-CPU Ray
cluster started once for this module; a worker killed midway and a re-run that redoes only the
missing units; a Ray address where nothing answers."""

from __future__ import annotations

import logging

import pytest
from _corpora import MIXED_UNIT_BYTES, documents, tree_bytes, write_mixed
from _text_fixtures import train_small_tokenizer

from bertgpu.data.engines import RunStopped
from bertgpu.data.prepare import prepare
from bertgpu.errors import BertgpuError

ray = pytest.importorskip("ray")
pytest.importorskip("pyarrow")

KW = dict(seq_len=64, shard_size=40, unit_bytes=MIXED_UNIT_BYTES)


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             logging_level=logging.ERROR)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_small_tokenizer(tmp_path_factory.mktemp("tok") / "tok", vocab_size=1000)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    return write_mixed(tmp_path_factory.mktemp("mixed"), documents())


@pytest.mark.parametrize("split", [dict(validation_fraction=0.05),
                                   dict(objective="mlm+nsp", validation_docs=30)])
def test_ray_engine_gives_the_local_engines_bytes(cluster, tok, mixed, tmp_path, split):
    """10 work units (JSONL and text in byte ranges, Parquet in row groups) completed in any
    order on 2 Ray workers: the same shards and manifest as the local engine. With
    --validation-docs 30 the first units hold them (run one by one) and the rest follow."""
    report: dict = {}
    local = prepare(mixed, tok, tmp_path / "local", workers=1, **KW, **split)
    on_ray = prepare(mixed, tok, tmp_path / "ray", engine="ray", report=report, **KW, **split)
    assert len(report["units"]) == 10 and report["resumed"] == 0
    assert on_ray == local
    assert tree_bytes(tmp_path / "ray") == tree_bytes(tmp_path / "local")
    assert not (tmp_path / "ray.tmp").exists()
    if "validation_docs" in split:
        assert local["splits"]["validation"]["documents"] == 30
    else:
        assert local["split_unit"] in ("document", "chunk")
        assert abs(local["validation_share"] - 0.05) <= 0.01


def test_worker_killed_then_rerun_redoes_only_missing_units(cluster, tok, mixed, tmp_path,
                                                            monkeypatch):
    """Unit 4's worker is killed midway (BERTGPU_FAULTS kill_unit=4, no retries left): one line,
    nothing sealed, the finished units kept; the same command redoes only the missing ones."""
    from bertgpu.data import ray_engine

    out = tmp_path / "data"
    reference = prepare(mixed, tok, tmp_path / "reference", workers=1, **KW)
    monkeypatch.setattr(ray_engine, "TASK_RETRIES", 0)  # Ray would retry a dead worker's task
    monkeypatch.setenv("BERTGPU_FAULTS", "kill_unit=4")  # the driver's plan reaches the tasks
    with pytest.raises(RunStopped, match=r"unit 4 \(.*b.parquet part 2\): its Ray worker died"
                       ) as info:
        prepare(mixed, tok, out, engine="ray", **KW)
    assert "\n" not in str(info.value)
    assert not out.exists()  # nothing sealed ...
    kept = sorted(p.name for p in (tmp_path / "data.tmp" / "units").iterdir())
    assert "00004.json" not in kept and 0 < len(kept) < 10  # ... the finished units kept
    assert any((tmp_path / "data.tmp").glob("train-00004-*.npy"))  # it died midway
    monkeypatch.delenv("BERTGPU_FAULTS")
    report: dict = {}
    again = prepare(mixed, tok, out, engine="ray", report=report, **KW)
    assert report["resumed"] == len(kept)
    assert again == reference
    assert tree_bytes(out) == tree_bytes(tmp_path / "reference")


def test_ray_address_that_does_not_answer_is_one_line(tok, mixed, tmp_path, capsys):
    from bertgpu.cli import main as cli_main

    code = cli_main(["prepare", "--corpus", str(mixed[-1]), "--tokenizer", str(tok),
                     "--out", str(tmp_path / "data"), "--engine", "ray",
                     "--ray-address", "127.0.0.1:1"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "--ray-address 127.0.0.1:1: no Ray cluster answers" in err
    assert not (tmp_path / "data").exists() and not (tmp_path / "data.tmp").exists()
    with pytest.raises(BertgpuError, match="--ray-address: only with --engine ray"):
        prepare(mixed, tok, tmp_path / "d2", ray_address="127.0.0.1:1")


def test_ray_address_from_the_environment_is_named_as_such(tok, mixed, tmp_path, capsys,
                                                           monkeypatch):
    """RAY_ADDRESS joins a cluster as Ray's own init does; one that does not answer is named as
    the variable. It had been read by ray.init beside num_cpus: "--ray-address None: cannot join
    the Ray cluster (ValueError: When connecting to an existing cluster, num_cpus ...)"."""
    from bertgpu.cli import main as cli_main

    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    code = cli_main(["prepare", "--corpus", str(mixed[-1]), "--tokenizer", str(tok),
                     "--out", str(tmp_path / "data"), "--engine", "ray", "--workers", "1"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "RAY_ADDRESS=127.0.0.1:1: no Ray cluster answers" in err


def test_an_output_the_workers_do_not_share_is_not_sealed(cluster, tok, mixed, tmp_path,
                                                          capsys):
    """Ray workers are other processes: what they write to memory:// (as to a local --out on
    another node's disk) never reaches the driver. prepare had sealed a manifest over no shards
    and exited 0; now one line names the missing files and nothing is sealed."""
    fsspec = pytest.importorskip("fsspec")
    from bertgpu.cli import main as cli_main

    code = cli_main(["prepare", "--corpus", *map(str, mixed), "--tokenizer", str(tok),
                     "--out", "memory://unshared/data", "--engine", "ray",
                     "--unit-bytes", str(MIXED_UNIT_BYTES), "--seq-len", "64"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "memory://unshared/data: " in err
    assert "shard files the work units wrote are not there" in err
    assert "expected an output every node writes to" in err
    assert not fsspec.filesystem("memory").exists("/unshared/data/manifest.json")


def test_a_sigterm_keeps_the_finished_units_as_the_local_engine_does(tok, tmp_path):
    """ray.init put Ray's own SIGTERM handler (sys.exit(15)) in place of bertgpu's: a SIGTERM
    to `prepare --engine ray` exited 15 with Ray's crash dump and deleted the finished units."""
    import os
    import random
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 8)))
             for _ in range(2000)]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for f in range(2):
        (corpus / f"f{f}.txt").write_text("".join(
            "".join(" ".join(rng.choice(words) for _ in range(15)) + ".\n" for _ in range(5))
            + "\n" for _ in range(2500)))
    out = tmp_path / "data"
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bertgpu", "prepare", "--corpus", str(corpus), "--tokenizer",
         str(tok), "--out", str(out), "--seq-len", "128", "--unit-bytes", "100000",
         "--workers", "2", "--engine", "ray"], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    units = tmp_path / "data.tmp" / "units"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None and (
            not units.is_dir() or len(list(units.glob("*.json"))) < 2):
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert err.strip().splitlines()[-1] == "bertgpu prepare: stopped by SIGTERM", err
    assert "the work units finished so far are kept in" in err
    assert len(list(units.glob("*.json"))) >= 2

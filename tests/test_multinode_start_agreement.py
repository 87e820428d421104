"""Two "machines" of one `bertgpu pretrain` job (_two_nodes): the ranks agree at start-up on what
they train (a node given another lr trained at it, one given other shards trained on two data
sets, one given another train.max_steps left rank 0 in a collective until the timeout), and one
rank's start-up error stops the others at once with its line instead of leaving them in
init_process_group until distributed.timeout_minutes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from _shards import write_synthetic_shards
from _two_nodes import last_line, node, two_nodes

from bertgpu.step_folders import complete_steps
from bertgpu.train.run_folder import run_folder_lock


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return write_synthetic_shards(tmp_path_factory.mktemp("data") / "d", n_train=48, n_val=8)


@pytest.mark.timeout(200)
def test_a_node_with_another_lr_and_max_steps_stops_every_rank(shards, tmp_path):
    # the probe: rank 1 trained at 1e-2 while config.toml and the start-up table said 0.001
    run = tmp_path / "run"
    results = two_nodes([node(shards, run),
                         node(shards, run, "--optim.lr", "1e-2", "--train.max_steps", "8")])
    expected = ("bertgpu pretrain: error: rank 1's --optim.lr 0.01 differs from rank 0's 0.001, "
                "its --train.max_steps 8 from 12: every machine must run the same command and "
                "recipe")
    for result in results:
        assert result.returncode == 2, result.stderr[-3000:]
        assert last_line(result) == expected, result.stderr[-3000:]
    assert not complete_steps(run / "checkpoints")


@pytest.mark.timeout(200)
def test_a_node_with_another_shard_set_stops_every_rank_and_a_copy_trains(shards, tmp_path):
    other = write_synthetic_shards(tmp_path / "other", n_train=48, n_val=8, seed=1)
    results = two_nodes([node(shards, tmp_path / "a"), node(other, tmp_path / "a")])
    for result in results:
        assert result.returncode == 2, result.stderr[-3000:]
        line = last_line(result)
        assert f"rank 1's shard set (--data {other}, its manifest.json sha256 " in line, line
        assert f"differs from rank 0's (--data {shards}, " in line, line
        assert line.endswith("every machine must run the same command and recipe"), line
    # an identical copy of the shards elsewhere on the other machine is the same shard set
    copy = tmp_path / "copy"
    shutil.copytree(shards, copy)
    run = tmp_path / "b"
    results = two_nodes([node(shards, run, "--train.max_steps", "2"),
                         node(copy, run, "--train.max_steps", "2")])
    assert [r.returncode for r in results] == [0, 0], results[1].stderr[-3000:]
    assert [s for s, _ in complete_steps(run / "checkpoints")][-1] == 2
    assert not (run / ".bertgpu-shared-check").exists()


@pytest.mark.timeout(200)
def test_a_rank_failing_its_start_up_check_stops_the_others_at_once(shards, tmp_path):
    # the probe: node 1 exited 2 at once; node 0 waited in init_process_group for the whole
    # timeout and died of "DistStoreError: wait timeout", no bertgpu message
    run = tmp_path / "run"
    zero, one = two_nodes([node(shards, run), node(shards, run, "--train.max_steps", "0")])
    assert one.returncode == 2 and zero.returncode == 2, zero.stderr[-3000:]
    own = last_line(one)
    assert own.startswith("bertgpu pretrain: error: ") and "train.max_steps" in own, own
    said = own.removeprefix("bertgpu pretrain: error: ")
    assert last_line(zero) == f"bertgpu pretrain: error: rank 1 stopped at start-up: {said}", \
        zero.stderr[-3000:]
    assert "Traceback" not in zero.stderr and "DistStoreError" not in zero.stderr
    assert not run.exists()


@pytest.mark.timeout(200)
def test_rank_0_finding_its_run_folder_locked_stops_the_others_at_once(shards, tmp_path):
    run = tmp_path / "run"
    with run_folder_lock(run):  # another pretrain training there
        zero, one = two_nodes([node(shards, run), node(shards, run)])
    own = last_line(zero)
    assert zero.returncode == 2 and "another bertgpu pretrain" in own, zero.stderr[-3000:]
    said = own.removeprefix("bertgpu pretrain: error: ")
    assert one.returncode == 2, one.stderr[-3000:]
    assert last_line(one) == f"bertgpu pretrain: error: rank 0 stopped at start-up: {said}"

"""Two "machines" of one `bertgpu pretrain` job (_two_nodes) whose --out are not one folder: a
fresh run with another --out per node trained, and nothing said that the run folder must be one
every node sees; a stale run folder at the same path on a node's own disk was resumed from by
that rank alone. Rank 0's token in the run folder, which every rank must read, stops them all."""

from __future__ import annotations

from pathlib import Path

import pytest
from _e2e import bertgpu_here
from _shards import write_synthetic_shards
from _two_nodes import last_line, node, two_nodes

from bertgpu.step_folders import complete_steps
from bertgpu.train.run_folder import check_run_folder


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return write_synthetic_shards(tmp_path_factory.mktemp("data") / "d", n_train=48, n_val=8)


@pytest.mark.timeout(200)
def test_a_rank_whose_out_is_not_rank_0s_folder_stops_every_rank(shards, tmp_path):
    # the probe: a fresh run with a different --out per node trained; nothing said the folder
    # must be shared
    a, b = tmp_path / "a", tmp_path / "b"
    results = two_nodes([node(shards, a), node(shards, b)])
    expected = (f"bertgpu pretrain: error: rank 1 does not see the run folder rank 0 writes (its "
                f"--out {b}, rank 0's {a}: no such folder); --out must be one folder every node "
                "sees (on a shared filesystem), not a folder of the same name on each machine")
    for result in results:
        assert result.returncode == 2, result.stderr[-3000:]
        assert last_line(result) == expected, result.stderr[-3000:]
    assert not (a / ".bertgpu-shared-check").exists() and not complete_steps(a / "checkpoints")


@pytest.mark.timeout(200)
def test_a_rank_with_a_stale_run_folder_of_its_own_stops_every_rank(shards, tmp_path):
    # the probe: rank 1 resumed silently from another run's checkpoints in a folder of the same
    # path on its own disk, while rank 0 resumed from the shared one
    shared, stale = tmp_path / "shared", tmp_path / "stale"
    for run in (shared, stale):
        other = ["--optim.lr", "2e-3"] if run == stale else []  # another run's weights
        done = bertgpu_here(node(shards, run, "--train.max_steps", "4", *other))
        assert done.returncode == 0, done.stderr[-3000:]
    results = two_nodes([node(shards, shared), node(shards, stale)])
    expected = (f"bertgpu pretrain: error: rank 1 does not see the run folder rank 0 writes (its "
                f"--out {stale}, rank 0's {shared}: no token from rank 0 in it); --out must be "
                "one folder every node sees (on a shared filesystem), not a folder of the same "
                "name on each machine")
    for result in results:
        assert result.returncode == 2, result.stderr[-3000:]
        assert last_line(result) == expected, result.stderr[-3000:]
    for run in (shared, stale):  # neither resumed: both still end at step 4
        assert [s for s, _ in complete_steps(run / "checkpoints")][-1] == 4
        assert not (run / ".bertgpu-shared-check").exists()


def test_a_token_left_by_a_killed_job_is_no_sign_of_another_folder(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".bertgpu-shared-check").write_text("0123", encoding="utf-8")
    check_run_folder(run)  # a new run may start here, as in an empty folder

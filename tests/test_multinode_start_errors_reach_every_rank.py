"""Two "machines" of one `bertgpu pretrain` job (_two_nodes), the holes a probe left in the
start-up agreement: an argparse error on one node only (raised in cli.py before pretrain.main)
left the other waiting for distributed.timeout_minutes; a rank that could not make a group of
the job's backend (`--impl.device cuda` on a node without a GPU: its hand-over tried NCCL)
left it waiting too; and `--init` was compared as a path, so one published model mounted at
another path on each node was refused."""

from __future__ import annotations

import shutil
import time

import pytest
import torch
from _e2e import bertgpu_here
from _two_nodes import last_line, node, two_nodes
from test_multinode_start_agreement import shards  # noqa: F401

from bertgpu.step_folders import complete_steps

PROMPT_S = 25.0  # well under the 30 s (TIMEOUT_MINUTES) a rank waited for one that never came


def _stopped_with(results, failing: int, tail: str) -> None:
    """The failing rank said `tail` itself; the other said it as that rank's start-up error."""
    own, other = results[failing], results[1 - failing]
    assert own.returncode == 2, own.stderr[-3000:]
    assert last_line(own) == f"bertgpu pretrain: error: {tail}", own.stderr[-3000:]
    assert other.returncode == 2, other.stderr[-3000:]
    assert last_line(other) == (f"bertgpu pretrain: error: rank {failing} stopped at start-up: "
                                f"{tail}"), other.stderr[-3000:]
    assert "DistStoreError" not in other.stderr and "Traceback" not in other.stderr


@pytest.mark.timeout(200)
def test_an_argparse_error_on_one_node_stops_the_other_at_once(shards, tmp_path):  # noqa: F811
    # the probe: rank 1 exited 2 on its bad --max-restarts; rank 0 waited out the timeout
    run = tmp_path / "run"
    start = time.monotonic()
    results = two_nodes([node(shards, run), node(shards, run, "--max-restarts", "two")])
    assert time.monotonic() - start < PROMPT_S
    _stopped_with(results, 1, "argument --max-restarts: invalid int value: 'two' (the options: "
                              "bertgpu pretrain --help)")
    assert not run.exists()


@pytest.mark.timeout(200)
def test_an_error_in_rank_0s_command_line_stops_rank_1(shards, tmp_path):  # noqa: F811
    # rank 0 hosts the rendezvous store: it stays until rank 1 has read its line
    run = tmp_path / "run"
    results = two_nodes([node(shards, run, "--max-restarts", "-1"), node(shards, run)])
    _stopped_with(results, 0, "--max-restarts -1: expected 0 or more")


@pytest.mark.timeout(200)
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a node without a visible GPU")
def test_a_node_without_the_jobs_gpu_stops_the_others_at_once(shards, tmp_path):  # noqa: F811
    # the hand-over joined the group on the config's device: no GPU here, so no NCCL group, and
    # rank 0 (a gloo job) waited out the timeout; the rendezvous store needs no device
    run = tmp_path / "run"
    start = time.monotonic()
    results = two_nodes([node(shards, run), node(shards, run, "--impl.device", "cuda")])
    assert time.monotonic() - start < PROMPT_S
    line = last_line(results[1]).removeprefix("bertgpu pretrain: error: ")
    assert "impl.device" in line and "cuda" in line, line
    _stopped_with(results, 1, line)


@pytest.mark.timeout(400)
def test_one_init_model_at_another_path_per_node_trains_and_another_model_stops(shards, tmp_path):  # noqa: F811
    # the probe: the same published model mounted at /a on one node and /b on the other was
    # refused as "rank 1's --init /b differs from rank 0's /a"
    made = {}
    for name, seed in (("model", "0"), ("other", "1")):
        done = bertgpu_here(node(shards, tmp_path / name, "--train.max_steps", "2", "--seed", seed))
        assert done.returncode == 0, done.stderr[-3000:]
        made[name] = tmp_path / name / "hf"
    copy = tmp_path / "mounted elsewhere"
    shutil.copytree(made["model"], copy)
    run = tmp_path / "run"
    results = two_nodes([node(shards, run, "--init", str(made["model"])),
                         node(shards, run, "--init", str(copy))])
    assert [r.returncode for r in results] == [0, 0], results[1].stderr[-3000:]
    assert complete_steps(run / "checkpoints")

    results = two_nodes([node(shards, tmp_path / "b", "--init", str(made["model"])),
                         node(shards, tmp_path / "b", "--init", str(made["other"]))])
    for result in results:
        assert result.returncode == 2, result.stderr[-3000:]
        line = last_line(result)
        assert f"rank 1's init model (--init {made['other']}, its model digest " in line, line
        assert f"differs from rank 0's (--init {made['model']}, its model digest " in line, line
        assert line.endswith("every machine must run the same command and recipe"), line
    assert not complete_steps(tmp_path / "b" / "checkpoints")

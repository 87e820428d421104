"""`bertgpu bench scaling`: the ring all-reduce cost model, reading a run's metrics, and a smoke
run at 1 and 2 CPU workers that writes the JSONL, the markdown table and the plot."""

from __future__ import annotations

import argparse
import json
import re

import pytest

from bertgpu.bench import scaling as bs
from bertgpu.errors import BertgpuError


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bs.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_cost_model_limits_and_trends():
    base = dict(params=110_000_000, bucket_mb=25, step_compute_s=0.02)
    assert bs.predict_efficiency(**base, bandwidth_GBps=1.0, accumulation=1, n=1) == 1.0
    # Infinite-ish bandwidth: only the per-bucket latency after the backward remains.
    assert bs.predict_efficiency(**base, bandwidth_GBps=1e9, accumulation=1, n=8) > 0.99
    effs = [bs.predict_efficiency(**base, bandwidth_GBps=16, accumulation=1, n=n)
            for n in (2, 4, 8, 64)]
    assert effs == sorted(effs, reverse=True) and effs[-1] < 0.5
    # Accumulation amortises the one all-reduce per step; the exposed time itself is unchanged.
    e1 = bs.predict_efficiency(**base, bandwidth_GBps=16, accumulation=1, n=8)
    e4 = bs.predict_efficiency(**base, bandwidth_GBps=16, accumulation=4, n=8)
    exposed1, exposed4 = 0.02 * (1 / e1 - 1), 4 * 0.02 * (1 / e4 - 1)
    assert e4 > e1 and exposed4 == pytest.approx(exposed1)
    # Bandwidth-bound: all of the all-reduce that does not fit behind the backward is exposed.
    ring = 2 * 7 / 8 * 110e6 * 4 / 16e9
    assert exposed1 == pytest.approx(ring - 2 / 3 * 0.02 * (1 - 25 * 2**20 / 440e6), rel=0.05)
    # A tail that is ready only at the end (the tied embedding) cannot be hidden.
    assert (bs.predict_efficiency(**base, bandwidth_GBps=200, accumulation=1, n=8,
                                  tail_params=23_000_000)
            < bs.predict_efficiency(**base, bandwidth_GBps=200, accumulation=1, n=8))
    with pytest.raises(BertgpuError):
        bs.predict_efficiency(**base, bandwidth_GBps=0, accumulation=1, n=8)


def test_bert_parameter_counts_match_the_model():
    from bertgpu.models.bert.config import BertConfig
    from bertgpu.models.bert.model import BertForPreTraining

    cfg = BertConfig.from_dict({"vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2,
                                "num_attention_heads": 4, "intermediate_size": 256})
    model = BertForPreTraining(cfg)
    total, tied = bs.bert_params(64, 2, vocab=1000, intermediate=256)
    # the vocabulary tables hold 1024 rows: 1000 padded to a multiple of 64 (shared.py)
    assert total == sum(p.numel() for p in model.parameters()) and tied == 1024 * 64


def test_measure_reads_steady_state_after_warmup(tmp_path):
    lines = [{"step": s, "kind": "train", "elapsed_s": 10.0 + 0.5 * s, "tokens_seen": 100 * s,
              "comm_share": 0.2, "data_wait_share": 0.1} for s in range(1, 6)]
    lines.insert(2, {"step": 2, "kind": "eval", "elapsed_s": 11.2})
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    m = bs.measure(path, warmup_steps=2)
    assert m["tokens_per_s"] == pytest.approx(200.0) and m["steps_measured"] == 3
    assert m["comm_share"] == pytest.approx(0.2) and m["data_wait_share"] == pytest.approx(0.1)
    with pytest.raises(BertgpuError, match="no train records"):
        bs.measure(path, warmup_steps=5)


@pytest.mark.timeout(240)
def test_smoke_one_and_two_workers(tmp_path, capsys, monkeypatch):
    out = tmp_path / "scaling"
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))  # the runs' temp folder: torch's launcher left one
    args = _args("--workers", "1", "2", "--accumulation", "1", "--steps", "2",
                 "--warmup-steps", "1", "--device", "cpu", "--micro-batch-size", "2",
                 "--seq-len", "16", "--set", "model.vocab_size=64", "--set", "model.hidden_size=32",
                 "--set", "model.intermediate_size=64", "--set", "impl.num_workers=0",
                 "--out", str(out))
    assert bs.main(args) == 0
    rows = [json.loads(line) for line in (out / "scaling.jsonl").read_text().splitlines()]
    assert ([(r["workers"], r["accumulation"], r["global_batch"]) for r in rows]
            == [(1, 1, 2), (2, 1, 4)])
    for r in rows:
        assert r["tokens_per_s"] > 0 and r["steps_measured"] == 2
        assert r["efficiency"] == pytest.approx(r["speedup"] / r["workers"])
    assert (rows[0]["speedup"] == 1.0 and rows[0]["comm_share"] == 0.0
            and 0.0 <= rows[1]["comm_share"] <= 1.0)
    md = (out / "scaling.md").read_text()
    assert "| workers | accumulation |" in md and "BERT-large" in md
    assert (out / "scaling.png").stat().st_size > 1000
    assert not (out / "runs" / "w2_a1").exists() and (out / "runs" / "w2_a1.metrics.jsonl").exists()
    assert not (out / "runs" / "w2_a1.launcher").exists()  # the launcher's files of a good run
    # inductor's compile cache is kept there on purpose
    assert [p.name for p in temp.iterdir() if not p.name.startswith("torchinductor_")] == []
    assert "efficiency" in capsys.readouterr().out


def test_bad_numbers_and_result_paths_are_refused_before_any_run(tmp_path, capsys):
    """`--device-tflops 0` divided by zero, `--bandwidth-gbps nan` read as perfect efficiency,
    `--micro-batch-size 0` fell back to the default, `bench quality --hours -2` projected
    negative tokens, and a folder named like a results file was a traceback after every
    measurement."""
    from bertgpu.cli import main as cli

    for argv in (["scaling", "--predict-only", "--device-tflops", "0"],
                 ["scaling", "--predict-only", "--bandwidth-gbps", "nan"],
                 ["scaling", "--predict-only", "--micro-batch-size", "0"],
                 ["quality", "--project", "--hours", "-2"],
                 ["quality", "--project", "--threads", "0"]):
        with pytest.raises(SystemExit) as e:
            cli(["bench", *argv])
        assert e.value.code == 2
        assert f"argument {argv[-2]}: expected a positive finite" in capsys.readouterr().err
    for suite, name in (("scaling", "scaling.jsonl"), ("quality", "quality.md"),
                        ("finetune-scaling", "finetune_scaling.jsonl")):
        out = tmp_path / suite
        (out / name).mkdir(parents=True)
        assert cli(["bench", suite, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"{out / name}: is a folder" in err and len(err.splitlines()) == 1, err
        assert sorted(p.name for p in out.iterdir()) == [name]


def _fake_point(args, data_dir, workers, accumulation, micro, model_overrides, env, runs_dir):
    """`_run_point` without a training run: the numbers of a point that scales perfectly."""
    return {"workers": workers, "accumulation": accumulation, "micro_batch_size": micro,
            "global_batch": micro * accumulation * workers, "wall_s": 1.0,
            "tokens_per_s": 100.0 * workers, "step_time_s": 0.1, "steps_measured": 2,
            "comm_share": 0.0, "data_wait_share": 0.0}


def test_data_gives_the_sequence_length_and_its_fit_is_checked_before_any_run(tmp_path, capsys,
                                                                               monkeypatch):
    """With --data, the rows and scaling.md said seq_len 64 (the synthetic default) while the
    shards were longer, an explicit --seq-len was silently ignored, and a vocabulary that did not
    fit the model failed inside the first run, leaving OUT/runs/ and its log behind."""
    from _shards import write_synthetic_shards

    from bertgpu.cli import main as cli

    data = write_synthetic_shards(tmp_path / "data", seq_len=32, vocab_size=100)
    out = tmp_path / "scaling"
    common = ["bench", "scaling", "--data", str(data), "--workers", "1", "2", "--accumulation",
              "1", "--device", "cpu", "--out", str(out)]
    for extra, message in (
            (["--set", "model.vocab_size=64"],
             f"--data: {data / 'manifest.json'}: vocab_size 100 does not fit the model"),
            (["--set", "model.max_position_embeddings=16"],
             f"--data: {data / 'manifest.json'}: seq_len 32 is longer than the model's "
             "max_position_embeddings 16"),
            (["--seq-len", "16"],
             f"--seq-len 16: the shard set --data {data} holds sequences of 32 tokens")):
        assert cli([*common, *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.splitlines()) == 1, err
        assert not out.exists()  # nothing left behind
    # Without --data, a --seq-len beyond the model's positions is refused too (it was cut).
    assert cli([*common[:2], "--seq-len", "256", "--out", str(out)]) == 2
    assert "max_position_embeddings 128; expected at most 128" in capsys.readouterr().err

    monkeypatch.setattr(bs, "_run_point", _fake_point)
    assert bs.main(_args(*common[2:], "--seq-len", "32")) == 0  # an agreeing --seq-len is fine
    assert bs.main(_args(*common[2:])) == 0  # a second run appends to the same file
    rows = [json.loads(line) for line in (out / "scaling.jsonl").read_text().splitlines()]
    assert [r["seq_len"] for r in rows] == [32] * 4 and all(r["data"] == str(data) for r in rows)
    ids = [r["run_id"] for r in rows]  # a bench run's rows share its run_id (its start time)
    assert ids[0] == ids[1] and ids[2] == ids[3]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", ids[0])
    md = (out / "scaling.md").read_text()
    assert f"Micro batch 8 x 32 tokens per device (the shard set {data})" in md
    assert f"(run {ids[2]}, cpu)" in md


def test_a_failed_point_names_one_worker_in_the_singular(tmp_path, monkeypatch):
    """A failed 1-worker point said "1 workers, accumulation 1 failed"."""
    said = []

    def fail(cmd, env, log, timeout_s, what):
        said.append(what)
        raise BertgpuError(f"{log}: {what} failed with exit code 2")

    monkeypatch.setattr(bs.cells, "run_logged", fail)
    args = _args("--workers", "1", "--steps", "1", "--warmup-steps", "1", "--device", "cpu")
    for workers in (1, 2):
        with pytest.raises(BertgpuError):
            bs._run_point(args, tmp_path / "data", workers, 1, 2, [], {}, tmp_path / "runs")
    assert said == ["1 worker, accumulation 1", "2 workers, accumulation 1"]

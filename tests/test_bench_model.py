"""`bertgpu bench model` smoke test: tiny sizes, one timed step of both models, table + JSONL."""

from __future__ import annotations

import argparse
import functools
import json

import pytest

from bertgpu.bench import model as bench_model
from bertgpu.bench.batches import sample_lengths
from bertgpu.bench.cells import append_rows

pytest.importorskip("transformers")


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    bench_model.add_arguments(p)
    return p.parse_args(argv)


def test_bench_model_smoke(tmp_path, capsys):
    out = tmp_path / "results.jsonl"
    args = parse(["--size", "tiny", "--micro-batch", "2", "--seq-len", "16", "--iters", "1",
                  "--warmup", "0", "--padding", "padded,unpadded", "--real-lengths", "uniform",
                  "--peak-tflops", "1", "--grad-ckpt", "--out", str(out)])
    assert bench_model.main(args) == 0
    text = capsys.readouterr().out
    assert "| size | B | T | dtype |" in text and "bertgpu" in text and "transformers" in text
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 4 and {r["model"] for r in rows} == {"bertgpu", "transformers"}
    for r in rows:
        assert r["tokens_per_s"] > 0 and r["fwd_ms"] > 0 and r["bwd_ms"] > 0 and r["opt_ms"] >= 0
        assert r["mfu"] is not None and r["mfu"] > 0  # --peak-tflops given
        assert r["mean_length"] <= 16
    assert [r["padding"] for r in rows if r["model"] == "bertgpu"] == ["padded", "unpadded"]
    hf = [r for r in rows if r["model"] == "transformers"]
    assert all(r["ratio_vs_transformers"] == pytest.approx(1.0) for r in hf)
    # runs accumulate
    assert bench_model.main(parse(["--size", "tiny", "--micro-batch", "2", "--seq-len", "8",
                                   "--iters", "1", "--warmup", "0", "--models", "bertgpu",
                                   "--out", str(out)])) == 0
    assert len(out.read_text().splitlines()) == 5


def test_bench_model_csv_and_lengths_from_shards(tmp_path):
    from _shards import write_synthetic_shards

    data = write_synthetic_shards(tmp_path / "data", seq_len=32, variable_lengths=True)
    lengths = sample_lengths(str(data), 50, 16, seed=0)
    assert lengths.shape == (50,) and lengths.max() <= 16 and lengths.min() >= 2
    out = tmp_path / "r.csv"
    append_rows(out, [dict(model="a", tokens_per_s=1.0)])
    append_rows(out, [dict(model="b", tokens_per_s=2.0)])
    assert out.read_text().splitlines() == ["model,tokens_per_s", "a,1.0", "b,2.0"]


def test_bench_model_gpu_preset_grid():
    args = parse(["--preset", "gpu"])
    grid = bench_model._grid(args, cuda=True)
    assert {p["size"] for p in grid} == {"base", "large"}
    assert {(p["seq_len"], p["padding"]) for p in grid} >= {(512, "padded"), (512, "unpadded")}
    assert any(p["compile"] for p in grid) and all(p["dtype"] == "bf16" for p in grid)


def test_bad_flags_are_rejected():
    with pytest.raises(SystemExit):
        parse(["--size", "huge"])
    with pytest.raises(SystemExit):
        parse(["--micro-batch", "x"])


def test_models_are_built_once_per_size_and_transformers_rows_reused(monkeypatch, tmp_path):
    built: list[str] = []
    real = bench_model.Models

    def counting(size, *a, **kw):
        built.append(size)
        return real(size, *a, **kw)

    monkeypatch.setattr(bench_model, "Models", counting)
    out = tmp_path / "r.jsonl"
    args = parse(["--size", "tiny", "--micro-batch", "2", "--seq-len", "8,16", "--iters", "1",
                  "--warmup", "0", "--padding", "padded,unpadded", "--real-lengths", "uniform",
                  "--out", str(out)])
    assert bench_model.main(args) == 0
    assert built == ["tiny"]  # one pair of models for all four points
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    hf = [(r["seq_len"], r["reused"]) for r in rows if r["model"] == "transformers"]
    # padded HF timed once per length
    assert sorted(hf) == [(8, False), (8, True), (16, False), (16, True)]


def test_gpu_preset_is_lean():
    grid = bench_model._grid(parse(["--preset", "gpu"]), cuda=True)
    assert {(p["size"], p["seq_len"]) for p in grid} == {("base", 128), ("base", 512),
                                                         ("large", 128), ("large", 512)}
    compiled = [p for p in grid if p["compile"]]
    # one compile per size
    assert [p["compile_models"] for p in compiled] == [["bertgpu"], ["bertgpu"]]
    assert [p["size"] for p in grid] == sorted((p["size"] for p in grid),
                                               key=["base", "large"].index)


# --------------------------------------------------------------------------------------------
# --strategy fsdp: bytes per rank (bench/sharded.py)


@functools.cache
def _bert_params(size: str) -> list:
    """The distinct parameters of our BertForPreTraining of a bench size (the tied decoder once),
    as meta tensors: shapes without memory."""
    import torch

    from bertgpu.bench.batches import SIZES
    from bertgpu.models.bert.config import BertConfig
    from bertgpu.models.bert.model import BertForPreTraining

    with torch.device("meta"):
        return list(BertForPreTraining(BertConfig(**SIZES[size])).parameters())


@pytest.mark.timeout(300)
def test_strategy_fsdp_measures_and_predicts_bytes_per_rank(tmp_path, capsys):
    """Counted independently from the model's shapes: fp32 parameters and gradients (4 bytes an
    element), AdamW's two moments (8) plus a 4-byte step count per tensor; on 2 fsdp ranks rank
    0 holds ceil(rows / 2) of each tensor; the 4- and 8-rank rows are the one-rank bytes / N."""
    out = tmp_path / "memory.jsonl"
    args = parse(["--strategy", "fsdp", "--size", "tiny", "--micro-batch", "1", "--seq-len", "8",
                  "--iters", "1", "--warmup", "0", "--ranks", "2", "--device", "cpu",
                  "--out", str(out)])
    assert bench_model.main(args) == 0
    assert "| fsdp | 8 |" in capsys.readouterr().out
    rows = {(r["strategy"], r["ranks"]): r for r in map(json.loads, out.read_text().splitlines())}
    assert sorted(rows) == [(s, n) for s in ("ddp", "fsdp") for n in (1, 2, 4, 8)]
    for (_, n), r in rows.items():
        assert r["source"] == ("measured" if n <= 2 else "predicted"), r
        assert r["total_bytes"] == r["params_bytes"] + r["grads_bytes"] + r["optimizer_bytes"]
    params = _bert_params("tiny")
    elements = sum(p.numel() for p in params)
    shard = sum(-(-p.shape[0] // 2) * (p[0].numel() if p.dim() > 1 else 1) for p in params)
    whole = (4 * elements, 4 * elements, 8 * elements + 4 * len(params))
    half = (4 * shard, 4 * shard, 8 * shard + 4 * len(params))

    def parts(r: dict) -> tuple[int, int, int]:
        return r["params_bytes"], r["grads_bytes"], r["optimizer_bytes"]

    for n in (1, 2, 4, 8):  # ddp: everything on every rank, measured or predicted
        assert parts(rows["ddp", n]) == whole, n
    assert parts(rows["fsdp", 1]) == whole and parts(rows["fsdp", 2]) == half
    for n in (4, 8):
        assert parts(rows["fsdp", n]) == tuple(-(-b // n) for b in whole), n
    # the prediction's rule holds where it can be measured: 2 ranks within 0.1%
    for got, one in zip(parts(rows["fsdp", 2]), whole, strict=True):
        assert abs(got - one / 2) < 1e-3 * got


def test_readme_table_of_bytes_per_rank_follows_from_the_models_shapes():
    """The README's table (BERT-base and -large, ddp and fsdp on 2, 4 and 8 ranks), each MiB
    figure recomputed from the parameter shapes: (P + G + O) / N for fsdp, all of it for ddp."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    table = [[c.strip() for c in line.strip("|").split("|")]
             for line in readme.splitlines() if line.startswith("| BERT-")]
    assert [(r[0], r[1], r[2], r[-1]) for r in table] == [
        (model, strategy, ranks, source) for model in ("BERT-base", "BERT-large")
        for strategy, ranks, source in (("ddp", "any", "measured (1, 2)"),
                                        ("fsdp", "2", "measured"), ("fsdp", "4", "predicted"),
                                        ("fsdp", "8", "predicted"))]
    for model, strategy, ranks, *mib, _ in table:
        params = _bert_params(model.removeprefix("BERT-"))
        elements = sum(p.numel() for p in params)
        n = 1 if strategy == "ddp" else int(ranks)
        want = [4 * elements, 4 * elements, 8 * elements + 4 * len(params)]
        want = [b / n for b in want] + [sum(want) / n]
        for got, b in zip(mib, want, strict=True):
            assert abs(float(got) - b / 2**20) <= 0.05 + 1e-9, (model, strategy, ranks, mib)

"""`bertgpu bench model`: the CLI grid (table + JSONL), the GPU preset's code path on the CPU
(gpu-smoke: every row, its ratios, no compile inside timed steps), batches whose masks and
lengths are what training draws, the length sources (shard set, SQuAD) and the preset's shape."""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

import pytest

from bertgpu.bench import model as bench_model
from bertgpu.bench.batches import make_batches, sample_lengths
from bertgpu.bench.cells import append_rows
from bertgpu.errors import BertgpuError

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

SQUAD = Path(__file__).parent / "fixtures" / "squad" / "dev-v1.1-sample.json"


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    bench_model.add_arguments(p)
    return p.parse_args(argv)


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_bench_model_smoke(tmp_path, capsys):
    out = tmp_path / "results.jsonl"
    args = parse(["--size", "tiny", "--micro-batch", "2", "--seq-len", "16", "--iters", "1",
                  "--warmup", "0", "--padding", "padded,unpadded", "--real-lengths", "uniform",
                  "--peak-tflops", "1", "--grad-ckpt", "--out", str(out)])
    assert bench_model.main(args) == 0
    text = capsys.readouterr().out
    assert "| arch | size | B | T | lengths | dtype |" in text
    assert "bertgpu" in text and "transformers" in text
    rows = read_rows(out)
    # ours padded and unpadded, transformers (padded) once
    assert [(r["model"], r["padding"]) for r in rows] == [
        ("bertgpu", "padded"), ("bertgpu", "unpadded"), ("transformers", "padded")]
    for r in rows:
        assert r["tokens_per_s"] > 0 and r["fwd_ms"] > 0 and r["bwd_ms"] > 0 and r["opt_ms"] >= 0
        assert r["mfu"] is not None and r["mfu"] > 0  # --peak-tflops given
        assert r["mean_length"] <= 16 and r["compile_mode"] == "off" and r["grad_ckpt"]
    ours, unpadded, hf = rows
    assert hf["vs_hf_eager"] == pytest.approx(1.0) and hf["vs_hf_compiled"] is None
    assert ours["vs_hf_eager"] == pytest.approx(ours["tokens_per_s"] / hf["tokens_per_s"])
    assert unpadded["unpadded_vs_padded"] == pytest.approx(
        unpadded["tokens_per_s"] / ours["tokens_per_s"])
    # runs accumulate
    assert bench_model.main(parse(["--size", "tiny", "--micro-batch", "2", "--seq-len", "8",
                                   "--iters", "1", "--warmup", "0", "--models", "bertgpu",
                                   "--out", str(out)])) == 0
    assert len(out.read_text().splitlines()) == 4


def test_gpu_smoke_preset_runs_every_row_of_the_gpu_table(tmp_path, capsys):
    """The GPU preset's code path on the CPU: the same points and variants, tiny; compiled rows
    compile in their warm-up (a cheap backend here), never in a timed step; every ratio the
    table shows is the one its rows imply; a row says device, versions, dtype, compile mode."""
    out = tmp_path / "smoke.jsonl"
    assert bench_model.main(parse(["--preset", "gpu-smoke", "--out", str(out)])) == 0
    text = capsys.readouterr().out
    rows = read_rows(out)
    expected = [v for p in bench_model.GPU_PRESET for v in p["variants"]]
    assert [(r["model"], r["compile"], r["padding"]) for r in rows] == [
        (v.model, v.compile, v.padding) for v in expected]
    assert {r["arch"] for r in rows} == {"bert", "modernbert"}
    for r in rows:
        assert r["tokens_per_s"] > 0 and r["timed_compiles"] == 0 and r["preset"] == "gpu-smoke"
        assert r["device_name"] and r["torch"] and r["transformers"] and r["dtype"] == "fp32"
        assert r["compile_mode"] == ("eager backend" if r["compile"] else "off")
    points: dict[tuple, list[dict]] = {}
    for r in rows:
        points.setdefault((r["arch"], r["seq_len"], r["lengths"], r["time"]), []).append(r)
    for group in points.values():
        tps = {(r["model"], r["compile"], r["padding"]): r["tokens_per_s"] for r in group}
        for r in group:
            hf = tps.get(("transformers", False, "padded"))
            assert r["vs_hf_eager"] == pytest.approx(r["tokens_per_s"] / hf)
            hfc = tps.get(("transformers", True, "padded"))
            assert r["vs_hf_compiled"] == (pytest.approx(r["tokens_per_s"] / hfc) if hfc
                                           else None)
            if r["padding"] == "unpadded" and ("bertgpu", r["compile"], "padded") in tps:
                assert r["unpadded_vs_padded"] == pytest.approx(
                    r["tokens_per_s"] / tps[("bertgpu", r["compile"], "padded")])
    first = [r for r in rows if r["compile"]][0]
    assert first["compile_s"] > 0  # the first compile happened in the warm-up, and was timed
    table = text[text.index("| model | B x T |"):]
    assert "| BERT-tiny HF | 2 x 16 | full | padded | eager backend |" in table
    assert "ModernBERT-tiny ours | 2 x 64 | uniform | unpadded | eager backend" in table
    assert len([ln for ln in table.splitlines() if ln.startswith("| ")]) == len(rows) + 1


def test_batches_mask_a_fixed_count_per_sequence_and_share_their_shapes():
    """Masks as training draws them (exactly round(rate x maskable) per row: [CLS] is never
    masked), and every batch a permutation of one length sample: the same tokens, masked count
    and longest row, so a compiled model does not recompile from batch to batch."""
    batches = make_batches(4, 8, 64, 1000, "uniform", 3, "cpu", mask_rate=0.3)
    shapes = set()
    for b in batches:
        lengths = b["attention_mask"].sum(1)
        labelled = (b["labels"] != -100).sum(1)
        assert labelled.tolist() == [int(0.3 * (n - 1) + 0.5) for n in lengths.tolist()]
        assert not (b["labels"][:, 0] != -100).any() and (b["input_ids"][:, 0] == 2).all()
        shapes.add((int(lengths.sum()), int(labelled.sum()), b["batch_meta"].max_len,
                    tuple(sorted(lengths.tolist()))))
    assert len(shapes) == 1
    assert len({tuple(b["attention_mask"].sum(1).tolist()) for b in batches}) > 1  # permuted


def test_compiled_rows_compile_once_per_shape(tmp_path):
    """A compiled variant at variable lengths: its compile happens in the warm-up (one is added
    when none was asked for), and the timed steps over four different batches compile nothing."""
    import torch

    from bertgpu.bench.model_runs import Models, Variant, run_point

    models = Models("bert", "tiny", torch.device("cpu"), ["bertgpu"], False, 0, backend="eager")
    rows = run_point(models, [Variant("bertgpu", True, "unpadded"), Variant("bertgpu", True)],
                     2, 32, "fp32", "uniform", torch.device("cpu"), iters=4, warmup=0, peak=None,
                     seed=0)
    assert [r["timed_compiles"] for r in rows] == [0, 0] and all(r["compile_s"] > 0 for r in rows)
    assert rows[0]["unpadded_vs_padded"] == pytest.approx(
        rows[0]["tokens_per_s"] / rows[1]["tokens_per_s"])


def test_lengths_from_shards_squad_and_csv(tmp_path, capsys):
    from _shards import write_synthetic_shards

    from bertgpu.data.tokenizer_folder import load_tokenizer
    from bertgpu.tasks.squad import featurize, read_squad

    data = write_synthetic_shards(tmp_path / "data", seq_len=32, variable_lengths=True)
    lengths = sample_lengths(str(data), 50, 16, seed=0)
    assert lengths.shape == (50,) and lengths.max() <= 16 and lengths.min() >= 2
    # SQuAD: the feature lengths fine-tuning would give, tokenized with the data's tokenizer
    feats = featurize(read_squad(SQUAD), load_tokenizer(data / "tokenizer"), max_seq_len=64,
                      doc_stride=22, max_query_len=16)
    squad = sample_lengths(f"squad:{SQUAD}", 200, 64, seed=0, tokenizer=str(data))
    assert set(squad.tolist()) == set(feats.attention_mask.sum(1).tolist())
    with pytest.raises(BertgpuError, match="expected --tokenizer"):
        sample_lengths(f"squad:{SQUAD}", 4, 64, seed=0)
    with pytest.raises(BertgpuError, match="expected full, uniform, squad:FILE"):
        sample_lengths(str(tmp_path / "nothing"), 4, 64, seed=0)
    out = tmp_path / "r.jsonl"
    assert bench_model.main(parse([
        "--size", "tiny", "--micro-batch", "2", "--seq-len", "64", "--iters", "1", "--warmup",
        "0", "--models", "bertgpu", "--real-lengths", f"uniform,squad:{SQUAD}",
        "--tokenizer", str(data), "--out", str(out)])) == 0
    assert [r["lengths"] for r in read_rows(out)] == ["uniform", f"squad:{SQUAD}"]
    csv = tmp_path / "r.csv"
    append_rows(csv, [dict(model="a", tokens_per_s=1.0)])
    append_rows(csv, [dict(model="b", tokens_per_s=2.0)])
    assert csv.read_text().splitlines() == ["model,tokens_per_s", "a,1.0", "b,2.0"]


def test_bad_flags_are_rejected():
    with pytest.raises(SystemExit):
        parse(["--size", "huge"])
    with pytest.raises(SystemExit):
        parse(["--micro-batch", "x"])
    with pytest.raises(SystemExit):
        parse(["--compile-mode", "fastest"])
    with pytest.raises(BertgpuError, match="--mask-rate 1.5: expected a value in"):
        bench_model.main(parse(["--mask-rate", "1.5"]))
    with pytest.raises(BertgpuError, match="--size large: modernbert comes in tiny, base"):
        bench_model._grid(parse(["--arch", "modernbert", "--size", "large"]), cuda=False)
    # These raised torch's or numpy's errors (a reshape of 0 elements, negative dimensions, an
    # IndexError, a position table of 512 rows against 600 tokens) after the models were built.
    for argv, message in ((["--micro-batch", "0"], "--micro-batch 0: expected 1 or more"),
                          (["--micro-batch", "-2"], "--micro-batch -2: expected 1 or more"),
                          (["--seq-len", "0"], "--seq-len 0: bert-tiny takes 8 to 512 tokens"),
                          (["--seq-len", "600"], "--seq-len 600: bert-tiny takes 8 to 512"),
                          (["--arch", "modernbert", "--seq-len", "2048"],
                           "--seq-len 2048: modernbert-tiny takes 8 to 1024")):
        with pytest.raises(BertgpuError, match=message):
            bench_model._grid(parse(["--size", "tiny", *argv]), cuda=False)
    # Rows went into b.txt as JSON lines, which `bertgpu report` then refused by its name.
    with pytest.raises(BertgpuError, match=r"b.txt: expected a .jsonl or .csv file name"):
        bench_model.main(parse(["--size", "tiny", "--out", "b.txt"]))


def test_models_are_built_once_per_size_and_transformers_timed_once_per_point(monkeypatch,
                                                                              tmp_path):
    built: list[tuple[str, str]] = []
    real = bench_model.Models

    def counting(arch, size, *a, **kw):
        built.append((arch, size))
        return real(arch, size, *a, **kw)

    monkeypatch.setattr(bench_model, "Models", counting)
    out = tmp_path / "r.jsonl"
    args = parse(["--size", "tiny", "--micro-batch", "2", "--seq-len", "8,16", "--iters", "1",
                  "--warmup", "0", "--padding", "padded,unpadded", "--real-lengths", "uniform",
                  "--out", str(out)])
    assert bench_model.main(args) == 0
    assert built == [("bert", "tiny")]  # one pair of models for both points
    rows = read_rows(out)
    assert sorted(r["seq_len"] for r in rows if r["model"] == "transformers") == [8, 16]


def test_gpu_preset_is_lean():
    """BERT-base/large and ModernBERT-base in bf16; transformers compiled as well as eager at
    BERT-base seq 128; padded and unpadded at real lengths; each model compiled once per shape
    and padding (six compiles); points grouped by model so each is built once."""
    grid = bench_model._grid(parse(["--preset", "gpu"]), cuda=True)
    assert all(p["dtype"] == "bf16" for p in grid)
    assert [(p["arch"], p["size"], p["seq_len"], p["lengths"]) for p in grid] == [
        ("bert", "base", 128, "full"), ("bert", "base", 512, "uniform"),
        ("bert", "large", 128, "full"), ("modernbert", "base", 1024, "uniform")]
    compiles = [(p["arch"], p["size"], p["seq_len"], v.model, v.padding)
                for p in grid for v in p["variants"] if v.compile]
    assert len(compiles) == len(set(compiles)) == 6
    assert ("bert", "base", 128, "transformers", "padded") in compiles
    assert ("modernbert", "base", 1024, "bertgpu", "unpadded") in compiles
    base512 = {(v.model, v.compile, v.padding) for v in grid[1]["variants"]}
    assert {("bertgpu", c, p) for c in (False, True) for p in ("padded", "unpadded")} <= base512
    # Extra length sources repeat the variable-length points; full rows stay once.
    grid = bench_model._grid(parse(["--preset", "gpu", "--real-lengths", "uniform,squad:x.json"]),
                             cuda=True)
    assert [p["lengths"] for p in grid] == ["full", "uniform", "squad:x.json", "full", "uniform",
                                            "squad:x.json"]


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
             for line in readme.splitlines()  # the memory table's rows, not the speed table's
             if line.startswith("| BERT-") and line.split("|")[2].strip() in ("ddp", "fsdp")]
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


def test_compile_modes_are_rows_side_by_side_each_against_its_own_peer(tmp_path):
    """`--compile-mode a,b`: every compiled variant once per mode, in one process; a row's
    *vs HF compiled* divides by transformers compiled in the same mode, or in the default mode
    when transformers has no row in that one."""
    import torch

    from bertgpu.bench.model_runs import Models, Variant, run_point

    out = tmp_path / "modes.jsonl"
    auto = "max-autotune-no-cudagraphs"
    assert bench_model.main(parse(["--size", "tiny", "--micro-batch", "2", "--seq-len", "8",
                                   "--iters", "1", "--warmup", "0", "--compile", "on",
                                   "--compile-mode", f"default,{auto}", "--compile-backend",
                                   "eager", "--out", str(out)])) == 0
    rows = read_rows(out)
    assert [(r["model"], r["compile_mode"]) for r in rows] == [
        ("bertgpu", "eager backend"), ("bertgpu", f"{auto}, eager backend"),
        ("transformers", "eager backend"), ("transformers", f"{auto}, eager backend")]
    ours, ours_auto, hf, hf_auto = rows
    assert ours["vs_hf_compiled"] == pytest.approx(ours["tokens_per_s"] / hf["tokens_per_s"])
    assert ours_auto["vs_hf_compiled"] == pytest.approx(
        ours_auto["tokens_per_s"] / hf_auto["tokens_per_s"])

    models = Models("bert", "tiny", torch.device("cpu"), ["bertgpu", "transformers"], False, 0,
                    backend="eager")
    rows = run_point(models, [Variant("bertgpu", True, mode=auto), Variant("transformers", True)],
                     2, 8, "fp32", "full", torch.device("cpu"), iters=1, warmup=0, peak=None,
                     seed=0)
    assert rows[0]["vs_hf_compiled"] == pytest.approx(
        rows[0]["tokens_per_s"] / rows[1]["tokens_per_s"])


def test_dropout_reaches_both_models(tmp_path):
    """`--dropout 0` (the budget recipe's) sets every dropout of ours and of transformers' peer:
    their first training losses on the same weights and batch then agree, where BERT's own 0.1
    draws a different mask in each model; each row records the probability it ran with."""
    def first_losses(extra: list[str], name: str) -> list[dict]:
        out = tmp_path / f"{name}.jsonl"
        assert bench_model.main(parse(["--size", "tiny", "--micro-batch", "4", "--seq-len", "16",
                                       "--iters", "1", "--warmup", "0", "--device", "cpu",
                                       "--out", str(out), *extra])) == 0
        return read_rows(out)

    ours, hf = first_losses(["--dropout", "0"], "off")
    assert ours["dropout"] == hf["dropout"] == 0.0
    assert ours["loss"] == pytest.approx(hf["loss"], rel=1e-5)
    ours, hf = first_losses([], "default")
    assert ours["dropout"] == hf["dropout"] == 0.1
    assert abs(ours["loss"] - hf["loss"]) > 1e-3
    with pytest.raises(BertgpuError, match="--dropout 1"):
        bench_model.main(parse(["--size", "tiny", "--dropout", "1", "--device", "cpu"]))

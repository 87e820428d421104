"""`bertgpu bench quality` end to end on a tiny budget: two recipes on one shared tokenizer and
shard set, held-out loss at 15% on the same sequences, fine-tuning pretrained vs random init over
two seeds; every number in quality.jsonl and quality.md is the one in the runs' own files, and
`bertgpu report` renders the file. Plus the GPU projection's arithmetic."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from _text_fixtures import pydoc_documents, write_sentences

from bertgpu.bench import quality as bq
from bertgpu.cli import main
from bertgpu.errors import BertgpuError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def bench_out(tmp_path_factory) -> Path:
    pytest.importorskip("gensim",
                        reason="the polarity set is gensim's test data (pip install bertgpu[demo])")
    import torch

    tmp = tmp_path_factory.mktemp("quality")
    corpus = write_sentences(tmp / "corpus.txt", pydoc_documents(40))
    out = tmp / "out"
    small = ["model.vocab_size=600", "model.hidden_size=32", "model.intermediate_size=64",
             "train.global_batch_size=8", "impl.micro_batch_size=8"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models on a shared CPU: spin-waiting threads only slow them
    try:
        assert main(["bench", "quality", "--corpus", str(corpus), "--seq-len", "32",
                     "--validation-fraction", "0.1", "--tokens", "2560", "--eval-every", "5",
                     "--sets", "polarity", "--seeds", "0", "1", "--ft", "epochs=1",
                     "--ft", "max_seq_len=32", "--device", "cpu",
                     "--out", str(out), *[w for kv in small for w in ("--set", kv)]]) == 0
    finally:
        torch.set_num_threads(threads)
    return out


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "quality.jsonl").read_text().splitlines()]


def test_pretraining_numbers_are_the_runs_own(bench_out: Path):
    pre = [r for r in _rows(bench_out) if r["kind"] == "pretrain"]
    assert [r["name"] for r in pre] == ["tiny", "modern-tiny"]
    assert [r["architecture"] for r in pre] == ["bert", "modernbert"]
    md = (bench_out / "quality.md").read_text()
    for r in pre:
        run = Path(r["run_dir"])
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        train = [x for x in records if x["kind"] == "train"]
        evals = [x for x in records if x["kind"] == "eval"]
        assert r["steps"] == train[-1]["step"] == 10  # 2560 tokens / (8 x 32) per step
        assert r["tokens_seen"] == train[-1]["tokens_seen"]
        assert r["val_mlm_loss"] == evals[-1]["val_mlm_loss"]
        assert r["val_mlm_acc"] == evals[-1]["val_mlm_acc"]
        assert ([(p["step"], p["val_mlm_loss"]) for p in r["curve"]]
                == [(x["step"], x["val_mlm_loss"]) for x in evals])
        assert [p["step"] for p in r["curve"]] == [5, 10]
        # The same held-out sequences and masks for both: the whole split, 15%, one seed.
        cfg = (run / "config.toml").read_text()
        assert "eval_mask_rate = 0.15" in cfg and "eval_sequences = 0" in cfg and "seed = 0" in cfg
        assert ((run / "tokenizer" / "vocab.txt").read_bytes()
                == (bench_out / "tokenizer" / "vocab.txt").read_bytes())
        assert f"| {r['name']} |" in md and f"{r['val_mlm_loss']:.3f}" in md
    assert pre[0]["val_sequences"] == pre[1]["val_sequences"] > 0
    # its own training rate
    assert "mask_rate = 0.3" in (Path(pre[1]["run_dir"]) / "config.toml").read_text()
    assert (bench_out / "quality.png").read_bytes().startswith(PNG_MAGIC)


def test_finetuning_scores_are_read_from_results(bench_out: Path):
    ft = [r for r in _rows(bench_out) if r["kind"] == "finetune"]
    assert sorted((r["name"], r["init"]) for r in ft) == sorted(
        (n, i) for n in ("tiny", "modern-tiny") for i in ("pretrained", "random"))
    md = (bench_out / "quality.md").read_text()
    for r in ft:
        assert r["task"] == "polarity" and r["seeds"] == [0, 1] and len(r["dirs"]) == 2
        results = [json.loads((Path(d) / "results.json").read_text()) for d in r["dirs"]]
        assert r["scores"] == [res["score"] for res in results]
        assert [res["config"]["seed"] for res in results] == [0, 1]
        assert r["median"] == pytest.approx(statistics.median(r["scores"]))
        assert r["spread"] == pytest.approx(max(r["scores"]) - min(r["scores"]))
        if r["init"] == "random":  # the twin: same architecture, no pretrained weights
            assert all(res["init"] == "random" and res["config_from"].endswith(f"{r['name']}/hf")
                       for res in results)
        assert f"{r['median']:.1f} ({r['min']:.1f}-{r['max']:.1f})" in md


def test_report_renders_the_quality_file(bench_out: Path, tmp_path: Path):
    assert main(["report", str(bench_out / "quality.jsonl"), "--out", str(tmp_path / "rep"),
                 "--format", "both"]) == 0
    text = (tmp_path / "rep" / "README.md").read_text()
    assert "Quality per unit of compute" in text and "pretrained: median (min-max)" in text
    pre = next(r for r in _rows(bench_out) if r["kind"] == "pretrain")
    assert f"{pre['val_mlm_loss']:.3f}" in text
    assert (tmp_path / "rep" / "quality0.png").read_bytes().startswith(PNG_MAGIC)
    assert "<table>" in (tmp_path / "rep" / "index.html").read_text()


def test_projection_arithmetic_and_inputs(tmp_path: Path):
    from bertgpu.config import overrides, schema
    from bertgpu.models.build import model_config
    from bertgpu.models.modernbert.cost import flops_per_token_of

    recipe = bq.resolve_recipe("configs/modern-budget-24h.toml")
    rows = bq.project(recipe, "H100 SXM", 0.4, 24.0)
    ours = rows[0]
    cfg = schema.load_config(recipe)
    fpt = flops_per_token_of(model_config(overrides.config_to_dict(cfg.model)), 128,
                             cfg.data.mask_rate)
    assert ours["flops_per_token"] == pytest.approx(fpt)
    assert ours["tokens"] == pytest.approx(0.4 * 989e12 / fpt * 24 * 3600)
    assert {r["model"] for r in rows} >= {"BERT-base", "ModernBERT-base", "Cramming (crammed BERT)"}
    with pytest.raises(BertgpuError, match="--gpu"):
        bq.project(recipe, "Abacus", 0.4, 24.0)
    with pytest.raises(BertgpuError, match="--mfu"):
        bq.project(recipe, "H100 SXM", 1.5, 24.0)
    (tmp_path / "quality.md").write_text("a measured run's table\n")
    assert main(["bench", "quality", "--project", "--out", str(tmp_path)]) == 0
    assert "modern-budget-24h (ours)" in (tmp_path / "projection.md").read_text()
    # the measured run's table stays beside its plot (the projection replaced it)
    assert (tmp_path / "quality.md").read_text() == "a measured run's table\n"
    assert "modern-budget-24h (ours)" in (tmp_path / "quality.jsonl").read_text()


def test_bad_arguments_fail_before_any_work(tmp_path: Path, capsys):
    assert main(["bench", "quality", "--recipe", str(tmp_path / "none.toml"),
                 "--out", str(tmp_path / "o")]) == 2
    assert "none.toml: recipe not found" in capsys.readouterr().err
    assert main(["bench", "quality", "--set", "train.nope=1", "--out", str(tmp_path / "o")]) == 2
    assert main(["bench", "quality", "--seeds", "1", "1", "--out", str(tmp_path / "o")]) == 2
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--validation-fraction", "0", "argument --validation-fraction: expected a number between 0 "
                                   "and 1 (both excluded), found 0"),
    ("--seeds", "-1", "argument --seeds: expected a seed from 0 to 4294967295, found -1"),
    ("--pretrain-seed", "-1", "argument --pretrain-seed: expected a seed from 0 to 4294967295"),
    ("--eval-every", "-5", "argument --eval-every: expected a positive finite int, found -5"),
    ("--budget-minutes", "nan", "argument --budget-minutes: expected a positive finite float"),
    ("--tokens", "0", "argument --tokens: expected a positive finite int, found 0"),
])
def test_numbers_out_of_range_are_refused_at_parsing(tmp_path: Path, capsys, flag, value,
                                                     message):
    """Each used to pass parsing and fail after the tokenizer and shards were built (a fraction of
    0 left no held-out set; a negative seed was numpy's traceback inside the first run; a
    negative --eval-every named the config key train.eval_every_steps)."""
    with pytest.raises(SystemExit):
        main(["bench", "quality", flag, value, "--out", str(tmp_path / "o")])
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()

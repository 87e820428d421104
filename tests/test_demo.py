"""The demo's pipeline end to end on the real Wikipedia sample, cut to a few steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertgpu.cli import main

pytest.importorskip("gensim",
                    reason="the demo reads gensim's test data (pip install bertgpu[demo])")


def test_demo_runs_tokenizer_prepare_pretrain_export_fill_mask(tmp_path: Path, capsys) -> None:
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--steps", "3", "--vocab-size", "2000",
                 "--skip-finetune"]) == 0
    printed = capsys.readouterr().out
    for stage in ("1. bertgpu tokenizer", "2. bertgpu prepare", "3. bertgpu pretrain",
                  "4. bertgpu export"):
        assert stage in printed
    assert "[MASK]" in printed and "demo finished" in printed
    manifest = json.loads((out / "data" / "manifest.json").read_text())
    assert manifest["counts"]["documents"] > 100  # the 106-article dump, redirects skipped
    assert (out / "run" / "hf" / "model.safetensors").exists()
    # Re-running resumes: the stages that are done are not redone, and the run is complete.
    assert main(["demo", "--out", str(out), "--steps", "3", "--vocab-size", "2000",
                 "--skip-finetune"]) == 0


def _rows(pre: dict[str, list[float]], rnd: dict[str, list[float]]) -> list[dict]:
    """Rows as bench quality's compare_downstream returns them."""
    import statistics

    rows = []
    for init, by_task in (("pretrained", pre), ("random", rnd)):
        for task, scores in by_task.items():
            sizes = {"train_examples": 160, "dev_examples": 40} if task == "polarity" else \
                {"train_examples": 985, "dev_examples": 240}
            rows.append({"kind": "finetune", "name": "modern-tiny", "init": init, "task": task,
                         "metric": "accuracy", **sizes, "seeds": [0, 1, 2], "scores": scores,
                         "median": statistics.median(scores), "min": min(scores),
                         "max": max(scores), "spread": max(scores) - min(scores)})
    return rows


@pytest.mark.parametrize("lee_pre, lee_rnd, verdict", [
    # +5 < spread 6
    ([70.0, 71.0, 72.0], [70.0, 64.0, 66.0], "spread on 1 of 2 sets. At this size"),
    ([80.0, 81.0, 82.0], [65.0, 64.0, 66.0], "spread on 2 of 2 sets."),
])
def test_finetune_table_gives_medians_benefit_spread_and_an_honest_verdict(
        monkeypatch, tmp_path, lee_pre, lee_rnd, verdict):
    from bertgpu import demo
    from bertgpu.bench import quality

    rows = _rows({"polarity": [80.0, 85.0, 82.5], "lee": lee_pre},
                 {"polarity": [50.0, 52.5, 55.0], "lee": lee_rnd})
    monkeypatch.setattr(quality, "compare_downstream", lambda inits, sets, seeds, out: rows)
    text = demo.finetune_table(tmp_path / "hf", tmp_path / "ft", [0, 1, 2], "modern-tiny")
    assert ("| modern-tiny | polarity | accuracy | 82.5 (80.0-85.0) | 52.5 "
            "(50.0-55.0) | +30.0 | 5.0 | yes |" in text)
    assert verdict in text
    assert ("seed noise, not a benefit" in text) == ("2 of 2" not in verdict)
    assert "160 train, 40 dev" in text  # the sizes the rows carry


def test_a_demo_folder_of_other_settings_is_refused_not_reused(tmp_path: Path) -> None:
    """The demo resumes by running its stages again, each finding its output done. It skipped a
    stage whose folder existed: a tokenizer of another --vocab-size (or another corpus's, in a
    folder that was not a demo's) was used as it was, and the run ended in a traceback when the
    model predicted ids the tokenizer did not have."""
    from bertgpu.data.corpus import gensim_test_data
    from bertgpu.demo import _tokenizer_and_shards
    from bertgpu.errors import BertgpuError

    wiki = Path(gensim_test_data("enwiki-latest-pages-articles1.xml-p000000010p000030302-"
                                 "shortened.bz2"))
    tok, data = tmp_path / "tokenizer", tmp_path / "data"
    _tokenizer_and_shards(wiki, tok, data, 1000, [])
    made = (tok / "vocab.txt").stat().st_mtime_ns
    _tokenizer_and_shards(wiki, tok, data, 1000, [])  # the same: nothing to do
    assert (tok / "vocab.txt").stat().st_mtime_ns == made
    with pytest.raises(BertgpuError, match=r"tokenizer: holds a tokenizer trained with "
                                           r"--vocab-size 1000 \(asked 2000\).*; this demo folder "
                                           r"was made otherwise: give --fresh to start it afresh"):
        _tokenizer_and_shards(wiki, tok, data, 2000, [])
    # a demo folder of a bertgpu that kept no record of how it made them: taken as it is
    from bertgpu.data.rerun import PREPARED, TRAINED

    (tok / TRAINED).unlink()
    (data / PREPARED).unlink()
    _tokenizer_and_shards(wiki, tok, data, 2000, [])
    assert (tok / "vocab.txt").stat().st_mtime_ns == made


def test_fill_mask_predicts_only_tokens_the_tokenizer_has(tmp_path: Path) -> None:
    """A model vocabulary larger than the tokenizer's (the recipe's --vocab-size past what the
    corpus gives) has rows no token names; one of them on top came out as None."""
    import torch
    from _tiny import TINY

    from bertgpu.data.tokenizer import train_tokenizer
    from bertgpu.demo import fill_mask
    from bertgpu.models.bert.config import BertConfig
    from bertgpu.models.bert.model import BertForPreTraining
    from bertgpu.models.hf_export import save_pretrained

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the war ended in paris and the city was free again.\n\n" * 50,
                      encoding="utf-8")
    tok = train_tokenizer([corpus], tmp_path / "tok", vocab_size=60)
    size = sum(1 for _ in open(tok / "vocab.txt", encoding="utf-8"))
    model = BertForPreTraining(BertConfig(**{**TINY, "vocab_size": size + 8}), with_nsp=False)
    with torch.no_grad():  # the rows past the tokenizer's win every prediction
        model.cls.predictions.bias[size:] = 100.0
    out = save_pretrained(model, tmp_path / "hf", tokenizer=tok)
    [(_, tokens)] = fill_mask(out, ["the war [MASK] in paris."])
    assert len(tokens) == 3 and all(isinstance(t, str) for t in tokens), tokens

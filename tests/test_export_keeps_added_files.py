"""Exporting again into an earlier export keeps the files the user added there (a model card
README.md, eval_results.json): they were deleted without a word, the folder replaced whole.
The export's own files are replaced, and a tokenizer file the new export does not write is
not carried over from the old one."""

from __future__ import annotations

import json

import torch
from _export_run import tiny_model, tiny_run, word_embeddings
from _tiny import TINY

from bertgpu.cli import main as cli
from bertgpu.models.hf_export import EXPORT_MARK, save_pretrained

CARD = "---\nlicense: mit\n---\n# card\n"


def _add_card(folder):
    (folder / "README.md").write_text(CARD, encoding="utf-8")
    (folder / "eval_results.json").write_text("{}\n", encoding="utf-8")


def test_a_re_export_keeps_the_model_card_and_replaces_the_model(tmp_path, capsys):
    run = tiny_run(tmp_path / "run", steps=(3, 6))
    card = tmp_path / "card"
    assert cli(["export", str(run), "--out", str(card), "--step", "3"]) == 0
    _add_card(card)
    assert cli(["export", str(run), "--out", str(card)]) == 0
    assert capsys.readouterr().out.endswith(f"(step 6) -> {card}\n")
    assert (card / "README.md").read_text(encoding="utf-8") == CARD
    assert (card / "eval_results.json").read_text(encoding="utf-8") == "{}\n"
    assert torch.equal(word_embeddings(card), word_embeddings(tmp_path / "run" / "checkpoints"
                                                              / "step_6"))
    assert sorted(p.name for p in card.parent.iterdir()) == ["card", "run"]  # no .tmp, .old left


def test_a_tokenizer_file_of_the_earlier_export_is_not_kept(tmp_path):
    run = tiny_run(tmp_path / "run")
    out = save_pretrained(tiny_model(), tmp_path / "hf", tokenizer=run / "tokenizer")
    _add_card(out)
    save_pretrained(tiny_model(), out)  # no tokenizer this time
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json",
                                                     "eval_results.json", "model.safetensors"]


def test_a_runs_own_hf_folder_is_still_replaced(tmp_path):
    """The end of an extended run exports to RUN/hf again: marked, or from a bertgpu before the
    mark (only export files in it)."""
    run = tiny_run(tmp_path / "run")
    (run / "config.toml").write_text("", encoding="utf-8")
    hf = save_pretrained(tiny_model(1), run / "hf", tokenizer=run / "tokenizer")
    config = json.loads((hf / "config.json").read_text(encoding="utf-8"))
    del config[EXPORT_MARK]  # an older bertgpu's export
    (hf / "config.json").write_text(json.dumps(config), encoding="utf-8")
    save_pretrained(tiny_model(2), hf, tokenizer=run / "tokenizer")
    assert json.loads((hf / "config.json").read_text(encoding="utf-8"))[EXPORT_MARK] is True
    _add_card(hf)
    save_pretrained(tiny_model(3), hf, tokenizer=run / "tokenizer")
    assert (hf / "README.md").read_text(encoding="utf-8") == CARD
    model = tiny_model(3).bert.embeddings.word_embeddings.weight[: TINY["vocab_size"]]
    assert torch.equal(word_embeddings(hf), model)

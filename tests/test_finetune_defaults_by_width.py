"""Fine-tuning's default lr and epochs by encoder width, against the table README.md documents
("The learning rate and epochs default by model size"): 3e-4 and 10 epochs up to hidden size 256
(BERT-tiny 128, BERT-mini 256), 1e-4 and 5 epochs up to 512 (BERT-medium), 2e-5 and 3 epochs
past 512 (BERT-base 768, BERT-large 1024: the BERT paper's setting, Devlin et al. 2019 A.3).
The row edges are inclusive ("up to"): a probe that made them exclusive moved BERT-mini and
BERT-medium to the next row, and one that set the base/large row's lr to 5e-5, and no fast test
failed."""

from __future__ import annotations

import pytest

from bertgpu.config.finetune import FinetuneConfig, finetune_defaults, resolve_finetune

# README.md's documented defaults: hidden size -> (lr, epochs).
README_TABLE = {
    128: (3e-4, 10),   # BERT-tiny, configs/tiny.toml
    200: (3e-4, 10),   # between rows
    256: (3e-4, 10),   # BERT-mini: "up to 256"
    257: (1e-4, 5),
    384: (1e-4, 5),    # all-MiniLM
    512: (1e-4, 5),    # BERT-medium: "up to hidden size 512"
    513: (2e-5, 3),    # "past hidden size 512"
    768: (2e-5, 3),    # BERT-base
    1024: (2e-5, 3),   # BERT-large
}


@pytest.mark.parametrize("hidden, expected", sorted(README_TABLE.items()))
def test_defaults_follow_the_readme_table(hidden, expected):
    lr, epochs = finetune_defaults(hidden)
    assert (lr, epochs) == pytest.approx(expected), hidden
    assert isinstance(epochs, int)


@pytest.mark.parametrize("hidden", [256, 512, 768])
def test_a_run_without_lr_or_epochs_resolves_to_its_rows_values(hidden):
    resolved, note = resolve_finetune(FinetuneConfig(), hidden)
    lr, epochs = README_TABLE[hidden]
    assert (resolved.lr, resolved.epochs) == pytest.approx((lr, epochs))
    assert note.startswith(f"lr {lr:g}, epochs {epochs} (hidden size {hidden};")

"""One compiled graph for a whole run: no recompile after the first step.

The H100 run of issue 24 recompiled at about step 15 (24 s) when the first micro batch with
padding arrived: the model branched on `batch_meta.index is None`, and the graph guarded on
values that change between batches. Here a tiny BERT and ModernBERT are compiled with dynamo
(backend "aot_eager": the same graph capture and guards as inductor, forward and backward, without
generating kernels, so it runs in seconds on a CPU) and trained on the real loader's micro batches
across an epoch boundary, over full batches, a batch with padding and masked-token counts that
change; dynamo's own counters must show one graph and no recompile.
"""

from __future__ import annotations

import pytest
import torch
from _shards import write_synthetic_shards
from _tiny import TINY

from bertgpu.data.loaders import PretrainLoader
from bertgpu.data.masking import MaskingConfig
from bertgpu.data.shards import ShardSet
from bertgpu.models.bert.config import BertConfig
from bertgpu.models.bert.model import BertForPreTraining
from bertgpu.models.modernbert.config import ModernBertConfig
from bertgpu.models.modernbert.model import ModernBertForMaskedLM
from bertgpu.models.shared import ModelOptions


def _loader_batches(tmp_path, steps: int) -> list[dict]:
    """`steps` micro batches of 4 from 10 training sequences (an epoch every 2.5 steps), one of
    them short: full batches, padded ones, and 15% masks whose count changes per batch."""
    data = write_synthetic_shards(tmp_path / "data", n_train=10, n_val=2, seq_len=16,
                                  vocab_size=99, variable_lengths=False)
    shards = ShardSet(data, "train")
    loader = PretrainLoader(shards, MaskingConfig(), global_batch_size=4, micro_batch_size=4)
    batches = [loader.next_step()[0] for _ in range(steps)]
    loader.close()
    return batches


def _short_batch(batch: dict) -> dict:
    """The same micro batch with its second row cut to 5 tokens (right padding) and the labels
    there dropped, its metadata rebuilt as the loader builds it."""
    from bertgpu.batch import IGNORE_INDEX, batch_meta

    b = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}
    b["attention_mask"][1, 5:] = 0
    b["input_ids"][1, 5:] = 0
    b["labels"][1, 5:] = IGNORE_INDEX
    b["batch_meta"] = batch_meta(b["attention_mask"], b["labels"])
    return b


def _train(model, batches) -> int:
    """Graphs dynamo made while training on `batches`: a graph break or a recompile each add one."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend="aot_eager")
    for batch in batches:
        meta = batch["batch_meta"].to("cpu")  # what the engine does when it moves a batch
        out = compiled(**{**batch, "batch_meta": meta})
        out.loss.backward()
    return counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_unpadded_model_compiles_once_over_epochs_and_padding(tmp_path, arch, one_thread):
    batches = _loader_batches(tmp_path, steps=6)  # 24 samples of 10: into the third epoch
    batches.insert(2, _short_batch(batches[1]))  # the first padded batch after two full ones
    masked = {int(b["batch_meta"].masked.numel()) for b in batches}
    assert len(masked) > 1, "the masked-token count should vary for this test to mean anything"
    assert not batches[0]["batch_meta"].padded and batches[2]["batch_meta"].padded
    torch.manual_seed(0)
    if arch == "bert":
        model = BertForPreTraining(BertConfig(**TINY), with_nsp=False,
                                   options=ModelOptions(unpad=True))
        batches = [{k: v for k, v in b.items() if k != "next_sentence_label"} for b in batches]
    else:
        model = ModernBertForMaskedLM(ModernBertConfig(
            vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
            intermediate_size=40, local_attention=8, global_attn_every_n_layers=3,
            pad_token_id=0), options=ModelOptions(unpad=True))
        batches = [{k: v for k, v in b.items() if k != "next_sentence_label"
                    and k != "token_type_ids"} for b in batches]
    assert _train(model.train(), batches) == 1


def test_a_full_batch_after_padded_ones_of_another_length_compiles_nothing(one_thread):
    # Fine-tuning pads each micro batch to its longest row. Once the length had changed (one
    # recompile, made dynamic), the graph guarded on the padded batches' index being a view
    # (nonzero's output squeezed), and the first full batch compiled again.
    from bertgpu.batch import IGNORE_INDEX, batch_meta

    def batch(lengths: list[int], T: int, seed: int) -> dict:
        g = torch.Generator().manual_seed(seed)
        mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()
        ids = torch.randint(5, 99, mask.shape, generator=g) * mask
        labels = torch.where((torch.rand(mask.shape, generator=g) < 0.4) & mask.bool(), ids,
                             IGNORE_INDEX)
        labels[0, 0] = ids[0, 0]
        return dict(input_ids=ids, attention_mask=mask, labels=labels,
                    batch_meta=batch_meta(mask, labels))

    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**TINY), with_nsp=False, options=ModelOptions(unpad=True))
    first = [batch([10, 6, 1, 3], 10, 0), batch([12, 5, 1, 3], 12, 1)]
    graphs = _train(model.train(), first)  # the second length: one recompile, made dynamic
    assert _train(model, first + [batch([12] * 4, 12, 2), batch([16, 2, 9, 4], 16, 3),
                                  batch([16] * 4, 16, 4)]) == graphs


def _split_with_one_short_row(tmp_path) -> ShardSet:
    """10 full training sequences of 16 but the 8th, cut to 6 tokens (a packed MLM split's
    last sequence); the manifest counts its tokens, as prepare's would."""
    import json

    import numpy as np

    data = write_synthetic_shards(tmp_path / "data", n_train=10, n_val=2, seq_len=16,
                                  vocab_size=99, variable_lengths=False)
    shards = ShardSet(data, "train")
    assert len(shards.shard_names) == 1 and not shards.has_short_rows()
    stem = data / shards.shard_names[0]
    lengths = np.load(f"{stem}.lengths.npy")
    ids = np.load(f"{stem}.input_ids.npy")
    lengths[7], ids[7, 6:] = 6, 0
    np.save(f"{stem}.lengths.npy", lengths)
    np.save(f"{stem}.input_ids.npy", ids)
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["splits"]["train"]["shards"][0]["tokens"] -= 10
    (data / "manifest.json").write_text(json.dumps(manifest))
    return ShardSet(data, "train")


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_a_masked_model_compiles_once_when_the_split_has_a_short_row(tmp_path, arch, one_thread):
    """Without unpadding (the CPU, fp32 on CUDA, `impl.unpad false`) a model masks attention only
    for a batch with padding, and dynamo guards on `BatchMeta.padded`: the first padded batch
    among full ones compiled the model again, mid-run. A compiled run's loader marks every batch
    padded when its split has any short row: one graph."""
    shards = _split_with_one_short_row(tmp_path)
    assert shards.has_short_rows()
    graphs = {}
    for compiled in (False, True):
        loader = PretrainLoader(shards, MaskingConfig(), global_batch_size=4, micro_batch_size=4,
                                compiled=compiled)
        batches = [loader.next_step()[0] for _ in range(5)]  # 20 samples: rows 7 and 17 short
        loader.close()
        real = [bool((b["attention_mask"] == 0).any()) for b in batches]
        assert True in real and False in real
        torch.manual_seed(0)
        if arch == "bert":
            model = BertForPreTraining(BertConfig(**TINY), with_nsp=False,
                                       options=ModelOptions(unpad=False))
            batches = [{k: v for k, v in b.items() if k != "next_sentence_label"}
                       for b in batches]
        else:
            model = ModernBertForMaskedLM(ModernBertConfig(
                vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                intermediate_size=40, local_attention=8, global_attn_every_n_layers=3,
                pad_token_id=0), options=ModelOptions(unpad=False))
            batches = [{k: v for k, v in b.items() if k not in ("next_sentence_label",
                                                                "token_type_ids")}
                       for b in batches]
        graphs[compiled] = _train(model.train(), batches)
    assert graphs == {False: 2, True: 1}


@pytest.mark.parametrize("unpad", [False, True])
def test_modernbert_bucketed_widths_on_either_side_of_the_window_compile_twice(unpad, one_thread):
    # `impl.bucket_window` pads each micro batch to a multiple of 16: widths at most half the
    # local window (every pair within it) took a shortcut that branched on T, so the first
    # such batch after wider ones compiled a third graph, mid-run. Two: the first width, then
    # one graph for any width (dynamo makes T dynamic at its second value).
    def batch(T: int, seed: int) -> dict:
        return _padded_batch([T, max(T - 5, 2), T, max(T // 2, 2)], T, seed)

    torch.manual_seed(0)
    model = ModernBertForMaskedLM(ModernBertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
        intermediate_size=40, local_attention=32, global_attn_every_n_layers=3,
        pad_token_id=0, max_position_embeddings=64), options=ModelOptions(unpad=unpad))
    widths = [48, 64, 16, 32, 16, 48]  # 16: within half the window (17); the others beyond it
    assert _train(model.train(), [batch(T, i) for i, T in enumerate(widths)]) == 2
    # compiled, a width within the window takes the windowed path: the same loss as eager's
    short = batch(16, 9)
    eager = model(**short).loss
    compiled = torch.compile(model, backend="aot_eager")(**short).loss
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)


def _padded_batch(lengths: list[int], T: int, seed: int) -> dict:
    """An MLM micro batch of rows of `lengths` right-padded to T, 30% masked (position 1 always),
    with its metadata as the loader builds it."""
    from bertgpu.batch import IGNORE_INDEX, batch_meta

    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()
    ids = torch.randint(5, 99, mask.shape, generator=g) * mask
    labels = torch.where((torch.rand(mask.shape, generator=g) < 0.3) & mask.bool(), ids,
                         IGNORE_INDEX)
    labels[:, 1] = ids[:, 1]
    return dict(input_ids=ids, attention_mask=mask, labels=labels,
                batch_meta=batch_meta(mask, labels))


def _rows_batch(B: int, seed: int) -> dict:
    return _padded_batch([16] * (B - 1) + [9], 16, seed)  # every micro batch has padding


@pytest.mark.parametrize("unpad", [False, True])
def test_micro_batches_that_change_size_compile_once_when_marked(unpad, one_thread):
    """Load balancing (distributed.balance auto) re-shares the global batch mid-run, and a
    rank's micro batches change size (4, 4, 2 for a share of 10): each new size compiled the
    model again on every rank that saw it (TORCH_LOGS: 'input_ids size mismatch at index 0').
    Marked (`mark_rows_dynamic`, what the pretraining task does with balance auto), one graph
    serves every size from 2 up."""
    import torch._dynamo  # noqa: F401 (marking needs torch.compile in use, as a compiled run)

    from bertgpu.batch import mark_rows_dynamic

    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**TINY), with_nsp=False,
                               options=ModelOptions(unpad=unpad)).train()
    sizes = [4, 4, 2, 3, 4, 2]
    batches = [_rows_batch(B, i) for i, B in enumerate(sizes)]
    assert _train(model, batches) > 1  # unmarked: a graph more for a new size
    for b in batches:
        mark_rows_dynamic(b)
    assert _train(model, batches) == 1


def test_the_pretraining_task_marks_rows_only_when_they_vary(monkeypatch):
    from bertgpu.tasks import pretraining

    marked = []
    monkeypatch.setattr(pretraining, "mark_rows_dynamic", marked.append)
    task = object.__new__(pretraining.PretrainTask)
    task.with_nsp = False
    model = BertForPreTraining(BertConfig(**TINY), with_nsp=False)
    batch = {**_rows_batch(3, 0), "token_type_ids": torch.zeros(3, 16, dtype=torch.long)}
    for rows_vary in (False, True):
        task.rows_vary = rows_vary
        task.loss(model, batch)
    assert marked == [batch]

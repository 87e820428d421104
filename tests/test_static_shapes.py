"""One batch shape for a whole run, for CUDA graphs (impl.compile_mode reduce-overhead or
max-autotune on CUDA), which replay the shapes they recorded and record again for any other.

Real batches change shape: the number of MLM labels follows each row's candidates (documents
packed with their [SEP]s, short rows, whole words), and padding-free batches change their token
count. With static shapes the loader pads the metadata's MLM positions to the most the masking
can give (`BatchMeta.masked_count` says how many are real) and `impl.unpad auto` runs padded
batches; the padding positions must change no loss, gradient or count. Checked here on the CPU:
the shapes over epochs of the real loader, the loss and gradients against unpadded positions,
and the graph dynamo captures (no symbolic size left for CUDA graphs to re-record on).
"""

from __future__ import annotations

import pytest
import torch
from _shards import write_synthetic_shards
from _tiny import TINY

from bertgpu.batch import IGNORE_INDEX, batch_meta
from bertgpu.config.sections import resolved_unpad
from bertgpu.data.loaders import PretrainLoader
from bertgpu.data.masking import MaskingConfig
from bertgpu.data.shards import ShardSet
from bertgpu.errors import BertgpuError
from bertgpu.models.bert.config import BertConfig
from bertgpu.models.bert.model import BertForPreTraining
from bertgpu.models.modernbert.config import ModernBertConfig
from bertgpu.models.modernbert.model import ModernBertForMaskedLM
from bertgpu.models.shared import ModelOptions


def _micro_batches(tmp_path, static: bool, steps: int = 8) -> list[dict]:
    """`steps` x 2 micro batches of 4 from 12 training rows of varying length (3 epochs)."""
    data = tmp_path / "data"
    if not data.exists():
        write_synthetic_shards(data, n_train=12, n_val=2, seq_len=32, vocab_size=99,
                               variable_lengths=True)
    loader = PretrainLoader(ShardSet(data, "train"), MaskingConfig(mask_rate=0.2),
                            global_batch_size=8, micro_batch_size=4, static_shapes=static)
    out = [mb for _ in range(steps) for mb in loader.next_step()]
    loader.close()
    return out


def _shapes(batch: dict) -> tuple:
    meta = batch["batch_meta"]
    return (*(tuple(batch[k].shape) for k in ("input_ids", "attention_mask", "labels")),
            tuple(meta.masked.shape), tuple(meta.cu_seqlens.shape))


def test_static_loader_gives_every_micro_batch_the_same_shapes(tmp_path):
    dynamic = _micro_batches(tmp_path, static=False)
    assert len({b["batch_meta"].masked.numel() for b in dynamic}) > 1, (
        "the label count should vary for this test to mean anything")
    assert any(b["batch_meta"].padded for b in dynamic)
    static = _micro_batches(tmp_path, static=True)
    assert len({_shapes(b) for b in static}) == 1
    for s, d in zip(static, dynamic, strict=True):  # the same samples and masks, padded
        assert torch.equal(s["labels"], d["labels"])
        meta, count = s["batch_meta"], d["batch_meta"].masked.numel()
        assert int(meta.masked_count) == count == int((s["labels"] != IGNORE_INDEX).sum())
        assert torch.equal(meta.masked[:count], d["batch_meta"].masked)
        assert torch.equal(meta.masked_rows[:count], d["batch_meta"].masked_rows)
        assert not meta.masked[count:].any()  # the padding entries point at position 0


def test_capacity_grows_for_a_batch_with_more_labels_and_refuses_labelled_padding():
    mask = torch.ones(2, 8, dtype=torch.long)
    labels = torch.full((2, 8), IGNORE_INDEX)
    labels[:, 1:6] = 7  # 10 labels
    meta = batch_meta(mask, labels, masked_capacity=4)
    assert meta.masked.numel() == 10 and int(meta.masked_count) == 10  # none lost
    assert batch_meta(mask, labels, masked_capacity=12).masked.numel() == 12
    mask[1, 4:] = 0  # labels on padding: masked and masked_rows would disagree
    with pytest.raises(ValueError, match="labels on padding"):
        batch_meta(mask, labels, masked_capacity=12)


def _model(arch: str, unpad: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    options = ModelOptions(unpad=unpad)
    if arch == "bert":
        cfg = BertConfig(**{**TINY, "hidden_dropout_prob": 0.0,
                            "attention_probs_dropout_prob": 0.0})
        return BertForPreTraining(cfg, with_nsp=False, options=options)
    cfg = ModernBertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=4, intermediate_size=40, local_attention=8,
                           global_attn_every_n_layers=2, pad_token_id=0)
    return ModernBertForMaskedLM(cfg, options=options)


def _loss_and_grads(model, batch, meta) -> tuple[dict, dict]:
    model.zero_grad(set_to_none=True)
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                labels=batch["labels"], batch_meta=meta)
    out.mlm_loss_sum.backward()
    terms = {k: out[k].detach().clone() for k in ("mlm_loss_sum", "mlm_count", "mlm_correct")}
    return terms, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("unpad", [False, True], ids=["padded", "unpadded"])
@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_padding_entries_change_no_loss_count_or_gradient(arch, unpad):
    """Position 0 carries a label here, so a padding entry (which points at position 0) that
    kept its label would count it again: the loss, count and gradients would all move."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 99, (3, 16), generator=g)
    mask = torch.ones(3, 16, dtype=torch.long)
    mask[1, 9:] = 0
    mask[2, 13:] = 0
    labels = torch.where((torch.rand(3, 16, generator=g) < 0.3) & mask.bool(), ids,
                         torch.tensor(IGNORE_INDEX))
    labels[0, 0] = ids[0, 0]
    batch = dict(input_ids=ids * mask, attention_mask=mask, labels=labels)
    model = _model(arch, unpad).train()
    ref_terms, ref_grads = _loss_and_grads(model, batch, batch_meta(mask, labels))
    count = int(ref_terms["mlm_count"])
    meta = batch_meta(mask, labels, masked_capacity=count + 9)
    assert meta.masked.numel() == count + 9
    terms, grads = _loss_and_grads(model, batch, meta)
    assert int(terms["mlm_count"]) == count and int(terms["mlm_correct"]) == int(
        ref_terms["mlm_correct"])
    torch.testing.assert_close(terms["mlm_loss_sum"], ref_terms["mlm_loss_sum"])
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], rtol=1e-5, atol=1e-6, msg=name)


def _graph_inputs(model, batches) -> tuple[int, int]:
    """(graphs dynamo made, symbolic sizes among the graphs' inputs) over `batches`."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    symbolic = []

    def backend(gm, example_inputs):
        symbolic.extend(x for x in example_inputs if isinstance(x, torch.SymInt))
        return gm.forward

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend=backend)
    for batch in batches:
        meta = batch["batch_meta"].to("cpu")  # what the engine does when it moves a batch
        out = compiled(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       labels=batch["labels"], batch_meta=meta)
        out.loss.backward()
    return counters["stats"]["unique_graphs"], len(symbolic)


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_static_batches_compile_one_graph_with_no_symbolic_size(tmp_path, arch, one_thread):
    """The padded model (what impl.unpad auto runs under CUDA graphs) on the static loader's
    batches: one graph, every size a constant. The loader's dynamic batches need a symbolic
    label count (sanity: that is what the static ones remove)."""
    model = _model(arch, unpad=False).train()
    assert _graph_inputs(model, _micro_batches(tmp_path, static=True, steps=3)) == (1, 0)
    graphs, symbolic = _graph_inputs(model, _micro_batches(tmp_path, static=False, steps=3))
    assert graphs == 1 and symbolic > 0


def test_auto_unpad_runs_padded_under_cuda_graphs_and_bucketing_is_refused(tmp_path):
    assert resolved_unpad("auto", "cuda:0", "bf16") is True
    assert resolved_unpad("auto", "cuda:0", "bf16", cuda_graphs=True) is False
    assert resolved_unpad(True, "cuda:0", "bf16", cuda_graphs=True) is True  # config refuses it
    write_synthetic_shards(tmp_path / "data", n_train=8, n_val=2, seq_len=16, vocab_size=99)
    with pytest.raises(BertgpuError, match="bucket_window: .* static_shapes"):
        PretrainLoader(ShardSet(tmp_path / "data", "train"), MaskingConfig(), 8, 4,
                       bucket_window=2, static_shapes=True)


def test_batch_shapes_script_counts_one_shape_with_static_shapes():
    """benchmarks/batch_shapes.py on the real Wikipedia shards kept in the repository: several
    MLM lengths from the plain loader, one from the static one."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("batch_shapes",
                                                  root / "benchmarks" / "batch_shapes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    data = root / "benchmarks" / "data" / "wiki-128"
    masked, _ = module.shapes(data, 256, 12, 0.15, static=False)
    assert len(masked) > 1
    assert module.shapes(data, 256, 12, 0.15, static=True)[0] == [256 * 19]  # round(0.15 * 128)

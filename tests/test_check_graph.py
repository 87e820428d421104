"""`bertgpu bench model --check-graph`: every training micro-step compiles to one graph and runs
without a host sync, and the check itself can see a break or a sync when there is one."""

from __future__ import annotations

import argparse
from contextlib import nullcontext

import torch

from bertgpu.bench import graph_check
from bertgpu.bench import model as bench_model


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    bench_model.add_arguments(p)
    return p.parse_args(argv)


def test_check_graph_passes_for_every_configuration(capsys, one_thread):
    assert bench_model.main(parse(["--check-graph"])) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [ln for ln in lines if "graph breaks:" in ln]
    names = {ln.split("  graph breaks")[0].strip() for ln in rows}
    assert {"pretraining padded mlm+nsp", "pretraining padded mlm", "pretraining packed mlm",
            "pretraining unpadded mlm+nsp", "pretraining unpadded mlm", "classification padded",
            "classification unpadded", "token classification unpadded",
            "question answering unpadded", "modernbert pretraining padded mlm",
            "modernbert pretraining unpadded mlm", "modernbert classification mean unpadded",
            "modernbert token classification unpadded",
            "modernbert question answering unpadded"} <= names
    assert all(ln.endswith("graph breaks: 0  host syncs: 0  recompiles: 0") for ln in rows)


def test_the_check_sees_a_recompile_on_the_configurations_next_batches(monkeypatch, one_thread):
    # The loader marks the lengths that vary (kept tokens, masked tokens) dynamic; without the
    # marks the second batch of another length compiles the model again, mid-run.
    from bertgpu.batch import BatchMeta

    case = next(c for c in graph_check.cases(torch.device("cpu"))
                if c.name == "pretraining unpadded mlm")
    assert {b["batch_meta"].index.numel() for b in [case.batch, *case.more]} != {
        case.batch["batch_meta"].index.numel()}
    assert graph_check.recompiles(case) == 0
    monkeypatch.setattr(BatchMeta, "mark_dynamic", lambda self: None)
    case = next(c for c in graph_check.cases(torch.device("cpu"))
                if c.name == "pretraining unpadded mlm")
    result = graph_check.check(case)
    assert result.recompiles > 0 and not result.ok


def test_the_check_sees_breaks_and_syncs_without_metadata(one_thread):
    # The Hugging Face-style call (no BatchMeta) decides padding and MLM rows on the device: the
    # check must report that, or its zeros above would mean nothing.
    case = next(c for c in graph_check.cases(torch.device("cpu"))
                if c.name == "pretraining unpadded mlm+nsp")
    case.batch.pop("batch_meta")
    result = graph_check.check(case)
    assert result.breaks > 0 and result.reasons
    assert "aten.nonzero" in result.syncs and "aten._local_scalar_dense" in result.syncs
    assert not result.ok


class _SyncInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        return x * 2

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        return g * float(g.sum())  # .item(): a sync only backward makes


def test_the_sync_counter_sees_backward_and_python_values():
    x = torch.randn(3, requires_grad=True)
    with graph_check.HostSyncCounter() as counter:
        _SyncInBackward.apply(x).sum().backward()
    assert counter.ops == ["aten._local_scalar_dense"]
    with graph_check.HostSyncCounter() as counter:
        torch.tensor(3) + x  # a tensor built from a Python value: an H2D copy on CUDA
    assert counter.ops == ["aten.lift_fresh"]


def test_packed_batches_keep_the_flash_path_when_compiled(one_thread):
    # No padding: SDPA must get attn_mask=None inside the compiled graph too (a mask rules the
    # flash kernel out).
    case = next(c for c in graph_check.cases(torch.device("cpu"))
                if c.name == "pretraining packed mlm+nsp")
    padded = next(c for c in graph_check.cases(torch.device("cpu"))
                  if c.name == "pretraining padded mlm+nsp")

    def sdpa_masks(c: graph_check.Case) -> list[object]:
        torch._dynamo.reset()
        explained = torch._dynamo.explain(graph_check.micro_step(c, nullcontext))(c.batch)
        calls = [n for g in explained.graphs for n in g.graph.nodes
                 if n.op == "call_function" and "scaled_dot_product_attention" in str(n.target)]
        assert calls, "no SDPA call in the graph"
        return [n.kwargs.get("attn_mask", n.args[3] if len(n.args) > 3 else None) for n in calls]

    assert all(m is None for m in sdpa_masks(case))
    assert all(m is not None for m in sdpa_masks(padded))


def test_compiled_fullgraph_equals_eager_with_few_compiles(one_thread):
    """The micro-step compiled whole (fullgraph, forward and backward through AOTAutograd) gives
    eager's loss and gradients, and bucketed widths (new T, N_tok, M every batch) cost at most
    one recompile: the second shape makes them dynamic."""
    from torch._dynamo.testing import CompileCounterWithBackend

    from bertgpu.batch import batch_meta
    from bertgpu.data.loaders import bucket_width
    from bertgpu.models.bert.config import BertConfig
    from bertgpu.models.bert.model import BertForPreTraining
    from bertgpu.models.shared import ModelOptions

    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**graph_check.TINY),
                               options=ModelOptions(unpad=True)).train()
    model.configure(attention_backend="padded")  # the CPU kernel, without the fallback warning
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0  # eager and compiled draw different dropout masks
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    g = torch.Generator().manual_seed(0)
    for longest in (13, 21, 30, 40):
        T = bucket_width(longest, 64)
        lengths = torch.randint(2, longest + 1, (3,), generator=g)
        lengths[0] = longest
        mask = (torch.arange(T)[None] < lengths[:, None]).long()
        ids = torch.randint(5, 128, (3, T), generator=g) * mask
        labels = torch.where((torch.rand(3, T, generator=g) < 0.3) & mask.bool(), ids,
                             torch.tensor(-100))
        labels[:, 1] = ids[:, 1]
        batch = dict(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids),
                     labels=labels, next_sentence_label=torch.tensor([0, 1, 1]),
                     batch_meta=batch_meta(mask, labels))
        results = []
        for run in (model, compiled):
            model.zero_grad(set_to_none=True)
            loss = run(**batch).loss
            loss.backward()
            results.append((loss.detach(),
                            [p.grad.clone() for p in model.parameters() if p.grad is not None]))
        torch.testing.assert_close(results[1][0], results[0][0], atol=1e-5, rtol=1e-4)
        for a, b in zip(results[1][1], results[0][1], strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert counter.frame_count <= 2


def test_the_compiled_step_keeps_bf16_activations_for_backward():
    """Under bf16 autocast, what the compiled step saves per token and encoder layer (inductor's
    partitioner) is bf16 only, BERT's dropout masks recomputed in backward from their hash (with
    Philox, one bool per element and site): BERT-base 16 hidden-sized bf16 tensors (the layer
    input, q/k/v, the attention output, two LayerNorm inputs and the first one's output, the
    intermediate before and after GELU), ModernBERT-base its GeGLU and rotated q/k.
    Broken: LayerNorm outputs left fp32 (the residual stream fp32), seen failing here."""
    from bertgpu.bench import saved_bytes

    bert = saved_bytes.per_layer("bert", torch.device("cpu"))
    modern = saved_bytes.per_layer("modernbert", torch.device("cpu"))
    H = 768
    for saved in (bert, modern):
        print(saved.line())
        assert saved.ok, saved.line()
    assert "bool" not in bert.by_dtype
    # the design's minimum: one more hidden-sized bf16 tensor (2 H bytes) would fail
    assert 32 * H <= bert.by_dtype["bfloat16"] < 34 * H
    assert "bool" not in modern.by_dtype  # modern-base trains without dropout
    assert 28 * H <= modern.by_dtype["bfloat16"] < 31 * H


def test_check_graph_under_bf16_reports_the_saved_bytes_and_fails_on_fp32(capsys, monkeypatch,
                                                                         one_thread):
    from bertgpu.bench import saved_bytes

    H = 768
    audited = [saved_bytes.Saved("bert-base padded", H, {"bfloat16": 32.0 * H, "bool": 2.0 * H}),
               saved_bytes.Saved("modern-base padded", H, {"bfloat16": 29.0 * H,
                                                           "float32": 4.0 * H})]
    monkeypatch.setattr(saved_bytes, "audit", lambda device: audited)
    every_case = graph_check.cases
    monkeypatch.setattr(graph_check, "cases", lambda device: every_case(device)[:1])
    assert bench_model.main(parse(["--check-graph", "--dtype", "bf16"])) == 1
    out = capsys.readouterr().out
    assert "bert-base padded                   saved for backward: 34.0 x H bytes per token and " \
           "layer (bfloat16 32.0 H, bool 2.0 H)" in out
    assert "modern-base padded" in out
    assert "an fp32 activation of the hidden state's size or larger is kept (4.0 x H" in out
    assert out.count("an fp32 activation") == 1

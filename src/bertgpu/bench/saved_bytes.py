"""What a compiled training step keeps for backward, per token and encoder layer, by dtype.

Every tensor saved in the forward is written once and read once more in the backward, and on a
GPU the step's elementwise kernels are memory-bound: these bytes are a large share of its memory
traffic (and of its activation memory, which caps the micro batch). An fp32 activation among
them means the residual stream, a dropout or a LayerNorm left in fp32 somewhere: twice the
traffic of that tensor, seen on an H100 as 28.6 vs 26.9 ms per BERT-base step (issue 24's
probe, when LayerNorm outputs were still fp32). This runs on a CPU in seconds and needs no GPU.

How: the micro-step (`graph_check.micro_step`: the model's loss under bf16 autocast, the
engine's normalisation) is compiled with AOT autograd, inductor's decompositions and inductor's
partitioner (`min_cut_rematerialization_partition`), which decides what is saved and what is
recomputed as `torch.compile` does on a GPU; the saved tensors are the backward graph's inputs
other than the incoming gradients. The step is compiled at 1 and 2 layers and at 2 and 4 rows,
and the difference of differences is the cost of one encoder layer for one token: embeddings,
heads and weights (whose size does not grow with the rows or the layers) cancel out.

Bytes are those of the buffers kept alive: views of one buffer (q, k and v of the fused
projection; an output and its reshape) count once, and a view keeps its whole buffer.

On a CPU, layer_norm runs as CUDA autocast runs it (input cast to fp32, `cuda_autocast_policy`):
CPU autocast keeps it in the input's dtype, and the GPU's choice (save the bf16 input and cast
again in backward, or save the fp32 copy) would go unseen.

The models have the dimensions of configs/bert-base.toml and configs/modern-base.toml (hidden
768) with their dropouts, on rows of 128 tokens. Attention on the CPU is not the GPU's flash
kernel: with attention dropout off both save q, k, v, the output and an fp32 log-sum-exp of N
floats per token, so BERT's attention dropout is turned off here (the flash kernel keeps its
dropout as a seed, not a mask). The padding-free layout is audited on CUDA only: on a CPU it
attends through a padded fallback that saves what the GPU's varlen kernel does not.

    bertgpu bench model --check-graph --dtype bf16     # prints these rows after the graph checks
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from bertgpu.batch import IGNORE_INDEX, batch_meta
from bertgpu.bench.batches import MODERN_SIZES, SIZES
from bertgpu.bench.graph_check import Case, _pretraining_loss, micro_step
from bertgpu.models.shared import ModelOptions

SEQ_LEN = 128
"""Tokens per row: above ModernBERT's half window (64), so its local layers use the window."""

VOCAB = 1024
"""The vocabulary only sizes the embeddings and the MLM head, which cancel out: small is faster."""


@dataclass
class Saved:
    """Bytes kept for backward by one encoder layer for one token, by dtype name."""

    name: str
    hidden: int
    by_dtype: dict[str, float]

    @property
    def total(self) -> float:
        return sum(self.by_dtype.values())

    @property
    def ok(self) -> bool:
        """No fp32 tensor of a hidden state's size: fp32 bytes below 4 x H per token and layer."""
        return self.by_dtype.get("float32", 0.0) < 4 * self.hidden

    def line(self) -> str:
        H = self.hidden
        parts = ", ".join(f"{dtype} {b / H:.1f} H" for dtype, b in
                          sorted(self.by_dtype.items(), key=lambda kv: -kv[1]) if b)
        return (f"{self.name:<34} saved for backward: {self.total / H:.1f} x H bytes per token "
                f"and layer ({parts})")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _outputs_only(gm: torch.fx.GraphModule) -> Callable[..., list[Any]]:
    """A stand-in for running `gm`: empty tensors of its outputs' sizes, strides and dtypes (from
    the tracer's fake values). What is saved is decided when the graphs are made, so the audit
    needs the compiles but not the arithmetic, which at BERT-base's width in bf16 on a CPU was
    three quarters of its time."""
    output = next(node for node in gm.graph.nodes if node.op == "output")
    values = [node.meta.get("val") if isinstance(node, torch.fx.Node) else node
              for node in output.args[0]]

    def run(*args: Any) -> list[Any]:
        return [torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device)
                if isinstance(v, torch.Tensor) else v for v in values]

    return run


def saved_tensors(case: Case, autocast: Callable[[], Any]) -> Counter[str]:
    """Bytes by dtype of the tensors that the compiled micro-step of `case` saves for backward
    (forward and backward run once, as the engine runs them)."""
    from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.decomposition import select_decomp_table

    found: Counter[str] = Counter()
    forward_values: dict[str, Any] = {}

    def forward_compiler(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        forward_values.update((node.name, node.meta.get("val")) for node in gm.graph.nodes)
        return make_boxed_func(_outputs_only(gm))

    def backward_compiler(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        # The backward's inputs are named after the forward's nodes; several may be views of one
        # buffer (q, k, v of the fused projection; an output and its reshape), kept once.
        buffers: set[int] = set()
        for node in gm.graph.nodes:
            if node.op != "placeholder" or node.name.startswith("tangents"):
                continue
            val = forward_values.get(node.name, node.meta.get("val"))
            if not isinstance(val, torch.Tensor):
                continue
            storage = val.untyped_storage()
            if storage._cdata not in buffers:  # the storage itself, not its Python wrapper
                buffers.add(storage._cdata)
                found[_dtype_name(val.dtype)] += storage.nbytes()
        return make_boxed_func(_outputs_only(gm))

    backend = aot_autograd(fw_compiler=forward_compiler, bw_compiler=backward_compiler,
                           partition_fn=min_cut_rematerialization_partition,
                           decompositions=select_decomp_table())
    torch._dynamo.reset()
    step = torch.compile(micro_step(case, autocast), backend=backend, dynamic=False,
                         fullgraph=True)
    case.model.zero_grad(set_to_none=True)
    with cuda_autocast_policy():
        step(case.batch).backward()
    case.model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    return found


@contextmanager
def cuda_autocast_policy() -> Iterator[None]:
    """Where CPU and CUDA autocast differ for these models, do as CUDA does: CUDA autocast runs
    layer_norm in fp32 (its input cast up, its output fp32), CPU autocast in the input's dtype.
    Without this a CPU audit would not see what a GPU keeps around a LayerNorm."""
    layer_norm = F.layer_norm

    def fp32_layer_norm(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if torch.is_autocast_enabled("cpu") and x.device.type == "cpu":
            x = x.float()
        return layer_norm(x, *args, **kwargs)

    F.layer_norm = fp32_layer_norm
    try:
        yield
    finally:
        F.layer_norm = layer_norm


def _batch(rows: int, device: torch.device | None = None
           ) -> tuple[dict[str, Any], dict[str, float]]:
    """`rows` rows of SEQ_LEN, every other one 37 tokens short, a seventh of the real tokens
    labelled, with the loader's BatchMeta; the same pair of rows repeats, so twice the rows is
    exactly twice the tokens, padded or not."""
    g = torch.Generator().manual_seed(0)
    T = SEQ_LEN
    lens = torch.tensor([T, T - 37] * (rows // 2))
    mask = (torch.arange(T)[None] < lens[:, None]).long()
    ids = torch.randint(5, 128, (2, T), generator=g).repeat(rows // 2, 1) * mask
    pick = (torch.arange(T)[None] % 7 == 3) & mask.bool()
    labels = torch.where(pick, ids, torch.tensor(IGNORE_INDEX))
    b = dict(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids),
             labels=labels)
    b = {k: v.to(device) for k, v in b.items()}
    # built where the batch is, not moved there: `BatchMeta.to` marks the varying lengths
    # dynamic, and the audit wants concrete sizes
    b["batch_meta"] = batch_meta(b["attention_mask"], b["labels"])
    return b, {"mlm": float(pick.sum())}


def _model(arch: str, layers: int, unpad: bool) -> torch.nn.Module:
    options = ModelOptions(unpad=unpad)
    if arch == "bert":
        from bertgpu.models.bert.config import BertConfig
        from bertgpu.models.bert.model import BertForPreTraining

        cfg = BertConfig(**{**SIZES["base"], "num_hidden_layers": layers, "vocab_size": VOCAB,
                            "attention_probs_dropout_prob": 0.0})
        return BertForPreTraining(cfg, with_nsp=False, options=options)
    from bertgpu.models.modernbert.config import ModernBertConfig
    from bertgpu.models.modernbert.model import ModernBertForMaskedLM

    # modern-base: global layer 0, then windowed layers; no dropout (ModernBERT's recipe)
    cfg = ModernBertConfig(**{**MODERN_SIZES["base"], "num_hidden_layers": layers,
                              "vocab_size": VOCAB, "pad_token_id": 0,
                              "max_position_embeddings": SEQ_LEN})
    return ModernBertForMaskedLM(cfg, options=options)


def per_layer(arch: str, device: torch.device, unpad: bool = False) -> Saved:
    """Saved bytes per token and encoder layer of `arch` ("bert", "modernbert") MLM pretraining
    under bf16 autocast on `device`, on padded rows or (`unpad`) padding-free."""
    padding = "unpadded" if unpad else "padded"

    def autocast() -> Any:
        return torch.autocast(device.type, dtype=torch.bfloat16)

    totals: dict[tuple[int, int], Counter[str]] = {}
    tokens: dict[int, int] = {}  # per row count: padded, every position; unpadded, real tokens
    for layers in (1, 2):
        torch.manual_seed(0)
        model = _model(arch, layers, unpad).to(device).train()
        for rows in (2, 4):
            batch, counts = _batch(rows, device)
            mask = batch["attention_mask"]
            tokens[rows] = int(mask.sum()) if unpad else mask.numel()
            case = Case(f"{arch} {padding}", model, batch, _pretraining_loss, counts)
            totals[layers, rows] = saved_tensors(case, autocast)
    tokens_added = tokens[4] - tokens[2]
    dtypes = set().union(*totals.values())
    by_dtype = {d: (totals[2, 4][d] - totals[2, 2][d] - totals[1, 4][d] + totals[1, 2][d])
                / tokens_added for d in dtypes}
    hidden = (MODERN_SIZES["base"] if arch == "modernbert" else SIZES["base"])["hidden_size"]
    return Saved(f"{'modern-base' if arch == 'modernbert' else 'bert-base'} {padding}", hidden,
                 {d: b for d, b in by_dtype.items() if abs(b) > 1e-9})


ARCHS = ("bert", "modernbert")


def audit(device: torch.device) -> list[Saved]:
    """`per_layer` for BERT-base and ModernBERT-base pretraining on padded rows, and on CUDA
    also padding-free (on a CPU that layout attends through a padded fallback that saves what
    the GPU's varlen kernel does not)."""
    layouts = (False, True) if device.type == "cuda" else (False,)
    return [per_layer(arch, device, unpad) for arch in ARCHS for unpad in layouts]


__all__ = ["SEQ_LEN", "VOCAB", "Saved", "saved_tensors", "cuda_autocast_policy", "per_layer",
           "ARCHS", "audit"]

"""`bertgpu bench model --check-graph`: does the training micro-step compile to one graph and run
without waiting on the host? Runs anywhere, in seconds, no GPU needed.

For each configuration (pretraining padded / packed / unpadded, with and without NSP, padded
with its MLM rows padded to a capacity as CUDA graphs run it, and the
sequence-classification, token-classification and QA heads, for BERT; the same without NSP for
ModernBERT, local and global layers, CLS and mean pooling) the micro-step is built exactly as
the engine runs it: the batch with its host-side `BatchMeta` (as the loader ships it), the task's
loss function (summed losses), the engine's normalisation into one scalar, then backward.

- `torch._dynamo.explain` captures the forward and the loss (what `torch.compile` sees): it
  reports the graph breaks and their reasons;
- the eager forward and backward run under a dispatch mode that counts host syncs: `.item()` /
  `bool(tensor)` (`_local_scalar_dense`), `nonzero` and friends (output shapes read back from the
  device), tensors built from Python values (`lift_fresh`, an H2D copy on CUDA);
- the model, compiled as the engine compiles it, runs on two more batches of the same
  configuration (other lengths, other masked-token counts, as the loader ships them): a graph
  made for either is a recompile that a real run would pay mid-run.

One line per configuration, `graph breaks: N  host syncs: M  recompiles: R`, then the reasons.
Under bf16, also what the compiled step keeps for backward per token and encoder layer of
BERT-base and ModernBERT-base, by dtype (bench/saved_bytes.py): an fp32 activation there (a
LayerNorm or a residual left in fp32) doubles that tensor's memory traffic on a GPU. The exit
status is 1 when any N, M or R is above 0 or such an fp32 activation is kept::

    bertgpu bench model --check-graph                 # CPU, tiny models, fp32, about a minute
    bertgpu bench model --check-graph --dtype bf16    # under bf16 autocast, and the saved bytes
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bertgpu.batch import IGNORE_INDEX, batch_meta
from bertgpu.models.bert.config import BertConfig
from bertgpu.models.bert.model import (
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bertgpu.models.shared import ModelOptions

TINY = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.1,
            attention_probs_dropout_prob=0.0)
"""Small enough to trace in about a second; dropout on, as in training."""

TINY_MODERN = dict(vocab_size=128, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                   intermediate_size=64, max_position_embeddings=64, global_attn_every_n_layers=3,
                   local_attention=16, pad_token_id=0, attention_dropout=0.1, mlp_dropout=0.1,
                   embedding_dropout=0.1)
"""Layer 0 global, layers 1-2 in a 16-token window (the window matters at 32 tokens)."""

# Ops whose result the host must wait for (or whose input the host must copy), by overload packet.
SYNC_OPS = frozenset({
    "aten._local_scalar_dense",  # .item(), bool(t), int(t), float(t)
    "aten.nonzero", "aten.masked_select", "aten.unique_consecutive", "aten._unique2",
    "aten.unique_dim", "aten.equal", "aten.is_nonzero",
    "aten.lift_fresh", "aten.lift_fresh_copy",  # torch.tensor(python values)
})


class HostSyncCounter(TorchDispatchMode):
    """Counts the SYNC_OPS dispatched while active (forward and, on this thread, backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = str(func.overloadpacket)
        if name in SYNC_OPS:
            self.ops.append(name)
        return func(*args, **(kwargs or {}))


LossFn = Callable[[torch.nn.Module, dict[str, Any]], dict[str, torch.Tensor]]


@dataclass
class Case:
    """One micro-step to check: a model, a batch as the loader/collator ships it, its loss fn."""

    name: str
    model: torch.nn.Module
    batch: dict[str, Any]
    loss_fn: LossFn
    counts: dict[str, float]
    """The engine's global counts (the loss normalisers), computed on the host."""
    more: list[dict[str, Any]] = field(default_factory=list)
    """Further batches of the same configuration (same shape, other contents): none may
    compile the model again."""


@dataclass
class Result:
    name: str
    graphs: int
    breaks: int
    reasons: list[str] = field(default_factory=list)
    syncs: list[str] = field(default_factory=list)
    recompiles: int = 0

    @property
    def ok(self) -> bool:
        return self.breaks == 0 and not self.syncs and self.recompiles == 0


def _pretraining_loss(model: torch.nn.Module, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
    out = model(**batch)
    terms = {"mlm": out.mlm_loss_sum, "_mlm_correct": out.mlm_correct}
    if "nsp_loss_sum" in out:
        terms.update(nsp=out.nsp_loss_sum, _nsp_correct=out.nsp_correct)
    return terms


def _task_loss(key: str) -> LossFn:
    return lambda model, batch: {key: model(**batch).loss_sum}


def _inputs(seed: int, B: int, T: int, lengths: list[int] | None) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor(lengths if lengths is not None else [T] * B)
    mask = (torch.arange(T)[None] < lens[:, None]).long()  # (B, T) right padding
    ids = torch.randint(5, TINY["vocab_size"], (B, T), generator=g) * mask
    types = ((torch.arange(T)[None] >= lens[:, None] // 2) & mask.bool()).long()
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=types, _g=g)


def _mlm_batch(seed: int, lengths: list[int] | None, rate: float,
               nsp: bool) -> tuple[dict[str, Any], dict[str, float]]:
    """A pretraining batch (MLM labels at `rate`, NSP labels if asked) with its BatchMeta,
    and its counts."""
    B, T = 4, 32
    b = _inputs(seed, B, T, lengths)
    g = b.pop("_g")
    pick = (torch.rand(B, T, generator=g) < rate) & b["attention_mask"].bool()
    pick[:, 1] = True
    b["labels"] = torch.where(pick, b["input_ids"], torch.tensor(IGNORE_INDEX))
    counts = {"mlm": float(pick.sum())}
    if nsp:
        b["next_sentence_label"] = torch.randint(0, 2, (B,), generator=g)
        counts["nsp"] = float(B)
    b["batch_meta"] = batch_meta(b["attention_mask"], b["labels"])  # what _make_batch adds
    return b, counts


def _task_batch(seed: int, head: str, lengths: list[int] | None = None
                ) -> tuple[dict[str, Any], dict[str, float]]:
    """A fine-tuning batch of `head` (cls, tok or qa) with the collator's BatchMeta,
    and its counts."""
    B, T = 4, 32
    b = _inputs(seed, B, T, lengths or [32, 17, 25, 8])
    g = b.pop("_g")
    if head == "cls":
        b["labels"] = torch.randint(0, 3, (B,), generator=g)
        count = float(B)
    elif head == "tok":
        b["labels"] = torch.where(b["attention_mask"].bool(),
                                  torch.randint(0, 5, (B, T), generator=g),
                                  torch.tensor(IGNORE_INDEX))
        count = float((b["labels"] != IGNORE_INDEX).sum())
    else:
        b.update(start_positions=torch.tensor([3, 1, 40, 2]),
                 end_positions=torch.tensor([5, 4, 41, 2]))
        count = float(B)
    b["batch_meta"] = batch_meta(b["attention_mask"])  # the fine-tuning collator's hook
    return b, {head: count}


PADDINGS = (("padded", [32, 20, 9, 27]), ("packed", None), ("unpadded", [32, 20, 9, 27]))
OTHER_LENGTHS = ([14, 32, 32, 3], [32, 31, 32, 32])
"""The row lengths of the further batches of a configuration with short rows."""


def _mlm_more(seed: int, lengths: list[int] | None, nsp: bool,
              masked_capacity: int | None = None) -> list[dict[str, Any]]:
    """Two more pretraining batches like `_mlm_batch(seed, lengths, ...)`'s: other rows, other
    lengths (when it has short rows), more and fewer masked tokens."""
    out = []
    for i, rate in enumerate((0.35, 0.1)):
        b, _ = _mlm_batch(seed + 10 + i, None if lengths is None else OTHER_LENGTHS[i], rate, nsp)
        if masked_capacity is not None:
            b["batch_meta"] = batch_meta(b["attention_mask"], b["labels"],
                                         masked_capacity=masked_capacity)
        out.append(b)
    return out


def _task_more(seed: int, head: str) -> list[dict[str, Any]]:
    """Two more fine-tuning batches of `head`, rows of other lengths."""
    return [_task_batch(seed + 10 + i, head, list(lengths))[0]
            for i, lengths in enumerate(([9, 32, 30, 2], [32, 32, 32, 31]))]


def cases(device: torch.device) -> list[Case]:
    """The configurations the engine trains, each with a batch as the loader/collator makes it."""
    cfg = BertConfig(**TINY)
    out: list[Case] = []
    for padding, lengths in PADDINGS:
        for nsp in (True, False):
            b, counts = _mlm_batch(0, lengths, 0.2, nsp)
            model = BertForPreTraining(cfg, with_nsp=nsp,
                                       options=ModelOptions(unpad=padding == "unpadded"))
            out.append(Case(f"pretraining {padding} {'mlm+nsp' if nsp else 'mlm'}", model, b,
                            _pretraining_loss, counts, _mlm_more(0, lengths, nsp)))
    # CUDA graphs' batches (impl.compile_mode reduce-overhead): padded, MLM rows to a capacity
    b, counts = _mlm_batch(0, PADDINGS[0][1], 0.2, False)
    b["batch_meta"] = batch_meta(b["attention_mask"], b["labels"], masked_capacity=4 * 32)
    out.append(Case("pretraining padded mlm, static shapes",
                    BertForPreTraining(cfg, with_nsp=False), b, _pretraining_loss, counts,
                    _mlm_more(0, PADDINGS[0][1], False, masked_capacity=4 * 32)))
    for unpad in (False, True):
        b, counts = _task_batch(1, "cls")
        model = BertForSequenceClassification(cfg, num_labels=3, options=ModelOptions(unpad=unpad))
        out.append(Case(f"classification {'unpadded' if unpad else 'padded'}", model, b,
                        _task_loss("cls"), counts, _task_more(1, "cls")))
    b, counts = _task_batch(2, "tok")
    # token classification and QA unpadded, as they run on CUDA (the padded encoder is above)
    unpadded = ModelOptions(unpad=True)
    out.append(Case("token classification unpadded",
                    BertForTokenClassification(cfg, num_labels=5, options=unpadded), b,
                    _task_loss("tok"), counts, _task_more(2, "tok")))
    b, counts = _task_batch(3, "qa")
    out.append(Case("question answering unpadded", BertForQuestionAnswering(cfg, unpadded), b,
                    _task_loss("qa"), counts, _task_more(3, "qa")))
    out += _modernbert_cases()
    return [Case(c.name, c.model.to(device).train(), _to(c.batch, device), c.loss_fn, c.counts,
                 [_to(b, device) for b in c.more]) for c in out]


def _modernbert_cases() -> list[Case]:
    """The ModernBERT configurations: MLM pretraining padded / packed / unpadded, classification
    with CLS (padded) and mean pooling (unpadded), token classification and QA (unpadded)."""
    from bertgpu.models.modernbert import model as mb
    from bertgpu.models.modernbert.config import ModernBertConfig

    cfg = ModernBertConfig(**TINY_MODERN)
    out: list[Case] = []
    for padding, lengths in PADDINGS:
        b, counts = _mlm_batch(4, lengths, 0.3, nsp=False)
        model = mb.ModernBertForMaskedLM(cfg, options=ModelOptions(unpad=padding == "unpadded"))
        out.append(Case(f"modernbert pretraining {padding} mlm", model, b,
                        _pretraining_loss, counts, _mlm_more(4, lengths, False)))
    for pooling, unpad in (("cls", False), ("mean", True)):
        b, counts = _task_batch(5, "cls")
        model = mb.ModernBertForSequenceClassification(
            ModernBertConfig(**TINY_MODERN, classifier_pooling=pooling), num_labels=3,
            options=ModelOptions(unpad=unpad))
        out.append(Case(f"modernbert classification {pooling} {'unpadded' if unpad else 'padded'}",
                        model, b, _task_loss("cls"), counts, _task_more(5, "cls")))
    b, counts = _task_batch(6, "tok")
    unpadded = ModelOptions(unpad=True)
    out.append(Case("modernbert token classification unpadded",
                    mb.ModernBertForTokenClassification(cfg, num_labels=5, options=unpadded), b,
                    _task_loss("tok"), counts, _task_more(6, "tok")))
    b, counts = _task_batch(7, "qa")
    out.append(Case("modernbert question answering unpadded",
                    mb.ModernBertForQuestionAnswering(cfg, options=unpadded), b,
                    _task_loss("qa"), counts, _task_more(7, "qa")))
    return out


def _to(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    return {k: v.to(device) for k, v in batch.items()}


def micro_step(case: Case, autocast: Callable[[], Any]) -> Callable[[dict[str, Any]], torch.Tensor]:
    """The engine's micro-step up to the scalar it calls backward on: the loss fn under autocast,
    then sum_k loss_sum[k] / count[k] in fp32 ("_" keys are extras, only summed)."""

    def step(batch: dict[str, Any]) -> torch.Tensor:
        with autocast():
            terms = case.loss_fn(case.model, batch)
        loss = None
        for key, value in terms.items():
            if key.startswith("_"):
                continue
            part = value.float() / max(case.counts[key], 1.0)
            loss = part if loss is None else loss + part
        assert loss is not None
        return loss

    return step


def check(case: Case, autocast: Callable[[], Any] = nullcontext) -> Result:
    """Graph breaks of the compiled forward + loss, host syncs of the eager forward + backward."""
    step = micro_step(case, autocast)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(step)(case.batch)
    reasons = []
    for r in explained.break_reasons:
        where = r.user_stack[-1] if getattr(r, "user_stack", None) else None
        first = str(r.reason).strip().splitlines()[0] if str(r.reason).strip() else "?"
        reasons.append(f"{first}"
                       + (f" ({where.filename}:{where.lineno})" if where is not None else ""))
    case.model.zero_grad(set_to_none=True)
    with HostSyncCounter() as counter:
        step(case.batch).backward()
    case.model.zero_grad(set_to_none=True)
    return Result(case.name, explained.graph_count, explained.graph_break_count, reasons,
                  counter.ops, recompiles(case, autocast))


def recompiles(case: Case, autocast: Callable[[], Any] = nullcontext) -> int:
    """Graphs that the model, compiled as the engine compiles it, makes for `case.more` after
    its first batch: dynamo's guards (its backend runs the captured graph as it is, forward
    only: the guards are the forward's). Each batch goes through `BatchMeta.to` as the engine
    moves it, which marks the lengths that vary dynamic."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(case.model, backend=counter)
    device = case.batch["input_ids"].device

    def run(batch: dict[str, Any]) -> None:
        with autocast():
            case.loss_fn(compiled, _to(batch, device))

    run(case.batch)
    first = counter.frame_count
    for batch in case.more:
        run(batch)
    return counter.frame_count - first


def main(args: argparse.Namespace) -> int:
    """Check every configuration, print one line each; 1 if any broke a graph or synced."""
    device = torch.device(args.device or "cpu")
    dtype = (args.dtype or ["fp32"])[0]
    autocast: Callable[[], Any] = nullcontext
    if dtype == "bf16":
        autocast = lambda: torch.autocast(device.type, dtype=torch.bfloat16)  # noqa: E731
    torch.manual_seed(args.seed)
    print(f"bertgpu bench model --check-graph | torch {torch.__version__} | {device} {dtype} | "
          "tiny BERT and ModernBERT",
          flush=True)
    results = [check(case, autocast) for case in cases(device)]
    width = max(len(r.name) for r in results)
    for r in results:
        print(f"{r.name:<{width}}  graph breaks: {r.breaks}  host syncs: {len(r.syncs)}  "
              f"recompiles: {r.recompiles}", flush=True)
        for reason in r.reasons:
            print(f"    break: {reason}")
        if r.syncs:
            print(f"    syncs: {', '.join(sorted(set(r.syncs)))}")
    bad = [r.name for r in results if not r.ok]
    print(f"{len(results) - len(bad)}/{len(results)} configurations compile to one graph without "
          "host syncs or recompiles"
          + (f"; not: {', '.join(bad)}" if bad else ""), flush=True)
    if dtype == "bf16":
        from bertgpu.bench import saved_bytes

        for saved in saved_bytes.audit(device):
            print(saved.line(), flush=True)
            if not saved.ok:
                print(f"    an fp32 activation of the hidden state's size or larger is kept "
                      f"({saved.by_dtype['float32'] / saved.hidden:.1f} x H bytes per token)")
                bad.append(saved.name)
    return 1 if bad else 0


__all__ = ["SYNC_OPS", "HostSyncCounter", "Case", "Result", "cases", "micro_step", "check",
           "recompiles", "main"]

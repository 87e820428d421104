"""Fine-tuning as a task of the training loop: any job of encoded sequences with labels.

The contract of the task modules (tasks/registry.py names them): a `JobRequest` (what the command
line gave about the data; tasks/job_request.py) goes in, a `Job` comes out. A `Job` (built by
tasks/glue_job.py for GLUE and STS-B-style regression, tasks/squad_job.py for SQuAD,
tasks/classify.py and tasks/ner.py for your own files) holds variable-length training sequences
with their targets and a list of evaluation sets, each with a scorer. The encoding helpers the
task modules share live here too (`encode_pairs`, `strip_padding`, `pad_to`), so that no task
module imports another for them.

This module turns a `Job` into what the loop asks for:

- the micro batches of step s: epoch e = s // steps_per_epoch + 1; a permutation from
  (seed, e) alone orders the examples; rank r takes the r-th contiguous slice of each step's
  global batch, cut into micro batches padded to their own longest row. A step is therefore a
  function of (seed, step, world size, micro batch) only, which is all a resume needs;
- summed losses with matching counts (sequences; labelled tokens for token classification), so
  accumulation and DDP are exact;
- evaluation at the end of every epoch, sharded: each rank runs the model on every world-th row
  of each evaluation set taken longest first (equal work per rank), rank 0 gathers the outputs
  and scores them (the official metrics, SQuAD's post-processing; every metric of a set is 0,
  with a one-line warning, when the model's outputs for it are not all finite), recorded as the
  per-epoch history that results.json reports, with the loop's cumulative train time at that
  evaluation and the evaluation's own time (rank 0's clock);
- the export: the fine-tuned model in the Hugging Face layout with its tokenizer.
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from bertgpu.batch import IGNORE_INDEX, batch_meta
from bertgpu.data.loaders import bucket_width
from bertgpu.errors import BertgpuError
from bertgpu.tasks.job_request import JobRequest as JobRequest  # the task modules' import of it
from bertgpu.tasks.job_request import task_key as task_key
from bertgpu.train import distributed
from bertgpu.train.engine import StepResult

if TYPE_CHECKING:
    from bertgpu.tasks.glue import Example


@dataclass
class Encoded:
    """Token sequences without padding plus per-sequence targets ((N,) arrays, may be empty) and
    per-token targets (one array per sequence, as long as its ids; IGNORE_INDEX = not labelled)."""

    ids: list[np.ndarray]
    types: list[np.ndarray]
    targets: dict[str, np.ndarray] = field(default_factory=dict)
    token_targets: dict[str, list[np.ndarray]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ids)

    @functools.cached_property
    def max_len(self) -> int:
        """Length of the longest row."""
        return max((len(x) for x in self.ids), default=0)

    def batch(self, idx: Sequence[int], pad_id: int) -> dict[str, torch.Tensor]:
        """Rows `idx` padded to the longest of them: input_ids, token_type_ids, attention_mask
        (B, T), the targets (B,) and the token targets (B, T), padding at IGNORE_INDEX."""
        # Padded to a few widths (multiples of 8, then of 64, never past the longest row of the
        # set): a compiled model then recompiles a bounded number of times.
        longest = bucket_width(max(len(self.ids[i]) for i in idx), self.max_len)
        ids = np.full((len(idx), longest), pad_id, dtype=np.int64)
        types = np.zeros((len(idx), longest), dtype=np.int64)
        mask = np.zeros((len(idx), longest), dtype=np.int64)
        for r, i in enumerate(idx):
            n = len(self.ids[i])
            ids[r, :n], types[r, :n], mask[r, :n] = self.ids[i], self.types[i], 1
        out = {"input_ids": torch.from_numpy(ids), "token_type_ids": torch.from_numpy(types),
               "attention_mask": torch.from_numpy(mask)}
        for k, v in self.targets.items():
            out[k] = torch.from_numpy(np.ascontiguousarray(v[list(idx)]))
        for k, rows in self.token_targets.items():
            padded = np.full((len(idx), longest), IGNORE_INDEX, dtype=np.int64)
            for r, i in enumerate(idx):
                padded[r, :len(rows[i])] = rows[i]
            out[k] = torch.from_numpy(padded)
        # The padding layout, computed here on the host so the model's forward never waits on it.
        out["batch_meta"] = batch_meta(out["attention_mask"])
        return out


@dataclass
class EvalSet:
    """One evaluation split: inputs, and a scorer from the model outputs to metrics (0-100)."""

    name: str
    """Split name ("dev", "dev_matched", ...); metrics are reported under it."""
    data: Encoded
    score: Callable[[dict[str, np.ndarray], Path | None], dict[str, float]]
    """(outputs in data order, folder to write predictions into or None) -> metrics."""
    column: str = ""
    """GLUE results-table column ("MNLI-m", "SST-2"); empty for SQuAD."""
    truth: bytes = b""
    """What `score` compares the outputs with when it is not in `data` (GLUE's dev labels, as
    read; SQuAD's gold answers), serialised for `finetune_output.data_digest`."""


@dataclass
class Job:
    """What one fine-tuning run trains on and how it is scored."""

    name: str
    head: str
    """"classification" (regression when num_labels is 1), "token_classification" or "qa"."""
    num_labels: int | None
    train: Encoded
    evals: list[EvalSet]
    primary: Callable[[dict[str, dict[str, float]]], float]
    """Single score of one evaluation (all splits), used to pick the best epoch."""
    predict_test: list[tuple[str, Encoded, Callable[[dict[str, np.ndarray], Path], None]]] = field(
        default_factory=list)
    labels: tuple[str, ...] | None = None
    """Label names in id order, written into the export's config.json (id2label / label2id) so
    that transformers' pipelines show them; None keeps the model's (LABEL_0, ...)."""

    @property
    def padded_outputs(self) -> bool:
        """Whether the outputs have a position axis (start/end logits, per-token logits), padded
        per batch, so rows of different batches are padded again to one width."""
        return self.head in ("qa", "token_classification")


# --------------------------------------------------------------------------------------------
# Encoding helpers the task modules share


def encode_pairs(tokenizer: Any, examples: Sequence[Example], max_seq_len: int,
                 regression: bool) -> Encoded:
    """`[CLS] a [SEP] (b [SEP])` with token types, truncated longest-first to `max_seq_len`;
    labels int64 (classification) or float32 (regression) when every example has one."""
    if max_seq_len < 5 and any(e.text_b is not None for e in examples):
        raise BertgpuError(f"--max_seq_len {max_seq_len}: too short for sentence pairs "
                           "([CLS] a [SEP] b [SEP] needs at least 5 tokens)")
    tokenizer.enable_truncation(max_length=max_seq_len, strategy="longest_first")
    tokenizer.no_padding()  # a Hugging Face tokenizer.json may carry its own padding setting
    inputs = [(e.text_a, e.text_b) if e.text_b is not None else e.text_a for e in examples]
    encs = tokenizer.encode_batch(inputs) if inputs else []
    out = Encoded([np.asarray(e.ids, dtype=np.int64) for e in encs],
                  [np.asarray(e.type_ids, dtype=np.int64) for e in encs])
    if examples and all(e.label is not None for e in examples):
        out.targets["labels"] = np.asarray([e.label for e in examples],
                                           dtype=np.float32 if regression else np.int64)
    return out


def gold_labels(examples: Sequence[Example], regression: bool) -> np.ndarray:
    """The labels to score against: the float64 scores as read from the file (regression; the
    training targets of `encode_pairs` are float32, rounded), or the int64 class ids."""
    return np.asarray([e.label for e in examples], dtype=np.float64 if regression else np.int64)


def nonfinite_rows(outputs: Mapping[str, np.ndarray], lengths: Sequence[int] | None = None
                   ) -> int:
    """How many rows (sequences) of model outputs hold a value that is NaN or infinite. With
    `lengths` (outputs with a position axis, padded per batch) only each row's first
    `lengths[i]` positions count: the rest is padding."""
    bad: np.ndarray | None = None
    for v in outputs.values():
        ok = np.isfinite(v)
        if lengths is not None:
            real = np.arange(v.shape[1])[None, :] < np.asarray(lengths)[:, None]  # (N, T)
            ok |= ~real.reshape(real.shape + (1,) * (v.ndim - 2))
        row_bad = ~ok.reshape(len(v), -1).all(axis=1)
        bad = row_bad if bad is None else bad | row_bad
    return 0 if bad is None else int(bad.sum())


def strip_padding(feats: Any) -> Encoded:
    """Fixed-length features (squad.Features: input_ids, token_type_ids, attention_mask (F, T),
    optional start/end positions) -> Encoded, so that their batches are padded per batch too."""
    lengths = feats.attention_mask.sum(axis=1)
    enc = Encoded([feats.input_ids[f, :n] for f, n in enumerate(lengths)],
                  [feats.token_type_ids[f, :n] for f, n in enumerate(lengths)])
    if feats.start_positions is not None:
        enc.targets = {"start_positions": feats.start_positions,
                       "end_positions": feats.end_positions}
    return enc


def pad_to(rows: np.ndarray, width: int) -> np.ndarray:
    """(N, w, ...) logits -> (N, width, ...), the new positions at -1e4 (never chosen)."""
    out = np.full((rows.shape[0], width, *rows.shape[2:]), -1e4, dtype=np.float32)
    out[:, : rows.shape[1]] = rows
    return out


# --------------------------------------------------------------------------------------------
# The loop's task


def epoch_steps(sequences: int, global_batch_size: int, world_size: int) -> int:
    """Optimizer steps in one pass over ``sequences`` training sequences: the last, smaller
    step of an epoch is kept when every device gets a sequence of it."""
    full, rest = divmod(sequences, global_batch_size)
    return full + (1 if rest >= world_size else 0)


def steps_per_epoch(job: Job, global_batch_size: int, world_size: int) -> int:
    """Optimizer steps in one pass over `job`'s training sequences: the last, smaller step of an
    epoch is kept when every device gets a sequence."""
    n = len(job.train)
    if n < world_size:
        raise BertgpuError(f"{job.name}: {n} training sequences for {world_size} devices; "
                           f"expected at least one per device (--nproc {max(n, 1)} or fewer)")
    return epoch_steps(n, global_batch_size, world_size)


class FinetuneTask:
    """The loop's task for one `Job` (see the module docstring)."""

    def __init__(self, job: Job, model: torch.nn.Module, *, pad_id: int, seed: int,
                 global_batch_size: int, micro_batch_size: int, epochs: int, eval_batch_size: int,
                 autocast: Callable[[], Any], info: distributed.DistInfo, work_dir: Path | None,
                 export: Callable[[], Path]) -> None:
        self.job, self.model, self.pad_id, self.seed = job, model, pad_id, seed
        self.global_batch_size, self.micro = global_batch_size, micro_batch_size
        self.epochs, self.eval_batch_size = epochs, eval_batch_size
        self.autocast, self.info, self.work_dir, self._export = autocast, info, work_dir, export
        self.device = torch.device(info.device)
        self.steps_per_epoch = steps_per_epoch(job, global_batch_size, info.world_size)
        self.total_steps = self.steps_per_epoch * epochs
        self.loss_key = {"qa": "qa", "token_classification": "tok"}.get(job.head, "cls")
        self.history: list[dict[str, Any]] = []
        self.eval_s, self.eval_examples = 0.0, 0
        # rank 0's newest evaluation outputs, (step, outputs), when their files were not written
        # (not the last step): a run its budget ends there writes them at its export
        self._unwritten: tuple[int, list[dict[str, np.ndarray]]] | None = None
        self._files_at: int | None = None  # the step whose prediction files are in work_dir
        # The loop's (train_s, data_s) since this process started training; the wiring points it
        # at the running loop (finetune.py). `_clock_before`: the same at the resumed checkpoint.
        self.clock: Callable[[], tuple[float, float]] = lambda: (0.0, 0.0)
        self._clock_before = (0.0, 0.0)
        self._epoch_steps: tuple[int, list[list[list[int]]]] | None = None
        # The evaluation under way ({"step", "train_loss"}), None once recorded. A checkpoint
        # written when a stop signal cut it short carries it, and the resumed run does it first.
        self._pending_eval: dict[str, Any] | None = None
        self._eval_in_steps_s = 0.0  # of the loop's train and data time: such an evaluation

    def epoch_of(self, step: int) -> int:
        """1-based epoch of optimizer step `step` (0-based)."""
        return step // self.steps_per_epoch + 1

    # -- training ---------------------------------------------------------------------------------
    def _step_indices(self, epoch: int) -> list[list[list[int]]]:
        """Per step of `epoch`, this rank's micro batches (lists of example indices)."""
        if self._epoch_steps is None or self._epoch_steps[0] != epoch:
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self.job.train))
            g, steps = self.global_batch_size, []
            for s in range(self.steps_per_epoch):
                mine = np.array_split(order[s * g:(s + 1) * g],
                                      self.info.world_size)[self.info.rank]
                steps.append([mine[i:i + self.micro].tolist()
                              for i in range(0, len(mine), self.micro)])
            self._epoch_steps = (epoch, steps)
        return self._epoch_steps[1]

    def micro_batches(self, step: int) -> list[dict[str, torch.Tensor]]:
        pending = self._pending_eval
        if pending is not None and pending["step"] == step:
            # Resumed from a checkpoint written while the evaluation of `step` (an epoch's end)
            # was cut short: evaluate it now, before the next epoch's first step (collective: the
            # same on every rank, which resumed from the same checkpoint). The loop times this
            # call as data; `_eval_in_steps_s` takes it out of the train and data times again.
            # (Its scores go to results.json's epochs and this line, not to metrics.jsonl.)
            t0 = time.perf_counter()
            flat = self.evaluate(step, pending["train_loss"])
            self._eval_in_steps_s += time.perf_counter() - t0
            if self.info.is_main:
                print(f"eval step {step} (cut short by the stop, done after the resume) | "
                      + " | ".join(f"{k} {v:.4g}" for k, v in flat.items()), flush=True)
        steps = self._step_indices(self.epoch_of(step))
        return [self.job.train.batch(idx, self.pad_id)
                for idx in steps[step % self.steps_per_epoch]]

    def loss(self, model: torch.nn.Module, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        return {self.loss_key: model(**batch).loss_sum}

    def counts(self, batch: Mapping[str, Any]) -> dict[str, int]:
        n = int(batch["input_ids"].shape[0])
        # Token classification averages over the labelled tokens of the whole step (HF's loss
        # averages per batch), so that accumulation and DDP give the same step as one batch.
        labelled = int((batch["labels"] != IGNORE_INDEX).sum()) if self.loss_key == "tok" else n
        return {self.loss_key: labelled, "sequences": n,
                "tokens": int(batch["attention_mask"].sum())}

    def log_scalars(self, res: StepResult) -> dict[str, Any]:
        """`epoch`: the 1-based epoch the step's samples came from, as pretraining's."""
        return {"epoch": self.epoch_of(res.step - 1)}

    # -- evaluation -------------------------------------------------------------------------------
    def predict(self, data: Encoded) -> dict[str, np.ndarray]:
        """Model outputs for every row of `data` (in order): logits (N, C), or start/end logits
        (N, T) or per-token logits (N, T, C) padded to the longest row. Rows run longest first to
        waste little compute on padding."""
        keys = ("start_logits", "end_logits") if self.job.head == "qa" else ("logits",)
        t0 = time.perf_counter()
        lengths = np.array([len(x) for x in data.ids])
        order = np.argsort(-lengths, kind="stable")
        chunks: dict[str, list[np.ndarray]] = {k: [] for k in keys}
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad():
            for i in range(0, len(order), self.eval_batch_size):
                idx = order[i:i + self.eval_batch_size].tolist()
                batch = {k: v.to(self.device) for k, v in data.batch(idx, self.pad_id).items()
                         if k in ("input_ids", "token_type_ids", "attention_mask", "batch_meta")}
                with self.autocast():
                    out = self.model(**batch)
                for k in keys:
                    chunks[k].append(out[k].float().cpu().numpy())
        self.model.train(was_training)
        result: dict[str, np.ndarray] = {}
        for k in keys:
            if self.job.padded_outputs:
                width = int(lengths.max()) if len(lengths) else 0
                empty = np.zeros((0, 0) if self.job.head == "qa"
                                 else (0, 0, self.job.num_labels or 1))
                rows = np.concatenate([pad_to(c, width) for c in chunks[k]]) if chunks[k] else empty
            else:
                rows = (np.concatenate(chunks[k]) if chunks[k]
                        else np.zeros((0, self.job.num_labels or 1)))
            unsorted = np.empty_like(rows)
            unsorted[order] = rows
            result[k] = unsorted
        self.eval_s += time.perf_counter() - t0
        self.eval_examples += len(data)
        return result

    def predict_sharded(self, data: Encoded) -> dict[str, np.ndarray] | None:
        """`predict` over all ranks; rank 0 gets every output in data order (None on the other
        ranks). Rank r runs rows r, r + world, ... of the rows sorted longest first, so every rank
        gets the same number of rows and about the same number of tokens (contiguous slices of a
        set sorted by length, SQuAD's windows of one long context, would not)."""
        world = self.info.world_size
        if world == 1:
            return self.predict(data)
        lengths = np.array([len(x) for x in data.ids])
        shards = [np.argsort(-lengths, kind="stable")[r::world] for r in range(world)]
        mine = shards[self.info.rank]
        part = Encoded([data.ids[i] for i in mine], [data.types[i] for i in mine])
        parts = distributed.gather_to_main(self.predict(part) if len(part) else None)
        if parts is None:
            return None
        rows = [(idx, p) for idx, p in zip(shards, parts, strict=True) if p is not None]
        out: dict[str, np.ndarray] = {}
        for k in rows[0][1]:
            # Padded outputs: each shard is padded to its own longest row; pad to the longest.
            width = max(p[k].shape[1] for _, p in rows) if self.job.padded_outputs else None
            first = rows[0][1][k]
            shape = (len(data), *((width,) if width else first.shape[1:2]), *first.shape[2:])
            out[k] = np.empty(shape, dtype=first.dtype)
            for idx, p in rows:
                out[k][idx] = pad_to(p[k], width) if width else p[k]
        return out

    def evaluate(self, step: int, train_loss: float | None) -> dict[str, Any]:
        """Every evaluation set, sharded over ranks and scored on rank 0 (predictions are written
        at the last epoch); appends the epoch's record to `history` on every rank."""
        t0 = time.perf_counter()
        self._pending_eval = {"step": step, "train_loss": train_loss}
        epoch = self.epoch_of(step - 1) if step else 1
        record: dict[str, Any] = {"epoch": epoch, "step": step, "train_loss": train_loss,
                                  "train_seconds": self.train_seconds()}
        flat: dict[str, Any] = {}
        outputs = [self.predict_sharded(ev.data) for ev in self.job.evals]
        if self.info.is_main:
            last = step >= self.total_steps
            metrics = {ev.name: self._score(ev, out, self.work_dir if last else None, step)
                       for ev, out in zip(self.job.evals, outputs, strict=True)}
            self._unwritten = None if last else (step, outputs)
            self._files_at = step if last else self._files_at
            record["metrics"] = metrics
            record["score"] = self.job.primary(metrics)
            flat = {"epoch": epoch, "score": record["score"],
                    **{f"{split}_{k}": v for split, m in metrics.items() for k, v in m.items()}}
        distributed.barrier()  # the other ranks wait while rank 0 scores (bounded by the timeout)
        record["eval_seconds"] = time.perf_counter() - t0
        self.history.append(record)
        self._pending_eval = None
        return flat

    def _score(self, ev: EvalSet, outputs: dict[str, np.ndarray], folder: Path | None,
               step: int) -> dict[str, float]:
        """`ev`'s metrics, or every one of them 0 with a one-line warning when the model's
        outputs for it are not all finite: a diverged model's NaN logits would otherwise still
        score (argmax of NaN is class 0, so accuracy became the share of class 0)."""
        lengths = [len(x) for x in ev.data.ids] if self.job.padded_outputs else None
        bad = nonfinite_rows(outputs, lengths)
        with np.errstate(invalid="ignore", over="ignore"):
            metrics = ev.score(outputs, folder)
        if not bad:
            return metrics
        warnings.warn(f"step {step}: the model's {ev.name} outputs are not finite (NaN or "
                      f"infinite) for {bad} of {len(ev.data)} sequences; every {ev.name} metric "
                      "is reported as 0", stacklevel=2)
        return dict.fromkeys(metrics, 0.0)

    # -- clocks, state and result ----------------------------------------------------------------
    def train_seconds(self) -> float:
        """Time in training steps so far (the loop's, on this rank), the steps before a resume
        included."""
        return self._clock_before[0] + self.clock()[0] - self._eval_in_steps_s

    def data_wait_seconds(self) -> float:
        """The part of `train_seconds` spent building batches on the host (`micro_batches`)."""
        return self._clock_before[1] + self.clock()[1] - self._eval_in_steps_s

    def state_dict(self) -> dict[str, Any]:
        return {"finetune_history": self.history, "eval_s": self.eval_s,
                "eval_examples": self.eval_examples, "train_seconds": self.train_seconds(),
                "data_wait_seconds": self.data_wait_seconds(),
                "finetune_pending_eval": self._pending_eval, "finetune_files_at": self._files_at}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.history = list(state.get("finetune_history", []))
        self._pending_eval = state.get("finetune_pending_eval")
        self._files_at = state.get("finetune_files_at")
        self.eval_s = float(state.get("eval_s", 0.0))
        self.eval_examples = int(state.get("eval_examples", 0))
        self._clock_before = (float(state.get("train_seconds", 0.0)),
                              float(state.get("data_wait_seconds", 0.0)))

    def export(self, step: int) -> Path:
        """The model; and the prediction files of a run that ended before its last step (its
        budget), from the evaluation of the step it ended at. A run resumed from the checkpoint
        of that evaluation (stopped before its export) has not its outputs: rank 0 runs the
        model on the evaluation sets again, alone, with the weights that made them."""
        if self.work_dir and self._files_at != step:
            outputs = (self._unwritten[1] if self._unwritten and self._unwritten[0] == step
                       else [self.predict(ev.data) for ev in self.job.evals])
            with np.errstate(invalid="ignore", over="ignore"):
                for ev, out in zip(self.job.evals, outputs, strict=True):
                    ev.score(out, self.work_dir)
            self._files_at = step
        return self._export()

    def close(self) -> None:
        pass


"""Fine-tuning on one GLUE task or SQuAD v1.1/v2.0, from our run folder or any Hugging Face BERT.

    bertgpu finetune sst2 --data glue_data --init runs/base --out ft/sst2
    bertgpu finetune mnli --data glue_data/MNLI --init bert-base-uncased/ --out ft/mnli \\
        --epochs 3 --lr 2e-5 --global_batch_size 32 --precision bf16 --nproc 2
    bertgpu finetune squad --data squad/ --init runs/base --out ft/squad      # train-v1.1.json, dev-v1.1.json
    bertgpu finetune squad2 --train-file train-v2.0.json --dev-file dev-v2.0.json --init hf/ --out ft/sq2
    bertgpu finetune rte --data glue_data --init random --config-from runs/base --out ft/rte-random

    from bertgpu.finetune import finetune
    results = finetune("sst2", "glue_data", "runs/base", "ft/sst2", overrides=["--epochs", "2"])

Overrides are the flat `FinetuneConfig` keys, `--epochs 3 --lr=2e-5` (`--help-config` lists them);
`--train.epochs 3` is accepted as the same key, so pretraining-style spellings work too.

`--init` is a bertgpu run folder (its latest checkpoint, tokenizer from RUN_DIR/tokenizer), a
checkpoint folder, or a Hugging Face BERT folder with its tokenizer files; `random` builds the
architecture of `--config-from FOLDER` with fresh weights (the "no pretraining" baseline).

A task is a `_Job`: encoded training sequences (variable length, padded per batch to the longest)
and a list of evaluation sets, each with a scorer. GLUE classification, STS-B regression and SQuAD
spans differ only there; the loop (`_Trainer.fit`) is shared, and one optimizer step is
`engine.Engine.train_step` with summed losses and counts, so accumulation and DDP are exact.

OUT/ (written as OUT.tmp and renamed when complete): results.json (metrics per epoch, final and
best, resolved config, speed, device), metrics.jsonl, model/ (Hugging Face export with the
tokenizer), predictions.json (SQuAD), submission/*.tsv (GLUE test, with --predict-test).
Evaluation runs on rank 0 over the whole dev set while the other ranks wait at a barrier.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bertgpu.errors import BertgpuError
from bertgpu.fsutil import replace_dir
from bertgpu.train.config import FinetuneConfig, load_finetune_config
from bertgpu.train.overrides import config_to_dict, format_help

if TYPE_CHECKING:
    import torch

    from bertgpu.tasks.glue import Example, GlueTask

ACCEPTS_OVERRIDES = True
SQUAD_TASKS = {"squad": False, "squad1": False, "squad2": True, "squadv2": True}  # name -> version_2


# --------------------------------------------------------------------------------------------
# Configuration


load_config = load_finetune_config


# --------------------------------------------------------------------------------------------
# Encoded data: variable-length sequences, padded per batch


@dataclass
class Encoded:
    """Token sequences without padding plus per-sequence targets ((N,) arrays, may be empty)."""

    ids: list[np.ndarray]
    types: list[np.ndarray]
    targets: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ids)

    def batch(self, idx: Sequence[int], pad_id: int) -> dict[str, torch.Tensor]:
        """Rows `idx` padded to the longest of them: input_ids, token_type_ids, attention_mask
        (B, T) and the targets (B,)."""
        import torch

        longest = max(len(self.ids[i]) for i in idx)
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
        return out


def encode_pairs(tokenizer: Any, examples: Sequence[Example], max_seq_len: int,
                 regression: bool) -> Encoded:
    """`[CLS] a [SEP] (b [SEP])` with token types, truncated longest-first to `max_seq_len`;
    labels int64 (classification) or float32 (regression) when every example has one."""
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


def _strip_padding(feats: Any) -> Encoded:
    """squad.Features (fixed length) -> Encoded, so SQuAD batches are padded per batch too."""
    lengths = feats.attention_mask.sum(axis=1)
    enc = Encoded([feats.input_ids[f, :n] for f, n in enumerate(lengths)],
                  [feats.token_type_ids[f, :n] for f, n in enumerate(lengths)])
    if feats.start_positions is not None:
        enc.targets = {"start_positions": feats.start_positions, "end_positions": feats.end_positions}
    return enc


# --------------------------------------------------------------------------------------------
# Jobs: what differs between GLUE, STS-B and SQuAD


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


@dataclass
class _Job:
    name: str
    head: str  # "classification" | "qa"
    num_labels: int | None
    train: Encoded
    evals: list[EvalSet]
    primary: Callable[[dict[str, dict[str, float]]], float]
    """Single score of one evaluation (all splits), used to pick the best epoch."""
    predict_test: list[tuple[str, Encoded, Callable[[dict[str, np.ndarray], Path], None]]] = field(
        default_factory=list)


def _limit(items: list[Any], n: int | None) -> list[Any]:
    return items[:n] if n is not None else items


def _glue_job(task: GlueTask, train: list[Example], devs: list[tuple[str, list[Example]]],
              tokenizer: Any, cfg: FinetuneConfig, where: str,
              tests: Sequence[tuple[str, list[Example]]] = ()) -> _Job:
    from bertgpu.tasks import glue as tasks
    from bertgpu.tasks import metrics as eval_metrics

    seq = cfg.max_seq_len or 128
    regression = task.kind == "regression"
    train = _limit(train, cfg.max_train_examples)
    unlabeled = [e.guid for e in train if e.label is None]
    if unlabeled:
        raise BertgpuError(f"{where}: training example {unlabeled[0]} has no label (GLUE {task.name})")
    evals = []
    for split, examples in devs:
        examples = _limit(examples, cfg.max_eval_examples)
        enc = encode_pairs(tokenizer, examples, seq, regression)
        if "labels" not in enc.targets:
            raise BertgpuError(f"{where}: {task.name} {split} split has unlabeled examples; cannot evaluate")
        labels = enc.targets.pop("labels")  # kept out of the forward pass: eval needs logits only

        def score(outputs: dict[str, np.ndarray], _folder: Path | None, labels: np.ndarray = labels
                  ) -> dict[str, float]:
            return eval_metrics.glue_metrics(task, outputs["logits"], labels)

        evals.append(EvalSet(split, enc, score, tasks.column_name(task, split)))

    def primary(metrics: dict[str, dict[str, float]]) -> float:
        return float(np.mean([eval_metrics.task_score(task, m) for m in metrics.values()]))

    test_sets = []
    for split, examples in tests:
        def write(outputs: dict[str, np.ndarray], folder: Path, split: str = split,
                  guids: list[str] = [e.guid for e in examples]) -> None:  # noqa: B006
            tasks.write_glue_submission(task, outputs["logits"], folder / "submission" /
                                        f"{tasks.column_name(task, split)}.tsv", indices=guids)

        test_sets.append((split, encode_pairs(tokenizer, examples, seq, regression), write))
    return _Job(task.name, "classification", task.num_labels,
                encode_pairs(tokenizer, train, seq, regression), evals, primary, test_sets)


def _squad_job(version_2: bool, train_file: Path, dev_file: Path, tokenizer: Any,
               cfg: FinetuneConfig) -> _Job:
    from bertgpu.tasks import squad

    seq = cfg.max_seq_len or 384
    tokenizer.no_truncation()
    tokenizer.no_padding()
    kw = {"max_seq_len": seq, "doc_stride": cfg.doc_stride, "max_query_len": cfg.max_query_len}
    train_ex = _limit(squad.read_squad(train_file), cfg.max_train_examples)
    dev_ex = _limit(squad.read_squad(dev_file), cfg.max_eval_examples)
    train_feats = squad.featurize(train_ex, tokenizer, is_training=True, **kw)
    if len(train_feats) == 0:
        raise BertgpuError(f"{train_file}: no training features (every answer outside its context?)")
    dev_feats = squad.featurize(dev_ex, tokenizer, **kw)

    def score(outputs: dict[str, np.ndarray], folder: Path | None) -> dict[str, float]:
        # Logits come back padded per batch; postprocess expects (F, max_seq_len). Pad positions
        # are never context tokens, so any value works there.
        start, end = (_pad_to(outputs[k], seq) for k in ("start_logits", "end_logits"))
        preds, _ = squad.postprocess(dev_ex, dev_feats, start, end, n_best=cfg.n_best,
                                     max_answer_len=cfg.max_answer_len, version_2=version_2,
                                     null_threshold=cfg.null_threshold)
        if folder is not None:
            squad.write_predictions(preds, folder / "predictions.json")
        return squad.squad_evaluate(dev_ex, preds, version_2=version_2)

    name = "SQuAD v2.0" if version_2 else "SQuAD v1.1"
    return _Job(name, "qa", None, _strip_padding(train_feats),
                [EvalSet("dev", _strip_padding(dev_feats), score)],
                lambda m: float(m["dev"]["f1"]))


def _pad_to(rows: np.ndarray, width: int) -> np.ndarray:
    out = np.full((rows.shape[0], width), -1e4, dtype=np.float32)
    out[:, : rows.shape[1]] = rows
    return out


# --------------------------------------------------------------------------------------------
# Model and tokenizer from --init


def _has_tokenizer(folder: Path) -> bool:
    return (folder / "tokenizer.json").is_file() or (folder / "vocab.txt").is_file()


def find_tokenizer(init: str | os.PathLike[str]) -> Path:
    """Tokenizer folder of `--init`: the folder itself (HF), RUN_DIR/tokenizer, or the run folder
    two levels above a checkpoints/step_N folder."""
    from bertgpu.models.hf_io import resolve_checkpoint_folder

    folder = Path(init)
    resolved = resolve_checkpoint_folder(folder)
    for cand in (folder, folder / "tokenizer", resolved, resolved.parent.parent / "tokenizer"):
        if cand.is_dir() and _has_tokenizer(cand):
            return cand
    raise BertgpuError(f"{folder}: no tokenizer (expected tokenizer.json or vocab.txt in it, or a "
                       "tokenizer/ folder of a bertgpu run)")


def _tokenizer_for(init: str, config_from: str | os.PathLike[str] | None) -> Path:
    if init == "random":
        if config_from is None:
            raise BertgpuError("--init random needs --config-from FOLDER (a run, checkpoint or HF folder)")
        return find_tokenizer(config_from)
    return find_tokenizer(init)


def build_model(init: str, head: str, num_labels: int | None, cfg: FinetuneConfig,
                config_from: str | None = None) -> torch.nn.Module:
    """The task model: pretrained weights from `init` (fresh head, listed in a warning), or with
    `init == "random"` the architecture of `config_from` with fresh weights."""
    import torch

    from bertgpu.models import hf_io
    from bertgpu.models.bert import (
        BertConfig,
        BertForQuestionAnswering,
        BertForSequenceClassification,
    )

    overrides = {"hidden_dropout_prob": cfg.hidden_dropout_prob} if cfg.hidden_dropout_prob is not None else None
    torch.manual_seed(cfg.seed)  # the fresh head (and random init) depend on the seed
    if init != "random":
        return hf_io.load_pretrained(init, head=head, num_labels=num_labels, config_overrides=overrides)
    if config_from is None:
        raise BertgpuError("--init random needs --config-from FOLDER (a run, checkpoint or HF folder)")
    folder = hf_io.resolve_checkpoint_folder(config_from)
    d = {**hf_io.read_config(folder), **(overrides or {})}
    try:
        bert_config = BertConfig.from_dict(d).validate()
    except BertgpuError as e:
        raise BertgpuError(f"{folder / 'config.json'}: {e}") from None
    if head == "qa":
        return BertForQuestionAnswering(bert_config)
    return BertForSequenceClassification(bert_config, num_labels=num_labels or 2)


# --------------------------------------------------------------------------------------------
# Training


class _Trainer:
    def __init__(self, job: _Job, model: Any, cfg: FinetuneConfig, info: Any, pad_id: int) -> None:
        import torch

        from bertgpu.train import config as config_mod
        from bertgpu.train import distributed, optim
        from bertgpu.train.engine import Engine

        self.job, self.cfg, self.info, self.pad_id = job, cfg, info, pad_id
        self.device = torch.device(info.device)
        self.world = info.world_size
        micro = cfg.micro_batch_size or max(cfg.global_batch_size // self.world, 1)
        self.micro = micro
        self.accumulation = config_mod.resolve_batch(cfg.global_batch_size, micro, self.world)
        n = len(job.train)
        if n < self.world:
            raise BertgpuError(f"{job.name}: {n} training sequences for {self.world} devices")
        # The last, smaller step of an epoch is kept when every device gets a sequence.
        full, rest = divmod(n, cfg.global_batch_size)
        self.steps_per_epoch = full + (1 if rest >= self.world else 0)
        self.total_steps = self.steps_per_epoch * cfg.epochs
        self.model = model.to(self.device)
        self.optimizer = optim.build_optimizer(self.model, cfg.optimizer, cfg.lr, weight_decay=cfg.weight_decay)
        torch.manual_seed(cfg.seed * 1000003 + info.rank)  # dropout noise differs per rank
        self.engine = Engine(distributed.wrap_ddp(self.model, info), self.optimizer, precision=cfg.precision,
                             device=self.device, grad_clip=cfg.grad_clip, lr_fn=self._lr)
        self.loss_key = "qa" if job.head == "qa" else "cls"
        self.train_s = 0.0
        self.train_examples = 0
        self.eval_s = 0.0
        self.eval_examples = 0

    def _lr(self) -> float:
        from bertgpu.train.schedule import lr_factor

        progress = min((self.engine.step + 1) / self.total_steps, 1.0)
        return self.cfg.lr * lr_factor(progress, self.cfg.warmup_fraction, self.cfg.decay)

    def _loss_fn(self, model: Any, batch: dict[str, Any]) -> dict[str, Any]:
        return {self.loss_key: model(**batch).loss_sum}

    def _count_fn(self, batch: dict[str, Any]) -> dict[str, int]:
        return {self.loss_key: int(batch["input_ids"].shape[0])}

    def _step_batches(self, epoch: int) -> list[list[list[int]]]:
        """Per step, this rank's micro batches (lists of example indices). The order is a
        permutation from (seed, epoch) alone; rank r takes the r-th contiguous slice of a step."""
        order = np.random.default_rng([self.cfg.seed, epoch]).permutation(len(self.job.train))
        g = self.cfg.global_batch_size
        steps = []
        for s in range(self.steps_per_epoch):
            mine = np.array_split(order[s * g:(s + 1) * g], self.world)[self.info.rank]
            steps.append([mine[i:i + self.micro].tolist() for i in range(0, len(mine), self.micro)])
        return steps

    def predict(self, data: Encoded) -> dict[str, np.ndarray]:
        """Model outputs for every row of `data` (in order): logits, or start/end logits padded
        to the longest row. Rows are run longest first to waste little compute on padding."""
        import torch

        keys = ("start_logits", "end_logits") if self.job.head == "qa" else ("logits",)
        t0 = time.perf_counter()
        lengths = np.array([len(x) for x in data.ids])
        order = np.argsort(-lengths, kind="stable")
        chunks: dict[str, list[np.ndarray]] = {k: [] for k in keys}
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad():
            for i in range(0, len(order), self.cfg.eval_batch_size):
                idx = order[i:i + self.cfg.eval_batch_size].tolist()
                batch = {k: v.to(self.device) for k, v in data.batch(idx, self.pad_id).items()
                         if k in ("input_ids", "token_type_ids", "attention_mask")}
                with self.engine.autocast():
                    out = self.model(**batch)
                for k in keys:
                    chunks[k].append(out[k].float().cpu().numpy())
        self.model.train(was_training)
        result: dict[str, np.ndarray] = {}
        for k in keys:
            if self.job.head == "qa":
                width = int(lengths.max()) if len(lengths) else 0
                rows = np.concatenate([_pad_to(c, width) for c in chunks[k]]) if chunks[k] else np.zeros((0, 0))
            else:
                rows = np.concatenate(chunks[k]) if chunks[k] else np.zeros((0, self.job.num_labels or 1))
            unsorted = np.empty_like(rows)
            unsorted[order] = rows
            result[k] = unsorted
        self.eval_s += time.perf_counter() - t0
        self.eval_examples += len(data)
        return result

    def evaluate(self, folder: Path | None) -> dict[str, dict[str, float]]:
        return {ev.name: ev.score(self.predict(ev.data), folder) for ev in self.job.evals}

    def fit(self, logger: Any, work: Path | None) -> list[dict[str, Any]]:
        """Train `epochs` epochs, evaluating (rank 0) after each; returns the per-epoch records."""
        from bertgpu.train import distributed

        history: list[dict[str, Any]] = []
        is_main = distributed.is_main()
        for epoch in range(1, self.cfg.epochs + 1):
            t0 = time.perf_counter()
            loss_sum, loss_n = 0.0, 0
            for micro_idx in self._step_batches(epoch):
                batches = [self.job.train.batch(idx, self.pad_id) for idx in micro_idx]
                res = self.engine.train_step(batches, self._loss_fn, self._count_fn)
                n = res.counts[self.loss_key]
                self.train_examples += n
                loss_sum, loss_n = loss_sum + res.loss * n, loss_n + n
                step = self.engine.step
                if step % self.cfg.log_every_steps == 0 or step == self.total_steps:
                    logger.log(step, "train", loss=res.loss, lr=res.lr, grad_norm=res.grad_norm,
                               epoch=epoch, examples_per_s=n / max(res.step_s, 1e-9),
                               skipped_steps=self.engine.skipped_steps)
            self.train_s += time.perf_counter() - t0
            record: dict[str, Any] = {"epoch": epoch, "step": self.engine.step,
                                      "train_loss": loss_sum / max(loss_n, 1)}
            if is_main:
                last = epoch == self.cfg.epochs
                metrics = self.evaluate(work if last else None)
                record["metrics"] = metrics
                record["score"] = self.job.primary(metrics)
                flat = {f"{split}_{k}": v for split, m in metrics.items() for k, v in m.items()}
                logger.log(self.engine.step, "eval", epoch=epoch, score=record["score"], **flat)
            distributed.barrier()  # the other ranks wait while rank 0 evaluates
            history.append(record)
        return history


# --------------------------------------------------------------------------------------------
# Entry points


def finetune(task: str, data: str | os.PathLike[str] | None, init: str | os.PathLike[str],
             out: str | os.PathLike[str], cfg: FinetuneConfig | None = None,
             overrides: list[str] | None = None, *, config_from: str | os.PathLike[str] | None = None,
             train_file: str | os.PathLike[str] | None = None,
             dev_file: str | os.PathLike[str] | None = None,
             predict_test: bool = False) -> dict[str, Any]:
    """Fine-tune on GLUE task `task` (any alias) or `squad` / `squad2` and return results.json's
    content. `data`: the GLUE root or task folder; for SQuAD a folder with train-v1.1.json and
    dev-v1.1.json (v2.0 for squad2) unless `train_file` / `dev_file` name them."""
    from bertgpu.tasks import glue as tasks

    cfg = load_config(cfg, overrides)
    key = task.lower().replace("-", "").replace("_", "").replace(".", "")
    init_s = str(init)
    tok_dir = _tokenizer_for(init_s, config_from)

    def job_fn(tokenizer: Any) -> tuple[_Job, dict[str, Any]]:
        if key in SQUAD_TASKS:
            v2 = SQUAD_TASKS[key]
            tr, dv = _squad_files(data, v2, train_file, dev_file)
            return _squad_job(v2, tr, dv, tokenizer, cfg), {"data": [str(tr), str(dv)], "task_key": key}
        if data is None:
            raise BertgpuError(f"finetune {task}: --data is required (the GLUE folder)")
        t = tasks.get_task(task)
        train_path = tasks.find_split_file(data, t, "train")
        devs = [(s, tasks.read_examples(t, tasks.find_split_file(data, t, s))) for s in t.dev_splits]
        tests = []
        if predict_test:
            for s in t.test_splits:
                try:
                    path = tasks.find_split_file(data, t, s)
                except BertgpuError:
                    continue  # no test file for this split: nothing to predict
                tests.append((s, tasks.read_examples(t, path, expect_labels=False)))
        job = _glue_job(t, tasks.read_examples(t, train_path), devs, tokenizer, cfg, str(train_path), tests)
        return job, {"data": str(data), "task_key": t.key, "kind": t.kind}

    return _run(job_fn, init_s, Path(out), cfg, tok_dir, config_from)


def finetune_examples(task: GlueTask | str, train: list[Example], dev: list[Example],
                      init: str | os.PathLike[str], out: str | os.PathLike[str],
                      cfg: FinetuneConfig | None = None, overrides: list[str] | None = None, *,
                      config_from: str | os.PathLike[str] | None = None,
                      name: str | None = None) -> dict[str, Any]:
    """Fine-tune on in-memory examples scored like GLUE task `task` (its kind, number of labels
    and official metrics), e.g. the demo's polarity sentences as an SST-2-style task."""
    from bertgpu.tasks import glue as tasks

    t = tasks.get_task(task)
    cfg = load_config(cfg, overrides)
    init_s = str(init)
    tok_dir = _tokenizer_for(init_s, config_from)

    def job_fn(tokenizer: Any) -> tuple[_Job, dict[str, Any]]:
        job = _glue_job(t, list(train), [("dev", list(dev))], tokenizer, cfg, name or "in-memory examples")
        if name:
            job.name = name
        return job, {"data": "in-memory examples", "task_key": t.key, "kind": t.kind}

    return _run(job_fn, init_s, Path(out), cfg, tok_dir, config_from)


def _squad_files(data: str | os.PathLike[str] | None, v2: bool, train_file: Any, dev_file: Any
                 ) -> tuple[Path, Path]:
    ver = "v2.0" if v2 else "v1.1"
    paths = []
    for given, split in ((train_file, "train"), (dev_file, "dev")):
        if given is not None:
            paths.append(Path(given))
            continue
        if data is None:
            raise BertgpuError(f"SQuAD {ver}: give --data FOLDER (with {split}-{ver}.json) or --{split}-file")
        path = Path(data) / f"{split}-{ver}.json"
        if not path.is_file():
            raise BertgpuError(f"{path}: not found (expected the official SQuAD {ver} {split} file)")
        paths.append(path)
    return paths[0], paths[1]


def _run(job_fn: Callable[[Any], tuple[_Job, dict[str, Any]]], init: str, out: Path,
         cfg: FinetuneConfig, tok_dir: Path, config_from: Any) -> dict[str, Any]:
    import torch

    from bertgpu import __version__
    from bertgpu.data.tokenizer import load_tokenizer
    from bertgpu.train import distributed, metrics

    t_start = time.perf_counter()
    owns_group = not distributed.is_initialized()
    info = distributed.init_distributed(cfg.device)
    try:
        tokenizer = load_tokenizer(tok_dir)
        pad_id = tokenizer.token_to_id("[PAD]")
        if pad_id is None:
            raise BertgpuError(f"{tok_dir}: the tokenizer has no [PAD] token (expected a BERT vocabulary)")
        job, extra = job_fn(tokenizer)
        model = build_model(init, job.head, job.num_labels, cfg, str(config_from) if config_from else None)
        vocab = model.config.vocab_size
        if tokenizer.get_vocab_size() > vocab:
            raise BertgpuError(f"{tok_dir}: the tokenizer has {tokenizer.get_vocab_size()} tokens but the "
                               f"model's config.json says vocab_size {vocab}; expected the model's own tokenizer")
        trainer = _Trainer(job, model, cfg, info, pad_id)

        is_main = distributed.is_main()
        work = out.with_name(out.name + ".tmp")
        if is_main:
            if work.exists():
                shutil.rmtree(work)  # left over from an interrupted run
            work.mkdir(parents=True)
            print(metrics.format_startup_table([
                ("task", job.name), ("init", init), ("train sequences", f"{len(job.train):,}"),
                ("eval", ", ".join(f"{e.name} {len(e.data):,}" for e in job.evals)),
                ("device", f"{info.device} x {trainer.world} ({cfg.precision})"),
                ("global batch / micro / accumulation", f"{cfg.global_batch_size} / {trainer.micro} / "
                                                        f"{trainer.accumulation}"),
                ("steps", f"{trainer.total_steps:,} ({cfg.epochs} epochs x {trainer.steps_per_epoch})"),
                ("learning rate", f"{cfg.lr:.3g} ({cfg.optimizer}, warm-up {cfg.warmup_fraction:.0%}, "
                                  f"{cfg.decay} decay)"),
            ], title="bertgpu finetune"), flush=True)
        distributed.barrier()
        logger = metrics.MetricsLogger(work if is_main else None, is_main, trainer.total_steps,
                                       tensorboard=False, log_every=cfg.log_every_steps)
        try:
            history = trainer.fit(logger, work if is_main else None)
            if is_main:
                for _split, data, write in job.predict_test:
                    write(trainer.predict(data), work)
        finally:
            logger.close()

        results: dict[str, Any] = {}
        if is_main:
            from bertgpu.models.hf_io import save_pretrained

            save_pretrained(trainer.model, work / "model", tokenizer=tok_dir)
            final = history[-1]
            best = max(history, key=lambda r: r["score"])
            columns = {}
            if job.head != "qa":
                from bertgpu.tasks import glue as tasks
                from bertgpu.tasks import metrics as eval_metrics

                t = tasks.get_task(extra["task_key"])
                columns = {ev.column: eval_metrics.task_score(t, final["metrics"][ev.name]) for ev in job.evals}
            results = {
                "task": job.name, **extra, "init": init,
                "config_from": str(config_from) if config_from else None,
                "tokenizer": str(tok_dir),
                "metrics": final["metrics"], "score": final["score"], "columns": columns,
                "best": {"epoch": best["epoch"], "metrics": best["metrics"], "score": best["score"]},
                "epochs": history,
                "config": config_to_dict(cfg),
                "train_sequences": len(job.train),
                "eval_sequences": {e.name: len(e.data) for e in job.evals},
                "steps": trainer.engine.step, "skipped_steps": trainer.engine.skipped_steps,
                "seconds": time.perf_counter() - t_start,
                "train_seconds": trainer.train_s,
                "train_examples_per_s": trainer.train_examples / max(trainer.train_s, 1e-9),
                "eval_examples_per_s": trainer.eval_examples / max(trainer.eval_s, 1e-9),
                "device": _device_name(info.device), "world_size": trainer.world,
                "torch_version": torch.__version__, "bertgpu_version": __version__,
            }
            tmp = work / "results.json.tmp"
            tmp.write_text(json.dumps(results, indent=2, allow_nan=False) + "\n", encoding="utf-8")
            os.replace(tmp, work / "results.json")
            replace_dir(work, out)
            print(f"{job.name}: " + ", ".join(f"{s} " + ", ".join(f"{k} {v:.2f}" for k, v in m.items())
                                              for s, m in final["metrics"].items()) + f" -> {out}", flush=True)
        distributed.barrier()
        return results
    finally:
        if owns_group:
            distributed.destroy()


def _device_name(device: str) -> str:
    import platform

    import torch

    if device.startswith("cuda"):
        return f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    return f"{device} ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


# --------------------------------------------------------------------------------------------
# Demo tasks from gensim's test data


def demo_tasks(seed: int = 0, dev_fraction: float = 0.2) -> dict[str, tuple[list[Example], list[Example], GlueTask]]:
    """Two small real-text tasks, split deterministically from `seed`:

    - "polarity": gensim's pang_lee_polarity.cor, 200 movie-review sentences ("__label__neg ..." /
      "__label__pos ..."), an SST-2-style task (negative=0, positive=1), dev stratified by class.
    - "lee": the 50 Lee news documents (lee.cor) and the human similarity matrix
      (similarities0-1.txt, upper triangle: 1,225 document pairs, scores 0-1, scaled by 5 to the
      STS-B range), an STS-B-style regression task on document pairs.
    """
    from bertgpu.data.corpus import gensim_test_data
    from bertgpu.tasks import glue as tasks

    rng = np.random.default_rng(seed)
    path = gensim_test_data("pang_lee_polarity.cor")
    by_label: dict[int, list[Example]] = {0: [], 1: []}
    # gensim's copies of these corpora are Windows-1252 (em dashes, accents, a pound sign).
    for n, line in enumerate(path.read_text(encoding="cp1252").splitlines(), 1):
        if not line.strip():
            continue
        tag, _, text = line.partition(" ")
        if tag not in ("__label__neg", "__label__pos") or not text.strip():
            raise BertgpuError(f"{path}:{n}: expected '__label__neg TEXT' or '__label__pos TEXT'")
        label = int(tag == "__label__pos")
        by_label[label].append(tasks.Example(f"polarity-{n}", text.strip(), None, label))
    pol_train: list[Example] = []
    pol_dev: list[Example] = []
    for label in (0, 1):
        items = by_label[label]
        perm = rng.permutation(len(items))
        n_dev = int(round(dev_fraction * len(items)))
        pol_dev += [items[i] for i in perm[:n_dev]]
        pol_train += [items[i] for i in perm[n_dev:]]
    pol_train = [pol_train[i] for i in rng.permutation(len(pol_train))]

    docs_path, sim_path = gensim_test_data("lee.cor"), gensim_test_data("similarities0-1.txt")
    docs = [d.strip() for d in docs_path.read_text(encoding="cp1252").splitlines() if d.strip()]
    sim = np.loadtxt(sim_path, dtype=np.float64)
    if sim.shape != (len(docs), len(docs)):
        raise BertgpuError(f"{sim_path}: a {sim.shape[0]}x{sim.shape[1]} matrix for {len(docs)} documents "
                           f"in {docs_path}; expected {len(docs)}x{len(docs)}")
    pairs = [tasks.Example(f"lee-{i}-{j}", docs[i], docs[j], float(5.0 * sim[i, j]))
             for i in range(len(docs)) for j in range(i + 1, len(docs))]

    # Split by a hash of (seed, pair): stable if the pair list is ever reordered.
    def in_dev(guid: str) -> bool:
        h = hashlib.sha256(f"{seed}:{guid}".encode()).digest()
        return int.from_bytes(h[:8], "big") / 2**64 < dev_fraction

    lee_dev = [p for p in pairs if in_dev(p.guid)]
    lee_train = [p for p in pairs if not in_dev(p.guid)]
    return {"polarity": (pol_train, pol_dev, tasks.get_task("sst2")),
            "lee": (lee_train, lee_dev, tasks.get_task("stsb"))}


# --------------------------------------------------------------------------------------------
# Command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.allow_abbrev = False  # else `--seed` would be taken for a prefix of a longer flag
    parser.add_argument("task", nargs="?", help="GLUE task (cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, "
                                                "wnli; any alias) or squad / squad2")
    parser.add_argument("--data", help="GLUE root or task folder; SQuAD: folder with train-/dev-v1.1.json")
    parser.add_argument("--init", help="run folder, checkpoint folder, Hugging Face BERT folder, or random")
    parser.add_argument("--config-from", help="with --init random: folder whose config.json (and tokenizer) to use")
    parser.add_argument("--out", help="output folder (results.json, metrics.jsonl, model/)")
    parser.add_argument("--train-file", help="SQuAD training JSON (instead of --data)")
    parser.add_argument("--dev-file", help="SQuAD dev JSON (instead of --data)")
    parser.add_argument("--predict-test", action="store_true",
                        help="GLUE: also write test-set predictions in leaderboard format to OUT/submission/")
    parser.add_argument("--nproc", default=None, help="worker processes on this machine: N or auto")
    parser.add_argument("--help-config", action="store_true", help="list every config key and exit")
    parser.epilog = "Overrides: --key value (or --train.key value), e.g. --epochs 3 --lr 2e-5 --seed 1"


def main(args: argparse.Namespace) -> int:
    from bertgpu.train import distributed

    if args.help_config:
        print(format_help(FinetuneConfig))
        return 0
    missing = [flag for flag, v in (("TASK", args.task), ("--init", args.init), ("--out", args.out)) if not v]
    if missing:
        raise BertgpuError(f"missing {', '.join(missing)} (bertgpu finetune TASK --data DIR --init FOLDER --out DIR)")
    cfg = load_config(None, args.overrides)  # validate once, before launching N workers
    if args.nproc is not None and "WORLD_SIZE" not in os.environ:
        n = distributed.resolve_nproc(args.nproc)
        if n > 1:
            argv = ["finetune", args.task, "--init", args.init, "--out", args.out]
            for flag, value in (("--data", args.data), ("--config-from", args.config_from),
                                ("--train-file", args.train_file), ("--dev-file", args.dev_file)):
                if value is not None:
                    argv += [flag, value]
            argv += ["--predict-test"] if args.predict_test else []
            return distributed.launch_local(n, [*argv, *args.overrides])
    finetune(args.task, args.data, args.init, args.out, cfg, config_from=args.config_from,
             train_file=args.train_file, dev_file=args.dev_file, predict_test=args.predict_test)
    return 0


if __name__ == "__main__":  # pragma: no cover
    from bertgpu.cli import main as cli_main

    sys.exit(cli_main(["finetune", *sys.argv[1:]]))

"""The model and tokenizer of a fine-tuning run's `--init`: a run folder, a checkpoint folder, a
Hugging Face folder, or `random` with `--config-from` (its architecture, fresh weights), the
checkpoint it resolves to (recorded in results.json, compared by `bertgpu glue`), and the
tokens per sequence its position table allows. `bertgpu finetune` and `bertgpu glue` use these
before anything trains (`--nproc`: before the workers start).

An init that already has a classifier of the task's size keeps it only when its labels are the
task's: config.json's id2label names compared case-insensitively (`-`, `_` and spaces alike), in
any order (the rows are put in the task's order: published MNLI models order the three classes
differently), or left as LABEL_i (nothing to compare; kept as before). A head naming other labels
is another task's and starts fresh, as one of another size does."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertgpu.config.finetune import FinetuneConfig, resolve_seq_len
from bertgpu.errors import BertgpuError

if TYPE_CHECKING:
    import torch

def has_tokenizer(folder: Path) -> bool:
    """`folder` holds a tokenizer AutoTokenizer builds from its files (not the empty 5-token one
    it makes of a folder without them)."""
    return (folder / "tokenizer.json").is_file() or (folder / "vocab.txt").is_file()


def find_tokenizer(init: str | os.PathLike[str]) -> Path:
    """Tokenizer folder of `--init`: the folder itself (HF), RUN_DIR/tokenizer, or the run folder
    two levels above a checkpoints/step_N folder (the run's own tokenizer before the copy a
    checkpoint carries for transformers)."""
    from bertgpu.models.hf_io import resolve_checkpoint_folder

    folder = Path(init)
    resolved = resolve_checkpoint_folder(folder)
    run_own = ([resolved.parent.parent / "tokenizer"] if resolved.parent.name == "checkpoints"
               else [])  # not a copy's: the folder two levels up is then not its run
    for cand in (*run_own, folder, folder / "tokenizer", resolved,
                 resolved.parent.parent / "tokenizer"):
        if cand.is_dir() and has_tokenizer(cand):
            return cand
    raise BertgpuError(f"{folder}: no tokenizer (expected tokenizer.json or vocab.txt in it, or a "
                       "tokenizer/ folder of a bertgpu run)")


def tokenizer_for(init: str, config_from: str | os.PathLike[str] | None) -> Path:
    """The tokenizer folder of `init` (of `config_from` with `--init random`); a one-line error
    when either is not a model or run folder."""
    if init == "random":
        if config_from is None:
            raise BertgpuError("--init random needs --config-from FOLDER (a run, checkpoint "
                               "or HF folder)")
        return find_tokenizer(config_from)
    if config_from is not None:  # (it was ignored, yet recorded: a glue re-run was refused)
        raise BertgpuError(f"--config-from {config_from}: only with --init random (a model "
                           f"of that shape with random weights); --init {init} brings its own "
                           "model and tokenizer: drop --config-from")
    return find_tokenizer(init)


@dataclasses.dataclass(frozen=True)
class InitCheckpoint:
    """The folder whose weights a fine-tuning starts from: `--init` itself (a Hugging Face or
    checkpoint folder) or, for a run folder, its newest good checkpoint when the run started,
    which moves while pretraining goes on."""

    path: Path
    """The folder, absolute."""
    step: int | None
    """N of a `checkpoints/step_N` folder; None for a Hugging Face folder."""
    sha256: str | None
    """model.safetensors' sha256 as its checksums.json records it, or hashed where there is none
    (a Hugging Face folder); None without a model.safetensors."""

    def record(self) -> dict[str, Any]:
        """results.json's `init_checkpoint`."""
        return {"path": str(self.path), "step": self.step, "sha256": self.sha256}

    def text(self) -> str:
        """The start-up table's row."""
        facts = [f"step {self.step}"] if self.step is not None else []
        if self.sha256:
            facts.append(f"model.safetensors sha256 {self.sha256[:12]}")
        return f"{self.path}" + (f" ({', '.join(facts)})" if facts else "")


def resolve_init(init: str) -> InitCheckpoint | None:
    """The checkpoint `init` stands for now (None for `random`): load from its `path` so that a
    checkpoint saved meanwhile is not mixed in."""
    from bertgpu.models.hf_io import is_checkpoint_folder, resolve_checkpoint_folder

    if init == "random":
        return None
    folder = resolve_checkpoint_folder(init).resolve()
    m = re.fullmatch(r"step_(\d+)(\.old)?", folder.name)
    step = int(m.group(1)) if m and is_checkpoint_folder(folder) else None
    return InitCheckpoint(folder, step, _recorded_sha256(folder))


def load_from(init: str, ckpt: InitCheckpoint | None) -> str:
    """What a run loads: the checkpoint `init` resolved to once (`resolve_init`), not `init` again:
    a run folder's newest moves while pretraining goes on, and the run would load another than
    it records."""
    return str(ckpt.path) if ckpt is not None else init


def _recorded_sha256(folder: Path) -> str | None:
    # checksums.json is read, not the weights hashed: resolving the folder has just verified it.
    try:
        files = json.loads((folder / "checksums.json").read_text(encoding="utf-8"))["files"]
        digest = files["model.safetensors"]["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        # A Hugging Face folder has no checksums.json: its weights are hashed, or a re-export
        # to the same path (pretraining went further) would pass for the model a finished or
        # stopped run started from (a resume, glue's reuse of finished tasks).
        return _weights_sha256(folder / "model.safetensors")
    return digest if isinstance(digest, str) else None


_hashed: dict[tuple[str, int, int], str] = {}
"""sha256 by (path, size, mtime): a glue run resolves the same init once per task and seed."""


def _weights_sha256(path: Path) -> str | None:
    from bertgpu.fsutil import file_sha256

    try:
        stat = path.stat()
        key = (str(path), stat.st_size, stat.st_mtime_ns)
        if key not in _hashed:
            _hashed[key] = file_sha256(path)
    except OSError:
        return None
    return _hashed[key]


def checkpoint_change(recorded: Any, recorded_init: Any, now: InitCheckpoint) -> str | None:
    """None when `recorded` (a results.json's init_checkpoint; `recorded_init` its --init) is
    the checkpoint `now`: the same model.safetensors sha256 (wherever the folder lies), else,
    without one on either side, the same folder and step. Otherwise "WAS (now IS)" for a
    one-line message."""
    if not isinstance(recorded, dict):
        return (f"{recorded_init}, its checkpoint not recorded (an older bertgpu) "
                f"(now {now.path})")
    then = recorded.get("sha256")
    if then and now.sha256:
        if then == now.sha256:
            return None
    elif recorded.get("path") == str(now.path) and recorded.get("step") == now.step:
        return None
    was = f"{recorded.get('path')}"
    if recorded.get("path") == str(now.path):  # the same folder saved again
        return f"{was} (sha256 {str(then)[:12]}; now sha256 {str(now.sha256)[:12]})"
    return f"{was} (now {now.path})"


def build_model(init: str, head: str, num_labels: int | None, cfg: FinetuneConfig,
                config_from: str | None = None,
                labels: Sequence[str] | None = None, job: Any = None) -> torch.nn.Module:
    """The task model: pretrained weights from `init` (fresh head, listed in a warning), or with
    `init == "random"` the architecture of `config_from` with fresh weights. `labels`: the class
    names by id, exported as config.json's id2label / label2id; an init's classifier of the same
    size is matched to them (`match_head`). `job`: the encoded task, whose token types (1 for
    text pairs) the model must have (`check_job_token_types`), checked before anything loads.
    A model the run could not export at its end (`config.export_problem()`) is refused here."""
    import torch

    from bertgpu.models import build, hf_io

    overrides = None
    if cfg.hidden_dropout_prob is not None:
        # BERT's hidden dropout, or what the architecture calls the same places (ModernBERT:
        # embedding and MLP dropout).
        source = hf_io.read_config(
            hf_io.resolve_checkpoint_folder(config_from if init == "random" else init))
        spec = build.spec(build.architecture_of(source))
        names = (("hidden_dropout_prob",)
                 if "hidden_dropout_prob" in spec.config_class.__dataclass_fields__
                 else spec.equivalents["hidden_dropout_prob"])
        overrides = dict.fromkeys(names, cfg.hidden_dropout_prob)
    if head == "qa":  # SQuAD: [CLS] question [SEP] (type 0), context [SEP] (type 1)
        check_token_types(init, config_from, 1, "question answering (question and context)")
    elif job is not None:
        check_job_token_types(job, init, config_from)
    torch.manual_seed(cfg.seed)  # the fresh head (and random init) depend on the seed
    if init != "random":
        model = hf_io.load_pretrained(init, head=head, num_labels=num_labels,
                                      config_overrides=overrides)
    else:
        if config_from is None:
            raise BertgpuError("--init random needs --config-from FOLDER (a run, checkpoint "
                               "or HF folder)")
        folder = hf_io.resolve_checkpoint_folder(config_from)
        d = {**hf_io.read_config(folder), **(overrides or {})}
        # the labels are this task's, not the folder's
        for key in ("id2label", "label2id", "num_labels"):
            d.pop(key, None)
        try:
            model = build.build_model(d, head, num_labels or (None if head == "qa" else 2))
        except BertgpuError as e:
            raise BertgpuError(f"{folder / 'config.json'}: {e}") from None
    problem = model.config.export_problem()
    if problem is not None:  # refused now, not after training: the run ends with an export
        source = hf_io.resolve_checkpoint_folder(config_from if init == "random" else init)
        raise BertgpuError(f"{source / 'config.json'}: {problem}; a fine-tuning run exports "
                           "its model, so it cannot start")
    if hasattr(model, "id2label"):
        if labels is not None and init != "random":
            match_head(model, list(labels))
        # What save_pretrained writes into config.json: this task's label names, or LABEL_i;
        # never the init's (a model fine-tuned on another task carries that task's names), now
        # that the head's rows are in the task's order.
        model.id2label = (dict(enumerate(labels)) if labels is not None
                          else {i: f"LABEL_{i}" for i in range(model.num_labels)})
    return model


def _type_vocab_size(init: str, config_from: str | os.PathLike[str] | None
                     ) -> tuple[int | None, Path]:
    """The token types the model of `init` (of `config_from` for `--init random`) has rows for
    (BERT's type_vocab_size; None for ModernBERT, which has no token types) and its config.json,
    read before any weights load."""
    from bertgpu.models import hf_io

    folder = hf_io.resolve_checkpoint_folder(config_from if init == "random" else init)
    fields = hf_io.read_config(folder)
    size = fields.get("type_vocab_size", 2) if fields.get("model_type", "bert") == "bert" else None
    return (size if isinstance(size, int) and not isinstance(size, bool) else None,
            folder / "config.json")


def _refuse_token_type(where: Path, task: str, used: int, size: int) -> BertgpuError:
    # pretraining's words for the same field (data/shards.py)
    return BertgpuError(f"{where}: {task} needs token types 0 to {used}: expected "
                        f"type_vocab_size >= {used + 1}, found {size} (single-text tasks work "
                        "with this model)")


def check_token_types(init: str, config_from: str | os.PathLike[str] | None, used: int,
                      task: str) -> None:
    """A one-line error when the model has no row for token type `used` (a pair's second
    segment is type 1): the embedding lookup would fail mid-run with an IndexError."""
    size, where = _type_vocab_size(init, config_from)
    if size is not None and used >= size:
        raise _refuse_token_type(where, task, used, size)


def check_job_token_types(job: Any, init: str,
                          config_from: str | os.PathLike[str] | None) -> None:
    """`check_token_types` for the token types `job`'s encoded data use (1 for text pairs):
    called once the data are encoded, before the model is built."""
    size, where = _type_vocab_size(init, config_from)
    if size is None:
        return
    for enc in (job.train, *(ev.data for ev in job.evals),
                *(data for _, data, _ in job.predict_test)):
        for types in enc.types:
            if len(types) and int(types.max()) >= size:
                raise _refuse_token_type(where, f"task {job.name!r} (text pairs)",
                                         int(types.max()), size)


def _label_key(name: str) -> str:
    # "CONTRADICTION", "not-entailment", "Not Entailment": the spellings of published heads
    return re.sub(r"[\s_-]+", "_", name.strip().lower())


def match_head(model: Any, labels: list[str]) -> None:
    """Fit a classifier loaded from the init (`model.id2label` still the init's names) to the
    task's `labels` (names by id): rows permuted to the task's order when the init names the
    same labels in another (a start-up row says so: `head_rows`), initialised fresh when it names
    others (listed with the fresh weights). Unnamed (LABEL_i) or fresh heads stay as they are."""
    import torch

    head = getattr(model, "classifier", None)
    report = getattr(model, "load_report", None)
    if (head is None or report is None or len(labels) != model.num_labels
            or any(k.startswith("classifier.") for k in report.missing)):
        return  # no head from the init: it is fresh already
    theirs = [str(model.id2label.get(i, f"LABEL_{i}")) for i in range(model.num_labels)]
    if all(name == f"LABEL_{i}" for i, name in enumerate(theirs)):
        return  # the init does not name its classes: nothing to check them against
    mine = [_label_key(x) for x in labels]
    index = {_label_key(name): i for i, name in enumerate(theirs)}
    if list(index) == mine:
        return
    if len(index) == len(theirs) and set(index) == set(mine):
        order = [index[k] for k in mine]  # task class t <- the init's row order[t]
        with torch.no_grad():
            for p in (head.weight, head.bias):
                if p is not None:
                    p.copy_(p[order])  # indexing copies first
        model.head_note = (f"the init's classifier, rows reordered from its labels "
                           f"({', '.join(theirs)}) to the task's ({', '.join(labels)})")
        return
    # Another task's head: its rows mean other classes. The architecture's own initialisation of
    # a fresh head: BERT's _init_weights takes the Linear, ModernBERT's the model holding it
    # (each is a no-op for the other).
    model._init_weights(head)
    model._init_weights(model)
    names = [f"classifier.{n}" for n, _ in head.named_parameters()]
    report.missing = sorted({*report.missing, *names})
    report.replaced.append(f"classifier (labels {', '.join(theirs)}; the task's "
                           f"{', '.join(labels)})")


def head_rows(model: Any) -> list[tuple[str, str]]:
    """The start-up rows about the task's head: the init's reordered to the task's labels, and
    the weights initialised fresh (`fresh_rows`)."""
    note = getattr(model, "head_note", None)
    return ([("head", note)] if note else []) + fresh_rows(model)


def sequence_length(cfg: FinetuneConfig, task_default: int, init: str,
                    config_from: str | os.PathLike[str] | None) -> tuple[int, str]:
    """Tokens per sequence of the run and the start-up row's note: --max_seq_len, else the
    task's default capped at the model's max_position_embeddings; a given value beyond it is a
    one-line error before anything loads."""
    from bertgpu.models.hf_io import position_limit

    if init == "random" and config_from is None:
        raise BertgpuError("--init random needs --config-from FOLDER (a run, checkpoint "
                           "or HF folder)")
    limit, where = position_limit(config_from if init == "random" else init)
    return resolve_seq_len(cfg, task_default, limit, str(where))


def fresh_rows(model: Any) -> list[tuple[str, str]]:
    """The start-up row naming the weights the init lacked (the task's head, and BERT's pooler
    after pretraining without NSP), initialised fresh as fine-tuning always does; weights beyond
    those are a warning from hf_io.load_pretrained as well."""
    report = getattr(model, "load_report", None)
    if report is None or not report.missing:
        return []
    return [("initialised fresh", report.fresh_text())]

"""The fine-tuning tasks by name: which module builds the job of `bertgpu finetune TASK`.

Every task module has the same three functions and one constant (`TaskModule`):

    check_request(request: JobRequest) -> None
        the flags it takes and refuses, and (your own files) that the files exist; called before
        the tokenizer loads and, with --nproc, once before the workers start;
    build_job(request: JobRequest, tokenizer, cfg: FinetuneConfig) -> tuple[Job, dict]
        reads its files, encodes them into a `finetuning.Job`, and returns what results.json
        records about the data ("data", "task_key", and "kind", "fields", "labels" where known);
    DEFAULT_MAX_SEQ_LEN: int
        tokens per sequence when --max_seq_len is not given (finetune.py caps it at the model's
        max_position_embeddings and hands build_job a config with max_seq_len set).
    input_files(request: JobRequest) -> list[Path]
        the files build_job reads, after check_request: finetune.py hashes them to see a run
        finished at --out before anything is encoded (tasks/request_key.py).

A new task is one module with these and one line in `TASKS`.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any, Protocol

from bertgpu.errors import BertgpuError
from bertgpu.tasks import classify, glue, glue_job, ner, squad_job
from bertgpu.tasks.finetuning import task_key

if TYPE_CHECKING:
    from pathlib import Path

    from bertgpu.config.finetune import FinetuneConfig
    from bertgpu.tasks.finetuning import Job, JobRequest


class TaskModule(Protocol):
    """What a task module provides (the module docstring says when each runs)."""

    DEFAULT_MAX_SEQ_LEN: int

    def check_request(self, request: JobRequest) -> None: ...

    def input_files(self, request: JobRequest) -> list[Path]: ...

    def build_job(self, request: JobRequest, tokenizer: Any, cfg: FinetuneConfig
                  ) -> tuple[Job, dict[str, Any]]: ...


TASKS: dict[str, TaskModule] = {  # keys as `task_key` spells them
    # every GLUE name and alias of glue.TASKS (none has a ".")
    **dict.fromkeys(glue.names(), glue_job),
    **dict.fromkeys(squad_job.VERSIONS, squad_job),  # squad, squad1, squad2, squadv2
    "classify": classify,
    "ner": ner,
}


def task_module(name: str) -> TaskModule:
    """The module of task `name` (any spelling `task_key` folds: "SST-2", "squad_v2", "NER")."""
    module = TASKS.get(task_key(name))
    if module is None:
        raise unknown_task(name)
    return module


def unknown_task(name: str) -> BertgpuError:
    """The one-line error for a name no task answers to: every task, and the nearest name."""
    everything = [t.key for t in glue.TASKS.values()] + ["squad", "squad2", "classify", "ner"]
    near = difflib.get_close_matches(task_key(name), everything, n=1)
    hint = f"; did you mean {near[0]}?" if near else ""
    # "unknown GLUE task": the words of glue.unknown_task, which scripts and tests know
    return BertgpuError(f"unknown GLUE task {name!r} (expected a GLUE task: "
                        f"{', '.join(everything[:-4])}; or {', '.join(everything[-4:-1])} or "
                        f"{everything[-1]}){hint}")

"""The fine-tuning tasks by name: which module builds the job of `bertgpu finetune TASK`.

Every task module has the same two functions (`TaskModule`):

    check_request(request: JobRequest) -> None
        the flags it takes and refuses, and (your own files) that the files exist; called before
        the tokenizer loads and, with --nproc, once before the workers start;
    build_job(request: JobRequest, tokenizer, cfg: FinetuneConfig) -> tuple[Job, dict]
        reads its files, encodes them into a `finetuning.Job`, and returns what results.json
        records about the data ("data", "task_key", and "kind", "fields", "labels" where known).

A new task is one module with these two functions and one line in `TASKS`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from bertgpu.tasks import classify, glue, glue_job, ner, squad_job
from bertgpu.tasks.finetuning import task_key

if TYPE_CHECKING:
    from bertgpu.config.finetune import FinetuneConfig
    from bertgpu.tasks.finetuning import Job, JobRequest


class TaskModule(Protocol):
    """What a task module provides (the module docstring says when each runs)."""

    def check_request(self, request: JobRequest) -> None: ...

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
        raise glue.unknown_task(name)  # the message users know; most names tried are GLUE's
    return module

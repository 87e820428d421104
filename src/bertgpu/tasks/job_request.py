"""What the command line (or `finetune()`'s arguments) says about a fine-tuning run's data, the
`JobRequest` a task module builds its job from (tasks/finetuning.py), and the one spelling of a
task name the registry looks up (`task_key`). Torch-free: it is read before anything loads."""

from __future__ import annotations

import os
from dataclasses import dataclass

from bertgpu.errors import BertgpuError


def task_key(name: str) -> str:
    """A task name as the registry spells it: no case, "-", "_" or "." ("SQuAD-v2" -> "squadv2")."""
    return name.lower().replace("-", "").replace("_", "").replace(".", "")


@dataclass(frozen=True)
class JobRequest:
    """What the command line (or `finetune()`'s arguments) says about a run's data. Each task
    module reads the fields it takes and refuses the flags it does not (`check_request`)."""

    task: str
    """The task name as given ("SST-2", "squad2", "classify"); error messages quote it."""
    data: str | os.PathLike[str] | None = None
    """--data: the GLUE root or task folder, or the folder of the SQuAD files."""
    train_file: str | os.PathLike[str] | None = None
    """--train-file: SQuAD's training JSON, or your own labelled file (classify, ner)."""
    dev_file: str | os.PathLike[str] | None = None
    """--dev-file: the evaluation file, as --train-file."""
    predict_test: bool = False
    """--predict-test: GLUE test-set predictions in leaderboard format."""
    text_field: str | None = None
    """--text-field: the text (classify) or tokens (ner) column; None = the task's default."""
    text_pair_field: str | None = None
    """--text-pair-field: classify's second text column (pair tasks); None = single texts."""
    label_field: str | None = None
    """--label-field: the label (classify) or tags (ner) column; None = the task's default."""
    regression: bool = False
    """--regression: classify's labels are scores, not classes."""

    @property
    def key(self) -> str:
        """The normalised task name (`task_key`)."""
        return task_key(self.task)

    def column_flags(self) -> list[str]:
        """The own-file flags that were given, in command-line order."""
        return [flag for flag, v in (("--text-field", self.text_field),
                                     ("--text-pair-field", self.text_pair_field),
                                     ("--label-field", self.label_field),
                                     ("--regression", self.regression)) if v]

    def check_no_columns(self) -> None:
        """For the tasks whose file formats fix the columns (GLUE, SQuAD):
        the flags are an error."""
        given = self.column_flags()
        if given:
            raise BertgpuError(f"{', '.join(given)}: only for finetune classify and ner "
                               "(your own files)")

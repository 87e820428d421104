"""`finetune --init RUN` takes RUN's newest checkpoint at start and loads it after the task's data
is encoded (minutes): a live pretraining with keep_last 1 may remove it meanwhile. That read
"RUN/checkpoints/step_24: not a folder (expected a Hugging Face model folder or a bertgpu run
folder)", of a run folder the user had given; now it says the run removed it."""

from __future__ import annotations

import pytest
from _export_run import save_step, tiny_run

from bertgpu.errors import BertgpuError
from bertgpu.models import hf_io
from bertgpu.tasks.init_model import load_from, resolve_init


def test_a_checkpoint_the_run_removed_after_it_was_chosen_is_named_so(tmp_path):
    run = tiny_run(tmp_path / "run", steps=(24,))
    ckpt = resolve_init(str(run))
    save_step(run, 25, keep_last=1)  # the live run saves while the data is encoded
    with pytest.raises(BertgpuError, match=r"step_24: removed while being read \(a running "
                                           r"pretraining deletes its older checkpoints"):
        hf_io.load_pretrained(load_from(str(run), ckpt), head="classification", num_labels=2)

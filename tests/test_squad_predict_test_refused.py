"""`finetune squad|squad2 --predict-test`: refused in one line before any work, as classify and
ner refuse it (it was ignored without a word: exit 0, no test output)."""

from __future__ import annotations

from pathlib import Path

import _tiny_init
import pytest
from _tiny_init import SPECIAL

from bertgpu.cli import main
from bertgpu.errors import BertgpuError
from bertgpu.tasks.finetuning import JobRequest
from bertgpu.tasks.registry import task_module

SQUAD = Path(__file__).parent / "fixtures" / "squad"


@pytest.mark.parametrize("task", ["squad", "squad2"])
def test_check_request_refuses_predict_test(tmp_path, task):
    request = JobRequest(task, train_file=SQUAD / "dev-v1.1-sample.json",
                         dev_file=SQUAD / "dev-v1.1-sample.json", predict_test=True)
    with pytest.raises(BertgpuError, match=rf"^finetune {task}: takes --data or --train-file "
                                           r"and --dev-file \(not --predict-test"):
        task_module(task).check_request(request)


@pytest.mark.parametrize("task, file", [("squad", "dev-v1.1-sample.json"),
                                        ("squad2", "dev-v2.0-sample.json")])
def test_the_cli_says_so_in_one_line_and_exits_2_before_any_work(tmp_path, capsys, task, file):
    init = _tiny_init.tiny_init(tmp_path, [*SPECIAL, "a"])
    out = tmp_path / "ft"
    assert main(["finetune", task, "--train-file", str(SQUAD / file), "--dev-file",
                 str(SQUAD / file), "--init", str(init), "--out", str(out), "--epochs", "1",
                 "--predict-test"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"bertgpu finetune: error: finetune {task}: takes --data or --train-file and "
                   "--dev-file (not --predict-test: SQuAD has no public test set, the flag is "
                   "for GLUE tasks)")
    assert not out.exists() and not out.with_name("ft.tmp").exists()

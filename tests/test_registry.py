"""The task registry (every name -> the module that builds its job) and the import graph of
tasks/: no circles, and no task module leaning on another (only on glue.py's table)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _imports import imports

from bertgpu.errors import BertgpuError
from bertgpu.tasks import classify, glue, glue_job, ner, squad_job
from bertgpu.tasks.finetuning import JobRequest
from bertgpu.tasks.registry import TASKS, task_module

TASKS_DIR = Path(glue.__file__).parent
JOB_MODULES = {"glue_job", "squad_job", "classify", "ner"}  # the modules with build_job


def test_every_name_and_alias_finds_its_module():
    for t in glue.TASKS.values():
        for name in (t.key, t.name, *t.aliases):
            assert task_module(name) is glue_job, name
    for name in ("squad", "squad1", "SQuAD-v2", "squad_2", "squadv2"):
        assert task_module(name) is squad_job, name
    assert task_module("classify") is classify and task_module("NER") is ner
    for module in set(TASKS.values()):
        assert callable(module.check_request) and callable(module.build_job)
    with pytest.raises(BertgpuError, match="unknown GLUE task 'squad3'"):
        task_module("squad3")


def test_each_task_refuses_the_flags_it_does_not_take(tmp_path):
    with pytest.raises(BertgpuError,
                       match="^--text-field, --regression: only for finetune classify and ner"):
        task_module("sst2").check_request(JobRequest("sst2", tmp_path, text_field="x",
                                                     regression=True))
    with pytest.raises(BertgpuError, match="^--label-field: only for finetune classify and ner"):
        task_module("squad").check_request(JobRequest("squad", tmp_path, label_field="y"))
    with pytest.raises(BertgpuError, match="^finetune sst-2: --data is required"):
        task_module("sst-2").check_request(JobRequest("sst-2"))
    with pytest.raises(BertgpuError,
                       match=r"^finetune classify: takes --train-file and --dev-file \(not --data"):
        task_module("classify").check_request(JobRequest("classify", tmp_path))
    with pytest.raises(BertgpuError,
                       match="^finetune ner: --train-file and --dev-file are required"):
        task_module("ner").check_request(JobRequest("ner"))
    with pytest.raises(BertgpuError,
                       match="^finetune ner: --text-pair-field and --regression are for classify"):
        task_module("ner").check_request(JobRequest("ner", regression=True))


def _task_imports(path: Path) -> set[str]:
    """The tasks/ modules `path` imports anywhere: top level, inside functions, TYPE_CHECKING,
    relative imports and modules loaded by name included (tests/_imports.py)."""
    found = {m.split(".")[2] for m in imports(path) if m.startswith("bertgpu.tasks.")}
    return found - {path.stem}


def test_task_modules_import_no_circles():
    graph = {p.stem: _task_imports(p) for p in TASKS_DIR.glob("*.py") if p.stem != "__init__"}
    assert all(dep in graph for deps in graph.values() for dep in deps)
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"import circle: {' -> '.join((*path, name))}"
        if name not in done:
            for dep in sorted(graph[name]):
                visit(dep, (*path, name))
            done.add(name)

    for name in sorted(graph):
        visit(name, ())
    # a task module uses the shared modules and glue's table, no other task
    for name in JOB_MODULES:
        assert not (graph[name] & (JOB_MODULES - {name})), (name, graph[name])

"""data_digest, which a fine-tuning checkpoint must match to be resumed, on data that differs
only where the end-to-end test in test_loop.py does not look: that test reverses the rows of
train.tsv, which the token ids alone already show."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from test_loop import _tiny_finetune


def _relabel(rows: list[str]) -> list[str]:  # "text<TAB>0" <-> "text<TAB>1"
    return [r[:-1] + str(1 - int(r[-1])) for r in rows]


def _digests(tmp_path: Path, edits: dict[str, tuple[str, Callable[[list[str]], list[str]]]]
             ) -> tuple[str, dict[str, str]]:
    """The digest of test_loop's SST-2 job, and that of a copy of its folder with one file's
    rows changed, for each edit (name -> (file, change))."""
    from bertgpu.config.finetune import job_config, load_finetune_config
    from bertgpu.data.tokenizer_folder import load_tokenizer
    from bertgpu.tasks.finetune_output import data_digest
    from bertgpu.tasks.finetuning import JobRequest
    from bertgpu.tasks.glue_job import build_job

    init, _ = _tiny_finetune(tmp_path)
    tok, cfg = load_tokenizer(init), job_config(load_finetune_config(None, []), 32, windows=False)

    def digest(folder: Path) -> str:
        return data_digest(build_job(JobRequest("sst2", data=folder), tok, cfg)[0])

    changed = {}
    for what, (name, change) in edits.items():
        folder = shutil.copytree(tmp_path / "SST-2", tmp_path / what / "SST-2")
        head, *rows = (folder / name).read_text(encoding="utf-8").splitlines()
        (folder / name).write_text("\n".join([head, *change(rows)]) + "\n", encoding="utf-8")
        changed[what] = digest(folder)
    return digest(tmp_path / "SST-2"), changed


def test_the_resume_digest_sees_the_training_labels_and_the_dev_set(tmp_path):
    """A training file relabelled after a crash (texts and order unchanged: the usual fix) or
    another dev set changes the digest, so the run starts over instead of resuming epochs 1-4 on
    one labelling and 5-8 on another; the same rows in another folder do not."""
    base, digests = _digests(tmp_path, {
        "train_labels": ("train.tsv", _relabel), "dev_order": ("dev.tsv", lambda r: r[::-1]),
        "dev_shorter": ("dev.tsv", lambda r: r[:-1]), "same": ("train.tsv", list)})
    assert digests.pop("same") == base
    assert {what: d != base for what, d in digests.items()} == dict.fromkeys(digests, True)


def test_the_resume_digest_sees_the_dev_labels(tmp_path):
    """GLUE's dev labels are kept in the scorer, out of the encoded data: a resume after the dev
    labels were corrected mixed two dev sets' epoch scores in one run (EvalSet.truth)."""
    base, digests = _digests(tmp_path, {"dev_labels": ("dev.tsv", _relabel)})
    assert digests["dev_labels"] != base


def test_the_resume_digest_sees_the_dev_labels_of_own_files(tmp_path):
    """classify (labels and regression scores) and ner keep their dev gold out of the encoded
    data too, and set no EvalSet.truth: dev labels corrected after a stop were resumed into,
    results.json then mixing epochs scored on the old labels with epochs on the new."""
    from bertgpu.config.finetune import job_config, load_finetune_config
    from bertgpu.data.tokenizer_folder import load_tokenizer
    from bertgpu.tasks.classify import classify_job
    from bertgpu.tasks.finetune_output import data_digest
    from bertgpu.tasks.ner import ner_job

    init, _ = _tiny_finetune(tmp_path)
    tok, cfg = load_tokenizer(init), job_config(load_finetune_config(None, []), 32, windows=False)
    train = tmp_path / "train.csv"
    train.write_text("text,label\ngood film,pos\nbad film,neg\nfine film,pos\nawful,neg\n")
    scores = tmp_path / "scores.csv"
    scores.write_text("text,label\ngood film,4.5\nbad film,0.5\nfine film,3.0\nawful,1.0\n")
    tags = tmp_path / "train.conll"
    tags.write_text("good B-X\nfilm O\n\nbad O\nfilm B-X\n\n")
    cases = {  # (job of a dev file, dev text, the same text with its gold corrected)
        "classify": (lambda dev: classify_job(train, dev, tok, cfg),
                     "text,label\ngood film,pos\nbad film,neg\n",
                     "text,label\ngood film,neg\nbad film,pos\n"),
        "regression": (lambda dev: classify_job(scores, dev, tok, cfg, regression=True),
                       "text,label\ngood film,4.5\nbad film,0.5\n",
                       "text,label\ngood film,4.0\nbad film,0.5\n"),
        "ner": (lambda dev: ner_job(tags, dev, tok, cfg), "good B-X\nfilm O\n\n",
                "good O\nfilm B-X\n\n"),
    }
    for name, (job, before, after) in cases.items():
        dev = tmp_path / f"{name}_dev{'.conll' if name == 'ner' else '.csv'}"
        dev.write_text(before)
        digest = data_digest(job(dev))
        assert data_digest(job(dev)) == digest, name
        dev.write_text(after)
        assert data_digest(job(dev)) != digest, name

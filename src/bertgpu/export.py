"""Export a run's checkpoint in the Hugging Face layout.

    bertgpu export runs/base --out hf/base              # the latest checkpoint
    bertgpu export runs/base --step 2000 --out hf/base  # a chosen one
    bertgpu export runs/base/checkpoints/step_2000 --out hf/base   # the same, by its folder

The folder holds config.json, model.safetensors and the tokenizer files; it loads with
transformers' AutoModelForPreTraining (or AutoModelForMaskedLM for MLM-only runs),
AutoModelForSequenceClassification / ForQuestionAnswering (fresh heads) and AutoTokenizer.
"""

from __future__ import annotations

import argparse
import re
import warnings
from pathlib import Path

from bertgpu.errors import BertgpuError

_COMPLETE_NOTE = re.compile(r"^step (\d+)$")  # what a checkpoint's COMPLETE file says


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="a pretraining run folder (bertgpu pretrain --out), or "
                        "one of its checkpoint folders (RUN/checkpoints/step_N)")
    parser.add_argument("--out", required=True,
                        help="folder to write (an earlier export there is replaced, the files "
                        "you added to it kept; any other non-empty folder is refused)")
    parser.add_argument("--step", type=int, default=None,
                        help="checkpoint step (default: the latest)")


def export(run_dir: str | Path, out: str | Path, step: int | None = None) -> Path:
    """Write the Hugging Face layout of `run_dir`'s checkpoint `step` (latest if None) to `out`.
    `run_dir` may also be a checkpoint folder (then `step` is None)."""
    return export_step(run_dir, out, step)[0]


def export_step(run_dir: str | Path, out: str | Path,
                step: int | None = None) -> tuple[Path, int | None]:
    """`export`, and the step of the checkpoint it wrote (the newest good one when `step` is
    None: a newer damaged or incomplete one is skipped with a warning; None when a checkpoint
    folder copied out of its run does not say). One command at a time writes `out`
    (locks.output_lock): two exports into one --out shared OUT.tmp, each removing the other's,
    and left config.json of one beside model.safetensors of the other, both saying done."""
    from bertgpu.locks import output_lock

    with output_lock(out, "bertgpu export"):
        return _export_step(Path(run_dir), out, step)


def _export_step(run_dir: Path, out: str | Path, step: int | None) -> tuple[Path, int | None]:
    """`export_step` with `out` locked. The newest checkpoint, picked again when the run removes
    the one picked while it is read (keep_last): a FileNotFoundError traceback before."""
    from bertgpu import fsutil
    from bertgpu.models.hf_export import check_export_folder
    from bertgpu.models.hf_io import is_checkpoint_folder
    from bertgpu.train.checkpoint import CHECKPOINTS

    if run_dir.exists() and not run_dir.is_dir():
        raise BertgpuError(f"{run_dir}: is a file, not a run folder; expected a pretraining run "
                           "folder, or one of its checkpoint folders")
    if not run_dir.is_dir():
        raise BertgpuError(f"{run_dir}: no such run folder")
    _check_not_finetuning(run_dir)
    if is_checkpoint_folder(run_dir):
        return _export_checkpoint_folder(run_dir, out, step)
    check_export_folder(out)
    if fsutil.within(out, run_dir / CHECKPOINTS):
        raise BertgpuError(f"{out}: inside the run's {CHECKPOINTS}/ folder; expected a folder "
                           "outside it (an export there would replace or mix with a checkpoint)")
    if Path(out).resolve() == (run_dir / "hf").resolve():  # a live run writes it at its end
        from bertgpu.train.run_folder import check_run_folder_free

        check_run_folder_free(run_dir)
    if step is not None:
        ckpt = _step_checkpoint(run_dir, step)
        return _write(ckpt, out, run_dir), step
    def newest() -> tuple[Path, int]:
        ckpt = _newest_checkpoint(run_dir)
        return _write(ckpt, out, run_dir), _step_of(ckpt)

    from bertgpu.step_folders import again_if_removed

    return again_if_removed(newest, "exporting the newest checkpoint now")


def _newest_checkpoint(run_dir: Path) -> Path:
    """The newest good checkpoint of `run_dir`; damaged newer ones are warned about."""
    from bertgpu import step_folders
    from bertgpu.models.hf_export import is_model_folder
    from bertgpu.models.hf_io import finetuned_model
    from bertgpu.train.checkpoint import CHECKPOINTS

    ckpt = step_folders.newest_good(run_dir / CHECKPOINTS,
                                    advice="nothing of this run can be exported")
    if ckpt is not None:
        return ckpt
    model = finetuned_model(run_dir)
    if model is not None:
        raise BertgpuError(f"{run_dir}: a fine-tuning output, not a pretraining run; its "
                           f"model {model} is already in the Hugging Face layout (expected "
                           "a pretraining run folder, or one of its checkpoint folders)")
    if is_model_folder(run_dir):
        raise BertgpuError(f"{run_dir}: an export, already in the Hugging Face layout "
                           "(expected a pretraining run folder, or one of its checkpoint "
                           "folders)")
    raise BertgpuError(f"{run_dir}: has no complete checkpoint under {CHECKPOINTS}/ "
                       "(expected a pretraining run folder, or one of its checkpoint folders)")


def _step_checkpoint(run_dir: Path, step: int) -> Path:
    """Checkpoint `step` of `run_dir` (--step), verified; a one-line error naming the complete
    and damaged ones when it is not there."""
    from bertgpu import fsutil, step_folders
    from bertgpu.train.checkpoint import CHECKPOINTS, checkpoint_problem, list_checkpoints

    def damaged(path: Path) -> bool:
        try:
            return checkpoint_problem(path) is not None
        except fsutil.FolderRemoved:  # pruned by the run as it saves: not listed as damaged
            return False

    ckpt = step_folders.step_folder(run_dir / CHECKPOINTS, step)
    if not ckpt.is_dir():
        listed = list_checkpoints(run_dir)
        bad = [s for s, p in listed if damaged(p)]
        steps = ", ".join(str(s) for s, _ in listed if s not in bad) or "none"
        raise BertgpuError(f"{run_dir}: has no checkpoint step_{step} under {CHECKPOINTS}/ "
                           f"(complete ones: {steps}" + (f"; damaged: "
                           f"{', '.join(map(str, bad))})" if bad else ")"))
    problem = checkpoint_problem(ckpt)
    if problem is not None:
        raise BertgpuError(f"{ckpt}: cannot export: {problem}")
    return ckpt


def _write(ckpt: Path, out: str | Path, run: Path | None, given: bool = False) -> Path:
    """Export good checkpoint `ckpt` to `out` with its tokenizer (`_tokenizer_of`; one found
    nowhere is warned about when the checkpoint folder was `given` in place of a run), or raise
    `fsutil.FolderRemoved` when its run removed it while it was read (keep_last; it read as a
    FileNotFoundError traceback, or "incomplete" of a checkpoint that had been complete). The
    tokenizer files of the checkpoint itself are read with its weights, before the check that it
    is still there: a run removes COMPLETE first (`fsutil.remove_dir`)."""
    import shutil
    import tempfile

    from bertgpu import fsutil
    from bertgpu.models.hf_export import save_pretrained
    from bertgpu.models.hf_io import TOKENIZER_FILES, load_pretrained

    with tempfile.TemporaryDirectory(prefix="bertgpu-export-") as held:
        try:
            model = load_pretrained(ckpt, head="pretraining")
            tokenizer = _tokenizer_of(ckpt, run)
            if tokenizer == ckpt:
                for name in TOKENIZER_FILES:
                    if (ckpt / name).is_file():
                        shutil.copyfile(ckpt / name, Path(held) / name)
                tokenizer = Path(held)
        except (BertgpuError, OSError):
            if fsutil.is_complete(ckpt):
                raise
            raise fsutil.FolderRemoved(ckpt) from None
        if not fsutil.is_complete(ckpt):
            raise fsutil.FolderRemoved(ckpt)
        if tokenizer is None and given:
            _warn_no_tokenizer(ckpt, run)
        return save_pretrained(model, out, tokenizer=tokenizer)


def _check_not_finetuning(folder: Path) -> None:
    """A fine-tuning checkpoint (its finetune.json), or a run folder holding them, is refused in
    one line: it read "no tokenizer to export with it", then "no config.json" of a folder that
    is a checkpoint. Its model, head and labels are written to OUT/model when the run ends."""
    from bertgpu.train.checkpoint import CHECKPOINTS

    own = (folder / "finetune.json").is_file()
    if own or any((folder / CHECKPOINTS).glob("step_*/finetune.json")):
        what = "a checkpoint" if own else "the checkpoints of a run"
        raise BertgpuError(f"{folder}: {what} of `bertgpu finetune`, which writes its model "
                           "in the Hugging Face layout to OUT/model when it ends (re-run the same "
                           "finetune command to finish a stopped one); expected a pretraining run "
                           "folder, or one of its checkpoint folders")


def _export_checkpoint_folder(ckpt: Path, out: str | Path,
                              step: int | None) -> tuple[Path, int | None]:
    """A checkpoint folder given in place of its run (as `--init` takes one): verified as export
    --step verifies one, with its run's tokenizer (RUN/tokenizer, two levels up, when it lies in
    a run's checkpoints/ folder) or else its own copy (`_tokenizer_of`)."""
    from bertgpu import fsutil
    from bertgpu.models.hf_export import check_export_folder
    from bertgpu.train.checkpoint import CHECKPOINTS, checkpoint_problem

    if step is not None:
        raise BertgpuError(f"--step {step}: given with the checkpoint folder {ckpt}; expected "
                           "either a run folder and --step, or a checkpoint folder alone")
    in_run = ckpt.parent.name == CHECKPOINTS
    check_export_folder(out)
    if fsutil.within(out, ckpt.parent if in_run else ckpt):
        raise BertgpuError(f"{out}: inside {ckpt.parent if in_run else ckpt}; expected a folder "
                           "outside it (an export there would replace or mix with a checkpoint)")
    problem = checkpoint_problem(ckpt)
    if problem is not None:
        raise BertgpuError(f"{ckpt}: cannot export: {problem}")
    return _write(ckpt, out, ckpt.parent.parent if in_run else None, given=True), _step_of(ckpt)


def _tokenizer_of(ckpt: Path, run: Path | None) -> Path | None:
    """The tokenizer folder that travels with `ckpt`'s export, by `--init`'s rule
    (tasks/init_model.find_tokenizer): its run's own, RUN/tokenizer, else the copy of it the
    checkpoint holds for transformers. A checkpoint copied out of its run, or of a run whose
    tokenizer/ was removed, was exported without one although it held the files, and
    transformers 5 then built an empty 5-token tokenizer from the export: fill-mask gave ''.
    None when neither has one (`_warn_no_tokenizer`)."""
    from bertgpu.tasks.init_model import has_tokenizer

    for folder in ([run / "tokenizer"] if run is not None else []) + [ckpt]:
        if folder.is_dir() and has_tokenizer(folder):
            return folder
    return None


def _warn_no_tokenizer(ckpt: Path, run: Path | None) -> None:
    where = (f"no {run / 'tokenizer'}" if run is not None
             else "it is not in a run's checkpoints/ folder, beside the run's tokenizer/")
    warnings.warn(f"{ckpt}: no tokenizer to export with it ({where}, and it holds no tokenizer "
                  "files); the export has no tokenizer files", stacklevel=5)


def _step_of(ckpt: Path) -> int | None:
    """A checkpoint's step: its folder's name (step_N), else what its COMPLETE file says."""
    from bertgpu import fsutil

    name = ckpt.name.removesuffix(fsutil.OLD)
    if name.startswith("step_") and name[5:].isdigit():
        return int(name[5:])
    try:
        m = _COMPLETE_NOTE.match((ckpt / fsutil.COMPLETE).read_text(encoding="utf-8").strip())
    except (OSError, UnicodeDecodeError):
        return None
    return int(m.group(1)) if m else None


def main(args: argparse.Namespace) -> int:
    folder, step = export_step(args.run_dir, args.out, args.step)
    print(f"exported {args.run_dir}{'' if step is None else f' (step {step})'} -> {folder}")
    return 0

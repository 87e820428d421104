"""Export a run's checkpoint in the Hugging Face layout.

    bertgpu export runs/base --out hf/base              # the latest checkpoint
    bertgpu export runs/base --step 2000 --out hf/base  # a chosen one

The folder holds config.json, model.safetensors and the tokenizer files; it loads with
transformers' AutoModelForPreTraining (or AutoModelForMaskedLM for MLM-only runs),
AutoModelForSequenceClassification / ForQuestionAnswering (fresh heads) and AutoTokenizer.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bertgpu.errors import BertgpuError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="a pretraining run folder (bertgpu pretrain --out)")
    parser.add_argument("--out", required=True,
                        help="folder to write (an earlier export there is replaced; any other "
                        "non-empty folder is refused)")
    parser.add_argument("--step", type=int, default=None,
                        help="checkpoint step (default: the latest)")


def export(run_dir: str | Path, out: str | Path, step: int | None = None) -> Path:
    """Write the Hugging Face layout of `run_dir`'s checkpoint `step` (latest if None) to `out`."""
    return export_step(run_dir, out, step)[0]


def export_step(run_dir: str | Path, out: str | Path, step: int | None = None) -> tuple[Path, int]:
    """`export`, and the step of the checkpoint it wrote (the newest good one when `step` is
    None: a newer damaged or incomplete one is skipped with a warning)."""
    from bertgpu import fsutil
    from bertgpu.models.hf_export import MODEL_FOLDER, is_model_folder, save_pretrained
    from bertgpu.models.hf_io import load_pretrained
    from bertgpu.train.checkpoint import (
        CHECKPOINTS,
        checkpoint_problem,
        latest_checkpoint,
        list_checkpoints,
    )

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise BertgpuError(f"{run_dir}: no such run folder")
    fsutil.check_output_folder(out, MODEL_FOLDER, replaces=is_model_folder)
    if fsutil.within(out, run_dir / CHECKPOINTS):
        raise BertgpuError(f"{out}: inside the run's {CHECKPOINTS}/ folder; expected a folder "
                           "outside it (an export there would replace or mix with a checkpoint)")
    if step is None:
        # the newest good one; damaged newer ones are warned about
        ckpt = latest_checkpoint(run_dir)
        if ckpt is None:
            raise BertgpuError(f"{run_dir}: has no complete checkpoint under {CHECKPOINTS}/")
    else:
        ckpt = fsutil.step_folder(run_dir / CHECKPOINTS, step)
        if not ckpt.is_dir():
            steps = ", ".join(str(s) for s, _ in list_checkpoints(run_dir)) or "none"
            raise BertgpuError(f"{run_dir}: has no checkpoint step_{step} under {CHECKPOINTS}/ "
                               f"(complete ones: {steps})")
        problem = checkpoint_problem(ckpt)
        if problem is not None:
            raise BertgpuError(f"{ckpt}: cannot export: {problem}")
    model = load_pretrained(ckpt, head="pretraining")
    tokenizer = run_dir / "tokenizer"
    folder = save_pretrained(model, out, tokenizer=tokenizer if tokenizer.is_dir() else None)
    return folder, int(ckpt.name.removeprefix("step_").removesuffix(fsutil.OLD))


def main(args: argparse.Namespace) -> int:
    folder, step = export_step(args.run_dir, args.out, args.step)
    print(f"exported {args.run_dir} (step {step}) -> {folder}")
    return 0

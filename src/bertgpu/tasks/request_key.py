"""A finished fine-tuning seen before its data is read and encoded: `request_key` hashes what the
run is made of before any tokenization (the task and its flags, the bytes of the files its task
module reads, the init's weights and config.json, the tokenizer's files, the settings, the
number of processes, the bertgpu version), and results.json records it beside `run_key`
(finetune_output.finished_key). The same command again finds it at once: it tokenized the whole
dataset first (minutes for MNLI or SQuAD), only to say there was nothing to do.

The key is stricter than `run_key` (a run on another number of processes, or a file renamed,
differs here and not there), never looser: where it differs, the run encodes its data and
`run_key` decides, as before."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bertgpu.config.finetune import FinetuneConfig
    from bertgpu.tasks.init_model import InitCheckpoint
    from bertgpu.tasks.job_request import JobRequest


def request_key(request: JobRequest, files: list[Path], init: str, ckpt: InitCheckpoint | None,
                config_from: Any, tok_dir: Path, cfg: FinetuneConfig, max_seq_len: int,
                world_size: int) -> str:
    """The sha256 of a run's inputs as given (`cfg` unresolved: the lr and epochs chosen by
    model size follow from the init's config.json, hashed) on `world_size` processes; `files`:
    what the task module's `input_files` names."""
    from bertgpu import __version__
    from bertgpu.config.overrides import config_to_dict
    from bertgpu.data.tokenizer_folder import TOKENIZER_FILES
    from bertgpu.models.hf_io import resolve_checkpoint_folder
    from bertgpu.tasks.finetune_output import RESUME_NEUTRAL

    model = ckpt.path if ckpt is not None else resolve_checkpoint_folder(config_from)
    fields = {
        "task": request.key, "predict_test": request.predict_test,
        "columns": [request.text_field, request.text_pair_field, request.label_field,
                    request.regression],
        "files": [[str(p.resolve()), _sha256(p)] for p in files],
        "init": init, "init_checkpoint": ckpt.record() if ckpt is not None else None,
        "config_from": str(config_from) if config_from else None,
        "model_config": _sha256(Path(model) / "config.json"),
        "tokenizer": {name: _sha256(tok_dir / name) for name in TOKENIZER_FILES},
        "config": {k: v for k, v in config_to_dict(cfg).items() if k not in RESUME_NEUTRAL},
        "max_seq_len": max_seq_len, "world_size": world_size, "version": __version__,
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def _sha256(path: Path) -> str | None:
    """A file's sha256, None where there is none (a folder without tokenizer.json)."""
    from bertgpu.fsutil import file_sha256

    return file_sha256(path) if path.is_file() else None

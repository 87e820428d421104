"""`bertgpu finetune squad | squad2`: the SQuAD v1.1 / v2.0 job from the official JSON files.

    bertgpu finetune squad --data squad/ --init runs/base --out ft/squad
                                      # (squad/ holds train-v1.1.json, dev-v1.1.json)
    bertgpu finetune squad2 --train-file train-v2.0.json --dev-file dev-v2.0.json --init hf/ \\
        --out ft/sq2

Reading, doc-stride windows and n-best decoding are squad.py's, EM/F1 squad_eval.py's; this module
finds the files, encodes both sets and scores the dev set (writing predictions.json at the end).

SQuAD v2.0 also reports best_exact / best_f1 and the --null_threshold giving each
(best_exact_thresh / best_f1_thresh, as evaluate-v2.0.py with --na-prob-file), and writes beside
predictions.json null_odds.json (question id -> null score - best span score; "" is predicted
when it exceeds --null_threshold) and span_predictions.json (the best span of every question,
the null answer left out). Applying another threshold needs no re-training:

    python evaluate-v2.0.py dev-v2.0.json OUT/span_predictions.json \\
        --na-prob-file OUT/null_odds.json --na-prob-thresh T
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bertgpu.errors import BertgpuError
from bertgpu.tasks import squad, squad_eval
from bertgpu.tasks.finetuning import EvalSet, Job, JobRequest, pad_to, strip_padding

if TYPE_CHECKING:
    from bertgpu.config.finetune import FinetuneConfig

VERSIONS = {"squad": False, "squad1": False, "squad2": True, "squadv2": True}
"""The names this module answers to (tasks/registry.py) -> whether the files are SQuAD v2.0."""
DEFAULT_MAX_SEQ_LEN = 384
"""Tokens per window unless --max_seq_len (BERT's SQuAD setting), capped at the model's
max_position_embeddings (finetune.py)."""


def check_request(request: JobRequest) -> None:
    """No own-file flags (SQuAD's JSON fixes its fields) and no --predict-test (GLUE's: SQuAD's
    test set is not public, so a run ignored the flag without a word); a file given is a file;
    --data only for a file not given (with both, it would be read by nothing)."""
    request.check_no_columns()
    if request.predict_test:
        raise BertgpuError(f"finetune {request.task}: takes --data or --train-file and "
                           "--dev-file (not --predict-test: SQuAD has no public test set, "
                           "the flag is for GLUE tasks)")
    if request.data is not None and None not in (request.train_file, request.dev_file):
        raise BertgpuError(f"finetune {request.task}: --data with both --train-file and "
                           "--dev-file would be unused; give the folder or the two files")
    for flag, given in (("--train-file", request.train_file), ("--dev-file", request.dev_file)):
        if given is not None and Path(given).is_dir():
            raise BertgpuError(f"{given}: is a folder, expected a SQuAD JSON file ({flag})")


def build_job(request: JobRequest, tokenizer: Any,
              cfg: FinetuneConfig) -> tuple[Job, dict[str, Any]]:
    """The job of --train-file / --dev-file, or of the official file names under --data."""
    check_request(request)
    version_2 = VERSIONS[request.key]
    train_file, dev_file = _files(request.data, version_2, request.train_file, request.dev_file)
    job = squad_job(version_2, train_file, dev_file, tokenizer, cfg)
    return job, {"data": [str(train_file), str(dev_file)], "task_key": request.key}


def input_files(request: JobRequest) -> list[Path]:
    """The files `build_job` reads (finetune.py hashes them before anything is encoded)."""
    return list(_files(request.data, VERSIONS[request.key], request.train_file,
                       request.dev_file))


def _files(data: str | os.PathLike[str] | None, v2: bool, train_file: str | os.PathLike[str] | None,
           dev_file: str | os.PathLike[str] | None) -> tuple[Path, Path]:
    """Each file as given, else `{split}-v1.1.json` (v2.0) in `data`."""
    ver = "v2.0" if v2 else "v1.1"
    paths = []
    for given, split in ((train_file, "train"), (dev_file, "dev")):
        if given is not None:
            paths.append(Path(given))
            continue
        if data is None:
            raise BertgpuError(f"SQuAD {ver}: give --data FOLDER (with {split}-{ver}.json) or "
                               f"--{split}-file")
        path = Path(data) / f"{split}-{ver}.json"
        if not path.is_file():
            raise BertgpuError(f"{path}: not found (expected the official SQuAD {ver} "
                               f"{split} file)")
        paths.append(path)
    return paths[0], paths[1]


def squad_job(version_2: bool, train_file: Path, dev_file: Path, tokenizer: Any,
              cfg: FinetuneConfig) -> Job:
    """Read and featurize both files; the dev set is scored with the official EM/F1."""
    from bertgpu.config.finetune import window_stride

    seq = cfg.max_seq_len or DEFAULT_MAX_SEQ_LEN
    tokenizer.no_truncation()
    tokenizer.no_padding()
    # the stride job_config resolved (the same again), or the default's for an unresolved cfg;
    # None: featurize picks it per question (results.json says how: config.finetune.doc_stride)
    kw = {"max_seq_len": seq, "doc_stride": window_stride(cfg, seq),
          "max_query_len": cfg.max_query_len}
    train_ex = squad.read_squad(train_file, version_2)[:cfg.max_train_examples]
    dev_ex = squad.read_squad(dev_file, version_2)[:cfg.max_eval_examples]
    if not version_2:  # v1.1 has an answer to every question; its scoring needs one
        for path, examples in ((train_file, train_ex), (dev_file, dev_ex)):
            impossible = [e.id for e in examples if e.is_impossible]
            if impossible:
                raise BertgpuError(f"{path}: {len(impossible)} questions without answers "
                                   "(is_impossible) are SQuAD v2.0: use finetune squad2 "
                                   f'(the first: id "{impossible[0]}")')
    train_feats = squad.featurize(train_ex, tokenizer, is_training=True, **kw)
    if len(train_feats) == 0:
        raise BertgpuError(f"{train_file}: no training features (every answer outside "
                           "its context?)")
    dev_feats = squad.featurize(dev_ex, tokenizer, **kw)

    def score(outputs: dict[str, np.ndarray], folder: Path | None) -> dict[str, float]:
        # Logits come back padded per batch; postprocess expects (F, max_seq_len). It takes its
        # candidates among each feature's context tokens only, so the values at the padding (the
        # model's own, or pad_to's) never matter.
        start, end = (pad_to(outputs[k], seq) for k in ("start_logits", "end_logits"))
        preds, nbest = squad.postprocess(dev_ex, dev_feats, start, end, n_best=cfg.n_best,
                                         max_answer_len=cfg.max_answer_len, version_2=version_2,
                                         null_threshold=cfg.null_threshold)
        metrics = squad_eval.squad_evaluate(dev_ex, preds, version_2=version_2)
        if version_2:
            # The threshold need not be chosen before training: the best span of every question
            # (kept where the null answer won) and its null odds let any threshold be applied
            # afterwards, here to find the best, and by evaluate-v2.0.py to the files.
            spans, odds = squad_eval.null_odds(nbest)
            metrics.update(squad_eval.best_thresholds(dev_ex, spans, odds))
        if folder is not None:
            squad.write_predictions(preds, folder / "predictions.json")
            if version_2:
                squad.write_predictions(odds, folder / "null_odds.json")
                squad.write_predictions(spans, folder / "span_predictions.json")
        return metrics

    name = "SQuAD v2.0" if version_2 else "SQuAD v1.1"
    return Job(name, "qa", None, strip_padding(train_feats),
               [EvalSet("dev", strip_padding(dev_feats), score,
                        truth=json.dumps([[e.id, e.answers] for e in dev_ex]).encode())],
               lambda m: float(m["dev"]["f1"]))

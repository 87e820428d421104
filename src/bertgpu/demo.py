"""The whole pipeline, tiny, offline, on a CPU in a few minutes:

    bertgpu demo --out demo_out        # (make demo does this in a fresh virtual environment)

1. tokenizer  WordPiece on a real Wikipedia sample (106 articles shipped in gensim's test data)
2. prepare    stream the XML dump into token shards (MLM, packed 128-token sequences)
3. pretrain   configs/modern-tiny.toml: a 3-layer ModernBERT-style encoder (the recipe that
              reaches the lower held-out loss in the same CPU minutes: `bertgpu bench quality`)
4. export     the Hugging Face layout, loaded back through transformers for fill-in-the-blank
5. finetune   the real labelled sets in gensim's test data (polarity sentences as an SST-2-style
              task, Lee document similarity as an STS-B-style task), pretrained vs random init

Every stage is the same code path as the corresponding `bertgpu` command. Re-running the demo
resumes: stages 1 and 2 are kept once done, pretraining resumes from its newest checkpoint, a
fine-tuning run stopped part-way from its own, and a finished one from the same export and
settings is kept (bench/downstream.py). A stop signal (SIGTERM, Ctrl-C, a closed terminal's
SIGHUP) ends the demo as a stop, not an error: one line names the stage it stopped and says how
to resume, exit status 143 (130 for SIGINT, 129 for SIGHUP).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from bertgpu import errors
from bertgpu.bench.cells import positive
from bertgpu.config.sections import seed_number
from bertgpu.errors import BertgpuError
from bertgpu.fsutil import check_not_cwd, check_output_folder, check_replaceable
from bertgpu.locks import output_lock
from bertgpu.stops import stop_signal

ROOT = Path(__file__).resolve().parents[2]
RECIPE = "modern-tiny.toml"

FILL_MASK_SENTENCES = [
    "the city is the [MASK] of the province.",
    "he was born in [MASK] and studied law.",
    "the war ended in [MASK].",
    "she is an american [MASK] and writer.",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="demo_out",
                        help="folder for everything the demo writes (default: demo_out)")
    parser.add_argument("--steps", type=positive(int), default=None,
                        help="pretraining steps (default: the recipe's)")
    parser.add_argument("--vocab-size", type=positive(int), default=8192,
                        help="WordPiece vocabulary size (default: 8192)")
    parser.add_argument("--skip-finetune", action="store_true",
                        help="stop after export and fill-mask")
    parser.add_argument("--seeds", type=seed_number, nargs="+", default=[0, 1, 2],
                        help="fine-tuning seeds (default: 0 1 2)")
    parser.add_argument("--fresh", action="store_true",
                        help="delete --out first (otherwise stages resume)")


class StageStopped(Exception):
    """A stop signal ended a stage's run (it kept a checkpoint to resume from): the demo ends
    with the run's exit status (143 for SIGTERM, 130 for SIGINT) and one line, not an error."""

    def __init__(self, status: int, what: str) -> None:
        super().__init__(what)
        self.status = status


def _stage(title: str, begun: list[str]) -> float:
    """Say that stage `title` begins (`begun`: the titles so far, which a stop names)."""
    begun.append(title)
    print(f"\n=== {title} " + "=" * max(0, 70 - len(title)), flush=True)
    return time.perf_counter()


def _signal_name(status: int) -> str:
    try:
        return signal.Signals(status - 128).name
    except ValueError:
        return f"exit status {status}"


def _finetune_stage(hf_dir: Path, folder: Path, seeds: list[int]) -> str:
    """Stage 5's table; StageStopped when a stop signal ended one of its fine-tuning runs."""
    from bertgpu.bench.downstream import RunStopped

    try:
        return finetune_table(hf_dir, folder, seeds, _recipe().stem)
    except RunStopped as e:
        raise StageStopped(e.status, str(e)) from None


def _done(t0: float) -> None:
    print(f"    ({time.perf_counter() - t0:.1f} s)", flush=True)


def _recipe() -> Path:
    """The demo's recipe, configs/modern-tiny.toml, from the source tree."""
    candidate = ROOT / "configs" / RECIPE
    if candidate.is_file():
        return candidate
    raise BertgpuError(f"configs/{RECIPE}: not found next to the package; run the demo from a "
                       "source checkout")


def _train_curve(run_dir: Path) -> list[dict[str, Any]]:
    from bertgpu.telemetry.records import read_metrics

    return read_metrics(run_dir / "metrics.jsonl", drop_superseded=True)


def fill_mask(hf_dir: Path, sentences: list[str], top_k: int = 3) -> list[tuple[str, list[str]]]:
    """Top-k predictions for each [MASK], through transformers (independent of our model code)."""
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    # a weight-loading bar per call would clutter the demo's output
    hf_logging.disable_progress_bar()
    tok = AutoTokenizer.from_pretrained(hf_dir)
    model = AutoModelForMaskedLM.from_pretrained(hf_dir).eval()
    results = []
    for text in sentences:
        enc = tok(text, return_tensors="pt")
        with torch.no_grad():
            logits = model(**enc).logits[0]  # (T, V)
        where = (enc["input_ids"][0] == tok.mask_token_id).nonzero().flatten()
        if len(where) == 0:
            continue
        # a model vocabulary larger than the tokenizer's (--vocab-size past what the corpus
        # gives) has rows no token names: predictions among the tokenizer's ids only
        top = logits[where[0], :len(tok)].topk(top_k).indices.tolist()
        results.append((text, [tok.convert_ids_to_tokens(i) for i in top]))
    return results


def finetune_table(hf_dir: Path, out: Path, seeds: list[int], name: str) -> str:
    """Fine-tune the exported model and a randomly initialised twin (same architecture, fresh
    weights) on the real labelled sets in gensim's test data once per seed; a markdown table of
    the dev scores (median and min-max over seeds), the benefit and the seed spread. The rows are
    `bertgpu bench quality`'s, rendered by the same function."""
    from bertgpu.bench.quality import DEMO_SETS, compare_downstream
    from bertgpu.report.quality import comparisons, downstream_table
    from bertgpu.report.render import render_markdown

    rows = compare_downstream({name: hf_dir}, list(DEMO_SETS), seeds, out)
    header, cells = downstream_table(rows)
    verdicts = comparisons(rows)
    beats = sum(bool(c.get("beats_spread")) for c in verdicts)
    text = render_markdown([("table", header, cells)]).rstrip()
    sizes = {r["task"]: f"{r['train_examples']} train, {r['dev_examples']} dev" for r in rows}
    if len(seeds) == 1:  # no spread measured: nothing to call noise or a benefit
        said = (f"    Seed {seeds[0]} alone measures no seed spread: a difference may be noise. "
                "Give --seeds 0 1 2 to\n    measure one.")
    else:
        said = (f"    Seeds {', '.join(map(str, seeds))} change the fresh head (and the twin's "
                "weights) and the data order; the\n"
                "    seed spread is the larger max - min of the two rows. Pretraining beats its "
                "random twin by more than the\n"
                f"    spread on {beats} of {len(verdicts)} sets."
                + ("" if beats == len(verdicts) else
                   " At this size and budget (a tiny model, a few CPU minutes on 106 articles) a\n"
                   "    difference within the spread is seed noise, not a benefit; what the "
                   "minutes bought is the held-out MLM\n"
                   "    loss above. `bertgpu bench quality` measures both for any recipes and "
                   "corpus, on a GPU too."))
    return "\n".join([
        f"    polarity: movie-review sentences, positive or negative ({sizes['polarity']}), scored "
        "like SST-2",
        f"    lee: similarity of 50 news documents, pairs rated by people ({sizes['lee']}), scored "
        "like STS-B",
        "",
        *("    " + line for line in text.splitlines()),
        "",
        said,
    ])


def _tokenizer_and_shards(wiki: Path, tok_dir: Path, data_dir: Path, vocab_size: int,
                          begun: list[str]) -> None:
    """Stages 1 and 2. Run again, each finds its output made from the same corpus and settings
    and does nothing (the demo resumes); one of other settings, or not a demo's, is an error
    naming it (it was used as it was: another vocabulary's, then a traceback). A folder of a
    bertgpu that kept no record of its making (trained-from.json, prepared-from.json) is taken
    as it is, as then."""
    from bertgpu.data.prepare import prepare
    from bertgpu.data.rerun import PREPARED, TRAINED
    from bertgpu.data.tokenizer import train_tokenizer

    t0 = _stage(f"1. bertgpu tokenizer --vocab-size {vocab_size}", begun)
    if not (tok_dir / "vocab.txt").is_file() or (tok_dir / TRAINED).is_file():
        _as_demo(lambda: train_tokenizer([wiki], tok_dir, vocab_size=vocab_size))
    print(f"    {tok_dir}: "
          f"{sum(1 for _ in open(tok_dir / 'vocab.txt', encoding='utf-8')):,} WordPieces")
    _done(t0)

    t0 = _stage("2. bertgpu prepare --objective mlm --seq-len 128", begun)
    if not (data_dir / "manifest.json").is_file() or (data_dir / PREPARED).is_file():
        _as_demo(lambda: prepare([wiki], tok_dir, data_dir, seq_len=128, objective="mlm",
                                 validation_fraction=0.05))
    manifest = json.loads((data_dir / "manifest.json").read_text())
    splits = manifest["splits"]
    print(f"    {manifest['counts']['documents']} documents -> {splits['train']['sequences']:,} "
          f"train / {splits['validation']['sequences']:,} validation sequences of "
          f"{manifest['seq_len']} tokens")
    _done(t0)


def _as_demo(stage: Any) -> None:
    """A stage's refusal of the folder it finds, with the demo's way out: the command's own
    (remove the folder, --overwrite) do not fit a demo folder (`bertgpu demo` has no
    --overwrite, and removing only tokenizer/ then refused data/)."""
    try:
        stage()
    except BertgpuError as exc:
        raise BertgpuError(f"{errors.one_line(exc)}; this demo folder was made otherwise: give "
                           "--fresh to start it afresh, or another --out") from None


def _pretraining_table(run_dir: Path) -> str:
    """The first train record and every evaluation of the run, as a markdown table."""
    curve = _train_curve(run_dir)
    train = [r for r in curve if r["kind"] == "train"]
    evals = [r for r in curve if r["kind"] == "eval"]
    lines = ["", "    how pretraining went (metrics.jsonl):",
             "    | step | train MLM loss | train MLM acc | val MLM loss | val MLM acc |",
             "    |---:|---:|---:|---:|---:|"]
    by_step = {r["step"]: r for r in evals}
    shown = [train[0]] + [r for r in train[1:] if r["step"] in by_step] if train else []
    for r in shown:
        e = by_step.get(r["step"], {})
        val_loss = f"{e['val_mlm_loss']:.3f}" if "val_mlm_loss" in e else ""
        val_acc = f"{e['val_mlm_acc']:.1%}" if "val_mlm_acc" in e else ""
        lines.append(f"    | {r['step']} | {r['loss']:.3f} | {r.get('mlm_acc', 0):.1%} | "
                     f"{val_loss} | {val_acc} |")
    return "\n".join(lines)


DEMO_ENTRIES = ("tokenizer", "data", "run", "finetune")


def is_demo_output(folder: Path) -> bool:
    """Everything in `folder` is what a demo writes (its stages' folders, their .tmp and .old)."""
    return all(e.name.removesuffix(".tmp").removesuffix(".old") in DEMO_ENTRIES
               for e in Path(folder).iterdir())


def _check_transformers() -> None:
    """Stage 4 loads the export through transformers (an independent reader of our files), so
    the demo needs it: refused before stage 1 rather than after minutes of pretraining."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise BertgpuError("demo: stage 4 (fill-mask) loads the exported model through "
                           "transformers, which is not installed; expected `pip install "
                           "'bertgpu[demo]'` (or `pip install transformers`)") from None


def main(args: argparse.Namespace) -> int:
    if len(set(args.seeds)) != len(args.seeds):  # one run counted twice: a spread of 0
        raise BertgpuError(f"--seeds {' '.join(map(str, args.seeds))}: each seed once")
    _check_transformers()
    out = Path(args.out)
    check_output_folder(out)
    # OUT.bertgpu-lock, beside the folder: a second demo into it is refused (its --fresh deleted
    # the first's folder mid-run); the stages lock their own subfolders inside it
    with output_lock(out, "bertgpu demo"):
        if args.fresh and out.exists():
            check_not_cwd(out)  # --fresh deletes the folder
            check_replaceable(out, is_demo_output, "a demo folder (only tokenizer/, data/, run/ "
                              "and finetune/ in it), which --fresh deletes")
            shutil.rmtree(out)
        out.mkdir(parents=True, exist_ok=True)
        return _run_stages_or_say_stop(args, out)


def _run_stages_or_say_stop(args: argparse.Namespace, out: Path) -> int:
    """The stages; a stop signal, or a stage stopped by one, ends the demo in one line that
    names the stage and says how to resume."""
    begun: list[str] = []
    try:
        return _run_stages(args, out, begun)
    except (StageStopped, KeyboardInterrupt) as e:  # SIGTERM and SIGHUP raise KeyboardInterrupts
        status = e.status if isinstance(e, StageStopped) else 128 + stop_signal(e)
        # "3. bertgpu pretrain configs/..." -> "stage 3 (bertgpu pretrain"
        number, command = (begun[-1].split(". ", 1) + [""])[:2] if begun else ("0", "")
        where = f"stage {number} ({' '.join(command.split()[:2])}"
        where += f": {e})" if isinstance(e, StageStopped) else ")"
        again = " (without --fresh)" if args.fresh else ""
        print(f"bertgpu demo: stopped by {_signal_name(status)} in {where}; run the same "
              f"bertgpu demo command again{again} to resume: the stages done are kept",
              file=sys.stderr, flush=True)
        return status


def _run_stages(args: argparse.Namespace, out: Path, begun: list[str]) -> int:
    from bertgpu import pretrain
    from bertgpu.config import schema
    from bertgpu.data.corpus import WIKI_SAMPLE, gensim_test_data

    t_all = time.perf_counter()
    wiki = gensim_test_data(WIKI_SAMPLE)
    print(f"corpus: {wiki.name} ({wiki.stat().st_size / 1e6:.1f} MB bz2, real English Wikipedia)")

    tok_dir, data_dir, run_dir = out / "tokenizer", out / "data", out / "run"
    _tokenizer_and_shards(wiki, tok_dir, data_dir, args.vocab_size, begun)

    t0 = _stage(f"3. bertgpu pretrain configs/{RECIPE}", begun)
    overrides = ["--data", str(data_dir), "--out", str(run_dir),
                 "--model.vocab_size", str(args.vocab_size)]
    if args.steps is not None:
        overrides += ["--train.max_steps", str(args.steps)]
    cfg = schema.load_config(_recipe(), overrides)
    result = pretrain.run(cfg)
    if result.preempted:  # it said which checkpoint it kept; there is no export to go on with
        raise StageStopped(result.exit_status, f"pretraining at step {result.step}, in {run_dir}")
    _done(t0)

    print(_pretraining_table(run_dir))

    hf_dir = result.export_dir or run_dir / "hf"
    t0 = _stage("4. bertgpu export -> transformers AutoModelForMaskedLM fill-mask", begun)
    for text, top in fill_mask(hf_dir, FILL_MASK_SENTENCES):
        print(f"    {text:<45} -> {', '.join(top)}")
    _done(t0)

    if not args.skip_finetune:
        t0 = _stage("5. bertgpu finetune on gensim's labelled sets: pretrained vs random init",
                    begun)
        print(_finetune_stage(hf_dir, out / "finetune", args.seeds))
        _done(t0)

    print(f"\ndemo finished in {time.perf_counter() - t_all:.0f} s; everything is under {out}/")
    print(f"  tokenizer {tok_dir}/  shards {data_dir}/  run {run_dir}/  Hugging Face "
          f"export {hf_dir}/")
    return 0

"""`bertgpu report`: a markdown (and optionally HTML) page with tables and plots of runs and
evaluations.

    bertgpu report runs/base runs/large eval/glue bench.jsonl --out report/ --format both

Each PATH is one of (recognised in this order):

- a GLUE folder (``glue_results.json``, from ``bertgpu glue``): scores per task column with the
  folder's protocol and average convention, published rows quoted with their sources, a bar chart;
  one without its table yet (``bertgpu glue`` interrupted or still running): its TASK/seed_N runs
  so far, each as the fine-tuning run below (finished or in progress), and a line saying so;
- a fine-tuning folder (``results.json``, from ``bertgpu finetune``): scores, curves per epoch;
  a fine-tuning run still in progress (``OUT.tmp``, which ``OUT`` falls back on as ``bertgpu
  watch`` does; told from a pretraining run by its marks, ``inputs.finetune_in_progress``): the
  same row from its records, with the score of its latest evaluation and how far it got;
- a pretraining run folder (``metrics.jsonl``, ``config.toml``): a summary table (how the run
  ended, steps, tokens, final losses, throughput, the device, MFU and the peak it is over,
  memory, wall time) and loss / accuracy / lr / tokens/s plots with all runs on the same axes;
  with the GPU monitor's ``gpu.jsonl``, per-GPU temperature, utilisation, power and clock plots
  and a per-GPU table (throttling included); with per-rank compute times in the train records
  (``rank_compute_s``), each rank's compute time per step (table and plot);
- a bench result file (``*.jsonl`` from ``bertgpu bench model|scaling``, or the ``*.csv`` that
  ``bench model --out FILE.csv`` writes; a bench suite's --out folder reads as the result file
  it holds): its rows as a table (`bench model`'s as its own table, report/bench_rows.py), and
  tokens/s per configuration, or tokens/s against workers with the ideal linear line (one table
  and plot per bench run that appended to a scaling file);
- a quality benchmark file (``quality.jsonl`` from ``bertgpu bench quality``): per recipe the
  pretraining numbers and held-out MLM loss, pretrained vs random init downstream (median and
  seed spread), the GPU projection, and validation loss against wall-clock and tokens;
- a fine-tuning scaling file (``finetune_scaling.jsonl`` from ``bertgpu bench finetune-scaling``):
  per cell (workers x aggregation x optimizer x seed) train, load and evaluation time, speedup and
  efficiency at the same global batch, the dev metric and time to target; the dev metric against
  aggregation and efficiency against workers.

``OUT/README.md`` holds the report, ``OUT/index.html`` the same as one self-contained page (the
plots embedded in it: the page alone can be copied), and the plots are PNG files next to them
(the markdown links them). OUT is written as ``OUT.tmp`` and renamed into place, replacing an
existing report. Missing keys and null (NaN) values are skipped, never plotted as zeros. The
plots need matplotlib (`pip install 'bertgpu[report]'`): without it a report that would draw one
is refused in one line and nothing is written (inputs without plots, such as `bench model
--strategy` rows, are reported).

The package: ``inputs`` (reading and the run summary), ``sections`` (runs, fine-tuning, GLUE),
``bench_results`` (bench result files), ``formats`` (numbers in tables), ``quality`` (bench
quality), ``system`` (GPUs and ranks), ``plots`` (matplotlib helpers), ``fonts`` (a fallback
font for characters matplotlib's default lacks, such as CJK run names), ``finetune_scaling``
(bench finetune-scaling), ``render`` (markdown, HTML).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bertgpu.errors import BertgpuError
from bertgpu.fsutil import check_output_folder, make_scratch, remove_marked, replace_dir, within
from bertgpu.locks import output_lock
from bertgpu.report.bench_results import bench_section
from bertgpu.report.finetune_scaling import study_blocks
from bertgpu.report.fonts import glyph_notice
from bertgpu.report.inputs import Source, load_sources
from bertgpu.report.quality import quality_blocks
from bertgpu.report.render import Block, render_html, render_markdown
from bertgpu.report.sections import finetune_section, glue_section, pretrain_section
from bertgpu.report.system import system_section

__all__ = ["add_arguments", "build_report", "main"]

FORMATS = ("md", "html", "both")


def _unique_names(sources: list[Source]) -> None:
    """Label each source by its folder name, adding its parent folders' names, one at a time, to
    the names still alike until no two are: the demo's .../pretrained/lee/seed_0 and
    .../random/lee/seed_0 need two (with one, both read "lee/seed_0" in every table and legend)."""
    base = {id(s): s.name for s in sources}
    # the folders above the name's own parts (a GLUE run's name is already TASK/seed_N)
    above = {id(s): s.path.resolve().parts[:-len(Path(s.name).parts) or None] for s in sources}
    depth = dict.fromkeys(base, 0)
    while True:
        by_name: dict[str, list[Source]] = {}
        for s in sources:
            by_name.setdefault(s.name, []).append(s)
        alike = [s for group in by_name.values() if len(group) > 1 for s in group
                 if depth[id(s)] < len(above[id(s)]) - 1]  # (not up to the root: "/")
        if not alike:
            return
        for s in alike:
            depth[id(s)] += 1
            s.name = "/".join([*above[id(s)][-depth[id(s)]:], base[id(s)]])


def build_report(paths: list[Path], out: Path, fmt: str = "md") -> Path:
    """Write the report of ``paths`` into ``out`` (README.md and/or index.html, PNG plots) and
    return ``out``. Raises BertgpuError naming any path that is not a known input."""
    if fmt not in FORMATS:
        raise BertgpuError(f"--format: found {fmt!r}, expected one of {', '.join(FORMATS)}")
    if not paths:
        raise BertgpuError("report: no inputs; expected run folders, GLUE/fine-tuning folders "
                           "or bench .jsonl files")
    out = Path(out)
    check_output_folder(out, REPORT_FOLDER, replaces=is_report)
    for p in paths:
        if within(Path(p), out) or within(out, Path(p)):
            raise BertgpuError(f"{out}: overlaps the input {p}; expected a separate output folder")
    sources, notes = [], []
    for p in paths:
        found, partial_glue = load_sources(p)
        seen = {s.path.resolve() for s in sources}  # an input given twice (or as run and file)
        found = [s for s in found if s.path.resolve() not in seen]
        sources += found
        if partial_glue and found:  # a GLUE folder without its table yet
            runs = f"its {len(found)} runs so far are" if len(found) > 1 else "its run so far is"
            notes.append(f"`{p}` has no GLUE table yet (`bertgpu glue` has not finished): "
                         f"{runs} below as fine-tuning runs.")
    _unique_names(sources)

    # one report at a time writes OUT (through OUT.tmp): two crashed on each other's files
    # (the characters no installed font has: one line for the whole report, report/fonts.py)
    with output_lock(out, "bertgpu report"), glyph_notice():
        return _write(sources, notes, out, fmt)


def _write(sources: list[Source], notes: list[str], out: Path, fmt: str) -> Path:
    """The report's blocks, rendered into OUT.tmp, which then replaces OUT."""
    tmp = make_scratch(out.with_name(out.name + ".tmp"), out)  # (one of an interrupted report)
    try:
        blocks: list[Block] = [
            ("h1", "bertgpu report"),
            ("p", f"Generated {time.strftime('%Y-%m-%d %H:%M')} from: "
                  + ", ".join(f"`{s.path}`" for s in sources) + "."),
            *(("p", note) for note in notes),
        ]
        by_kind = {k: [s for s in sources if s.kind == k] for k in ("pretrain", "finetune", "glue")}
        if by_kind["pretrain"]:
            blocks += pretrain_section(by_kind["pretrain"], tmp)
            blocks += system_section(by_kind["pretrain"], tmp)
        if by_kind["glue"]:
            blocks += glue_section(by_kind["glue"], tmp)
        if by_kind["finetune"]:
            blocks += finetune_section(by_kind["finetune"], tmp)
        for i, s in enumerate(s for s in sources if s.kind == "bench"):
            blocks += bench_section(s, tmp, i)
        for i, s in enumerate(s for s in sources if s.kind == "quality"):
            blocks += quality_blocks(s.data, tmp, f"quality{i}")
        for i, s in enumerate(s for s in sources if s.kind == "finetune-scaling"):
            blocks += study_blocks(s.data, tmp, f"finetune_scaling{i}")
        if fmt in ("md", "both"):
            (tmp / "README.md").write_text(render_markdown(blocks), encoding="utf-8")
        if fmt in ("html", "both"):
            (tmp / "index.html").write_text(render_html(blocks, tmp), encoding="utf-8")
    except BaseException:
        remove_marked(tmp)
        raise
    return replace_dir(tmp, out, replaces=is_report, what=REPORT_FOLDER)


REPORT_FOLDER = "a report folder (README.md or index.html of bertgpu report)"


def is_report(folder: Path) -> bool:
    """An earlier report, which a new one replaces: its README.md or index.html says so."""
    for name, head in (("README.md", "# bertgpu report"), ("index.html", "<title>bertgpu report")):
        try:
            with open(Path(folder) / name, encoding="utf-8") as f:
                if head in f.read(4096):
                    return True
        except (OSError, UnicodeDecodeError):
            pass
    return False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", type=Path, metavar="PATH",
                        help="pretraining run folders, fine-tuning or GLUE output folders, "
                             "bench result .jsonl files (or bench model's .csv) (any mix)")
    parser.add_argument("--out", type=Path, default=Path("report"),
                        help="output folder: a new or empty one, or an earlier report, which "
                             "is replaced; any other folder is refused (default: report/)")
    parser.add_argument("--format", choices=FORMATS, default="md",
                        help="README.md, index.html, or both (default: md)")


def main(args: argparse.Namespace) -> int:
    out = build_report(list(args.paths), args.out, args.format)
    files = sorted(p.name for p in out.iterdir())
    print(f"report: wrote {out}/ ({', '.join(files)})", flush=True)
    return 0


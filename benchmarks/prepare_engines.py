"""`bertgpu prepare` on the local engine and on Ray: tokens/s side by side, the projection to N
machines from the per-unit times, and worker memory as a Parquet corpus grows.

    .venv/bin/python benchmarks/prepare_engines.py                         # 10 MB, 100 MB, 1 GB
    .venv/bin/python benchmarks/prepare_engines.py --sizes-mb 10 100 --compare-mb 100

The corpus is real English (Wikipedia's 106 articles from gensim's test data, else Python's
reference topics), one article per row of a Parquet file (uncompressed, row groups of
--row-group-mb) of each size in --sizes-mb. Each case runs in a fresh process: `prepare` with
--workers W on the local engine (this process reads, a pool of W processes tokenizes) and on a
local Ray cluster of W CPUs (each work unit a task; cluster start-up timed apart).

- Overhead of the engine: tokens/s of ray / local on the --compare-mb file, same machine, same
  run, and the bytes of both outputs compared (they must be identical).
- Projection: from the Ray run's per-unit seconds (one core each) a corpus of --project-gb on N
  machines of --cores cores takes ceil(units / (N x cores)) x mean unit time + the driver's own
  time (planning, sealing) measured here; the overhead of Ray per task is inside the unit times.
- Memory: for each size, the peak RSS of the Ray workers (the largest VmHWM any unit reported)
  and of the local engine's processes (main: VmHWM; pool: the largest ru_maxrss).

Results on the project's 2-core machine are in README.md, "Corpora larger than one machine".
Run nothing else meanwhile: on 2 cores a concurrent job changes the engines' ratio (a loaded run
once showed Ray 2.64x local on 100 MB; idle, it is 0.73x).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
args = json.loads(sys.argv[1])
from bertgpu.data.prepare import prepare
ray_start = 0.0
if args["engine"] == "ray":
    import logging, ray
    t = time.perf_counter()
    ray.init(num_cpus=args["workers"], include_dashboard=False, log_to_driver=False,
             logging_level=logging.ERROR)
    ray_start = time.perf_counter() - t
report = {}
start = time.perf_counter()
m = prepare([args["corpus"]], args["tok"], args["out"], workers=args["workers"],
            engine=args["engine"], seq_len=128, unit_bytes=args["unit_bytes"], report=report)
seconds = time.perf_counter() - start
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
units = report["units"]
print(json.dumps({"seconds": seconds, "ray_start": ray_start, "tokens": m["counts"]["tokens"],
                  "units": [[u["seconds"], u["bytes"], u["peak_rss_kb"]] for u in units],
                  "main_mb": hwm / 1024, "pool_mb": kids / 1024}))
"""


def texts() -> list[str]:
    try:
        from bertgpu.data.corpus import WIKI_SAMPLE, gensim_test_data, iter_documents

        return [" ".join(d) for d in iter_documents([gensim_test_data(WIKI_SAMPLE)])]
    except Exception:  # noqa: BLE001 - no gensim: Python's own documentation
        from pydoc_data.topics import topics

        return [" ".join(t.split()) for t in topics.values()]


def write_parquet(path: Path, docs: list[str], mb: int, row_group_mb: int) -> None:
    """One document per row, cycling the documents (numbered, so rows differ) to ``mb`` MB."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    target, group = mb * 1_000_000, row_group_mb * 1_000_000
    schema = pa.schema([("id", pa.int64()), ("text", pa.string())])
    with pq.ParquetWriter(path, schema, compression="none") as writer:
        written, i = 0, 0
        while written < target:
            rows, size = [], 0
            while size < min(group, target - written):
                doc = f"{i}. {docs[i % len(docs)]}"
                rows.append(doc)
                size += len(doc.encode())
                i += 1
            writer.write_table(pa.table({"id": list(range(i - len(rows), i)), "text": rows},
                                        schema=schema))
            written += size


def run(engine: str, corpus: Path, tok: Path, out: Path, workers: int, unit_bytes: int) -> dict:
    arg = json.dumps({"engine": engine, "corpus": str(corpus), "tok": str(tok), "out": str(out),
                      "workers": workers, "unit_bytes": unit_bytes})
    proc = subprocess.run([sys.executable, "-c", CHILD, arg], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{engine} on {corpus.name} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def same_bytes(a: Path, b: Path) -> bool:
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    return files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file()) and all(
        (a / f).read_bytes() == (b / f).read_bytes() for f in files)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--compare-mb", type=int, default=100)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--unit-bytes", type=int, default=64 << 20)
    parser.add_argument("--row-group-mb", type=int, default=8)
    parser.add_argument("--project-gb", type=float, default=20.0,
                        help="corpus of the projection (BERT's 3.3 B words: about 20 GB)")
    parser.add_argument("--cores", type=int, default=32, help="cores per machine (projection)")
    parser.add_argument("--memory-engines", nargs="+", default=["ray", "local"])
    args = parser.parse_args()

    from bertgpu.data.tokenizer import train_tokenizer

    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        work = Path(tmp)
        docs = texts()
        (work / "sample.txt").write_text("\n\n".join(docs))
        tok = train_tokenizer([work / "sample.txt"], work / "tok", vocab_size=30522)
        files = {}
        for mb in sorted(set(args.sizes_mb) | {args.compare_mb}):
            files[mb] = work / f"corpus_{mb}mb.parquet"
            write_parquet(files[mb], docs, mb, args.row_group_mb)
        print(f"{os.cpu_count()} cores, --workers {args.workers}, --unit-bytes "
              f"{args.unit_bytes}, seq_len 128, Parquet row groups of {args.row_group_mb} MB")

        c = args.compare_mb
        local = run("local", files[c], tok, work / "local", args.workers, args.unit_bytes)
        ray = run("ray", files[c], tok, work / "ray", args.workers, args.unit_bytes)
        identical = same_bytes(work / "local", work / "ray")
        rate = {k: r["tokens"] / r["seconds"] for k, r in (("local", local), ("ray", ray))}
        print(f"\n## Engines on {c} MB ({local['tokens']:,} tokens, {len(ray['units'])} units)\n")
        print("| engine | seconds | M tokens/s | ratio to local | identical bytes |")
        print("|---|---|---|---|---|")
        print(f"| local | {local['seconds']:.1f} | {rate['local'] / 1e6:.3f} | 1.00 | |")
        print(f"| ray (+{ray['ray_start']:.1f} s cluster start) | {ray['seconds']:.1f} | "
              f"{rate['ray'] / 1e6:.3f} | {rate['ray'] / rate['local']:.2f} | {identical} |")

        times = [u[0] for u in ray["units"]]
        unit_mean, per_byte = sum(times) / len(times), sum(times) / sum(u[1] for u in ray["units"])
        driver = max(ray["seconds"] - sum(times) / args.workers, 0.0)
        units = math.ceil(args.project_gb * 1e9 / args.unit_bytes)
        print(f"\n## Projection: {args.project_gb:g} GB in {units} units of "
              f"{args.unit_bytes / 2**20:.0f} MiB, {args.cores} cores per machine\n")
        print(f"Per unit on one core: mean {unit_mean:.1f} s ({1 / per_byte / 1e6:.2f} MB/s); "
              f"driver {driver:.1f} s\n")
        print("| machines | waves | hours | M tokens/s |")
        print("|---|---|---|---|")
        tokens_total = args.project_gb * 1e9 * local["tokens"] / (c * 1e6)
        for n in (1, 4, 16, 64):
            waves = math.ceil(units / (n * args.cores))
            seconds = waves * args.unit_bytes * per_byte + driver
            print(f"| {n} | {waves} | {seconds / 3600:.2f} | {tokens_total / seconds / 1e6:.1f} |")

        print("\n## Peak memory as the Parquet file grows\n")
        print("| file MB | engine | units | seconds | M tokens/s | peak RSS MB: workers / main |")
        print("|---|---|---|---|---|---|")
        for mb in args.sizes_mb:
            for engine in args.memory_engines:
                r = (local if engine == "local" else ray) if mb == c else run(
                    engine, files[mb], tok, work / f"{engine}{mb}", args.workers,
                    args.unit_bytes)
                worker = (max(u[2] for u in r["units"]) / 1024 if engine == "ray"
                          else r["pool_mb"])
                print(f"| {mb} | {engine} | {len(r['units'])} | {r['seconds']:.1f} | "
                      f"{r['tokens'] / r['seconds'] / 1e6:.3f} | {worker:.0f} / "
                      f"{r['main_mb']:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

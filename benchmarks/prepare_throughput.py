"""Throughput (tokens/s) and peak memory of `bertgpu prepare`, against tokenizers alone.

    .venv/bin/python benchmarks/prepare_throughput.py             # markdown table on stdout
    .venv/bin/python benchmarks/prepare_throughput.py --repeat 10 --workers 2 --shard-size 4096
    .venv/bin/python benchmarks/prepare_throughput.py --cases ad  # the dump and one huge document

Inputs: gensim's real Wikipedia sample (106 articles, ~0.56 M tokens), read (a) from the XML
dump, (b) as extracted text in the one-sentence-per-line format, (c) that text repeated
--repeat times, (d) that text without its blank lines, 1x and --repeat times: a corpus that is
one huge document (issue 12: its peak memory must not grow with it). Validation is the default
1% of the tokens (the "val %" column says what was held out). Each case runs in a fresh process
so that its peak RSS is its own: VmHWM of
the main process and the largest ru_maxrss of its worker processes (Linux). The reference,
measured right before each case (the machine may be shared), is `Tokenizer.encode_batch_fast`
on the same documents, with all cores (Rust threads), batches of 1000 documents. On a shared
machine wall-clock rates swing; the CPU columns (user + system seconds of the main process and
its workers, and tokenizers' CPU time for the same number of tokens as a percentage of it) are
the stable measure of overhead.
Targets: >= 0.8 M tokens/s on 2 cores, >= 60% of tokenizers alone, peak memory flat from 1x to
10x (with a --shard-size small enough that one shard buffer fills in the 1x case; a shard
buffer is at most shard_size x seq_len x 3 bytes per split).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
from bertgpu.data.prepare import prepare
args = json.loads(sys.argv[1])
start = time.perf_counter()
m = prepare(args["paths"], args["tok"], args["out"], objective=args["objective"],
            workers=args["workers"], seq_len=128, shard_size=args["shard_size"])
seconds = time.perf_counter() - start
# VmHWM, not ru_maxrss, for this process: Linux carries ru_maxrss over exec from the parent.
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # kB; the largest pool worker
cpu = sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                            resource.getrusage(resource.RUSAGE_CHILDREN)))
val = m["splits"]["validation"]["tokens"] / max(m["counts"]["tokens"], 1)
print(json.dumps({"seconds": seconds, "tokens": m["counts"]["tokens"],
                  "documents": m["counts"]["documents"], "val": val,
                  "sequences": m["counts"]["sequences"], "main_mb": hwm / 1024,
                  "worker_mb": kids / 1024, "cpu": cpu}))
"""


def run_case(paths: list[str], tok: Path, work: Path, objective: str, workers: int,
             shard_size: int) -> dict:
    out = Path(tempfile.mkdtemp(dir=work)) / "data"
    arg = json.dumps({"paths": paths, "tok": str(tok), "out": str(out), "objective": objective,
                      "workers": workers, "shard_size": shard_size})
    proc = subprocess.run([sys.executable, "-c", CHILD, arg], capture_output=True,
                          text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def tokenizers_alone(tok: Path, docs: list[list[str]]) -> tuple[float, float]:
    """(tokens/s, CPU seconds per token) of encode_batch_fast on the documents, all cores."""
    from bertgpu.data.tokenizer_folder import load_tokenizer

    t = load_tokenizer(tok)
    texts = [" ".join(d) for d in docs]
    fn = getattr(t, "encode_batch_fast", t.encode_batch)
    start, cpu = time.perf_counter(), time.process_time()
    n = 0
    for i in range(0, len(texts), 1000):
        n += sum(len(e.ids) for e in fn(texts[i : i + 1000], add_special_tokens=False))
    return n / (time.perf_counter() - start), (time.process_time() - cpu) / n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10, help="copies of the text in case (c)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--shard-size", type=int, default=65536,
                        help="sequences per shard (default 65536)")
    parser.add_argument("--cases", default="abcd",
                        help="which inputs to run, by letter (default abcd)")
    args = parser.parse_args()

    from bertgpu.data.corpus import WIKI_SAMPLE, gensim_test_data, iter_documents
    from bertgpu.data.tokenizer import train_tokenizer

    wiki = gensim_test_data(WIKI_SAMPLE)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        docs = list(iter_documents([wiki]))
        text = work / "wiki.txt"
        text.write_text("".join("\n".join(d) + "\n\n" for d in docs), encoding="utf-8")
        big = work / f"wiki_x{args.repeat}.txt"
        one = work / "one_document.txt"  # the same sentences without blank lines: one document
        one.write_text("".join("\n".join(d) + "\n" for d in docs), encoding="utf-8")
        one_big = work / f"one_document_x{args.repeat}.txt"
        for source, target in ((text, big), (one, one_big)):
            with open(target, "w", encoding="utf-8") as f:
                for _ in range(args.repeat):
                    f.write(source.read_text(encoding="utf-8"))
        tok = train_tokenizer([text], work / "tok", vocab_size=30522)

        w = args.workers
        cases = [
            ("(a) XML dump .bz2", [str(wiki)], "mlm", w),
            ("(a) XML dump .bz2", [str(wiki)], "mlm+nsp", w),
            ("(b) text 1x", [str(text)], "mlm", w),
            ("(b) text 1x", [str(text)], "mlm+nsp", w),
            (f"(c) text {args.repeat}x", [str(big)], "mlm", w),
            (f"(c) text {args.repeat}x", [str(big)], "mlm+nsp", w),
            (f"(c) text {args.repeat}x", [str(big)], "mlm", 1),
            ("(d) one document 1x", [str(one)], "mlm", w),
            (f"(d) one document {args.repeat}x", [str(one_big)], "mlm", w),
            ("(d) one document 1x", [str(one)], "mlm+nsp", w),
            (f"(d) one document {args.repeat}x", [str(one_big)], "mlm+nsp", w),
        ]
        cases = [c for c in cases if c[0][1] in args.cases]
        print(f"{os.cpu_count()} cores, shard size {args.shard_size}, seq_len 128; reference: "
              "encode_batch_fast on the same documents, all cores, measured before each case")
        print()
        print("| input | objective | workers | tokens | val % | seconds | M tokens/s | tokenizers "
              "alone M tokens/s | % of tokenizers alone | CPU s | % of tokenizers alone, CPU | "
              "peak RSS MB main / worker |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for name, paths, objective, workers in cases:
            ref, ref_cpu = tokenizers_alone(tok, docs * 2)
            r = run_case(paths, tok, work, objective, workers, args.shard_size)
            rate = r["tokens"] / r["seconds"]
            print(f"| {name} | {objective} | {workers} | {r['tokens']:,} | {100 * r['val']:.2f} | "
                  f"{r['seconds']:.2f} | {rate / 1e6:.2f} | {ref / 1e6:.2f} | "
                  f"{100 * rate / ref:.0f}% | {r['cpu']:.1f} | "
                  f"{100 * ref_cpu * r['tokens'] / r['cpu']:.0f}% | {r['main_mb']:.0f} / "
                  f"{r['worker_mb']:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

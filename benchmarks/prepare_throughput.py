"""Throughput (tokens/s) and peak memory of `bertgpu prepare`, against tokenizers alone.

    .venv/bin/python benchmarks/prepare_throughput.py            # markdown table on stdout
    .venv/bin/python benchmarks/prepare_throughput.py --repeat 10 --workers 2

Inputs: gensim's real Wikipedia sample (106 articles, ~0.65 M tokens), read (a) from the XML
dump, (b) as extracted text in the one-sentence-per-line format, (c) that text repeated
--repeat times. Each case runs in a fresh process so its peak RSS (its own and its worker
processes', whichever is larger; Linux only) is its own. The reference is `Tokenizer.encode_batch` on the same
documents in the same run, with all cores (Rust threads), batches of 1000 documents.
Targets: >= 60% of tokenizers alone, and peak memory flat from 1x to 10x.
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
from bertgpu.prepare import prepare
args = json.loads(sys.argv[1])
start = time.perf_counter()
m = prepare(args["paths"], args["tok"], args["out"], objective=args["objective"], workers=args["workers"],
            seq_len=128)
seconds = time.perf_counter() - start
# VmHWM, not ru_maxrss, for this process: Linux carries ru_maxrss over exec from the parent.
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
rss = max(hwm, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)  # kB; children = pool workers
print(json.dumps({"seconds": seconds, "tokens": m["counts"]["tokens"], "documents": m["counts"]["documents"],
                  "sequences": m["counts"]["sequences"], "rss_mb": rss / 1024}))
"""


def run_case(paths: list[str], tok: Path, work: Path, objective: str, workers: int) -> dict:
    out = Path(tempfile.mkdtemp(dir=work)) / "data"
    arg = json.dumps({"paths": paths, "tok": str(tok), "out": str(out), "objective": objective, "workers": workers})
    proc = subprocess.run([sys.executable, "-c", CHILD, arg], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def tokenizers_alone(tok: Path, docs: list[list[str]]) -> dict[str, float]:
    """tokens/s of encode_batch / encode_batch_fast on the documents, all cores."""
    from bertgpu.tokenizer import load_tokenizer

    t = load_tokenizer(tok)
    texts = [" ".join(d) for d in docs]
    result = {}
    for name in ("encode_batch", "encode_batch_fast"):
        fn = getattr(t, name)
        start = time.perf_counter()
        n = 0
        for i in range(0, len(texts), 1000):
            n += sum(len(e.ids) for e in fn(texts[i : i + 1000], add_special_tokens=False))
        result[name] = n / (time.perf_counter() - start)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10, help="copies of the text in case (c)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()

    from bertgpu.corpus import gensim_test_data, iter_documents
    from bertgpu.tokenizer import train_tokenizer

    wiki = gensim_test_data("enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        docs = list(iter_documents([wiki]))
        text = work / "wiki.txt"
        text.write_text("".join("\n".join(d) + "\n\n" for d in docs), encoding="utf-8")
        big = work / f"wiki_x{args.repeat}.txt"
        with open(big, "w", encoding="utf-8") as f:
            for _ in range(args.repeat):
                f.write(text.read_text(encoding="utf-8"))
        tok = train_tokenizer([text], work / "tok", vocab_size=30522)
        ref = tokenizers_alone(tok, docs * 3)  # 3 copies: long enough for a stable rate
        best_ref = max(ref.values())

        cases = [
            ("(a) XML dump .bz2", [str(wiki)], "mlm", args.workers),
            ("(b) text 1x", [str(text)], "mlm", args.workers),
            ("(b) text 1x", [str(text)], "mlm+nsp", args.workers),
            (f"(c) text {args.repeat}x", [str(big)], "mlm", args.workers),
            (f"(c) text {args.repeat}x", [str(big)], "mlm+nsp", args.workers),
            (f"(c) text {args.repeat}x", [str(big)], "mlm", 1),
        ]
        print(f"tokenizers alone (all {os.cpu_count()} cores, same documents): "
              + ", ".join(f"{k} {v / 1e6:.2f} M tokens/s" for k, v in ref.items()))
        print()
        print("| input | objective | workers | documents | tokens | seconds | M tokens/s | % of tokenizers alone | peak RSS MB |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name, paths, objective, workers in cases:
            r = run_case(paths, tok, work, objective, workers)
            rate = r["tokens"] / r["seconds"]
            print(f"| {name} | {objective} | {workers} | {r['documents']} | {r['tokens']:,} | {r['seconds']:.2f} | "
                  f"{rate / 1e6:.2f} | {100 * rate / best_ref:.0f}% | {r['rss_mb']:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

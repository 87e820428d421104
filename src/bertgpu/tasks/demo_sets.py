"""Two small real labelled sets for the demo and the quality benchmark, from gensim's test data.

Only the files are read (gensim itself is never imported): `pip install bertgpu[demo]`.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np

from bertgpu.errors import BertgpuError

if TYPE_CHECKING:
    from bertgpu.tasks.glue import Example, GlueTask


# How to fine-tune a tiny model on each set (flat `bertgpu finetune` keys), shared by the demo and
# `bertgpu bench quality`. Short sequences keep a run under a minute on a CPU; the 160 polarity
# sentences need many epochs at a moderate lr (at 1e-3 a tiny post-norm model stays at chance),
# the 985 Lee pairs converge in a few epochs.
FINETUNE_COMMON = ["--global_batch_size", "16", "--max_seq_len", "64", "--warmup_fraction", "0.1"]
FINETUNE_PER_SET = {
    "polarity": ["--epochs", "15", "--lr", "3e-4"],
    "lee": ["--epochs", "6", "--lr", "1e-3"],
}


def finetune_words(name: str) -> list[str]:
    """The fine-tuning overrides of demo set `name`."""
    return [*FINETUNE_COMMON, *FINETUNE_PER_SET.get(name, [])]

def demo_tasks(
    seed: int = 0, dev_fraction: float = 0.2
) -> dict[str, tuple[list[Example], list[Example], GlueTask]]:
    """Two small real-text tasks, split deterministically from `seed`:

    - "polarity": gensim's pang_lee_polarity.cor, 200 movie-review sentences ("__label__neg ..." /
      "__label__pos ..."), an SST-2-style task (negative=0, positive=1), dev stratified by class.
    - "lee": the 50 Lee news documents (lee.cor) and the human similarity matrix
      (similarities0-1.txt, upper triangle: 1,225 document pairs, scores 0-1, scaled by 5 to the
      STS-B range), an STS-B-style regression task on document pairs.
    """
    from bertgpu.data.corpus import gensim_test_data
    from bertgpu.tasks import glue as tasks

    rng = np.random.default_rng(seed)
    path = gensim_test_data("pang_lee_polarity.cor")
    by_label: dict[int, list[Example]] = {0: [], 1: []}
    # gensim's copies of these corpora are Windows-1252 (em dashes, accents, a pound sign).
    for n, line in enumerate(path.read_text(encoding="cp1252").splitlines(), 1):
        if not line.strip():
            continue
        tag, _, text = line.partition(" ")
        if tag not in ("__label__neg", "__label__pos") or not text.strip():
            raise BertgpuError(f"{path}:{n}: expected '__label__neg TEXT' or '__label__pos TEXT'")
        label = int(tag == "__label__pos")
        by_label[label].append(tasks.Example(f"polarity-{n}", text.strip(), None, label))
    pol_train: list[Example] = []
    pol_dev: list[Example] = []
    for label in (0, 1):
        items = by_label[label]
        perm = rng.permutation(len(items))
        n_dev = int(round(dev_fraction * len(items)))
        pol_dev += [items[i] for i in perm[:n_dev]]
        pol_train += [items[i] for i in perm[n_dev:]]
    pol_train = [pol_train[i] for i in rng.permutation(len(pol_train))]

    docs_path, sim_path = gensim_test_data("lee.cor"), gensim_test_data("similarities0-1.txt")
    docs = [d.strip() for d in docs_path.read_text(encoding="cp1252").splitlines() if d.strip()]
    sim = np.loadtxt(sim_path, dtype=np.float64)
    if sim.shape != (len(docs), len(docs)):
        raise BertgpuError(f"{sim_path}: a {sim.shape[0]}x{sim.shape[1]} matrix for {len(docs)} "
                           f"documents in {docs_path}; expected {len(docs)}x{len(docs)}")
    pairs = [tasks.Example(f"lee-{i}-{j}", docs[i], docs[j], float(5.0 * sim[i, j]))
             for i in range(len(docs)) for j in range(i + 1, len(docs))]

    # Split by a hash of (seed, pair): stable if the pair list is ever reordered.
    def in_dev(guid: str) -> bool:
        h = hashlib.sha256(f"{seed}:{guid}".encode()).digest()
        return int.from_bytes(h[:8], "big") / 2**64 < dev_fraction

    lee_dev = [p for p in pairs if in_dev(p.guid)]
    lee_train = [p for p in pairs if not in_dev(p.guid)]
    return {"polarity": (pol_train, pol_dev, tasks.get_task("sst2")),
            "lee": (lee_train, lee_dev, tasks.get_task("stsb"))}



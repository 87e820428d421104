"""Deterministic global sample order and dynamic masking.

Determinism (Megatron's idea): the sample at global position `p` is
`sample_order(n, seed, p // n)[p % n]`, and the mask of sample `i` in epoch `e` comes from a
numpy Philox generator keyed on `(seed, e, i)` alone. Nothing depends on the world size, the
micro batch size, the number of workers or restarts, so resuming at another world size continues
with exactly the next samples and the same masks.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bertgpu.batch import IGNORE_INDEX
from bertgpu.data.shards import ShardSet
from bertgpu.data.tokenizer_folder import load_tokenizer
from bertgpu.data.word_rule import WORDPIECE, UnknownWordRule, word_rule
from bertgpu.errors import BertgpuError

_U64 = (1 << 64) - 1
# Philox keys are (seed, domain): the order and the masks use separate streams even for one seed.
_ORDER_DOMAIN = 0x6F72646572  # "order"
_MASK_DOMAIN = 0x6D61736B  # "mask"


# --------------------------------------------------------------------------------------------
# Global sample order


def check_seed(seed: int) -> int:
    if (not isinstance(seed, (int, np.integer)) or isinstance(seed, bool)
            or not 0 <= int(seed) <= _U64):
        raise BertgpuError(f"seed: found {seed!r}, expected an integer in [0, 2**64)")
    return int(seed)


def _philox(seed: int, domain: int, epoch: int, index: int) -> np.random.Generator:
    """A generator that depends on (seed, domain, epoch, index) alone.

    The key holds (seed, domain); (index, epoch) sit in the two high words of Philox's 256-bit
    counter, which draws advance from the low word, so streams never overlap (2**128 blocks each).
    """
    key = np.array([seed, domain], dtype=np.uint64)
    counter = np.array([0, 0, index, epoch], dtype=np.uint64)
    return np.random.Generator(np.random.Philox(key=key, counter=counter))


def sample_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """The permutation of `range(n)` (int64) used in `epoch`;
    a function of (n, seed, epoch) alone."""
    return _philox(check_seed(seed), _ORDER_DOMAIN, int(epoch), 0).permutation(int(n))


@functools.lru_cache(maxsize=4)
def _cached_order(n: int, seed: int, epoch: int) -> np.ndarray:
    # uint32 halves the memory of a large epoch permutation; read-only because it is shared.
    order = sample_order(n, seed, epoch)
    if n <= np.iinfo(np.uint32).max:
        order = order.astype(np.uint32)
    order.flags.writeable = False
    return order


def positions_to_indices(positions: np.ndarray, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Global positions (any shape) -> (epochs, sample indices), both int64 of the same shape."""
    if n <= 0:
        raise ValueError("positions_to_indices needs a non-empty data set")
    pos = np.asarray(positions, dtype=np.int64)
    epochs, offsets = np.divmod(pos, n)
    indices = np.empty_like(pos)
    # A batch spans at most a few epochs; each permutation is computed once and cached.
    for e in np.unique(epochs).tolist():
        sel = epochs == e
        indices[sel] = _cached_order(int(n), int(seed), int(e))[offsets[sel]]
    return epochs, indices


# --------------------------------------------------------------------------------------------
# Masking


@dataclass
class MaskingConfig:
    """How tokens are chosen for the masked-language-model objective (BERT, §3.1)."""

    mask_rate: float = 0.15
    """Fraction of the maskable tokens (not special, inside the sequence) chosen for prediction:
    exactly round(mask_rate * maskable), at least one. 0.15 in BERT, 0.3 in MosaicBERT."""
    replace_mask: float = 0.8
    """Of the chosen tokens, the fraction replaced by [MASK]."""
    replace_random: float = 0.1
    """Of the chosen tokens, the fraction replaced by a random non-special token; the remaining
    1 - replace_mask - replace_random stay unchanged (but are still predicted)."""
    whole_word: bool = False
    """Choose whole words: all tokens of a word are chosen together, up to the same token
    budget. Where words start is the tokenizer's rule (data/word_rule.py: WordPiece's "##"
    pieces continue a word, byte-level BPE's "Ġ" and Metaspace's "▁" tokens start one). Shards
    prepared with a word segmenter (`prepare --whole-word-segmenter jieba`) carry their own word
    starts, which then decide instead (whole Chinese words)."""

    def __post_init__(self) -> None:
        if not 0.0 < self.mask_rate < 1.0:
            raise BertgpuError(f"masking.mask_rate: found {self.mask_rate}, expected a "
                               "value in (0, 1)")
        for name in ("replace_mask", "replace_random"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise BertgpuError(f"masking.{name}: found {getattr(self, name)}, expected a "
                                   "value in [0, 1]")
        if self.replace_mask + self.replace_random > 1.0 + 1e-9:
            raise BertgpuError(
                "masking: replace_mask + replace_random = "
                f"{self.replace_mask + self.replace_random}, expected <= 1"
            )


def continuation_table_from_vocab(vocab_txt_path: str | Path) -> np.ndarray:
    """(V,) bool: True for vocab entries that continue a word (WordPiece "##" pieces)."""
    path = Path(vocab_txt_path)
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except OSError as e:
        raise BertgpuError(f"{path}: cannot read the vocabulary ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise BertgpuError(f"{path}: cannot read the vocabulary ({e})") from None
    if lines and lines[-1] == "":
        lines.pop()  # the trailing newline, not an entry
    return np.array([tok.rstrip("\r").startswith("##") for tok in lines], dtype=bool)


def continuation_table(tokenizer_dir: str | Path) -> np.ndarray:
    """(V,) bool of a tokenizer folder: True for the tokens that continue a word, by the rule of
    its kind (`word_rule`: "##" pieces of WordPiece, every token but a "Ġ"/"▁" word start of a
    byte-level BPE or Metaspace one; added tokens never). A WordPiece folder's vocab.txt is read
    as BERT's tokenizer reads it; a folder of tokenizer.json alone (which `prepare` accepts, as
    transformers does) gives its vocabulary by id. A tokenizer of another kind is refused."""
    folder = Path(tokenizer_dir)
    rule = word_rule(folder)
    if rule == WORDPIECE and ((folder / "vocab.txt").is_file()
                              or not (folder / "tokenizer.json").is_file()):
        return continuation_table_from_vocab(folder / "vocab.txt")  # (names vocab.txt if absent)
    tok = load_tokenizer(folder)
    vocab = tok.get_vocab(with_added_tokens=True)
    table = np.zeros(max(vocab.values(), default=-1) + 1, dtype=bool)
    for token, i in vocab.items():
        table[i] = rule.continues(token)
    table[list(tok.get_added_tokens_decoder())] = False
    return table


class Masker:
    """Dynamic, deterministic masking: the mask of a sample depends on (seed, epoch, index) only.

    Each row gets its own Philox generator; all other work is vectorised over the batch.
    """

    def __init__(
        self,
        cfg: MaskingConfig,
        vocab_size: int,
        special_ids: Iterable[int] | np.ndarray,
        mask_id: int,
        continuation: np.ndarray | None = None,
    ) -> None:
        self.cfg = cfg
        self.vocab_size = int(vocab_size)
        self.mask_id = int(mask_id)
        special = np.zeros(self.vocab_size, dtype=bool)
        special[np.asarray(list(special_ids), dtype=np.int64)] = True
        self._special = special  # (V,) lookup: True for tokens never masked
        # Random replacements are drawn from these ids only, so they are never special.
        self._replacement = np.flatnonzero(~special).astype(np.int64)
        if self._replacement.size == 0:
            raise BertgpuError("masking: every vocabulary entry is special; nothing to mask")
        self._continuation: np.ndarray | None = None
        if cfg.whole_word:
            if continuation is None:
                raise BertgpuError("masking.whole_word needs the tokenizer's word continuations "
                                   "(continuation table)")
            table = np.zeros(max(self.vocab_size, len(continuation)), dtype=bool)
            table[: len(continuation)] = np.asarray(continuation, dtype=bool)
            self._continuation = table

    @classmethod
    def from_shards(cls, cfg: MaskingConfig, shards: ShardSet) -> Masker:
        """A masker for a shard set: its vocab size, special tokens and (whole-word) the word
        continuations of its tokenizer (`continuation_table`). Shards that carry their own word
        starts (a segmenter's) need no rule of the tokenizer's: one it has none of is no error."""
        continuation = None
        if cfg.whole_word:
            try:
                continuation = continuation_table(shards.tokenizer_dir)
            except UnknownWordRule:
                if not shards.has_word_starts:
                    raise
                continuation = np.zeros(shards.vocab_size, dtype=bool)
            if len(continuation) != shards.vocab_size:
                vocab = shards.tokenizer_dir / "vocab.txt"
                source = vocab if vocab.is_file() else shards.tokenizer_dir / "tokenizer.json"
                raise BertgpuError(
                    f"{source}: {len(continuation)} entries, expected vocab_size "
                    f"{shards.vocab_size} from {shards.manifest_path}"
                )
        return cls(cfg, shards.vocab_size, shards.special_tokens.values(),
                   shards.special_tokens["mask"], continuation)

    def mask(
        self, input_ids_row: np.ndarray, length: int, seed: int, epoch: int, index: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Mask one row (T,): returns (masked ids (T,), labels (T,) with -100 where not
        predicted)."""
        masked, labels = self.mask_batch(
            np.asarray(input_ids_row)[None, :], np.array([length]), seed, np.array([epoch]),
            np.array([index])
        )
        return masked[0], labels[0]

    def budget(self, n_cand: np.ndarray) -> np.ndarray:
        """Labels per row for rows of `n_cand` maskable tokens: mask_rate of them rounded half
        up, at least 1 where a row has any."""
        n_cand = np.asarray(n_cand, dtype=np.int64)
        budget = np.floor(self.cfg.mask_rate * n_cand + 0.5).astype(np.int64)  # round half up
        return np.where((n_cand > 0) & (budget == 0), 1, budget)

    def most_per_row(self, seq_len: int) -> int:
        """The most labels `mask_batch` gives a row of `seq_len` tokens: its budget for a row
        whose every token is a candidate (whole-word masking exceeds it only in a row whose one
        chosen word is longer than the budget)."""
        return int(self.budget(np.array([int(seq_len)]))[0])

    def mask_batch(
        self,
        input_ids: np.ndarray,
        lengths: np.ndarray,
        seed: int,
        epochs: np.ndarray,
        indices: np.ndarray,
        word_starts: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Mask a batch: input_ids (B, T), lengths/epochs/indices (B,) -> (masked ids, labels),
        (B, T) int64.

        Row b is exactly `mask(input_ids[b], lengths[b], seed, epochs[b], indices[b])`: nothing
        depends on the other rows or on T beyond the row's length. ``word_starts`` (B, T), from a
        shard set prepared with a segmenter, marks where words begin for whole-word masking.
        """
        ids = np.asarray(input_ids, dtype=np.int64)
        B, T = ids.shape
        seed = check_seed(seed)
        lens = np.minimum(np.asarray(lengths, dtype=np.int64).reshape(B), T)
        epochs = np.asarray(epochs, dtype=np.int64).reshape(B)
        indices = np.asarray(indices, dtype=np.int64).reshape(B)
        pos = np.arange(T)
        if ids.size and int(ids.max()) >= len(self._special):  # (an IndexError traceback)
            raise BertgpuError(f"the shards hold token id {int(ids.max())}, past the vocabulary "
                               f"of {len(self._special)} (manifest.json's vocab_size): a damaged "
                               "shard or one of another tokenizer; expected the shard set as "
                               "bertgpu prepare wrote it (prepare it again)")
        cand = (pos[None, :] < lens[:, None]) & ~self._special[ids]  # (B, T) maskable
        # Three uniforms per real token: selection key, 80/10/10 action, replacement token.
        # Only `length` of each are drawn, so padding width never changes a row's mask.
        u = np.ones((3, B, T))
        # One bit generator re-keyed per row: the same stream as `_philox(seed, _MASK_DOMAIN, e, i)`
        # (checked in the tests) at a third of the cost of constructing a new one.
        bit_gen = np.random.Philox(key=np.array([seed, _MASK_DOMAIN], dtype=np.uint64))
        gen = np.random.Generator(bit_gen)
        state = bit_gen.state
        for b, (L, e, i) in enumerate(zip(lens.tolist(), epochs.tolist(), indices.tolist(),
                                          strict=True)):
            state["state"]["counter"] = np.array([0, 0, i, e], dtype=np.uint64)
            # drop buffered draws
            state["buffer_pos"], state["has_uint32"], state["uinteger"] = 4, 0, 0
            bit_gen.state = state
            u[:, b, :L] = gen.random((3, L))
        budget = self.budget(cand.sum(axis=1))  # (B,)
        if self._continuation is None:
            chosen = self._choose_tokens(u[0], cand, budget)
        else:
            chosen = self._choose_words(ids, u[0], cand, budget, word_starts)
        action = u[1]
        to_mask = chosen & (action < self.cfg.replace_mask)
        to_random = chosen & ~to_mask & (action < self.cfg.replace_mask + self.cfg.replace_random)
        n_repl = self._replacement.size
        # random_ids: (B, T)
        random_ids = self._replacement[np.minimum((u[2] * n_repl).astype(np.int64), n_repl - 1)]
        masked = ids.copy()
        masked[to_mask] = self.mask_id
        masked[to_random] = random_ids[to_random]
        labels = np.where(chosen, ids, IGNORE_INDEX)
        return masked, labels

    @staticmethod
    def _choose_tokens(keys: np.ndarray, cand: np.ndarray, budget: np.ndarray) -> np.ndarray:
        """The `budget[b]` candidates with the smallest keys in each row:
        a uniform random subset."""
        B, T = cand.shape
        order = np.argsort(np.where(cand, keys, np.inf), axis=1)
        chosen = np.zeros((B, T), dtype=bool)
        np.put_along_axis(chosen, order, np.arange(T)[None, :] < budget[:, None], axis=1)
        return chosen

    def _choose_words(self, ids: np.ndarray, keys: np.ndarray, cand: np.ndarray, budget: np.ndarray,
                      word_starts: np.ndarray | None = None) -> np.ndarray:
        """Whole words in random order, skipping a word that would overshoot the token budget
        (Google's create_pretraining_data.py); at least one word when a row has any."""
        assert self._continuation is not None
        B, T = cand.shape
        prev_cand = np.zeros_like(cand)
        prev_cand[:, 1:] = cand[:, :-1]
        # A word starts at a candidate unless it continues the word of the candidate before it:
        # by the tokenizer's rule ("##", no "Ġ"), or (segmented shards) a token the segmenter
        # did not mark as a start.
        inside = (~np.asarray(word_starts, dtype=bool) if word_starts is not None
                  else self._continuation[ids])
        start = cand & ~(inside & prev_cand)
        chosen = np.zeros((B, T), dtype=bool)
        for b in range(B):
            starts = np.flatnonzero(start[b])
            if starts.size == 0:
                continue
            word_of = np.cumsum(start[b]) - 1  # (T,) word number of each candidate position
            sizes = np.bincount(word_of[cand[b]], minlength=starts.size)
            take = np.zeros(starts.size, dtype=bool)
            covered, k = 0, int(budget[b])
            # word key: its first piece's
            for w in np.argsort(keys[b, starts], kind="stable").tolist():
                if covered + sizes[w] > k:
                    continue
                take[w] = True
                covered += int(sizes[w])
                if covered == k:
                    break
            if covered == 0:
                take[int(np.argmin(keys[b, starts]))] = True
            chosen[b] = cand[b] & take[np.maximum(word_of, 0)]
        return chosen



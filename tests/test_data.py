"""Tests for bertgpu.data (shards, masking, loaders): shard validation, global order,
masking statistics, rank/resume invariance."""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest
import torch
from _shards import write_synthetic_shards

from bertgpu.batch import IGNORE_INDEX
from bertgpu.data.loaders import PretrainLoader, ValidationLoader, iter_eval_batches, trim_batch
from bertgpu.data.manifest import Manifest
from bertgpu.data.masking import (
    Masker,
    MaskingConfig,
    _philox,
    continuation_table_from_vocab,
    positions_to_indices,
    sample_order,
)
from bertgpu.data.shards import ShardSet, check_compatible
from bertgpu.data.writer import ShardSetWriter
from bertgpu.errors import BertgpuError

SPECIAL = {0, 1, 2, 3, 4}
MASK_ID = 4


@pytest.fixture(scope="module")
def mlm_dir(tmp_path_factory):
    return write_synthetic_shards(tmp_path_factory.mktemp("mlm") / "data", variable_lengths=True)


@pytest.fixture(scope="module")
def nsp_dir(tmp_path_factory):
    return write_synthetic_shards(tmp_path_factory.mktemp("nsp") / "data", objective="mlm+nsp",
                                  variable_lengths=True, seed=1)


def _raw(data_dir, split="train"):
    """The split's arrays concatenated in manifest order, read independently of ShardSet."""
    manifest = json.loads((data_dir / "manifest.json").read_text())
    fields = ["input_ids", "lengths"] + (["token_type_ids", "nsp_labels"]
                                         if manifest["objective"] != "mlm" else [])
    return {f: np.concatenate([np.load(data_dir / f"{s['name']}.{f}.npy")
                               for s in manifest["splits"][split]["shards"]])
            for f in fields}


# ----------------------------------------------------------------------------- shard set


def test_shardset_reads_across_shard_boundaries(mlm_dir):
    shards = ShardSet(mlm_dir)
    raw = _raw(mlm_dir)
    assert len(shards) == 64 and len(shards.shard_names) == 3  # 24 + 24 + 16
    assert (shards.seq_len, shards.objective, shards.vocab_size) == (32, "mlm", 100)
    assert shards.special_tokens == {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
    # unsorted, repeated, each side of each boundary
    idx = np.array([63, 0, 23, 24, 47, 48, 5, 23, 30])
    got = shards.get(idx)
    assert got["input_ids"].dtype == np.int64 and got["input_ids"].shape == (9, 32)
    assert got["lengths"].dtype == np.int64 and got["token_type_ids"].dtype == np.int64
    np.testing.assert_array_equal(got["input_ids"], raw["input_ids"][idx])
    np.testing.assert_array_equal(got["lengths"], raw["lengths"][idx])
    assert not got["token_type_ids"].any() and "nsp_labels" not in got
    assert shards.get(np.array([], dtype=np.int64))["input_ids"].shape == (0, 32)
    with pytest.raises(IndexError):
        shards.get([64])
    val = ShardSet(mlm_dir, "validation")
    np.testing.assert_array_equal(val.get(np.arange(8))["input_ids"],
                                  _raw(mlm_dir, "validation")["input_ids"])


def test_shardset_nsp_fields(nsp_dir):
    shards = ShardSet(nsp_dir)
    raw = _raw(nsp_dir)
    idx = np.arange(64)[::-1]
    got = shards.get(idx)
    for key, raw_key in (("token_type_ids", "token_type_ids"), ("nsp_labels", "nsp_labels")):
        assert got[key].dtype == np.int64
        np.testing.assert_array_equal(got[key], raw[raw_key][idx])


def test_shardset_pickles_without_data(mlm_dir):
    shards = ShardSet(mlm_dir)
    shards.get([1])
    blob = pickle.dumps(shards)
    assert len(blob) < 20_000  # the memmaps are re-opened, not copied
    np.testing.assert_array_equal(pickle.loads(blob).get([40])["input_ids"],
                                  shards.get([40])["input_ids"])


def _break_missing_manifest(d):
    (d / "manifest.json").unlink()
    return "manifest.json"


def _break_bad_json(d):
    (d / "manifest.json").write_text('{"format_version": 1,\n "objective": }')
    return "manifest.json"


def _break_version(d):
    m = json.loads((d / "manifest.json").read_text())
    m["format_version"] = 2
    (d / "manifest.json").write_text(json.dumps(m))
    return "manifest.json"


def _break_missing_shard(d):
    (d / "train-00001.lengths.npy").unlink()
    return "train-00001.lengths.npy"


def _break_shape(d):
    np.save(d / "train-00002.input_ids.npy", np.zeros((16, 31), dtype=np.uint16))
    return "train-00002.input_ids.npy"


def _break_dtype(d):
    np.save(d / "train-00000.lengths.npy", np.zeros(24, dtype=np.int64))
    return "train-00000.lengths.npy"


def _break_count(d):
    m = json.loads((d / "manifest.json").read_text())
    m["splits"]["train"]["shards"][0]["sequences"] = 25
    (d / "manifest.json").write_text(json.dumps(m))
    return "manifest.json"


def _break_not_npy(d):
    (d / "train-00000.input_ids.npy").write_bytes(b"not a numpy file")
    return "train-00000.input_ids.npy"


@pytest.mark.parametrize("breaker",
                         [_break_missing_manifest, _break_bad_json, _break_version,
                          _break_missing_shard, _break_shape, _break_dtype, _break_count,
                          _break_not_npy])
def test_shardset_errors_name_the_file(tmp_path, breaker):
    d = write_synthetic_shards(tmp_path / "data")
    name = breaker(d)
    with pytest.raises(BertgpuError) as err:
        ShardSet(d)
    msg = str(err.value)
    assert str(d / name) in msg and "\n" not in msg


def test_manifest_gives_back_the_keys_of_the_file(mlm_dir, tmp_path):
    path = mlm_dir / "manifest.json"
    on_disk = json.loads(path.read_text())
    m = ShardSet(mlm_dir).manifest
    assert m == Manifest.read(path) and m.to_json() == on_disk and m.seq_len == 32 and not m.has_nsp
    assert "split_unit" not in on_disk and m.split_unit is None  # synthetic sets record no split
    # A manifest with the required keys only (as from before split_unit existed) loads and
    # writes back just those keys; a null stays a null.
    required = ("format_version", "objective", "seq_len", "dtype", "vocab_size", "tokenizer_hash",
                "special_tokens", "splits")
    old = {**{k: on_disk[k] for k in required}, "validation_docs": None}
    (tmp_path / "manifest.json").write_text(json.dumps(old))
    back = Manifest.read(tmp_path / "manifest.json")
    assert back.to_json() == old
    assert back.counts == {} and back.created_by is None and not back.has_word_starts


@pytest.mark.parametrize("key, value, expected", [
    ("dtype", None, "missing key 'dtype'"),
    ("objective", "clm", "objective: found 'clm', expected one of ['mlm', 'mlm+nsp']"),
    ("seq_len", True, "seq_len: found True, expected a positive integer"),
    ("vocab_size", 0, "vocab_size: found 0, expected a positive integer"),
    ("dtype", "int8", "dtype: found 'int8', expected 'uint16' or 'uint32'"),
    ("special_tokens", {"pad": 0},
     "special_tokens: found {'pad': 0}, expected integer ids below vocab_size"),
    ("splits", [], "splits: expected an object with 'train' and 'validation'"),
])
def test_manifest_errors_are_one_line_naming_the_key(mlm_dir, tmp_path, key, value, expected):
    m = json.loads((mlm_dir / "manifest.json").read_text())
    if value is None:
        del m[key]
    else:
        m[key] = value
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(m))
    with pytest.raises(BertgpuError) as err:
        Manifest.read(path)
    assert str(err.value).startswith(f"{path}: {expected}") and "\n" not in str(err.value)


def test_shard_set_writer_leaves_the_old_set_on_failure(mlm_dir, tmp_path):
    out = tmp_path / "data"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(RuntimeError), ShardSetWriter(out, 8, np.uint16, 4, nsp=False) as data:
        data.writers["train"].add({"input_ids": np.ones((5, 8)), "lengths": np.full(5, 8)})
        raise RuntimeError("killed midway")
    assert (out / "keep.txt").exists() and not (tmp_path / "data.tmp").exists()


def test_check_compatible(mlm_dir):
    shards = ShardSet(mlm_dir)
    check_compatible(shards, vocab_size=128, max_position_embeddings=32,
                     tokenizer_hash=shards.tokenizer_hash)
    cases = [
        (dict(vocab_size=99, max_position_embeddings=64), "vocab_size"),
        (dict(vocab_size=100, max_position_embeddings=16), "max_position_embeddings"),
        (dict(vocab_size=100, max_position_embeddings=64, tokenizer_hash="ab" * 32), "ab" * 32),
    ]
    for kwargs, expected in cases:
        with pytest.raises(BertgpuError) as err:
            check_compatible(shards, **kwargs)
        assert str(shards.manifest_path) in str(err.value) and expected in str(err.value)


def test_check_compatible_refuses_nsp_with_one_token_type(mlm_dir, nsp_dir):
    nsp = ShardSet(nsp_dir)
    check_compatible(nsp, vocab_size=128, max_position_embeddings=32, type_vocab_size=2)
    with pytest.raises(BertgpuError) as err:
        check_compatible(nsp, vocab_size=128, max_position_embeddings=32, type_vocab_size=1)
    assert str(nsp.manifest_path) in str(err.value) and "type_vocab_size" in str(err.value)
    # Without NSP one token type is enough.
    check_compatible(ShardSet(mlm_dir), vocab_size=128, max_position_embeddings=32,
                     type_vocab_size=1)


def test_shardset_get_refuses_out_of_range_indices(mlm_dir):
    shards = ShardSet(mlm_dir)
    for bad in ([-1], [0, -1], [len(shards)]):
        with pytest.raises(IndexError):
            shards.get(bad)


# ----------------------------------------------------------------------------- global order


def test_sample_order_is_a_reproducible_permutation():
    a = sample_order(1000, seed=7, epoch=0)
    assert a.dtype == np.int64 and np.array_equal(np.sort(a), np.arange(1000))
    assert np.array_equal(a, sample_order(1000, seed=7, epoch=0))
    assert not np.array_equal(a, sample_order(1000, seed=7, epoch=1))
    assert not np.array_equal(a, sample_order(1000, seed=8, epoch=0))
    assert not np.array_equal(a, np.arange(1000))
    for p in (0, 999, 1000, 2345):
        e, i = (int(x[0]) for x in positions_to_indices(np.array([p]), 1000, 7))
        assert (e, i) == (p // 1000, sample_order(1000, 7, p // 1000)[p % 1000])
    epochs, indices = positions_to_indices(np.arange(1990, 2010), 1000, 7)
    assert epochs.tolist() == [1] * 10 + [2] * 10
    assert indices[:10].tolist() == sample_order(1000, 7, 1)[990:].tolist()
    assert indices[10:].tolist() == sample_order(1000, 7, 2)[:10].tolist()


# ----------------------------------------------------------------------------- masking


def _random_rows(rng, B, T, vocab_size=100):
    """[CLS] tokens [SEP] then [PAD], with an occasional [UNK] inside; variable lengths."""
    lengths = rng.integers(3, T + 1, size=B)
    ids = rng.integers(5, vocab_size, size=(B, T))
    ids[rng.random((B, T)) < 0.02] = 1
    ids[:, 0] = 2
    ids[np.arange(B), lengths - 1] = 3
    ids[np.arange(T)[None, :] >= lengths[:, None]] = 0
    return ids, lengths


@pytest.mark.parametrize("rate", [0.15, 0.3])
def test_masking_statistics(rate):
    rng = np.random.default_rng(0)
    B, T = 4000, 64
    ids, lengths = _random_rows(rng, B, T)
    masker = Masker(MaskingConfig(mask_rate=rate), 100, SPECIAL, MASK_ID)
    masked, labels = masker.mask_batch(ids, lengths, seed=3, epochs=np.zeros(B),
                                       indices=np.arange(B))
    chosen = labels != IGNORE_INDEX
    special = np.isin(ids, list(SPECIAL))
    inside = np.arange(T)[None, :] < lengths[:, None]
    cand = inside & ~special
    # Labels carry the original ids; specials and padding are never chosen or changed.
    np.testing.assert_array_equal(labels[chosen], ids[chosen])
    assert not (chosen & ~cand).any()
    np.testing.assert_array_equal(masked[~chosen], ids[~chosen])
    # Exactly round-half-up(rate * candidates) per row, at least one.
    n_cand = cand.sum(1)
    expected = np.maximum(np.floor(rate * n_cand + 0.5), n_cand > 0)
    np.testing.assert_array_equal(chosen.sum(1), expected)
    # 80 / 10 / 10 among chosen tokens (a random token may equal the original: 1/95 of 10%).
    n = chosen.sum()
    frac_mask = (masked[chosen] == MASK_ID).mean()
    changed = chosen & (masked != MASK_ID) & (masked != ids)
    frac_random = changed.sum() / n
    assert n > 15_000
    assert abs(frac_mask - 0.8) < 0.015
    assert abs(frac_random - 0.1 * 94 / 95) < 0.01
    # Random replacements are never special tokens, and cover the non-special vocabulary.
    replaced = masked[chosen & (masked != MASK_ID)]
    assert not np.isin(replaced, list(SPECIAL)).any()
    assert len(np.unique(masked[changed])) > 80
    # Chosen positions are uniform over the sequence (no positional bias): first half vs second
    # half.
    half = (np.arange(T)[None, :] < (lengths[:, None] // 2))
    ratio = (chosen & half).sum() / (cand & half).sum()
    assert abs(ratio - chosen.sum() / cand.sum()) < 0.01


def test_mask_is_a_function_of_seed_epoch_index_only():
    rng = np.random.default_rng(1)
    ids, lengths = _random_rows(rng, 16, 40)
    masker = Masker(MaskingConfig(), 100, SPECIAL, MASK_ID)
    epochs, indices = np.full(16, 2), np.arange(100, 116)
    m_all, l_all = masker.mask_batch(ids, lengths, 5, epochs, indices)
    # Same row alone, in another batch order, or with more padding: the same mask.
    perm = rng.permutation(16)
    m_perm, l_perm = masker.mask_batch(ids[perm], lengths[perm], 5, epochs[perm], indices[perm])
    np.testing.assert_array_equal(m_perm, m_all[perm])
    padded = np.pad(ids, ((0, 0), (0, 24)))
    m_pad, l_pad = masker.mask_batch(padded, lengths, 5, epochs, indices)
    np.testing.assert_array_equal(m_pad[:, :40], m_all)
    assert (l_pad[:, 40:] == IGNORE_INDEX).all()
    for b in range(16):
        m_one, l_one = masker.mask(ids[b], lengths[b], 5, 2, 100 + b)
        np.testing.assert_array_equal(m_one, m_all[b])
        np.testing.assert_array_equal(l_one, l_all[b])
        # Independent reference: the `budget` candidates with the smallest Philox keys.
        L = lengths[b]
        keys = _philox(5, 0x6D61736B, 2, 100 + b).random((3, L))[0]
        cand = np.flatnonzero(~np.isin(ids[b, :L], list(SPECIAL)))
        k = max(1, int(np.floor(0.15 * cand.size + 0.5)))
        expected = np.sort(cand[np.argsort(keys[cand])[:k]])
        np.testing.assert_array_equal(np.flatnonzero(l_all[b] != IGNORE_INDEX), expected)
    # Another seed, epoch or index gives another mask.
    for s, e, i in ((6, 2, 100), (5, 3, 100), (5, 2, 101)):
        assert not np.array_equal(masker.mask(ids[0], lengths[0], s, e, i)[1], l_all[0])


def test_whole_word_masking_masks_all_pieces(mlm_dir):
    shards = ShardSet(mlm_dir)
    continuation = continuation_table_from_vocab(shards.tokenizer_dir / "vocab.txt")
    assert continuation.shape == (100,) and continuation.sum() > 10 and not continuation[:5].any()
    masker = Masker.from_shards(MaskingConfig(whole_word=True, mask_rate=0.2), shards)
    # Long rows of words made of 1-3 pieces.
    rng = np.random.default_rng(2)
    words, conts = np.flatnonzero(~continuation[5:]) + 5, np.flatnonzero(continuation)
    B, T = 300, 64
    ids = np.zeros((B, T), dtype=np.int64)
    for b in range(B):
        row = [2]
        while len(row) < T - 1:
            row += [int(rng.choice(words))] + rng.choice(
                conts, size=int(rng.integers(0, 3))).tolist()
        ids[b] = row[: T - 1] + [3]
    lengths = np.full(B, T)
    masked, labels = masker.mask_batch(ids, lengths, 0, np.zeros(B), np.arange(B))
    chosen = labels != IGNORE_INDEX
    n_words_split = 0
    for b in range(B):
        start = 1
        for t in range(2, T):
            if not continuation[ids[b, t]] or ids[b, t] == 3:  # a word ends before t
                word = chosen[b, start:t]
                assert word.all() or not word.any(), (b, start, t)
                n_words_split += int(word.all() and t - start > 1)
                start = t
    assert n_words_split > 50  # multi-piece words were masked, whole
    budget = np.floor(0.2 * (T - 2) + 0.5)
    assert (chosen.sum(1) <= budget).all() and chosen.sum(1).mean() > budget - 1
    assert not chosen[:, [0, T - 1]].any()


# Whole-word vocabulary for the tests below: specials 0-4, word starts 5-59, "##" pieces 60-99.
WW_CONT = np.arange(100) >= 60
WW_SPECIAL = np.isin(np.arange(100), list(SPECIAL))


def _reference_whole_words(row, L, keys, rate):
    """Google's create_pretraining_data.py word loop, written out: the candidate words, then in
    random order (here: by the key of each word's first piece) take a word unless it would
    overshoot the budget, and go on with the next (`continue`, not `break`) until the budget is
    met. Two documented bertgpu differences: a "##" piece continues a word only when the token
    right before it is maskable (Google glues a "##" after [SEP] to the word before the [SEP];
    here it starts a word), and a row whose every word overshoots still masks its first word."""
    words: list[list[int]] = []
    for t in range(L):
        if WW_SPECIAL[row[t]]:
            continue
        if WW_CONT[row[t]] and t > 0 and not WW_SPECIAL[row[t - 1]]:
            words[-1].append(t)
        else:
            words.append([t])
    n_cand = sum(len(w) for w in words)
    budget = max(1, int(np.floor(rate * n_cand + 0.5))) if n_cand else 0
    covered: list[int] = []
    order = sorted(words, key=lambda w: keys[w[0]])
    for w in order:
        if len(covered) >= budget:
            break
        if len(covered) + len(w) > budget:
            continue
        covered += w
    if not covered and order:
        covered = order[0]
    return sorted(covered), budget, sum(len(w) == 1 for w in words)


def _whole_word_rows(rng, B, T):
    """[CLS] words of 1-4 pieces [SEP] (and a second segment), with "##" pieces placed right
    after [CLS], after the middle [SEP] and after an [UNK]; variable lengths, padded."""
    ids = np.zeros((B, T), dtype=np.int64)
    lengths = rng.integers(T // 2, T + 1, size=B)
    for b in range(B):
        L = int(lengths[b])
        row = [2]
        if rng.random() < 0.4:
            row += [int(rng.integers(60, 100))]  # a "##" piece right after [CLS]
        while len(row) < L - 1:
            r = rng.random()
            if r < 0.05:
                row += [3] + [int(rng.integers(60, 100))] * int(rng.integers(0, 2))
            elif r < 0.1:
                row += [1] + [int(rng.integers(60, 100))] * int(rng.integers(0, 2))
            else:
                n = int(rng.choice([1, 1, 1, 2, 3, 4]))
                row += [int(rng.integers(5, 60))] + rng.integers(60, 100, size=n - 1).tolist()
        ids[b, :L] = row[: L - 1] + [3]
    return ids, lengths


def test_whole_word_masking_matches_googles_word_loop():
    """Exactly the reference's positions, row by row. The loop once stopped (`break`) at the
    first word that would overshoot, leaving rows under their budget."""
    rng = np.random.default_rng(5)
    B, T, rate = 400, 40, 0.2
    ids, lengths = _whole_word_rows(rng, B, T)
    masker = Masker(MaskingConfig(whole_word=True, mask_rate=rate), 100, SPECIAL, MASK_ID,
                    continuation=WW_CONT)
    epochs, indices = np.full(B, 3), np.arange(1000, 1000 + B)
    _, labels = masker.mask_batch(ids, lengths, 9, epochs, indices)
    full_rows = 0
    for b in range(B):
        L = int(lengths[b])
        keys = _philox(9, 0x6D61736B, 3, 1000 + b).random((3, L))[0]
        expected, budget, singles = _reference_whole_words(ids[b], L, keys, rate)
        got = np.flatnonzero(labels[b] != IGNORE_INDEX).tolist()
        assert got == expected, b
        # Skipping an overshooting word and going on: single-piece words always fill the budget.
        if singles >= budget:
            assert len(got) == budget, (b, len(got), budget)
            full_rows += 1
    assert full_rows > 0.75 * B


def test_whole_word_piece_after_a_special_token_starts_a_word():
    """A "##" piece right after [CLS], [SEP] or [UNK] (never masked) continues no word: it starts
    one (with the "##" pieces after it), as `_choose_words` says: a word starts at a candidate
    unless the candidate before it is part of the same word. It must neither crash nor glue
    itself to the word before the special token."""
    #            0  1   2   3   4  5   6   7   8  9   10  11
    row = np.array([2, 61, 62, 10, 3, 63, 11, 64, 1, 65, 12, 3])
    words = [[1, 2], [3], [5], [6, 7], [9], [10]]
    masker = Masker(MaskingConfig(whole_word=True, mask_rate=0.3), 100, SPECIAL, MASK_ID,
                    continuation=WW_CONT)
    B = 300
    _, labels = masker.mask_batch(np.tile(row, (B, 1)), np.full(B, len(row)), 4, np.zeros(B),
                                  np.arange(B))
    chosen = labels != IGNORE_INDEX
    budget = int(np.floor(0.3 * sum(map(len, words)) + 0.5))  # 8 maskable tokens -> 2
    seen = np.zeros(len(words), dtype=int)
    for b in range(B):
        for k, w in enumerate(words):
            assert chosen[b, w].all() or not chosen[b, w].any(), (b, w)  # whole words only
            seen[k] += int(chosen[b, w].all())
        assert chosen[b].sum() == budget  # 4 single-piece words: the budget is always met
    # Every word, the "##" ones after specials included, is chosen on its own sometimes.
    assert (seen > 0.1 * B).all(), seen
    assert (chosen[:, 5] & ~chosen[:, 3]).any() and (chosen[:, 3] & ~chosen[:, 5]).any()
    assert (chosen[:, 9] & ~chosen[:, 6]).any()
    assert not chosen[:, [0, 4, 8, 11]].any()


def test_masking_config_validation():
    with pytest.raises(BertgpuError, match="mask_rate"):
        MaskingConfig(mask_rate=1.5)
    with pytest.raises(BertgpuError, match="replace_mask"):
        MaskingConfig(replace_mask=0.95, replace_random=0.1)
    with pytest.raises(BertgpuError, match="whole_word"):
        Masker(MaskingConfig(whole_word=True), 100, SPECIAL, MASK_ID)


# ----------------------------------------------------------------------------- loader


def _steps(data_dir, world, micro, steps, G=16, seed=11, state=None, num_workers=0, cfg=None):
    """All ranks' micro batches, concatenated per step in rank order: {key: (steps*G, ...)}."""
    shards = ShardSet(data_dir)
    loaders = [PretrainLoader(shards, cfg or MaskingConfig(), G, micro, rank=r, world_size=world,
                              seed=seed, num_workers=num_workers) for r in range(world)]
    for ld in loaders:
        assert ld.accumulation_steps == G // (micro * world)
        if state is not None:
            ld.load_state_dict(state)
    out: dict[str, list[torch.Tensor]] = {}
    for _ in range(steps):
        for ld in loaders:
            micro_batches = ld.next_step()
            assert len(micro_batches) == ld.accumulation_steps
            for mb in micro_batches:
                assert mb["input_ids"].shape[0] == micro
                for k, v in mb.items():
                    if k == "batch_meta":  # host-side layout of the batch (test_batch_meta.py)
                        continue
                    assert v.dtype == torch.long
                    out.setdefault(k, []).append(v)
    for ld in loaders:
        ld.close()
    return {k: torch.cat(v) for k, v in out.items()}, loaders[0].state_dict()


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if k == "batch_meta":  # a function of the other tensors (test_batch_meta.py)
            continue
        assert torch.equal(a[k], b[k]), k


def test_loader_global_order_is_independent_of_world_and_accumulation(nsp_dir):
    steps = 6  # 96 positions: crosses the 64-sample epoch boundary
    ref, state = _steps(nsp_dir, 1, 16, steps)
    assert state == {"position": 96, "seed": 11}
    assert set(ref) == {"input_ids", "attention_mask", "token_type_ids", "labels",
                        "next_sentence_label"}
    # Independent check: position p holds sample order(epoch)[p % n], unchanged where not masked.
    shards = ShardSet(nsp_dir)
    epochs, indices = positions_to_indices(np.arange(96), 64, 11)
    raw = shards.get(indices)
    keep = ref["labels"].numpy() == IGNORE_INDEX
    np.testing.assert_array_equal(ref["input_ids"].numpy()[keep], raw["input_ids"][keep])
    np.testing.assert_array_equal(ref["labels"].numpy()[~keep], raw["input_ids"][~keep])
    np.testing.assert_array_equal(ref["attention_mask"].numpy().sum(1), raw["lengths"])
    np.testing.assert_array_equal(ref["next_sentence_label"].numpy(), raw["nsp_labels"])
    assert sorted(indices[:64].tolist()) == list(range(64))
    for world, micro in ((1, 4), (2, 8), (2, 2), (4, 4), (4, 1)):
        got, state = _steps(nsp_dir, world, micro, steps)
        _assert_same(got, ref)
        assert state["position"] == 96


def test_resume_continues_with_the_next_samples(mlm_dir):
    full, _ = _steps(mlm_dir, 1, 8, 5)
    first, state = _steps(mlm_dir, 2, 4, 3)
    assert state["position"] == 48
    for world, micro in ((1, 16), (2, 4), (4, 2)):
        rest, state = _steps(mlm_dir, world, micro, 2, state={"position": 48, "seed": 11})
        _assert_same({k: torch.cat([first[k], rest[k]]) for k in full}, full)
        assert state["position"] == 80
    loader = PretrainLoader(ShardSet(mlm_dir), MaskingConfig(), 16, 8, seed=11)
    loader.load_state_dict({"position": 70, "seed": 11})
    assert loader.epoch == 1
    with pytest.raises(BertgpuError, match="seed"):
        loader.load_state_dict({"position": 0, "seed": 12})


def test_num_workers_match_single_process(nsp_dir):
    cfg = MaskingConfig(whole_word=True)
    single, _ = _steps(nsp_dir, 1, 4, 3, cfg=cfg)
    workers, _ = _steps(nsp_dir, 1, 4, 3, num_workers=2, cfg=cfg)
    _assert_same(workers, single)
    # After load_state_dict the prefetched batches are dropped.
    shards = ShardSet(nsp_dir)
    loader = PretrainLoader(shards, cfg, 16, 4, seed=11, num_workers=2)
    loader.next_step()
    loader.load_state_dict({"position": 16, "seed": 11})
    got = loader.next_step()
    loader.close()
    for k in single:
        assert torch.equal(torch.cat([mb[k] for mb in got]), single[k][16:32]), k


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
def test_a_step_of_many_micro_batches_from_workers_holds_no_descriptor_each(mlm_dir):
    """Each tensor a loader worker sends keeps a file descriptor open while it lives: a step of
    A micro batches held about 9 A of them, and bert-large's recipe (accumulation 4096 at micro
    batch 2) ended in torch's "Too many open files" traceback. 64 micro batches of one sequence
    now hold a handful, whatever A; the batches are the single process's (above)."""
    loader = PretrainLoader(ShardSet(mlm_dir), MaskingConfig(), 64, 1, seed=11, num_workers=1)
    try:
        loader.next_step()  # the worker started, its prefetch in flight
        before = len(os.listdir("/proc/self/fd"))
        held = loader.next_step()
        assert len(held) == 64
        assert len(os.listdir("/proc/self/fd")) - before < 16
    finally:
        loader.close()


def test_num_workers_match_single_process_with_two_ranks(nsp_dir):
    # Each rank's worker reads its own window of every step (offset + step x G), not only step 0.
    single, _ = _steps(nsp_dir, 2, 4, 3)
    workers, _ = _steps(nsp_dir, 2, 4, 3, num_workers=1)
    _assert_same(workers, single)


def test_load_state_dict_drops_prefetched_batches_when_moving_back(nsp_dir):
    single, _ = _steps(nsp_dir, 1, 4, 2)
    loader = PretrainLoader(ShardSet(nsp_dir), MaskingConfig(), 16, 4, seed=11, num_workers=1)
    loader.next_step()
    loader.load_state_dict({"position": 0, "seed": 11})
    got = [loader.next_step() for _ in range(2)]
    loader.close()
    for k in single:
        if k == "batch_meta":
            continue
        assert torch.equal(torch.cat([mb[k] for step in got for mb in step]), single[k]), k


def test_batch_arithmetic_errors(mlm_dir):
    shards = ShardSet(mlm_dir)
    with pytest.raises(BertgpuError) as err:
        PretrainLoader(shards, MaskingConfig(), 96, 8, rank=0, world_size=5)
    assert ("global_batch_size 96 is not divisible by micro_batch_size "
            "8 x 5 devices" in str(err.value))
    with pytest.raises(BertgpuError, match="rank"):
        PretrainLoader(shards, MaskingConfig(), 16, 8, rank=2, world_size=2)
    assert PretrainLoader(shards, MaskingConfig(), 96, 4, world_size=3).accumulation_steps == 8


def test_eval_batches_cover_the_split_in_order_with_fixed_masks(mlm_dir):
    val = ShardSet(mlm_dir, "validation")
    batches = list(iter_eval_batches(val, MaskingConfig(), batch_size=3, seed=4))
    assert [b["input_ids"].shape[0] for b in batches] == [3, 3, 2]
    again = list(ValidationLoader(val, MaskingConfig(), 3, seed=4))
    for a, b in zip(batches, again, strict=True):
        _assert_same(a, b)
    raw = _raw(mlm_dir, "validation")
    labels = torch.cat([b["labels"] for b in batches]).numpy()
    ids = torch.cat([b["input_ids"] for b in batches]).numpy()
    keep = labels == IGNORE_INDEX
    np.testing.assert_array_equal(ids[keep], raw["input_ids"][keep])
    assert (labels != IGNORE_INDEX).sum(1).min() >= 1
    assert len(list(iter_eval_batches(val, MaskingConfig(), 3, seed=4, max_batches=2))) == 2
    # Two ranks split the batches between them.
    r0 = ValidationLoader(val, MaskingConfig(), 3, seed=4, rank=0, world_size=2)
    r1 = ValidationLoader(val, MaskingConfig(), 3, seed=4, rank=1, world_size=2)
    assert (len(r0), len(r1)) == (2, 1)
    _assert_same(next(iter(r1)), batches[1])


def test_trim_batch_keeps_the_math(nsp_dir):
    torch.manual_seed(0)
    loader = PretrainLoader(ShardSet(nsp_dir), MaskingConfig(), 8, 8, seed=2)
    batch = loader.next_step()[0]
    trimmed = trim_batch(batch)
    L = int(batch["attention_mask"].sum(1).max())
    assert (L < 32 and trimmed["input_ids"].shape == (8, L)
            and trimmed["next_sentence_label"].shape == (8,))
    assert (batch["labels"][:, L:] == IGNORE_INDEX).all()
    # A tiny encoder + MLM loss gives the same summed loss on the trimmed batch.
    emb, head = torch.nn.Embedding(100, 16), torch.nn.Linear(16, 100)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)

    def loss(b):
        h = layer(emb(b["input_ids"]) + 0.1 * b["token_type_ids"][..., None],
                  src_key_padding_mask=b["attention_mask"] == 0)
        return torch.nn.functional.cross_entropy(head(h).flatten(0, 1), b["labels"].flatten(),
                                                 reduction="sum")

    torch.testing.assert_close(loss(trimmed), loss(batch), rtol=1e-5, atol=1e-5)
    raw = ShardSet(nsp_dir).get(np.arange(8))
    assert trim_batch(raw)["input_ids"].shape == (8, int(raw["lengths"].max()))

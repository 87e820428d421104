"""SQuAD v1.1 / v2.0: reading, doc-stride windows and n-best span decoding.

The pipeline, numpy in and out so it knows nothing of the model::

    examples = read_squad("dev-v2.0.json", version_2=True)
    feats = featurize(examples, load_tokenizer("tok/"), max_seq_len=384, doc_stride=128)
    start_logits, end_logits = ...          # (len(feats), max_seq_len) each, from the QA head
    preds, nbest = postprocess(examples, feats, start_logits, end_logits, version_2=True)
    write_predictions(preds, "predictions.json")
    print(squad_eval.squad_evaluate(examples, preds))  # {"exact": .., "f1": .., ...}

Windows. The question (at most `max_query_len` tokens) and the context are tokenised separately
with the fast tokenizer's character offsets; every feature is `[CLS] question [SEP] window [SEP]`
where the windows cover the context tokens and consecutive windows overlap by `doc_stride`
tokens (Hugging Face run_qa.py semantics; Google's run_squad.py instead uses doc_stride as the
step between window starts); not given, 128, or half of a question's window where 128 does not
fit below it. A token can sit in several windows; as in Google's BERT, only the window where it
has the most context on both sides may start a predicted answer.

Reading the files is `squad_read.py`'s (re-exported here); the official EM/F1
(evaluate-v1.1.py / evaluate-v2.0.py) are in `squad_eval.py`.
"""

from __future__ import annotations

import collections
import json
import os
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from bertgpu.config.finetune import question_doc_stride
from bertgpu.errors import BertgpuError
from bertgpu.tasks.squad_read import SquadExample, read_squad, read_squad_counted

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = [
    "Features",
    "SquadExample",
    "featurize",
    "postprocess",
    "read_squad",
    "read_squad_counted",
    "write_predictions",
]


# --------------------------------------------------------------------------------------------
# Features (doc-stride windows)


@dataclass
class Features:
    """Model inputs for a list of examples: one row per window. F = features, L = max_seq_len."""

    input_ids: np.ndarray  # (F, L) int64, right-padded with [PAD]
    token_type_ids: np.ndarray  # (F, L) int64: 0 for [CLS] question [SEP], 1 for window [SEP]
    attention_mask: np.ndarray  # (F, L) int64
    example_index: np.ndarray  # (F,) int64: index into the examples list
    offsets: list[list[tuple[int, int] | None]]
    """Per feature and token: [start, end) character span in the context; None off-context."""
    token_is_max_context: np.ndarray  # (F, L) bool: this window is the token's best-centred one
    start_positions: np.ndarray | None = None  # (F,) int64, training only; 0 = [CLS] = no answer
    end_positions: np.ndarray | None = None
    skipped_examples: list[int] = field(default_factory=list)
    """Training only: examples left out because their answer is not in the context."""

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def context_mask(self, f: int) -> np.ndarray:
        """(L,) bool: which tokens of feature `f` are context tokens (may hold an answer)."""
        return np.array([o is not None for o in self.offsets[f]], dtype=bool)


def _special_id(tokenizer: Tokenizer, token: str) -> int:
    i = tokenizer.token_to_id(token)
    if i is None:
        raise BertgpuError(f"tokenizer has no {token} token (expected a BERT WordPiece vocabulary)")
    return int(i)


def featurize(examples: Sequence[SquadExample], tokenizer: Tokenizer, max_seq_len: int = 384,
              doc_stride: int | None = None, max_query_len: int = 64, is_training: bool = False
              ) -> Features:
    """Cut every example into `[CLS] question [SEP] context window [SEP]` features.

    Windows over the context tokens hold `max_seq_len - len(question) - 3` tokens and overlap by
    `doc_stride` tokens; None (not given): per question, 128 where it fits below the question's
    window, else half of it (config.finetune.question_doc_stride). With `is_training`, each
    feature gets the token positions of the first answer when it lies entirely inside the
    window, else (0, 0), the [CLS] "no answer" target; examples whose answer text is not in the
    context are skipped (`skipped_examples`).
    """
    specials = tuple(_special_id(tokenizer, t) for t in ("[CLS]", "[SEP]", "[PAD]"))
    q_encs = tokenizer.encode_batch([e.question for e in examples], add_special_tokens=False)
    c_encs = tokenizer.encode_batch([e.context for e in examples], add_special_tokens=False)
    rows = _Rows()
    for i, (ex, qe, ce) in enumerate(zip(examples, q_encs, c_encs, strict=True)):
        q_ids = qe.ids[:max_query_len]
        max_ctx = max_seq_len - len(q_ids) - 3
        _check_window(max_seq_len, max_ctx, len(q_ids), doc_stride)
        # Not given: an overlap that fits this question's own window (taken from the longest
        # question a run allows, it was 1 token at 48 tokens whatever the question).
        stride = question_doc_stride(max_ctx) if doc_stride is None else doc_stride
        span = ex.train_span if is_training else None
        tok_span = _char_to_token_span(ce.offsets, span) if span is not None else None
        if is_training and tok_span is None and not ex.is_impossible:
            rows.skipped.append(i)  # no answer in the context, or one that covers no token
            continue
        windows = _windows(len(ce.ids), max_ctx, stride)
        for w in range(len(windows)):
            rows.add(i, q_ids, ce.ids, ce.offsets, windows, w, specials,
                     tok_span if is_training else None, is_training)
    return rows.features(max_seq_len, specials[2], is_training)


def _check_window(max_seq_len: int, max_ctx: int, q_len: int, doc_stride: int | None) -> None:
    """A question must leave context tokens, and more than a `doc_stride` given."""
    if max_ctx > 0 and (doc_stride is None or max_ctx > doc_stride):
        return
    left = f"{max_ctx} context tokens per window" if max_ctx > 0 else "no context tokens"
    why = (f"max_seq_len={max_seq_len} leaves {left} after a {q_len}-token question and "
           "[CLS] [SEP] [SEP]")
    if doc_stride is None:
        raise BertgpuError(f"{why} (raise max_seq_len, or lower max_query_len)")
    raise BertgpuError(f"{why}; that must exceed doc_stride={doc_stride} (raise max_seq_len, or "
                       "lower doc_stride or max_query_len)")


def _windows(n: int, max_ctx: int, doc_stride: int) -> list[tuple[int, int]]:
    """[start, end) token windows of a context of `n` tokens: step max_ctx - doc_stride, the last
    window ends at the last token."""
    step = max_ctx - doc_stride
    starts = [0]
    while starts[-1] + max_ctx < n:
        starts.append(starts[-1] + step)
    return [(s, min(s + max_ctx, n)) for s in starts]


@dataclass
class _Rows:
    """Features under construction, one list entry per window."""

    ids: list[list[int]] = field(default_factory=list)
    types: list[list[int]] = field(default_factory=list)
    offsets: list[list[tuple[int, int] | None]] = field(default_factory=list)
    max_context: list[list[bool]] = field(default_factory=list)
    example_index: list[int] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)

    def add(self, i: int, q_ids: list[int], c_ids: list[int], c_off: Sequence[tuple[int, int]],
            windows: list[tuple[int, int]], w: int, specials: tuple[int, int, int],
            tok_span: tuple[int, int] | None, is_training: bool) -> None:
        """Window `w` of example `i`: tokens, types, offsets, max-context flags and targets."""
        cls_id, sep_id, _ = specials
        s, e = windows[w]
        prefix = len(q_ids) + 2  # position of the first context token in the feature
        self.ids.append([cls_id, *q_ids, sep_id, *c_ids[s:e], sep_id])
        self.types.append([0] * prefix + [1] * (e - s + 1))
        self.offsets.append([None] * prefix + [tuple(o) for o in c_off[s:e]] + [None])  # type: ignore[misc]
        self.max_context.append([False] * prefix
                                + [_is_max_context(windows, w, t) for t in range(s, e)]
                                + [False])
        self.example_index.append(i)
        if is_training:
            inside = tok_span is not None and s <= tok_span[0] and tok_span[1] < e
            self.starts.append(tok_span[0] - s + prefix if inside else 0)  # type: ignore[index]
            self.ends.append(tok_span[1] - s + prefix if inside else 0)  # type: ignore[index]

    def features(self, max_seq_len: int, pad_id: int, is_training: bool) -> Features:
        """Right-padded (F, max_seq_len) arrays."""
        f_count = len(self.ids)
        input_ids = np.full((f_count, max_seq_len), pad_id, dtype=np.int64)
        token_type_ids = np.zeros((f_count, max_seq_len), dtype=np.int64)
        attention_mask = np.zeros((f_count, max_seq_len), dtype=np.int64)
        is_max = np.zeros((f_count, max_seq_len), dtype=bool)
        for f, (ids, types, mc) in enumerate(zip(self.ids, self.types, self.max_context,
                                                 strict=True)):
            input_ids[f, : len(ids)] = ids
            token_type_ids[f, : len(ids)] = types
            attention_mask[f, : len(ids)] = 1
            is_max[f, : len(ids)] = mc
            self.offsets[f] += [None] * (max_seq_len - len(ids))
        return Features(
            input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask,
            example_index=np.asarray(self.example_index, dtype=np.int64), offsets=self.offsets,
            token_is_max_context=is_max,
            start_positions=np.asarray(self.starts, dtype=np.int64) if is_training else None,
            end_positions=np.asarray(self.ends, dtype=np.int64) if is_training else None,
            skipped_examples=self.skipped,
        )


def _char_to_token_span(offsets: Sequence[tuple[int, int]],
                        span: tuple[int, int]) -> tuple[int, int] | None:
    """First and last context token overlapping the character span [start, end), or None. An
    answer that starts or ends inside a token ("1950" of "1950s", "Paris" of "Parisian") covers
    the whole tokens holding its characters, as run_qa.py's targets do: it is neither dropped
    nor cut to the tokens it fills."""
    cs, ce = span
    hit = [t for t, (a, b) in enumerate(offsets) if b > cs and a < ce and b > a]
    return (hit[0], hit[-1]) if hit else None


def _is_max_context(windows: Sequence[tuple[int, int]], w: int, t: int) -> bool:
    """Whether window `w` gives token `t` the most context (Google BERT's check_is_max_context):
    score = min(tokens left, tokens right) + 0.01 * window length; first best window wins."""
    best, best_score = None, -1.0
    for k, (s, e) in enumerate(windows):
        if not s <= t < e:
            continue
        score = min(t - s, e - 1 - t) + 0.01 * (e - s)
        if score > best_score:
            best, best_score = k, score
    return best == w


# --------------------------------------------------------------------------------------------
# Post-processing


def postprocess(examples: Sequence[SquadExample], features: Features,
                start_logits: npt.ArrayLike, end_logits: npt.ArrayLike, n_best: int = 20,
                max_answer_len: int = 30, version_2: bool = False, null_threshold: float = 0.0,
                use_max_context: bool = True
                ) -> tuple[dict[str, str], dict[str, list[dict[str, Any]]]]:
    """Best answer text per example id, and the n-best list behind it.

    For each example, over all its features: the `n_best` highest start logits among the
    feature's context tokens that may start an answer (in the window where the token is best
    centred: Google BERT; `use_max_context=False` allows any window, as transformers' run_qa.py)
    and the `n_best` highest end logits among its context tokens; of those, the spans with
    end >= start and at most `max_answer_len` tokens. Other positions (the question, [CLS],
    [SEP], padding) are never candidates, so the answer depends only on the logits of the
    feature's own context tokens, not on how far the feature was padded (Google's and
    run_qa.py's decoders take the top n over all positions first and can lose every valid span
    to them). Score = start + end logit; text cut from the original context by character
    offsets, surrounding whitespace stripped. v2: the null score is the smallest [CLS] start + end
    over the example's features, and "" is predicted when null - best span > `null_threshold`.
    n-best entries: {"text", "score", "start_logit", "end_logit", "probability"} (softmax over the
    list; v2 lists include the null entry with text "").
    """
    sl_all = np.asarray(start_logits, dtype=np.float64)
    el_all = np.asarray(end_logits, dtype=np.float64)
    if sl_all.shape != el_all.shape or sl_all.shape[0] != len(features):
        raise ValueError(
            f"logits {sl_all.shape} / {el_all.shape} do not match {len(features)} features"
        )
    by_example: dict[int, list[int]] = collections.defaultdict(list)
    for f, i in enumerate(features.example_index.tolist()):
        by_example[i].append(f)

    predictions: dict[str, str] = {}
    all_nbest: dict[str, list[dict[str, Any]]] = {}
    for i, ex in enumerate(examples):
        cands, null_score = _candidates(ex, by_example.get(i, []), features, sl_all, el_all, n_best,
                                        max_answer_len, use_max_context)
        entries = _distinct_best(cands, n_best)
        best = entries[0] if entries else None
        if version_2 and np.isfinite(null_score):
            entries.append({"text": "", "score": null_score, "start_logit": None,
                            "end_logit": None})
            entries.sort(key=lambda d: -d["score"])
            null_wins = best is None or null_score - best["score"] > null_threshold
            predictions[ex.id] = "" if null_wins else best["text"]
        else:
            predictions[ex.id] = best["text"] if best is not None else ""
        if entries:
            scores = np.array([d["score"] for d in entries])
            probs = np.exp(scores - scores.max())
            probs /= probs.sum()
            for d, p in zip(entries, probs, strict=True):
                d["probability"] = float(p)
        all_nbest[ex.id] = entries
    return predictions, all_nbest


def _candidates(ex: SquadExample, feature_ids: list[int], features: Features, sl_all: np.ndarray,
                el_all: np.ndarray, n_best: int, max_answer_len: int, use_max_context: bool
                ) -> tuple[list[tuple[float, float, float, str]], float]:
    """Every valid span of an example over its features as (score, start logit, end logit, text),
    best first, and the example's null score (the smallest [CLS] start + end)."""
    cands: list[tuple[float, float, float, str]] = []
    null_score = float("inf")
    for f in feature_ids:
        sl, el = sl_all[f], el_all[f]
        null_score = min(null_score, sl[0] + el[0])
        ok_end = features.context_mask(f)[: len(sl)]
        ok_start = (ok_end & features.token_is_max_context[f][: len(sl)] if use_max_context
                    else ok_end)
        # Only positions that may start (end) an answer take part in the n-best search: the
        # logits at the question, [SEP] and padding would otherwise crowd the real candidates out
        # of the top n, and how much padding a feature has depends on its evaluation batch.
        s_idx = _top_positions(sl, ok_start, n_best)
        e_idx = _top_positions(el, ok_end, n_best)
        length = e_idx[None, :] - s_idx[:, None] + 1  # (n, n)
        valid = (length >= 1) & (length <= max_answer_len)
        for a, b in zip(*np.nonzero(valid), strict=True):
            s, e = int(s_idx[a]), int(e_idx[b])
            cs, ce = features.offsets[f][s][0], features.offsets[f][e][1]  # type: ignore[index]
            ce = _past_marks(ex.context, ce)
            # A byte-level BPE piece ("Ġof") carries the space before its word, and its offsets
            # do too unless the tokenizer trims them; the official normalisation drops it, so
            # stripping changes only the text in predictions.json (and merges " x" with "x").
            text = ex.context[cs:ce].strip()
            cands.append((float(sl[s] + el[e]), float(sl[s]), float(el[e]), text))
    cands.sort(key=lambda c: -c[0])
    return cands, null_score


def _past_marks(text: str, end: int) -> int:
    """`end` moved past the combining marks that follow it: an uncased vocabulary's normaliser
    strips them (accents, Devanagari vowel signs, Hebrew points), so a token's offsets end before
    them, and answers lost their last vowel ("गुरु" came out "गुर", an NFD "Café" "Cafe")."""
    while end < len(text) and unicodedata.category(text[end]).startswith("M"):
        end += 1
    return end


def _top_positions(logits: np.ndarray, allowed: np.ndarray, n: int) -> np.ndarray:
    """The (at most) `n` allowed positions with the highest logits, best first (ties: the lower
    position first)."""
    candidates = np.flatnonzero(allowed)
    return candidates[np.argsort(-logits[candidates], kind="stable")[:n]]


def _distinct_best(cands: list[tuple[float, float, float, str]],
                   n_best: int) -> list[dict[str, Any]]:
    """The n-best entries, keeping the best-scoring occurrence of each text (the same span comes
    from two windows)."""
    seen: set[str] = set()
    entries: list[dict[str, Any]] = []
    for score, s, e, text in cands:
        if text in seen:
            continue
        seen.add(text)
        entries.append({"text": text, "score": score, "start_logit": s, "end_logit": e})
        if len(entries) == n_best:
            break
    return entries


def write_predictions(predictions: Mapping[str, str | float],
                      path: str | os.PathLike[str]) -> Path:
    """Write the official predictions.json ({question id: answer text}), or v2's null_odds.json
    ({question id: float}, squad_job.py), atomically."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(dict(predictions), f, ensure_ascii=False, indent=2)
    os.replace(tmp, out)
    return out

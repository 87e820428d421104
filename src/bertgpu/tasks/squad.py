"""SQuAD v1.1 / v2.0: reading, doc-stride windows, n-best span decoding, official EM/F1.

The pipeline, numpy in and out so it knows nothing of the model::

    examples = read_squad("dev-v2.0.json")
    feats = featurize(examples, load_tokenizer("tok/"), max_seq_len=384, doc_stride=128)
    start_logits, end_logits = ...          # (len(feats), max_seq_len) each, from the QA head
    preds, nbest = postprocess(examples, feats, start_logits, end_logits, version_2=True)
    write_predictions(preds, "predictions.json")
    print(squad_evaluate(examples, preds))  # {"exact": .., "f1": .., "HasAns_exact": .., ...}

Windows. The question (at most `max_query_len` tokens) and the context are tokenised separately
with the fast tokenizer's character offsets; every feature is `[CLS] question [SEP] window [SEP]`
where the windows cover the context tokens and consecutive windows overlap by `doc_stride`
tokens (Hugging Face run_qa.py semantics; Google's run_squad.py instead uses doc_stride as the
step between window starts). A token can sit in several windows; as in Google's BERT, only the
window where it has the most context on both sides may start a predicted answer.

Evaluation follows the official evaluate-v1.1.py / evaluate-v2.0.py scripts: the same answer
normalisation, token-overlap F1, max over gold answers, 0-100 scale. For v2, a question with
no answer is right only when the prediction is "" (both empty -> 1, otherwise 0). One deliberate
difference: a question without a prediction scores 0 and counts in the total (the v2 script
would crash on it).
"""

from __future__ import annotations

import collections
import json
import logging
import os
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from bertgpu.errors import BertgpuError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

log = logging.getLogger(__name__)

__all__ = [
    "Features",
    "SquadExample",
    "exact_match",
    "f1_score",
    "featurize",
    "normalize_answer",
    "postprocess",
    "read_squad",
    "read_squad_counted",
    "squad_evaluate",
    "write_predictions",
]


# --------------------------------------------------------------------------------------------
# Reading


@dataclass(frozen=True)
class SquadExample:
    """One question about one context paragraph."""

    id: str
    title: str
    question: str
    context: str
    answers: tuple[str, ...]
    """Gold answer texts (all annotators); empty for an unanswerable v2 question."""
    answer_starts: tuple[int, ...]
    """Character starts of `answers` in `context`, corrected where the file's was off."""
    is_impossible: bool = False
    plausible_answers: tuple[str, ...] = ()
    """v2 only: what an annotator marked for an unanswerable question (not used for scoring)."""

    @property
    def train_span(self) -> tuple[int, int] | None:
        """Character span [start, end) of the first answer, the one training uses; None when
        unanswerable or when its `answer_start` could not be located in the context."""
        if self.is_impossible or not self.answers or self.answer_starts[0] < 0:
            return None
        return self.answer_starts[0], self.answer_starts[0] + len(self.answers[0])


def read_squad(path: str | os.PathLike[str]) -> list[SquadExample]:
    """All questions of an official SQuAD v1.1 or v2.0 JSON file; see `read_squad_counted`."""
    examples, mismatched = read_squad_counted(path)
    if mismatched:
        log.warning("%s: %d answers whose answer_start does not point at their text", path,
                    mismatched)
    return examples


def read_squad_counted(path: str | os.PathLike[str]) -> tuple[list[SquadExample], int]:
    """Examples of a SQuAD JSON file and the number of answers whose `answer_start` did not point
    at the answer text.

    Such an answer is moved to the occurrence of its text nearest to the given start (the file's
    offsets are sometimes off by a character or two); if the text is nowhere in the context its
    start becomes -1 and training skips the example. Structural problems raise `BertgpuError`
    naming the file and the JSON path, e.g. `data[3].paragraphs[0].qas[2]: missing "id"`.
    """
    path = Path(path)
    if not path.is_file():
        raise BertgpuError(f"{path}: no such file (expected a SQuAD v1.1/v2.0 JSON file)")
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except json.JSONDecodeError as e:
        raise BertgpuError(f"{path}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except UnicodeDecodeError as e:
        raise BertgpuError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None

    def need(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
        if not isinstance(obj, dict):
            raise BertgpuError(f"{path}: {where}: expected an object, found {type(obj).__name__}")
        if key not in obj:
            raise BertgpuError(f'{path}: {where}: missing "{key}"')
        v = obj[key]
        if not isinstance(v, kind):
            names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
            raise BertgpuError(
                f'{path}: {where}.{key}: expected {names}, found {type(v).__name__}'
            )
        return v

    examples: list[SquadExample] = []
    seen: set[str] = set()
    mismatched = 0
    data = need(doc, "data", list, "top level")
    for a, article in enumerate(data):
        wa = f"data[{a}]"
        title = str(article.get("title", "")) if isinstance(article, dict) else ""
        for p, para in enumerate(need(article, "paragraphs", list, wa)):
            wp = f"{wa}.paragraphs[{p}]"
            context = need(para, "context", str, wp)
            for q, qa in enumerate(need(para, "qas", list, wp)):
                wq = f"{wp}.qas[{q}]"
                qid = str(need(qa, "id", (str, int), wq))
                if qid in seen:
                    raise BertgpuError(f'{path}: {wq}: duplicate id "{qid}"')
                seen.add(qid)
                question = need(qa, "question", str, wq)
                impossible = bool(qa.get("is_impossible", False))
                answers = qa.get("answers", []) if impossible else need(qa, "answers", list, wq)
                texts: list[str] = []
                starts: list[int] = []
                for k, ans in enumerate(answers):
                    wk = f"{wq}.answers[{k}]"
                    text = need(ans, "text", str, wk)
                    start = need(ans, "answer_start", int, wk)
                    fixed = _locate(context, text, start)
                    if fixed != start:
                        mismatched += 1
                    texts.append(text)
                    starts.append(fixed)
                if not impossible and not texts:
                    raise BertgpuError(
                        f'{path}: {wq}.answers: empty for a question without "is_impossible": true'
                    )
                plausible = tuple(
                    str(x.get("text", "")) for x in qa.get("plausible_answers", [])
                    if isinstance(x, dict)
                )
                examples.append(SquadExample(qid, title, question, context, tuple(texts),
                                             tuple(starts), impossible, plausible))
    if not examples:
        raise BertgpuError(f"{path}: no questions (expected data[].paragraphs[].qas[])")
    return examples, mismatched


def _locate(context: str, text: str, start: int) -> int:
    """`start` if the answer text is there, else the nearest occurrence of the text, else -1."""
    if context[start:start + len(text)] == text:
        return start
    hits = [m.start() for m in re.finditer(re.escape(text), context)] if text else []
    return min(hits, key=lambda h: abs(h - start)) if hits else -1


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
              doc_stride: int = 128, max_query_len: int = 64, is_training: bool = False
              ) -> Features:
    """Cut every example into `[CLS] question [SEP] context window [SEP]` features.

    Windows over the context tokens hold `max_seq_len - len(question) - 3` tokens and overlap by
    `doc_stride` tokens. With `is_training`, each feature gets the token positions of the first
    answer when it lies entirely inside the window, else (0, 0), the [CLS] "no answer" target;
    examples whose answer text is not in the context are skipped (`skipped_examples`).
    """
    cls_id, sep_id = _special_id(tokenizer, "[CLS]"), _special_id(tokenizer, "[SEP]")
    pad_id = _special_id(tokenizer, "[PAD]")
    q_encs = tokenizer.encode_batch([e.question for e in examples], add_special_tokens=False)
    c_encs = tokenizer.encode_batch([e.context for e in examples], add_special_tokens=False)

    ids_rows: list[list[int]] = []
    type_rows: list[list[int]] = []
    offset_rows: list[list[tuple[int, int] | None]] = []
    maxctx_rows: list[list[bool]] = []
    ex_index: list[int] = []
    starts: list[int] = []
    ends: list[int] = []
    skipped: list[int] = []
    for i, (ex, qe, ce) in enumerate(zip(examples, q_encs, c_encs, strict=True)):
        q_ids = qe.ids[:max_query_len]
        max_ctx = max_seq_len - len(q_ids) - 3
        if max_ctx <= doc_stride:
            raise BertgpuError(
                f"max_seq_len={max_seq_len} leaves {max_ctx} context tokens per window after a "
                f"{len(q_ids)}-token question; that must exceed doc_stride={doc_stride} "
                "(lower doc_stride or max_query_len)"
            )
        c_ids, c_off = ce.ids, ce.offsets
        n = len(c_ids)
        span = ex.train_span if is_training else None
        if is_training and span is None and not ex.is_impossible:
            skipped.append(i)
            continue
        tok_span = _char_to_token_span(c_off, span) if span is not None else None
        if is_training and span is not None and tok_span is None:
            skipped.append(i)  # the answer covers no token (e.g. only whitespace)
            continue

        # Window starts: step max_ctx - doc_stride, the last window ends at the last token.
        step = max_ctx - doc_stride
        win_starts = [0]
        while win_starts[-1] + max_ctx < n:
            win_starts.append(win_starts[-1] + step)
        windows = [(s, min(s + max_ctx, n)) for s in win_starts]

        for w, (s, e) in enumerate(windows):
            ids = [cls_id, *q_ids, sep_id, *c_ids[s:e], sep_id]
            types = [0] * (len(q_ids) + 2) + [1] * (e - s + 1)
            prefix = len(q_ids) + 2  # position of the first context token in the feature
            offs: list[tuple[int, int] | None] = [None] * prefix
            offs += [tuple(o) for o in c_off[s:e]]  # type: ignore[misc]
            offs.append(None)
            maxctx = [False] * prefix + [
                _is_max_context(windows, w, t) for t in range(s, e)
            ] + [False]
            ids_rows.append(ids)
            type_rows.append(types)
            offset_rows.append(offs)
            maxctx_rows.append(maxctx)
            ex_index.append(i)
            if is_training:
                if tok_span is not None and s <= tok_span[0] and tok_span[1] < e:
                    starts.append(tok_span[0] - s + prefix)
                    ends.append(tok_span[1] - s + prefix)
                else:
                    starts.append(0)
                    ends.append(0)

    f_count = len(ids_rows)
    input_ids = np.full((f_count, max_seq_len), pad_id, dtype=np.int64)
    token_type_ids = np.zeros((f_count, max_seq_len), dtype=np.int64)
    attention_mask = np.zeros((f_count, max_seq_len), dtype=np.int64)
    is_max = np.zeros((f_count, max_seq_len), dtype=bool)
    for f, (ids, types, mc) in enumerate(zip(ids_rows, type_rows, maxctx_rows, strict=True)):
        input_ids[f, : len(ids)] = ids
        token_type_ids[f, : len(ids)] = types
        attention_mask[f, : len(ids)] = 1
        is_max[f, : len(ids)] = mc
        offset_rows[f] += [None] * (max_seq_len - len(ids))
    return Features(
        input_ids=input_ids,
        token_type_ids=token_type_ids,
        attention_mask=attention_mask,
        example_index=np.asarray(ex_index, dtype=np.int64),
        offsets=offset_rows,
        token_is_max_context=is_max,
        start_positions=np.asarray(starts, dtype=np.int64) if is_training else None,
        end_positions=np.asarray(ends, dtype=np.int64) if is_training else None,
        skipped_examples=skipped,
    )


def _char_to_token_span(offsets: Sequence[tuple[int, int]],
                        span: tuple[int, int]) -> tuple[int, int] | None:
    """First and last context token overlapping the character span [start, end), or None."""
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

    For each example, over all its features: the `n_best` highest start and end logits, spans
    inside the context with end >= start, at most `max_answer_len` tokens, starting in the
    window where the start token is best centred (Google BERT; `use_max_context=False` allows any
    window, as transformers' run_qa.py); score = start + end logit; text cut from the
    original context by character offsets. v2: the null score is the smallest [CLS] start + end
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
        cands: list[tuple[float, float, float, str]] = []  # (score, start, end, text)
        null_score = float("inf")
        for f in by_example.get(i, []):
            sl, el = sl_all[f], el_all[f]
            null_score = min(null_score, sl[0] + el[0])
            ok_end = features.context_mask(f)[: len(sl)]
            ok_start = ok_end & features.token_is_max_context[f][: len(sl)] if use_max_context \
                else ok_end
            s_idx = np.argsort(-sl, kind="stable")[:n_best]
            e_idx = np.argsort(-el, kind="stable")[:n_best]
            length = e_idx[None, :] - s_idx[:, None] + 1  # (n, n)
            valid = (ok_start[s_idx][:, None] & ok_end[e_idx][None, :]
                     & (length >= 1) & (length <= max_answer_len))
            for a, b in zip(*np.nonzero(valid), strict=True):
                s, e = int(s_idx[a]), int(e_idx[b])
                cs, ce = features.offsets[f][s][0], features.offsets[f][e][1]  # type: ignore[index]
                cands.append((float(sl[s] + el[e]), float(sl[s]), float(el[e]), ex.context[cs:ce]))
        cands.sort(key=lambda c: -c[0])
        # Keep the best-scoring occurrence of each text (the same span comes from two windows).
        seen: set[str] = set()
        entries: list[dict[str, Any]] = []
        for score, s, e, text in cands:
            if text in seen:
                continue
            seen.add(text)
            entries.append({"text": text, "score": score, "start_logit": s, "end_logit": e})
            if len(entries) == n_best:
                break
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


def write_predictions(predictions: Mapping[str, str], path: str | os.PathLike[str]) -> Path:
    """Write the official predictions.json ({question id: answer text}), atomically."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(dict(predictions), f, ensure_ascii=False, indent=2)
    os.replace(tmp, out)
    return out


# --------------------------------------------------------------------------------------------
# Official evaluation (evaluate-v1.1.py / evaluate-v2.0.py)

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """Lower-case, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised strings are equal."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction: str, gold: str, version_2: bool = True) -> float:
    """Token-overlap F1 of the normalised answers.

    v2 rule (default): when either side has no tokens, 1.0 if both have none else 0.0. The v1.1
    script returns 0.0 whenever nothing overlaps, even for two empty strings.
    """
    p = normalize_answer(prediction).split()
    g = normalize_answer(gold).split()
    if version_2 and (not p or not g):
        return float(p == g)
    common = collections.Counter(p) & collections.Counter(g)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def squad_evaluate(examples: Sequence[SquadExample], predictions: Mapping[str, str],
                   version_2: bool | None = None) -> dict[str, float]:
    """Official SQuAD scores on the 0-100 scale: exact, f1, total; for v2 also HasAns_/NoAns_
    exact, f1 and total. `version_2` defaults to "any example is unanswerable"."""
    if version_2 is None:
        version_2 = any(e.is_impossible for e in examples)
    em: dict[str, float] = {}
    f1: dict[str, float] = {}
    missing = 0
    for ex in examples:
        if version_2:
            # evaluate-v2.0.py: golds that normalise to nothing are dropped; none left = no answer.
            golds = [a for a in ex.answers if normalize_answer(a)] or [""]
        else:
            golds = list(ex.answers)
        pred = predictions.get(ex.id)
        if pred is None:
            missing += 1
            em[ex.id] = f1[ex.id] = 0.0
            continue
        em[ex.id] = max(exact_match(pred, g) for g in golds)
        f1[ex.id] = max(f1_score(pred, g, version_2) for g in golds)
    if missing:
        log.warning("%d of %d questions have no prediction (scored 0)", missing, len(examples))

    def block(ids: list[str], prefix: str = "") -> dict[str, float]:
        n = len(ids)
        return {
            f"{prefix}exact": 100.0 * sum(em[k] for k in ids) / n if n else 0.0,
            f"{prefix}f1": 100.0 * sum(f1[k] for k in ids) / n if n else 0.0,
            f"{prefix}total": float(n),
        }

    out = block([e.id for e in examples])
    if version_2:
        # evaluate-v2.0.py: "has answer" means a non-empty answers list, before normalisation.
        has = [e.id for e in examples if e.answers and not e.is_impossible]
        has_set = set(has)
        no = [e.id for e in examples if e.id not in has_set]
        if has:
            out.update(block(has, "HasAns_"))
        if no:
            out.update(block(no, "NoAns_"))
    return out

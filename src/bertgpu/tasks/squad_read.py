"""SQuAD v1.1 / v2.0 files read into questions: `read_squad` (tasks/squad.py re-exports it, with
the windows and the span decoding that use its `SquadExample`s). Every problem of a file is one
line naming it and the JSON path (`data[0].paragraphs[1].qas[2]...`); answers whose
`answer_start` is off are moved onto their text, and answers whose text is nowhere in their
context are counted apart, since their questions leave training."""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertgpu.errors import BertgpuError
from bertgpu.fsutil import not_utf8

log = logging.getLogger(__name__)

__all__ = ["SquadExample", "read_squad", "read_squad_counted"]


@dataclass(frozen=True)
class SquadExample:
    """One question about one context paragraph."""

    id: str
    title: str
    question: str
    context: str
    answers: tuple[str, ...]
    """Gold answer texts (all annotators) as the file gives them; empty for an unanswerable v2
    question in an official file (squad_eval.py scores a question with answers as answerable,
    as evaluate-v2.0.py does, even when it is marked is_impossible)."""
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


def read_squad(path: str | os.PathLike[str], version_2: bool = False) -> list[SquadExample]:
    """All questions of an official SQuAD v1.1 or v2.0 JSON file; see `read_squad_counted`."""
    examples, mismatched = read_squad_counted(path, version_2)
    lost = sum(s < 0 for e in examples for s in e.answer_starts)  # text not in the context
    untrained = sum(1 for e in examples
                    if not e.is_impossible and e.answers and e.answer_starts[0] < 0)
    if mismatched > lost:
        log.warning("%s: %d answers whose answer_start does not point at their text, moved onto "
                    "its nearest occurrence", path, mismatched - lost)
    if lost:
        log.warning("%s: %d answers whose text is nowhere in their context; %d questions whose "
                    "first answer is one of them have no training target and are left out of "
                    "training (evaluation scores answers by their text)", path, lost, untrained)
    return examples


def read_squad_counted(path: str | os.PathLike[str],
                       version_2: bool = False) -> tuple[list[SquadExample], int]:
    """Examples of a SQuAD JSON file and the number of answers whose `answer_start` did not point
    at the answer text.

    Such an answer is moved to the occurrence of its text nearest to the given start (the file's
    offsets are sometimes off by a character or two); if the text is nowhere in the context its
    start becomes -1 and training skips the example. Structural problems raise `BertgpuError`
    naming the file and the JSON path, e.g. `data[3].paragraphs[0].qas[2]: missing "id"`.

    A question is unanswerable when it says `"is_impossible": true`, or, with `version_2`, when
    it has no such field and `"answers": []`: Hugging Face's squad_v2 has no is_impossible, and
    evaluate-v2.0.py looks at the answers list only. Without `version_2` (SQuAD v1.1, where every
    question has an answer) such a question is refused, pointing at `finetune squad2`.
    `"is_impossible": false` with no answers is refused in every file: no official one, train or
    dev, has it, and it contradicts itself (an answerable question with nothing to train on or
    to score against; which of the two is wrong, only the file's author knows).
    """
    path = Path(path)
    doc = _read_json(path)
    examples: list[SquadExample] = []
    seen: set[str] = set()
    mismatched = 0
    for a, article in enumerate(_need(path, doc, "data", list, "top level")):
        wa = f"data[{a}]"
        title = str(article.get("title", "")) if isinstance(article, dict) else ""
        for p, para in enumerate(_need(path, article, "paragraphs", list, wa)):
            wp = f"{wa}.paragraphs[{p}]"
            context = _need(path, para, "context", str, wp)
            for q, qa in enumerate(_need(path, para, "qas", list, wp)):
                wq = f"{wp}.qas[{q}]"
                qid = str(_need(path, qa, "id", (str, int), wq))
                if qid in seen:
                    raise BertgpuError(f'{path}: {wq}: duplicate id "{qid}"')
                seen.add(qid)
                question = _need(path, qa, "question", str, wq)
                flag = qa.get("is_impossible")
                if flag is not None and not isinstance(flag, bool):  # "false" would read true
                    raise BertgpuError(f'{path}: {wq}.is_impossible: expected true or false, '
                                       f'found {json.dumps(flag)}')
                texts, starts, moved = _answers(path, qa, context, flag, version_2, wq)
                # No flag (files converted from Hugging Face's squad_v2 have none): unanswerable
                # exactly when "answers" is empty, as evaluate-v2.0.py decides.
                impossible = not texts if flag is None else bool(flag)
                mismatched += moved
                plausible = tuple(
                    str(x.get("text", "")) for x in qa.get("plausible_answers", [])
                    if isinstance(x, dict)
                )
                examples.append(SquadExample(qid, title, question, context, tuple(texts),
                                             tuple(starts), impossible, plausible))
    if not examples:
        raise BertgpuError(f"{path}: no questions (expected data[].paragraphs[].qas[])")
    return examples, mismatched


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise BertgpuError(f"{path}: no such file (expected a SQuAD v1.1/v2.0 JSON file)")
    try:
        with open(path, encoding="utf-8-sig") as f:  # a BOM is no JSON error
            return json.load(f)
    except json.JSONDecodeError as e:
        raise BertgpuError(f"{path}: invalid JSON at line {e.lineno} column "
                           f"{e.colno}: {e.msg}") from None
    except UnicodeDecodeError:
        raise not_utf8(path) from None


def _need(path: Path, obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """obj[key] of type `kind`, or the one-line error naming the file and the JSON path."""
    if not isinstance(obj, dict):
        raise BertgpuError(f"{path}: {where}: expected an object, found {type(obj).__name__}")
    if key not in obj:
        raise BertgpuError(f'{path}: {where}: missing "{key}"')
    v = obj[key]
    if not isinstance(v, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise BertgpuError(f'{path}: {where}.{key}: expected {names}, found {type(v).__name__}')
    return v


def _answers(path: Path, qa: Any, context: str, flag: Any, version_2: bool,
             wq: str) -> tuple[list[str], list[int], int]:
    """The answer texts of a question (`flag`: its "is_impossible", None when absent), their
    starts (moved onto the text when off), and how many moved."""
    answers = qa.get("answers", []) if flag else _need(path, qa, "answers", list, wq)
    texts: list[str] = []
    starts: list[int] = []
    moved = 0
    for k, ans in enumerate(answers):
        wk = f"{wq}.answers[{k}]"
        text = _need(path, ans, "text", str, wk)
        start = _need(path, ans, "answer_start", int, wk)
        fixed = _locate(context, text, start)
        moved += fixed != start
        texts.append(text)
        starts.append(fixed)
    if flag is None and not texts and not version_2:
        raise BertgpuError(f'{path}: {wq}.answers: empty for a question without "is_impossible": '
                           'true (every SQuAD v1.1 question has an answer; for SQuAD v2.0, where '
                           '"answers": [] marks an unanswerable question, use finetune squad2)')
    if flag is not None and not flag and not texts:
        raise BertgpuError(f'{path}: {wq}.answers: empty for a question with "is_impossible": '
                           f'{json.dumps(flag)} (expected its answers, or "is_impossible": true '
                           'for an unanswerable SQuAD v2.0 question)')
    return texts, starts, moved


def _locate(context: str, text: str, start: int) -> int:
    """`start` if the answer text is there, else the nearest occurrence of the text, else -1."""
    if context[start:start + len(text)] == text:
        return start
    hits = [m.start() for m in re.finditer(re.escape(text), context)] if text else []
    return min(hits, key=lambda h: abs(h - start)) if hits else -1

"""SQuAD edge cases: an answer at the very start of the context, the question cap, windows that
exactly fill the context, the n-best length, v2's best_exact over unanswered questions and the
job's --max_eval_examples cut."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _tiny_init import word_tokenizer

from bertgpu.config.finetune import FinetuneConfig
from bertgpu.tasks.squad import SquadExample, _windows, featurize, postprocess
from bertgpu.tasks.squad_eval import best_thresholds
from bertgpu.tasks.squad_job import squad_job

WORDS = [f"w{i}" for i in range(20)] + "what is the red blue green gold ?".split()


@pytest.fixture
def tok(tmp_path: Path):
    """A word-level BERT WordPiece tokenizer (vocab.txt only) as `load_tokenizer` builds it."""
    return word_tokenizer(tmp_path / "tok", WORDS)


def _example(qid: str, context: str, answer: str, question: str = "what is red ?"
             ) -> SquadExample:
    return SquadExample(qid, "t", question, context, (answer,), (context.index(answer),))


def test_answer_at_the_start_of_the_context_is_trained_on(tok) -> None:
    """A training question whose answer starts at character 0 of the context keeps its answer
    span instead of being dropped as one without an answer."""
    ex = _example("q0", "red is the w1 w2", "red")
    assert ex.answer_starts == (0,)
    assert ex.train_span == (0, 3)
    feats = featurize([ex], tok, max_seq_len=32, doc_stride=4, is_training=True)
    assert feats.skipped_examples == [] and len(feats) == 1
    s, e = int(feats.start_positions[0]), int(feats.end_positions[0])
    assert s == e and s > 0
    assert ex.context[feats.offsets[0][s][0]:feats.offsets[0][e][1]] == "red"


def test_question_is_cut_to_max_query_len_tokens(tok) -> None:
    """A long question keeps exactly max_query_len tokens: [CLS], 5 question tokens, [SEP],
    then the context."""
    question = " ".join(f"w{i}" for i in range(10))
    ex = _example("q", "red blue green", "blue", question=question)
    feats = featurize([ex], tok, max_seq_len=32, doc_stride=4, max_query_len=5)
    vocab = tok.get_vocab()
    ids = feats.input_ids[0].tolist()
    assert ids[:7] == [vocab["[CLS]"]] + [vocab[f"w{i}"] for i in range(5)] + [vocab["[SEP]"]]
    assert int(np.flatnonzero(feats.token_type_ids[0])[0]) == 7
    assert ids[7] == vocab["red"]


def test_context_that_exactly_fills_a_window_gets_one_window() -> None:
    """A context exactly as long as a window is one window, with no redundant second window;
    one token more needs a second window ending at the last token."""
    assert _windows(10, 10, 4) == [(0, 10)]
    assert _windows(11, 10, 4) == [(0, 10), (6, 11)]
    assert _windows(9, 10, 4) == [(0, 9)]


def test_nbest_list_holds_n_best_entries(tok) -> None:
    """The n-best list of a question holds at most n_best answers (not one more), when the
    context has more valid spans than that."""
    ex = _example("q", "w1 w2 w3 w4 w5 w6", "w2")
    feats = featurize([ex], tok, max_seq_len=32, doc_stride=4)
    ctx = [k for k, o in enumerate(feats.offsets[0]) if o is not None]
    assert len(ctx) == 6
    sl = np.full(feats.input_ids.shape, -5.0)
    el = np.full(feats.input_ids.shape, -5.0)
    sl[0, ctx[0]], sl[0, ctx[1]] = 3.0, 2.0  # starts w1, w2; ends w3, w4: four valid spans
    el[0, ctx[2]], el[0, ctx[3]] = 3.0, 2.0
    _, nbest = postprocess([ex], feats, sl, el, n_best=2)
    assert [d["text"] for d in nbest["q"]] == ["w1 w2 w3", "w1 w2 w3 w4"]


def test_best_exact_counts_unpredicted_questions_as_wrong() -> None:
    """v2 best_exact / best_f1 divide by every question: one right answer out of two questions,
    the other without a prediction, is 50, not 100."""
    examples = [_example("a", "red blue", "red"), _example("b", "green gold", "gold")]
    out = best_thresholds(examples, {"a": "red"}, {"a": -1.0})
    assert out["best_exact"] == pytest.approx(50.0)
    assert out["best_f1"] == pytest.approx(50.0)


def test_squad_job_cuts_dev_by_max_eval_examples(tmp_path: Path, tok) -> None:
    """--max_eval_examples cuts the SQuAD dev set and --max_train_examples the training set, each
    by its own number (the dev set is not cut by the training number)."""
    colours = ["red", "blue", "green", "gold"]
    qas = []
    for i in range(6):
        ctx = f"w{i} is {colours[i % 4]} ."
        qas.append({"context": ctx, "qas": [{"id": f"q{i}", "question": f"what is w{i} ?",
                                             "answers": [{"text": colours[i % 4],
                                                          "answer_start": ctx.index("is") + 3}]}]})
    path = tmp_path / "squad.json"
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": qas}]}),
                    encoding="utf-8")
    cfg = FinetuneConfig(max_seq_len=64, max_query_len=16, max_train_examples=2,
                         max_eval_examples=5)
    job = squad_job(False, path, path, tok, cfg)
    assert len(job.train) == 2
    dev_ids = [qid for qid, _ in json.loads(job.evals[0].truth)]
    assert dev_ids == ["q0", "q1", "q2", "q3", "q4"]
    assert len(job.evals[0].data) == 5

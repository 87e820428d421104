"""SQuAD edge cases: an answer at the very start of the context, the question cap, windows that
exactly fill the context, the n-best length, v2's best_exact over unanswered questions and the
job's --max_eval_examples cut."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _tiny_init import word_tokenizer

from bertgpu.config.finetune import (
    FinetuneConfig,
    doc_stride,
    doc_stride_note,
    job_config,
    load_finetune_config,
)
from bertgpu.errors import BertgpuError
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


# --------------------------------------------------------------------------------------------
# The default doc stride with a short max_seq_len: chosen per question

SQUAD_V1 = Path(__file__).parent / "fixtures" / "squad" / "dev-v1.1-sample.json"


def _numbered(n: int) -> str:
    """n word tokens: w0 .. w19, w0 .. (one token each in `tok`'s vocabulary)."""
    return " ".join(f"w{i % 20}" for i in range(n))


def _overlaps(feats) -> list[int]:
    """Context tokens shared by consecutive windows of one example's features."""
    ctx = [[o for o in offs if o is not None] for offs in feats.offsets]
    return [len(set(a) & set(b)) for a, b in zip(ctx, ctx[1:], strict=False)]


def test_default_stride_is_half_of_each_questions_own_window(tok) -> None:
    """No doc_stride: each question's windows overlap by the default 128 where it fits below the
    context tokens the question leaves, else by half of them. The default came from the longest
    question (max_query_len 64), which leaves nothing of 48 tokens: the overlap was 1 token
    whatever the question (or featurize refused 128)."""
    context = _numbered(90)
    short = _example("short", context, "w5", question="what is red ?")  # 4 tokens: 41 left
    long_q = _example("long", context, "w5", question=_numbered(13))  # 13 tokens: 32 left
    for ex, stride in ((short, 20), (long_q, 16)):
        feats = featurize([ex], tok, max_seq_len=48)
        assert len(feats) >= 3 and set(_overlaps(feats)) == {stride}, ex.id
        same = featurize([ex], tok, max_seq_len=48, doc_stride=stride)
        np.testing.assert_array_equal(feats.input_ids, same.input_ids)
    both = featurize([short, long_q], tok, max_seq_len=48)  # each its own, in one call
    assert len(both) == len(featurize([short], tok, max_seq_len=48)) + len(
        featurize([long_q], tok, max_seq_len=48))
    # 128 where it fits: 200 tokens leave 193 after a 4-token question
    assert set(_overlaps(featurize([_example("s", _numbered(400), "w5")], tok,
                                   max_seq_len=200))) == {128}
    # a window of one context token cannot overlap: one token per window, not an error
    one = featurize([_example("one", "w1 w2 w3", "w2", question="w1 w2 w3 w4")], tok,
                    max_seq_len=8)
    assert len(one) == 3 and set(_overlaps(one)) == {0}
    with pytest.raises(BertgpuError, match="leaves no context tokens"):
        featurize([long_q], tok, max_seq_len=16)


def test_squad_job_default_stride_keeps_an_answer_across_a_window_edge(tmp_path: Path,
                                                                        tok) -> None:
    """`finetune squad` at 48 tokens without --doc_stride (a 48-position model): a 3-token
    answer across the first window's end (context tokens 39..41 of windows of 41) lay wholly in
    no window with the old 1-token overlap, and the question had no training target; with half
    the question's window (20) the second window holds it."""
    context = _numbered(60)
    answer = "w19 w0 w1"
    start = len(" ".join(_numbered(60).split()[:39])) + 1
    assert context[start:start + len(answer)] == answer
    qa = {"id": "q", "question": "what is red ?",
          "answers": [{"text": answer, "answer_start": start}]}
    path = tmp_path / "squad.json"
    path.write_text(json.dumps({"version": "1.1", "data": [
        {"title": "t", "paragraphs": [{"context": context, "qas": [qa]}]}]}), encoding="utf-8")
    cfg = job_config(load_finetune_config(None, ["--max_seq_len", "48"]), 48)
    job = squad_job(False, path, path, tok, cfg)
    starts, ends = job.train.targets["start_positions"], job.train.targets["end_positions"]
    held = [f for f in range(len(starts)) if starts[f]]
    assert len(held) == 1
    f = held[0]
    pieces = [tok.id_to_token(int(i)) for i in job.train.ids[f][starts[f]:ends[f] + 1]]
    assert " ".join(pieces) == answer


def test_config_says_which_doc_stride_is_used() -> None:
    """The stride results.json records and the start-up table shows: 128 where it fits every
    question's window, else how it is chosen per question; a given one as given. job_config's
    stride (None: per question) gives the same again when squad_job resolves it."""
    cfg = load_finetune_config()
    assert doc_stride(cfg, 384) == 128 == job_config(cfg, 384).doc_stride
    assert doc_stride_note(cfg, 384) == "128"
    per_question = ("half of each question's window (the default 128 does not fit beside a "
                    "question in 48 tokens)")
    assert doc_stride(cfg, 48) == per_question == doc_stride_note(cfg, 48)
    assert job_config(cfg, 48).doc_stride is None
    assert doc_stride(job_config(cfg, 48), 48) == per_question
    assert doc_stride(cfg, 160) == ("128, or half of a question's window where 128 does not fit "
                                    "beside it in 160 tokens (questions of 29 tokens or more)")
    assert doc_stride(job_config(cfg, 384), 384) == 128
    given = load_finetune_config(None, ["--doc_stride", "20", "--max_query_len", "16"])
    assert doc_stride(given, 48) == 20 == job_config(given, 48).doc_stride
    assert doc_stride_note(given, 48) == "20"


def test_results_say_the_default_stride_was_chosen_per_question(tmp_path: Path, capsys) -> None:
    """`finetune squad --max_seq_len 64`: results.json and the start-up table say that each
    question's windows overlap by half its window, and the training sequences are those windows
    (featurize without a stride), not those of the old 1-token overlap."""
    from _tiny_init import SPECIAL, tiny_init

    from bertgpu.data.tokenizer_folder import load_tokenizer
    from bertgpu.finetune import finetune
    from bertgpu.tasks.squad import read_squad

    vocab = SPECIAL + "the of a is in what who and to , . ? which".split()
    init = tiny_init(tmp_path, vocab)
    res = finetune("squad", None, init, tmp_path / "out", train_file=SQUAD_V1,
                   dev_file=SQUAD_V1, overrides=["--epochs", "1", "--global_batch_size", "4",
                                                 "--max_seq_len", "64"])
    said = ("half of each question's window (the default 128 does not fit beside a question in "
            "64 tokens)")
    assert res["doc_stride"] == said and res["config"]["doc_stride"] is None
    assert f"doc stride {said}" in capsys.readouterr().out
    tokenizer = load_tokenizer(init)
    tokenizer.no_truncation()
    tokenizer.no_padding()
    examples = read_squad(SQUAD_V1)

    def windows(stride: int | None) -> int:
        return len(featurize(examples, tokenizer, max_seq_len=64, doc_stride=stride,
                             is_training=True))

    assert res["train_sequences"] == windows(None) != windows(1)


# --------------------------------------------------------------------------------------------
# Answers that start or end inside a word piece


def _run_qa_span(folder: Path, question: str, context: str, start_char: int, end_char: int
                 ) -> tuple[list[int], int, int]:
    """Input ids and start/end targets of one window as transformers' run_qa.py
    `prepare_train_features` makes them: the start is the last context token starting at or
    before the answer's first character, the end the first one ending at or after its last."""
    from transformers import BertTokenizerFast

    enc = BertTokenizerFast.from_pretrained(str(folder), do_lower_case=True)(
        question, context, return_offsets_mapping=True)
    offsets, seq_ids = enc["offset_mapping"], enc.sequence_ids(0)
    s = seq_ids.index(1)
    e = len(seq_ids) - 1 - seq_ids[::-1].index(1)
    while s <= e and offsets[s][0] <= start_char:
        s += 1
    while offsets[e][1] >= end_char:
        e -= 1
    return enc["input_ids"], s - 1, e + 1


@pytest.mark.parametrize("context,answer,widened", [
    ("born in the 1950s ?", "1950", "1950s"),  # ends inside the token "1950s"
    ("born in the 1950s ?", "50s", "1950s"),  # starts inside it
    ("the parisian city", "Paris", "parisian"),  # ends inside "##isian" ("par ##isian")
    ("the parisian city", "risi", "parisian"),  # starts inside "par", ends inside "##isian"
    ("the parisian city", "sian city", "isian city"),  # starts inside "##isian"
])
def test_an_answer_inside_a_word_piece_covers_the_whole_pieces(tmp_path: Path, context: str,
                                                               answer: str, widened: str) -> None:
    """A training answer whose characters start or end inside a token is not dropped: its span
    covers the tokens holding its characters (widened to whole tokens), run_qa.py's targets."""
    tok = word_tokenizer(tmp_path / "pieces", "born in the 1950s ? par ##isian city what".split())
    assert tok.encode("Parisian 1950s", add_special_tokens=False).tokens == [
        "par", "##isian", "1950s"]
    start = context.lower().index(answer.lower())
    ex = SquadExample("q", "t", "what ?", context, (answer,), (start,))
    feats = featurize([ex], tok, max_seq_len=32, doc_stride=4, is_training=True)
    assert feats.skipped_examples == [] and len(feats) == 1
    s, e = int(feats.start_positions[0]), int(feats.end_positions[0])
    assert context[feats.offsets[0][s][0]:feats.offsets[0][e][1]] == widened
    ids, ref_s, ref_e = _run_qa_span(tmp_path / "pieces", ex.question, context, start,
                                     start + len(answer))
    assert feats.input_ids[0, :len(ids)].tolist() == ids and (s, e) == (ref_s, ref_e)

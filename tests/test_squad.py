"""SQuAD: official-format fixtures (tests/fixtures/squad), windows checked against transformers'
BertTokenizerFast overflow windows, span decoding on synthetic logits, and the official EM/F1
rules on hand-made cases."""

from __future__ import annotations

import json
import re
import string
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from bertgpu.errors import BertgpuError
from bertgpu.tasks.squad import (
    Features,
    SquadExample,
    featurize,
    postprocess,
    read_squad,
    read_squad_counted,
    write_predictions,
)
from bertgpu.tasks.squad_eval import exact_match, f1_score, normalize_answer, squad_evaluate

FIX = Path(__file__).parent / "fixtures" / "squad"
V1 = FIX / "dev-v1.1-sample.json"
V2 = FIX / "dev-v2.0-sample.json"
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _vocab(texts: list[str]) -> list[str]:
    """A WordPiece vocabulary covering `texts`; words longer than 6 characters are only in the
    vocabulary as two pieces ("bro", "##ncos") so the tests see sub-word tokens."""
    pre = pre_tokenizers.BertPreTokenizer()
    norm = normalizers.BertNormalizer(lowercase=True)
    vocab = dict.fromkeys(SPECIALS)
    for t in texts:
        for word, _ in pre.pre_tokenize_str(norm.normalize_str(t)):
            if len(word) > 6:
                vocab.update(dict.fromkeys([word[:3], "##" + word[3:]]))
            else:
                vocab[word] = None
    return list(vocab)


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    texts = []
    for path in (V1, V2):
        for e in read_squad(path):
            texts += [e.question, e.context]
    texts += [_long_example().context, _long_example().question]
    path = tmp_path_factory.mktemp("tok") / "vocab.txt"
    path.write_text("\n".join(_vocab(texts)) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tok(vocab_file: Path) -> Tokenizer:
    vocab = {w: i for i, w in enumerate(vocab_file.read_text(encoding="utf-8").split("\n")) if w}
    t = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    t.normalizer = normalizers.BertNormalizer(lowercase=True)
    t.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return t


def _long_example(answer_at: int = 40) -> SquadExample:
    # 60 numbered sentences; the answer is sentence number `answer_at`'s city.
    words = [f"Station{i} lies in town{i}." for i in range(60)]
    context = " ".join(words)
    answer = f"town{answer_at}"
    start = context.index(answer + ".")
    return SquadExample("long", "t", "Where does station lie?", context, (answer,), (start,))


# --------------------------------------------------------------------------------------------
# Reading


def test_read_v1_and_v2_fixtures() -> None:
    v1, bad = read_squad_counted(V1)
    assert bad == 0 and len(v1) == 5 and not any(e.is_impossible for e in v1)
    e = v1[1]
    assert e.id == "56be4db0acb8001400a502ee" and e.title == "Super_Bowl_50"
    assert e.answers[1] == "Levi's Stadium" and len(e.answers) == 3
    for ex in v1:
        for text, start in zip(ex.answers, ex.answer_starts, strict=True):
            assert ex.context[start:start + len(text)] == text
    v2 = read_squad(V2)
    assert [e.is_impossible for e in v2] == [False, False, True, True]
    assert v2[2].answers == () and v2[2].plausible_answers == ("Normans",)
    france = v2[0].context.index("France")
    assert v2[0].train_span == (france, france + len("France")) and v2[2].train_span is None


def test_answer_start_mismatch_is_counted_and_fixed(tmp_path: Path) -> None:
    doc = json.loads(V1.read_text(encoding="utf-8"))
    qa = doc["data"][1]["paragraphs"][0]["qas"][0]
    qa["answers"][0]["answer_start"] += 2  # off by two: moved back onto "France"
    qa["answers"][1]["text"] = "Atlantis"  # not in the context at all
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    ex, bad = read_squad_counted(path)
    assert bad == 2
    e = next(x for x in ex if x.id == qa["id"])
    assert e.context[e.answer_starts[0]:].startswith("France") and e.answer_starts[1] == -1


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d["data"][1]["paragraphs"][0]["qas"][1].pop("id"),
     'data[1].paragraphs[0].qas[1]: missing "id"'),
    (lambda d: d["data"][0]["paragraphs"][0].pop("context"),
     'data[0].paragraphs[0]: missing "context"'),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][2]["answers"][0].update(answer_start="7"),
     "data[0].paragraphs[0].qas[2].answers[0].answer_start: expected int, found str"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][2].update(answers=[]),
     "data[0].paragraphs[0].qas[2].answers: empty"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][1].update(id="56be4db0acb8001400a502ec"),
     'data[0].paragraphs[0].qas[1]: duplicate id "56be4db0acb8001400a502ec"'),
    (lambda d: d.pop("data"), 'top level: missing "data"'),
])
def test_errors_name_file_and_json_path(tmp_path: Path, mutate, message: str) -> None:
    doc = json.loads(V1.read_text(encoding="utf-8"))
    mutate(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(BertgpuError) as err:
        read_squad(path)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)
    assert "\n" not in str(err.value)


def test_invalid_json_names_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"version": "1.1",\n "data": [}', encoding="utf-8")
    with pytest.raises(BertgpuError, match=r"broken.json: invalid JSON at line 2"):
        read_squad(path)


# --------------------------------------------------------------------------------------------
# Featurisation


def _span_text(ex: SquadExample, feats: Features, f: int, s: int, e: int) -> str:
    return ex.context[feats.offsets[f][s][0]:feats.offsets[f][e][1]]


def test_training_labels_decode_to_the_answer(tok: Tokenizer) -> None:
    examples = read_squad(V1) + read_squad(V2)
    feats = featurize(examples, tok, max_seq_len=128, doc_stride=32, is_training=True)
    assert len(feats) == len(examples) and feats.skipped_examples == []
    assert feats.input_ids.shape == (len(examples), 128)
    for f, i in enumerate(feats.example_index):
        ex = examples[i]
        s, e = int(feats.start_positions[f]), int(feats.end_positions[f])
        if ex.is_impossible:
            assert (s, e) == (0, 0)
        else:
            assert _span_text(ex, feats, f, s, e) == ex.answers[0]
            assert feats.token_type_ids[f, s] == 1 and feats.attention_mask[f, e] == 1
    # "Broncos" is split into sub-word pieces in this vocabulary
    assert tok.encode("Broncos", add_special_tokens=False).tokens == ["bro", "##ncos"]


def test_windows_match_transformers_overflow(tok: Tokenizer, vocab_file: Path) -> None:
    from transformers import BertTokenizerFast

    ex = _long_example()
    L, stride = 48, 12
    feats = featurize([ex], tok, max_seq_len=L, doc_stride=stride)
    # from_pretrained(folder with vocab.txt) reads the vocabulary in transformers 4.x and 5.x alike
    ref = BertTokenizerFast.from_pretrained(str(vocab_file.parent), do_lower_case=True)(
        ex.question, ex.context, truncation="only_second", max_length=L, stride=stride,
        return_overflowing_tokens=True, return_offsets_mapping=True, padding="max_length")
    assert len(feats) == len(ref["input_ids"]) > 3
    np.testing.assert_array_equal(feats.input_ids, np.array(ref["input_ids"]))
    np.testing.assert_array_equal(feats.token_type_ids, np.array(ref["token_type_ids"]))
    np.testing.assert_array_equal(feats.attention_mask, np.array(ref["attention_mask"]))
    for f in range(len(feats)):
        for t, off in enumerate(feats.offsets[f]):
            if off is not None:
                assert off == tuple(ref["offset_mapping"][f][t])
    # consecutive windows overlap by exactly `stride` context tokens
    ctx = [[o for o in offs if o is not None] for offs in feats.offsets]
    for a, b in zip(ctx, ctx[1:], strict=False):
        assert a[-stride:] == b[:stride]
    # every context token is "max context" in exactly one window
    n_ctx = len(tok.encode(ex.context, add_special_tokens=False).ids)
    assert int(feats.token_is_max_context.sum()) == n_ctx


def test_answer_outside_window_and_impossible_map_to_cls(tok: Tokenizer) -> None:
    ex = _long_example(answer_at=40)
    feats = featurize([ex], tok, max_seq_len=48, doc_stride=12, is_training=True)
    inside = [f for f in range(len(feats)) if feats.start_positions[f] != 0]
    assert 1 <= len(inside) < len(feats)
    for f in inside:
        assert _span_text(ex, feats, f, feats.start_positions[f],
                          feats.end_positions[f]) == "town40"
    imp = SquadExample("x", "t", ex.question, ex.context, (), (), is_impossible=True)
    feats = featurize([imp], tok, max_seq_len=48, doc_stride=12, is_training=True)
    assert not feats.start_positions.any() and not feats.end_positions.any()
    lost = SquadExample("y", "t", ex.question, ex.context, ("nowhere",), (-1,))
    assert featurize([lost, ex], tok, max_seq_len=48, doc_stride=12,
                     is_training=True).skipped_examples == [0]
    with pytest.raises(BertgpuError, match="must exceed doc_stride=40"):
        featurize([ex], tok, max_seq_len=48, doc_stride=40)


def _run_qa_targets(vocab_file: Path, ex: SquadExample, max_seq_len: int, doc_stride: int
                    ) -> tuple[list[list[int]], list[int], list[int]]:
    """Input ids and start/end targets per window as transformers' examples/pytorch/
    question-answering/run_qa.py `prepare_train_features` makes them (offset_mapping and
    sequence_ids of BertTokenizerFast's overflowing windows; padding on the right), but for one
    thing: run_qa's forward scan for the start token walks on over the closing [SEP] and the
    padding (their offsets are (0, 0)) when the answer starts at a window's last context token,
    and so targets the [SEP]; here the scan stops at the window's last context token."""
    from transformers import BertTokenizerFast

    tokenizer = BertTokenizerFast.from_pretrained(str(vocab_file.parent), do_lower_case=True)
    enc = tokenizer(ex.question, ex.context, truncation="only_second", max_length=max_seq_len,
                    stride=doc_stride, return_overflowing_tokens=True,
                    return_offsets_mapping=True, padding="max_length")
    start_char = ex.answer_starts[0]
    end_char = start_char + len(ex.answers[0])
    starts, ends = [], []
    for i, offsets in enumerate(enc["offset_mapping"]):
        input_ids = enc["input_ids"][i]
        cls_index = input_ids.index(tokenizer.cls_token_id)
        sequence_ids = enc.sequence_ids(i)
        token_start_index = 0
        while sequence_ids[token_start_index] != 1:
            token_start_index += 1
        token_end_index = len(input_ids) - 1
        while sequence_ids[token_end_index] != 1:
            token_end_index -= 1
        if not (offsets[token_start_index][0] <= start_char
                and offsets[token_end_index][1] >= end_char):
            starts.append(cls_index)
            ends.append(cls_index)
        else:
            while (token_start_index <= token_end_index  # run_qa: < len(offsets)
                   and offsets[token_start_index][0] <= start_char):
                token_start_index += 1
            starts.append(token_start_index - 1)
            while offsets[token_end_index][1] >= end_char:
                token_end_index -= 1
            ends.append(token_end_index + 1)
    return enc["input_ids"], starts, ends


@pytest.mark.parametrize("before,after", [(1, 1), (2, 1), (0, 1), (1, 2), (1, 0)])
def test_answer_crossing_a_window_edge_targets_cls_there_as_run_qa(
        tok: Tokenizer, vocab_file: Path, before: int, after: int) -> None:
    """An answer whose last token was the first token after a window's end got a target in that
    window (its end on the window's closing [SEP]): the inside check compared the answer's last
    token with the window's exclusive end using <=. Each window now gets the targets of
    run_qa.py's prepare_train_features: the answer's tokens when it lies wholly inside, else
    (0, 0). The answer covers `before` tokens before a window edge and `after` from it on; the
    edge is every window's end (and so also the overlap with the next window's start)."""
    base = _long_example()
    L, stride = 48, 12
    plain = featurize([base], tok, max_seq_len=L, doc_stride=stride)
    n_windows = len(plain)
    assert n_windows > 3
    c_off = tok.encode(base.context, add_special_tokens=False).offsets
    ctx_per_window = [sum(o is not None for o in offs) for offs in plain.offsets]
    window_start = 0
    for f in range(n_windows - 1):
        edge = window_start + ctx_per_window[f]  # first context token after window f
        first, last = edge - before, edge + after - 1
        start_char, end_char = c_off[first][0], c_off[last][1]
        ex = SquadExample(f"edge{f}", "t", base.question, base.context,
                          (base.context[start_char:end_char],), (start_char,))
        feats = featurize([ex], tok, max_seq_len=L, doc_stride=stride, is_training=True)
        ref_ids, ref_starts, ref_ends = _run_qa_targets(vocab_file, ex, L, stride)
        np.testing.assert_array_equal(feats.input_ids, np.array(ref_ids))  # the same windows
        assert feats.start_positions.tolist() == ref_starts, (f, before, after)
        assert feats.end_positions.tolist() == ref_ends, (f, before, after)
        if before and after:  # straddles window f's end: no target there
            assert (feats.start_positions[f], feats.end_positions[f]) == (0, 0)
        sep = tok.token_to_id("[SEP]")
        for g in range(len(feats)):
            s, e = int(feats.start_positions[g]), int(feats.end_positions[g])
            if (s, e) == (0, 0):
                continue
            assert s <= e
            for p in (s, e):
                assert feats.token_type_ids[g, p] == 1 and feats.input_ids[g, p] != sep
            assert _span_text(ex, feats, g, s, e) == ex.answers[0]
        assert any(feats.start_positions), f  # some window holds the whole answer
        window_start += ctx_per_window[f] - stride


def _google_check_is_max_context(doc_spans: list[tuple[int, int]], cur_span_index: int,
                                 position: int) -> bool:
    """google-research/bert run_squad.py `_check_is_max_context`, spans as (start, length)."""
    best_score = None
    best_span_index = None
    for span_index, (start, length) in enumerate(doc_spans):
        end = start + length - 1
        if position < start:
            continue
        if position > end:
            continue
        num_left_context = position - start
        num_right_context = end - position
        score = min(num_left_context, num_right_context) + 0.01 * length
        if best_score is None or score > best_score:
            best_score = score
            best_span_index = span_index
    return cur_span_index == best_span_index


def test_max_context_matches_google_check_is_max_context() -> None:
    """The right context of a token counted the token after the window's last one (e - t, not
    e - 1 - t), so windows [0, 10) and [4, 14) tied at token 7 and the first won although the
    second centres it better (left 3, right 6 against left 7, right 2). Compared with Google's
    function over the windows featurize cuts and over random overlapping layouts."""
    from bertgpu.tasks.squad import _is_max_context, _windows

    assert _is_max_context([(0, 10), (4, 14)], 1, 7)
    assert not _is_max_context([(0, 10), (4, 14)], 0, 7)
    layouts = [[(0, 10), (4, 14)]]
    for n in range(1, 40):
        for max_ctx in range(2, 14):
            for stride in range(max_ctx):
                layouts.append(_windows(n, max_ctx, stride))
    rng = np.random.default_rng(0)
    for _ in range(300):
        starts = np.sort(rng.integers(0, 30, size=rng.integers(1, 6)))
        layouts.append([(int(s), int(s + rng.integers(1, 15))) for s in starts])
    checked = 0
    for windows in layouts:
        spans = [(s, e - s) for s, e in windows]
        for t in range(max(e for _, e in windows)):
            for w in range(len(windows)):
                if windows[w][0] <= t < windows[w][1]:
                    assert (_is_max_context(windows, w, t)
                            == _google_check_is_max_context(spans, w, t)), (windows, w, t)
                    checked += 1
    assert checked > 10_000


def test_featurized_max_context_flags_match_google(tok: Tokenizer) -> None:
    """token_is_max_context of real features against Google's check, windows read back from
    the features' context tokens."""
    ex = _long_example()
    for L, stride in ((48, 12), (40, 20), (30, 5)):
        feats = featurize([ex], tok, max_seq_len=L, doc_stride=stride)
        spans, start = [], 0
        for f in range(len(feats)):
            length = int(feats.context_mask(f).sum())
            spans.append((start, length))
            start += length - stride
        for f in range(len(feats)):
            positions = np.flatnonzero(feats.context_mask(f))
            expected = [_google_check_is_max_context(spans, f, spans[f][0] + k)
                        for k in range(len(positions))]
            assert feats.token_is_max_context[f, positions].tolist() == expected, (L, stride, f)


def test_windows_too_short_for_the_question_say_to_raise_max_seq_len(tok: Tokenizer) -> None:
    ex = _long_example()
    with pytest.raises(BertgpuError) as err:
        featurize([ex], tok, max_seq_len=4, doc_stride=2)
    msg = str(err.value)
    assert "leaves no context tokens after a" in msg and "raise max_seq_len" in msg
    assert "-" not in msg.split("leaves")[1].split("after")[0]  # no negative token count


def test_doc_stride_fits_the_windows_of_a_capped_default_length() -> None:
    """doc_stride not given: 128 (run_qa.py's, for 384 tokens) unless the window after the
    longest question is not longer (the default max_seq_len capped at the model's positions, or
    a shorter max_seq_len given): then featurize picks it per question (tests/test_squad_edges.py).
    A doc_stride given is used as given, or refused in one line when it does not fit: it used to
    be replaced by half a window without a word (--doc_stride 61 became 30)."""
    from bertgpu.config.finetune import doc_stride, job_config, load_finetune_config

    cfg = load_finetune_config()
    assert cfg.doc_stride is None  # the default, told apart from a 128 given
    assert doc_stride(cfg, 384) == 128 and doc_stride(cfg, 16).startswith("half of each")
    assert job_config(cfg, 128).doc_stride is None and job_config(cfg, 128).max_seq_len == 128
    given = load_finetune_config(None, ["--max_seq_len", "128"])
    assert doc_stride(given, 128) == doc_stride(cfg, 128)
    assert job_config(given, 128).doc_stride is None
    for value in ("61", "128"):
        with pytest.raises(BertgpuError) as err:
            doc_stride(load_finetune_config(None, ["--doc_stride", value]), 128)
        assert str(err.value) == (f"--doc_stride {value}: not below the 61 context tokens of a "
                                  "window (max_seq_len 128 - max_query_len 64 - 3 for [CLS] [SEP] "
                                  "[SEP]); expected at most 60, or no --doc_stride (the default "
                                  "fits the window)")
    assert doc_stride(load_finetune_config(None, ["--doc_stride", "60"]), 128) == 60
    assert doc_stride(load_finetune_config(None, ["--doc_stride", "128"]), 384) == 128
    # Only a task cut into windows checks it: a GLUE run does not use it.
    glue = job_config(load_finetune_config(None, ["--doc_stride", "100"]), 128, windows=False)
    assert glue.doc_stride == 100


# --------------------------------------------------------------------------------------------
# Post-processing


def _logits_for(feats: Features, spans: dict[int, tuple[int, int]], null: float = 0.0
                ) -> tuple[np.ndarray, np.ndarray]:
    """Logits that put start/end mass on the given (feature -> token span) and `null` on [CLS]."""
    rng = np.random.default_rng(0)
    sl = rng.normal(scale=0.1, size=feats.input_ids.shape) - 5.0
    el = rng.normal(scale=0.1, size=feats.input_ids.shape) - 5.0
    sl[:, 0] = el[:, 0] = null / 2
    for f, (s, e) in spans.items():
        sl[f, s] += 10.0
        el[f, e] += 10.0
    return sl, el


def test_perfect_logits_give_perfect_scores(tok: Tokenizer) -> None:
    for path in (V1, V2):
        examples = read_squad(path)
        feats = featurize(examples, tok, max_seq_len=40, doc_stride=8, is_training=True)
        spans = {f: (int(s), int(e)) for f, (s, e) in
                 enumerate(zip(feats.start_positions, feats.end_positions, strict=True)) if s}
        sl, el = _logits_for(feats, spans, null=0.0)
        v2 = path == V2
        preds, nbest = postprocess(examples, feats, sl, el, version_2=v2)
        assert squad_evaluate(examples, preds)["exact"] == pytest.approx(100.0)
        assert squad_evaluate(examples, preds)["f1"] == pytest.approx(100.0)
        for ex in examples:
            probs = [d["probability"] for d in nbest[ex.id]]
            assert sum(probs) == pytest.approx(1.0) and probs == sorted(probs, reverse=True)


def _answer_windows(feats: Features) -> dict[int, tuple[int, int]]:
    """feature -> labelled answer token span, for every window that holds the answer."""
    assert feats.start_positions is not None and feats.end_positions is not None
    return {f: (int(s), int(e)) for f, (s, e) in
            enumerate(zip(feats.start_positions, feats.end_positions, strict=True)) if s}


def test_span_recovered_across_windows_and_max_answer_len(tok: Tokenizer) -> None:
    ex = _long_example(answer_at=40)
    feats = featurize([ex], tok, max_seq_len=48, doc_stride=12, is_training=True)
    spans = _answer_windows(feats)
    assert len(feats) > 3 and len(spans) == 2  # the answer sits in the overlap of two windows
    sl, el = _logits_for(feats, spans, null=-20.0)
    preds, nbest = postprocess([ex], feats, sl, el)
    assert preds == {"long": "town40"}
    assert [d["text"] for d in nbest["long"]].count("town40") == 1  # deduplicated across windows

    # Only the window where the start token is best centred may start the answer.
    (f_best,) = [f for f, (s, _) in spans.items() if feats.token_is_max_context[f, s]]
    (f_edge,) = [f for f in spans if f != f_best]
    only_edge = _logits_for(feats, {f_edge: spans[f_edge]}, null=-20.0)
    assert postprocess([ex], feats, *only_edge)[0]["long"] != "town40"
    assert postprocess([ex], feats, *only_edge, use_max_context=False)[0]["long"] == "town40"
    only_best = _logits_for(feats, {f_best: spans[f_best]}, null=-20.0)
    assert postprocess([ex], feats, *only_best)[0]["long"] == "town40"

    # A higher-scoring span that is too long is skipped. Window 0 holds no answer and its first
    # token is in no other window.
    assert 0 not in spans
    ctx = [k for k, o in enumerate(feats.offsets[0]) if o is not None]
    sl2, el2 = sl.copy(), el.copy()
    sl2[0, ctx[0]] += 12.0  # span score about 14 > 10, but paired with noise only about 2
    el2[0, ctx[-1]] += 12.0
    long_text = ex.context[feats.offsets[0][ctx[0]][0]:feats.offsets[0][ctx[-1]][1]]
    assert postprocess([ex], feats, sl2, el2, max_answer_len=len(ctx))[0]["long"] == long_text
    assert postprocess([ex], feats, sl2, el2, max_answer_len=len(ctx) - 1)[0]["long"] == "town40"

    # Question tokens, [CLS] and [SEP] never hold an answer even with the highest logits.
    sl3, el3 = sl.copy(), el.copy()
    sl3[:, 1] += 100.0
    el3[:, 2] += 100.0
    sep = int(np.flatnonzero(feats.input_ids[0] == 3)[0])
    el3[:, sep] += 100.0
    assert postprocess([ex], feats, sl3, el3)[0]["long"] == "town40"


def test_v2_null_threshold(tok: Tokenizer) -> None:
    ex = _long_example(answer_at=5)
    feats = featurize([ex], tok, max_seq_len=48, doc_stride=12, is_training=True)
    spans = _answer_windows(feats)
    # span score about 5 + 5 = 10, null score 4 + 4 = 8 in every window
    sl, el = _logits_for(feats, spans, null=8.0)
    preds, nbest = postprocess([ex], feats, sl, el, version_2=True)
    assert preds["long"] == "town5"
    assert [d["text"] for d in nbest["long"]][:2] == ["town5", ""]
    # null - best is about -2: a threshold below that predicts no answer, above keeps the span.
    assert postprocess([ex], feats, sl, el, version_2=True, null_threshold=-3.0)[0]["long"] == ""
    assert postprocess([ex], feats, sl, el, version_2=True,
                       null_threshold=-1.0)[0]["long"] == "town5"
    # At exactly null - best the span stays (Google's run_squad: "" only when the difference
    # is greater than the threshold); a hair below it predicts no answer.
    by_text = {d["text"]: d["score"] for d in nbest["long"]}
    diff = by_text[""] - by_text["town5"]
    assert postprocess([ex], feats, sl, el, version_2=True,
                       null_threshold=diff)[0]["long"] == "town5"
    assert postprocess([ex], feats, sl, el, version_2=True,
                       null_threshold=float(np.nextafter(diff, -np.inf)))[0]["long"] == ""
    # v1 ignores the null score entirely
    assert postprocess([ex], feats, sl, el, null_threshold=-3.0)[0]["long"] == "town5"
    # The null score is the minimum over windows: one window with a low [CLS] score decides.
    sl4, el4 = sl.copy(), el.copy()
    sl4[:, 0] = el4[:, 0] = 20.0
    assert postprocess([ex], feats, sl4, el4, version_2=True)[0]["long"] == ""
    # Whichever window it is: the first, a middle one or the last (a loop keeping only the last
    # window's null score passed when only the last was lowered).
    assert len(feats) >= 3
    for low in range(len(feats)):
        sl5 = sl4.copy()
        sl5[low, 0] = -20.0
        assert postprocess([ex], feats, sl5, el4, version_2=True)[0]["long"] == "town5", low
    sl4[len(feats) - 1, 0] = -20.0
    assert postprocess([ex], feats, sl4, el4, version_2=True)[0]["long"] == "town5"


def test_logits_outside_the_context_never_change_the_answer(tok: Tokenizer) -> None:
    """The top n start/end logits were taken over every position before the context mask, so
    high logits at the padding (as many as a feature got in its evaluation batch) or the
    question filled the n-best list and the answer became "": the prediction depended on how
    far the feature was padded."""
    examples = read_squad(V1)
    feats = featurize(examples, tok, max_seq_len=96, doc_stride=16, is_training=True)
    sl, el = _logits_for(feats, _answer_windows(feats), null=-20.0)
    expected, _ = postprocess(examples, feats, sl, el, n_best=3)
    assert all(expected.values())
    outside = np.array([[o is None for o in feats.offsets[f]] for f in range(len(feats))])
    outside[:, 0] = False  # [CLS]: the null score
    for lift in (-1e4, 30.0):
        lifted = (np.where(outside, lift, sl), np.where(outside, lift, el))
        assert postprocess(examples, feats, *lifted, n_best=3)[0] == expected


# --------------------------------------------------------------------------------------------
# Official evaluation


def test_normalize_answer() -> None:
    assert normalize_answer("  The  Denver\tBroncos! ") == "denver broncos"
    assert normalize_answer("an apple, a pear & the fig.") == "apple pear fig"
    assert normalize_answer("theater anarchy") == "theater anarchy"  # articles only as words
    assert normalize_answer("24–10") == "24–10"  # the en dash is not ASCII punctuation
    assert normalize_answer("U.S.") == "us"
    assert normalize_answer("The") == ""


def _official_normalize_answer(s: str) -> str:
    """normalize_answer of evaluate-v1.1.py / evaluate-v2.0.py, as written there."""
    def remove_articles(text):
        return re.sub(re.compile(r"\b(a|an|the)\b", re.UNICODE), " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    return white_space_fix(remove_articles(remove_punc(s.lower())))


TRICKY_ANSWERS = [
    "the-cat", "a.m.", "p.m. the", "an-apple", "A-B-C", "The.End", "(the) answer", "'a' grade",
    "the/an/a", "U.S.A.", "theater", "Anne and the an", "a,b", "x-the-y", "THE CAT", "é the é",
    "the\u00a0cat", "rock-'n'-roll", "the_a", "an_", "...", "", "The", "a b c the", "[the]",
]


def test_normalize_answer_matches_the_official_script() -> None:
    """Punctuation goes before the articles, as in the official scripts: "the-cat" is one word
    "thecat", not the article and "cat"."""
    assert normalize_answer("the-cat") == "thecat"
    assert normalize_answer("a.m.") == "am"
    assert normalize_answer("x-the-y") == "xthey"
    for s in TRICKY_ANSWERS:
        assert normalize_answer(s) == _official_normalize_answer(s), s
    assert exact_match("the-cat", "cat") == 0.0  # official: "thecat" vs "cat"


def test_v2_gold_answers_that_normalise_to_nothing_are_dropped() -> None:
    """evaluate-v2.0.py: `gold_answers = [a['text'] for a in qa['answers'] if
    normalize_answer(a['text'])]`, and `['']` only when none is left. A gold "the" is no gold:
    "" does not match it; a question whose only gold is "." is answered by ""."""
    ex = [SquadExample("q1", "t", "Where?", "the Paris", ("the", "Paris"), (0, 4)),
          SquadExample("q2", "t", "What?", "Dot.", (".",), (3,))]
    assert squad_evaluate(ex[:1], {"q1": ""}, version_2=True) == pytest.approx(
        {"exact": 0.0, "f1": 0.0, "total": 1, "HasAns_exact": 0.0, "HasAns_f1": 0.0,
         "HasAns_total": 1})
    r = squad_evaluate(ex[:1], {"q1": "Paris"}, version_2=True)
    assert r["exact"] == pytest.approx(100.0) and r["f1"] == pytest.approx(100.0)
    # Only "." as gold: none is left, so the gold is [""] and "" scores 100 (still HasAns: the
    # answers list itself is not empty).
    r = squad_evaluate(ex[1:], {"q2": ""}, version_2=True)
    assert r["exact"] == pytest.approx(100.0) and r["f1"] == pytest.approx(100.0)
    assert r["HasAns_total"] == 1
    r = squad_evaluate(ex[1:], {"q2": "Dot"}, version_2=True)
    assert r["exact"] == 0.0 and r["f1"] == 0.0


def test_exact_and_f1_by_hand() -> None:
    assert exact_match("the Denver Broncos.", "Denver Broncos") == 1.0
    assert exact_match("Broncos", "Denver Broncos") == 0.0
    # pred "denver broncos team" vs gold "denver broncos": P = 2/3, R = 1, F1 = 0.8
    assert f1_score("Denver Broncos team", "Denver Broncos") == pytest.approx(0.8)
    # repeated tokens count with multiplicity: pred "a b b" vs gold "b": P = 1/3, R = 1
    assert f1_score("x y y", "y") == pytest.approx(0.5)
    assert f1_score("", "") == 1.0 and f1_score("", "France") == 0.0
    assert f1_score("", "", version_2=False) == 0.0  # evaluate-v1.1.py behaviour


def test_squad_evaluate_v1_and_v2() -> None:
    v1 = read_squad(V1)
    preds = {v1[0].id: "Broncos", v1[1].id: "Levi's Stadium", v1[2].id: "24–10",
             v1[3].id: "in France", v1[4].id: "Norway"}
    r = squad_evaluate(v1, preds)
    f1_norway = 2 * 1 * (1 / 4) / (1 + 1 / 4)  # gold "denmark iceland and norway": R = 1/4
    assert r["total"] == 5
    assert r["exact"] == pytest.approx(100 * 2 / 5)  # several golds: max over them
    assert r["f1"] == pytest.approx(100 * (2 / 3 + 1 + 1 + 2 / 3 + f1_norway) / 5)
    assert "HasAns_exact" not in r

    v2 = read_squad(V2)
    preds = {v2[0].id: "France", v2[1].id: "", v2[2].id: "", v2[3].id: "King Charles III"}
    r = squad_evaluate(v2, preds)
    assert r == pytest.approx({
        "exact": 50.0, "f1": 50.0, "total": 4,
        "HasAns_exact": 50.0, "HasAns_f1": 50.0, "HasAns_total": 2,
        "NoAns_exact": 50.0, "NoAns_f1": 50.0, "NoAns_total": 2})
    # a missing prediction scores 0 and still counts
    del preds[v2[0].id]
    assert squad_evaluate(v2, preds)["exact"] == pytest.approx(25.0)


def test_question_counts_are_integers() -> None:
    """The totals were floats: results.json said "total": 5.0 and the run's last line
    "total 5.00"; the official scripts count questions with integers."""
    r = squad_evaluate(read_squad(V2), {})
    totals = {k: v for k, v in r.items() if k.endswith("total")}
    assert totals == {"total": 4, "HasAns_total": 2, "NoAns_total": 2}
    assert all(type(v) is int for v in totals.values())
    assert type(squad_evaluate(read_squad(V1), {})["total"]) is int


def test_v2_has_answer_is_a_non_empty_answers_list_as_evaluate_v2(tmp_path: Path) -> None:
    """An is_impossible question whose file kept annotators' spans in "answers" was counted under
    NoAns yet scored against those answers, so the prediction "Paris" was a correct no-answer
    (NoAns_exact 100). evaluate-v2.0.py sets has-answer to bool(qa["answers"]): the question is
    HasAns, and there is no NoAns block."""
    ctx = "The cat sat on the mat in Paris."
    doc = {"version": "v2.0", "data": [{"title": "t", "paragraphs": [{"context": ctx, "qas": [
        {"id": "q1", "question": "Where did the cat sit?", "is_impossible": False,
         "answers": [{"text": "on the mat", "answer_start": 12}]},
        {"id": "q2", "question": "Where is the dog?", "is_impossible": True,
         "answers": [{"text": "Paris", "answer_start": 26}],
         "plausible_answers": [{"text": "Paris", "answer_start": 26}]}]}]}]}
    path = tmp_path / "v2edge.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    examples = read_squad(path)
    # evaluate-v2.0.py on this file: q1 "the mat" vs "on the mat" F1 2/3, q2 exact.
    assert squad_evaluate(examples, {"q1": "the mat", "q2": "Paris"}, version_2=True) == \
        pytest.approx({"exact": 50.0, "f1": 100 * (2 / 3 + 1) / 2, "total": 2,
                       "HasAns_exact": 50.0, "HasAns_f1": 100 * (2 / 3 + 1) / 2,
                       "HasAns_total": 2})
    # and "" on it is wrong, as the official script has it
    assert squad_evaluate(examples, {"q1": "on the mat", "q2": ""}, version_2=True)["exact"] == \
        pytest.approx(50.0)


def test_write_predictions(tmp_path: Path) -> None:
    out = write_predictions({"a1": "Denver Broncos", "b2": "24–10", "c3": ""}, tmp_path / "p.json")
    assert json.loads(out.read_text(encoding="utf-8")) == {
        "a1": "Denver Broncos", "b2": "24–10", "c3": ""}
    assert not list(tmp_path.glob("*.tmp"))


def test_byte_level_bpe_answers_have_no_leading_space() -> None:
    """A byte-level BPE piece ("Ġbroncos") holds the space before its word, and so do its offsets
    under a `[CLS] $A [SEP]` post-processor (ModernBERT's layout); the answer text written to
    predictions.json is the gold text itself, not " Denver Broncos"."""
    from tokenizers import ByteLevelBPETokenizer, processors

    examples = [e for e in read_squad(V1) if not e.context[e.answer_starts[0]].isspace()]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([t for e in examples for t in (e.question, e.context)],
                            vocab_size=600, min_frequency=1, show_progress=False,
                            special_tokens=SPECIALS)
    tok = bpe._tokenizer
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", tok.token_to_id("[CLS]")),
                                                 ("[SEP]", tok.token_to_id("[SEP]"))])
    feats = featurize(examples, tok, max_seq_len=64, doc_stride=16, is_training=True)
    sl, el = _logits_for(feats, _answer_windows(feats))
    preds, nbest = postprocess(examples, feats, sl, el)
    mid_sentence = [e for e in examples if e.answer_starts[0] > 0]
    assert mid_sentence  # answers after a space: the case the leading space came from
    for ex in examples:
        assert preds[ex.id] == ex.answers[0]
        assert all(d["text"] == d["text"].strip() for d in nbest[ex.id])


def test_answers_keep_the_marks_the_normaliser_strips() -> None:
    # An uncased vocabulary strips combining marks, so a token's offsets end before them: the
    # predicted text lost a word's last vowel sign ("गुरु" -> "गुर") or an NFD accent ("Cafe").
    contexts = [("मेरे गुरु आज आए हैं।", "गुरु"), ("वे दिल्ली में हैं।", "वे"),
                ("Cafe\u0301 de Flore est à Paris.", "Cafe\u0301")]
    examples = [SquadExample(f"q{i}", "t", "कौन?", c, (a,), (c.index(a),))
                for i, (c, a) in enumerate(contexts)]
    vocab = {w: i for i, w in enumerate(_vocab([e.context for e in examples] + ["कौन?"]))}
    t = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    t.normalizer = normalizers.BertNormalizer(lowercase=True)
    t.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    feats = featurize(examples, t, max_seq_len=32, doc_stride=8, is_training=True)
    sl, el = _logits_for(feats, _answer_windows(feats), null=0.0)
    preds, _ = postprocess(examples, feats, sl, el)
    assert preds == {f"q{i}": a for i, (_, a) in enumerate(contexts)}

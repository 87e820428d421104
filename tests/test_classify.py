"""`bertgpu finetune classify` on your own files: readers, labels, metrics, end to end, bad inputs.

End-to-end runs use the tiny random BERT of tests/_tiny_init.py on fixtures with a learnable rule
(a keyword decides the label), so a score far above chance shows that reading, label mapping,
encoding, training and scoring fit together. Metrics are checked against scikit-learn / scipy.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import _tiny_init
import numpy as np
import pytest
from _tiny_init import SPECIAL

from bertgpu.config.finetune import (
    FinetuneConfig,
    finetune_defaults,
    load_finetune_config,
    resolve_finetune,
)
from bertgpu.errors import BertgpuError
from bertgpu.finetune import finetune
from bertgpu.tasks import classify, metrics

WORDS = ("apple river stone cloud table green quiet music paper window garden silver bright "
         "lamp horse ocean".split())
KEYWORDS = {"positive": "good", "negative": "bad", "neutral": "meh"}
VOCAB = SPECIAL + ["good", "bad", "meh", '"', ","] + WORDS
FAST = ["--lr", "3e-3", "--hidden_dropout_prob", "0", "--warmup_fraction", "0.05",
        "--global_batch_size", "16", "--max_seq_len", "32"]

pytestmark = pytest.mark.usefixtures("one_thread")


def sentence(rng: random.Random, keyword: str) -> str:
    words = rng.sample(WORDS, 5)
    words.insert(rng.randrange(6), keyword)
    return " ".join(words)


def write_csv(path: Path, n: int, seed: int,
              labels: tuple[str, ...] = ("positive", "negative", "neutral")) -> Path:
    """text,label rows; the label is named by the keyword in the text."""
    rng = random.Random(seed)
    rows = ["text,label"]
    for _ in range(n):
        y = rng.choice(labels)
        rows.append(f"{sentence(rng, KEYWORDS[y])},{y}")
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def run(tmp_path: Path, train: Path, dev: Path, *extra: str, **kw) -> dict:
    init = _tiny_init.tiny_init(tmp_path, VOCAB)
    return finetune("classify", None, init, tmp_path / "ft", train_file=train, dev_file=dev,
                    overrides=[*FAST, *extra], **kw)


# --------------------------------------------------------------------------------------------
# Metrics against scikit-learn / scipy


def test_macro_f1_matches_sklearn():
    sk = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    for k in (2, 3, 7):
        for _ in range(20):
            y, p = rng.integers(0, k, 50), rng.integers(0, k, 50)
            assert metrics.macro_f1(p, y) == pytest.approx(sk.f1_score(y, p, average="macro"))
    # A class only in the predictions, one only in the labels, one never right.
    y, p = np.array([0, 0, 1, 1, 2]), np.array([0, 3, 1, 0, 0])
    assert metrics.macro_f1(p, y) == pytest.approx(sk.f1_score(y, p, average="macro",
                                                               zero_division=0))


def test_label_metrics_against_references():
    sk = pytest.importorskip("sklearn.metrics")
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(1)
    logits, y = rng.normal(size=(40, 3)), rng.integers(0, 3, 40)
    m = metrics.label_metrics(logits, y, regression=False)
    assert m["accuracy"] == pytest.approx(100 * sk.accuracy_score(y, logits.argmax(1)))
    assert m["macro_f1"] == pytest.approx(100 * sk.f1_score(y, logits.argmax(1), average="macro"))
    scores, gold = rng.normal(size=(40, 1)), rng.normal(size=40)
    r = metrics.label_metrics(scores, gold, regression=True)
    assert r["pearson"] == pytest.approx(100 * stats.pearsonr(scores[:, 0], gold)[0])
    assert r["spearman"] == pytest.approx(100 * stats.spearmanr(scores[:, 0], gold)[0])
    # constant: undefined
    assert metrics.label_metrics(np.ones(5), gold[:5], regression=True)["pearson"] == 0.0


# --------------------------------------------------------------------------------------------
# Reading and labels


def test_readers_agree_across_formats(tmp_path):
    rows = [("it's \"fine\", really", "a", "pos"), ("tab-free text", "b", "neg")]
    (tmp_path / "x.csv").write_text('premise,hyp,gold\n"it\'s ""fine"", really",a,pos\n'
                                    'tab-free text,b,neg\n',
                                    encoding="utf-8-sig")  # a BOM, as spreadsheets write it
    (tmp_path / "x.tsv").write_text("gold\tpremise\thyp\npos\tit's \"fine\", really\ta\n\n"
                                    "neg\ttab-free text\tb\n")
    (tmp_path / "x.jsonl").write_text("\n".join(
        json.dumps({"premise": a, "hyp": b, "gold": y, "extra": 1}) for a, b, y in rows) + "\n")
    fields = classify.Fields("premise", "hyp", "gold")
    for name in ("x.csv", "x.tsv", "x.jsonl"):
        got = classify.read_labelled(tmp_path / name, fields)
        assert [r[1:] for r in got] == rows, name
    # file lines
    assert [r[0] for r in classify.read_labelled(tmp_path / "x.tsv", fields)] == [2, 4]


def test_tsv_reads_quotes_as_characters(tmp_path):
    """Quoting off, as GLUE: an unbalanced quote must not swallow the following rows."""
    (tmp_path / "t.tsv").write_text('text\tlabel\n"a quote that never ends\tx\nnext row\ty\n')
    got = classify.read_labelled(tmp_path / "t.tsv", classify.Fields())
    assert [(r[1], r[3]) for r in got] == [('"a quote that never ends', "x"), ("next row", "y")]


def test_labels_are_discovered_sorted():
    p = Path("train.csv")
    assert (classify.discover_labels(p, ["pos", "neg", "neutral", "neg"])
            == ("neg", "neutral", "pos"))
    # integers by value
    assert classify.discover_labels(p, ["10", "2", "1", "2"]) == ("1", "2", "10")
    with pytest.warns(UserWarning, match="--regression"):
        assert classify.discover_labels(p, ["0.5", "1", "2.25"]) == ("0.5", "1", "2.25")
    with pytest.raises(BertgpuError, match="train.csv: every row has the label 'x'"):
        classify.discover_labels(p, ["x", "x"])


def test_json_labels_may_be_numbers_or_booleans(tmp_path):
    (tmp_path / "j.jsonl").write_text('{"text": "a", "label": 1}\n{"text": "b", "label": true}\n'
                                      '{"text": "c", "label": 2.5}\n')
    assert ([r[3] for r in classify.read_labelled(tmp_path / "j.jsonl", classify.Fields())]
            == ["1", "true", "2.5"])


# --------------------------------------------------------------------------------------------
# End to end


def test_three_labels_learn_and_export_their_names(tmp_path):
    train = write_csv(tmp_path / "train.csv", 240, 0)
    dev = write_csv(tmp_path / "dev.csv", 60, 1)
    res = run(tmp_path, train, dev, "--epochs", "10", "--lr", "1e-3")
    assert res["task"] == "classify" and res["kind"] == "classification"
    assert res["labels"] == ["negative", "neutral", "positive"] and res["columns"] == {}
    dev_m = res["metrics"]["dev"]
    # chance: ~33
    assert set(dev_m) == {"accuracy", "macro_f1"} and dev_m["accuracy"] >= 90.0, dev_m
    assert res["score"] == pytest.approx((dev_m["accuracy"] + dev_m["macro_f1"]) / 2)
    out = tmp_path / "ft"
    cfg = json.loads((out / "model" / "config.json").read_text())
    assert cfg["id2label"] == {"0": "negative", "1": "neutral", "2": "positive"}
    assert cfg["label2id"] == {"negative": 0, "neutral": 1, "positive": 2}
    assert cfg["architectures"] == ["BertForSequenceClassification"]
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(preds) == 60 and preds[0]["id"] == "dev.csv:2"
    assert (np.mean([p["label"] == p["prediction"] for p in preds]) * 100
            == pytest.approx(dev_m["accuracy"]))

    # transformers reads the names: the pipeline says "positive", not LABEL_2.
    transformers = pytest.importorskip("transformers")
    clf = transformers.pipeline("text-classification", model=str(out / "model"))
    assert clf("apple good river stone")[0]["label"] == "positive"
    assert clf("apple bad river stone")[0]["label"] == "negative"


def test_text_pair_reads_the_second_column(tmp_path):
    """The label is the keyword of the second text; the first holds a keyword too, so the model
    must tell the segments apart: chance unless the pair is encoded as a pair."""
    rng = random.Random(2)
    for split, n in (("train", 192), ("dev", 48)):
        lines = []
        for _ in range(n):
            y = rng.choice(["yes", "no"])
            lines.append(json.dumps({"a": sentence(rng, rng.choice(["good", "bad"])),
                                     "b": sentence(rng, "good" if y == "yes" else "bad"), "y": y}))
        (tmp_path / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    res = run(tmp_path, tmp_path / "train.jsonl", tmp_path / "dev.jsonl", "--epochs", "8",
              text_field="a", text_pair_field="b", label_field="y")
    assert res["fields"] == {"text": "a", "text_pair": "b", "label": "y"}
    assert (res["labels"] == ["no", "yes"]
            and res["metrics"]["dev"]["accuracy"] >= 90.0), res["metrics"]


def test_regression_learns(tmp_path):
    """score = the number of "good" words (0-3); TSV with --regression."""
    rng = random.Random(3)
    for split, n in (("train", 256), ("dev", 64)):
        rows = ["text\tscore"]
        for _ in range(n):
            k = rng.randrange(4)
            words = rng.sample(WORDS, 6 - k) + ["good"] * k
            rng.shuffle(words)
            rows.append(f"{' '.join(words)}\t{k}")
        (tmp_path / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    res = run(tmp_path, tmp_path / "train.tsv", tmp_path / "dev.tsv", "--epochs", "4",
              "--lr", "1e-3", label_field="score", regression=True)
    assert res["kind"] == "regression" and res["labels"] == []
    assert set(res["metrics"]["dev"]) == {"pearson", "spearman"}
    assert res["metrics"]["dev"]["pearson"] > 60.0, res["metrics"]  # chance: ~0
    cfg = json.loads((tmp_path / "ft" / "model" / "config.json").read_text())
    assert cfg["num_labels"] == 1 and cfg["problem_type"] == "regression"


def test_defaults_by_model_size(tmp_path, capsys):
    assert finetune_defaults(128) == (3e-4, 10) and finetune_defaults(256) == (3e-4, 10)
    assert finetune_defaults(384)[0] == 1e-4 and finetune_defaults(768) == (2e-5, 3)
    assert finetune_defaults(1024) == (2e-5, 3)
    cfg = FinetuneConfig()
    assert cfg.lr is None and cfg.epochs is None
    given = load_finetune_config(None, ["--lr", "5e-5"])
    resolved, note = resolve_finetune(given, 768)
    assert ((resolved.lr, resolved.epochs, given.epochs) == (5e-5, 3, None)
            and note.startswith("epochs 3 "))
    assert resolve_finetune(load_finetune_config(None, ["--lr", "1e-3", "--epochs", "2"]),
                            64)[1] == ""
    # The run records what it used and prints where it came from.
    train = write_csv(tmp_path / "train.csv", 32, 0)
    res = finetune("classify", None, _tiny_init.tiny_init(tmp_path, VOCAB), tmp_path / "ft",
                   train_file=train, dev_file=train, overrides=["--global_batch_size", "16"])
    assert (res["config"]["lr"], res["config"]["epochs"]) == (3e-4, 10) and res["steps"] == 20
    assert "by model size" in capsys.readouterr().out


# --------------------------------------------------------------------------------------------
# Bad inputs: one line naming the file (and line)


def _one_line_error(fn, match: str) -> str:
    with pytest.raises(BertgpuError, match=match) as e:
        fn()
    assert "\n" not in str(e.value)
    return str(e.value)


BAD_FILES = [  # (file, content, the one-line error)
    ("a.csv", "sentence,label\nx,y\n",
     r"a\.csv:1: no column 'text' \(found 'sentence', 'label'\); expected --text-field"),
    ("b.jsonl", '{"text": "a", "label": "x"}\n{"text": "b"}\n',
     r"b\.jsonl:2: no field 'label' .*expected --label-field"),
    ("c.csv", "text,label\nfine,x\nno label,\n", r"c\.csv:3: empty label in 'label'"),
    ("d.jsonl", '{"text": "a", "label": null}\n', r"d\.jsonl:1: empty label"),
    ("e.csv", "text,label\n,x\n", r"e\.csv:2: empty text in 'text'"),
    ("f.tsv", "text\tlabel\na\tb\tc\n", r"f\.tsv:2: 3 fields, expected 2"),
    ("g.txt", "text,label\n", r"g\.txt: unknown file type '\.txt'"),
    ("h.jsonl", '["a", "b"]\n', r"h\.jsonl:1: found a JSON list"),
    # an empty JSONL asked for "a header line", which JSONL has not
    ("i.jsonl", "\n", r"i\.jsonl: no rows \(expected one JSON object per line with 'text' and "
                      r"'label'\)"),
    ("j.csv", "text,label\n", r"j\.csv: no rows \(expected a header line and labelled rows\)"),
    # a stray quote glued rows 2-5 into one text ("hello,pos\nbye,neg\n...") without a word
    ("k.csv", 'text,label\n"hello,pos\nbye,neg\nnice,pos\n"great" movie,pos\nawful,neg\n',
     r"k\.csv:2: not readable as CSV \(',' expected after '\"'\); expected a field that starts "
     r"with a quote to end with one"),
    # the first of two 'label' columns was read, the second ignored
    ("l.csv", "text,label,label\nhello,pos,x\nbye,neg,y\n",
     r"l\.csv:1: the header names column 'label' 2 times; expected each name once "
     r"\(--label-field\)"),
]


@pytest.mark.parametrize(("name", "content", "error"), BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_bad_inputs_name_file_and_line(tmp_path, name, content, error):
    (tmp_path / name).write_text(content)
    _one_line_error(lambda: classify.read_labelled(tmp_path / name, classify.Fields()), error)


def test_a_long_cell_is_read_and_one_column_takes_one_role(tmp_path):
    """A cell over 131,072 characters (csv's default field limit: a long document) was refused
    as "not readable as CSV (field larger than field limit)"; --label-field naming the text
    column trained every text as its own class."""
    path = tmp_path / "long.csv"
    path.write_text("text,label\n" + "good film " * 20000 + ",pos\nbad,neg\n")
    rows = classify.read_labelled(path, classify.Fields())
    assert [(len(text), label) for _, text, _, label in rows] == [(200000, "pos"), (3, "neg")]
    for fields, error in (
            (dict(label="text"), "--label-field text: the same column as --text-field"),
            (dict(text="a", text_pair="a"), "--text-pair-field a: the same column as --text-field"),
            (dict(text_pair="b", label="b"), "--label-field b: the same column as "
                                             "--text-pair-field")):
        _one_line_error(lambda f=fields: classify.Fields(**f), error)


def test_label_only_in_dev_and_bad_scores(tmp_path):
    (tmp_path / "train.csv").write_text("text,label\na,pos\nb,neg\n")
    (tmp_path / "dev.csv").write_text("text,label\na,pos\nb,neutral\n")
    tok = None  # never reached: the files are checked before encoding
    cfg = FinetuneConfig()
    _one_line_error(lambda: classify.classify_job(tmp_path / "train.csv", tmp_path / "dev.csv",
                                                  tok, cfg),
                    r"dev\.csv:3: label 'neutral' is not in the training file \(expected one of "
                    r"'neg', 'pos'\)")
    _one_line_error(lambda: classify.classify_job(tmp_path / "train.csv", tmp_path / "dev.csv",
                                                  tok, cfg, regression=True),
                    r"train\.csv:2: label 'pos' in 'label' is not a finite number")


def test_command_line_errors(tmp_path, capsys):
    from bertgpu.cli import main

    init = _tiny_init.tiny_init(tmp_path, VOCAB)
    train = write_csv(tmp_path / "train.csv", 8, 0)
    base = ["finetune", "classify", "--init", str(init), "--out", str(tmp_path / "ft")]
    assert main([*base, "--train-file", str(train)]) == 2
    assert "--dev-file is required" in capsys.readouterr().err
    assert main([*base, "--train-file", str(train), "--dev-file", str(tmp_path / "nope.csv")]) == 2
    assert "nope.csv: not found (--dev-file)" in capsys.readouterr().err
    (tmp_path / "dev.csv").write_text("sentence,label\nx,y\n")
    assert main([*base, "--train-file", str(train), "--dev-file", str(tmp_path / "dev.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "dev.csv:1: no column 'text'" in err
    assert main(["finetune", "sst2", "--data", str(tmp_path), "--init", str(init),
                 "--out", str(tmp_path / "o"), "--label-field", "y"]) == 2
    assert "--label-field: only for finetune classify and ner" in capsys.readouterr().err
    assert not (tmp_path / "ft").exists() and not (tmp_path / "ft.tmp").exists()


def test_labels_equal_as_numbers_are_one_class(tmp_path):
    """JSON 1 and 1.0 (a float column that held a NaN) used to be two classes, '1' and '1.0',
    with a warning about "fractions"; a dev file with 1.0 against a training file with 1 was
    refused. Equal numbers are one class named by its value, in CSV text too; a real fraction
    still warns, in words that say what it is."""
    rows = [(1, "good"), (1.0, "great"), (0, "bad"), (0.0, "awful")]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"text": t, "label": y}) + "\n"
                                              for y, t in rows))
    (tmp_path / "d.jsonl").write_text('{"text": "fine", "label": 1.0}\n')
    fields = classify.Fields()
    train = classify.read_labelled(tmp_path / "t.jsonl", fields)
    classes = classify.discover_labels(tmp_path / "t.jsonl", [r[3] for r in train])
    assert classes == ("0", "1")
    dev = classify.to_examples(tmp_path / "d.jsonl",
                               classify.read_labelled(tmp_path / "d.jsonl", fields),
                               classes, "label")
    assert [ex.label for ex in dev] == [1]
    p = Path("train.csv")
    assert classify.discover_labels(p, ["1", "1.0", "0", "0.00", "10"]) == ("0", "1", "10")
    with pytest.warns(UserWarning, match=r"some not whole \(e\.g\. '0\.5'\); each distinct "
                                         r"value is read as a class"):
        assert classify.discover_labels(p, ["0.50", "1", "1.0"]) == ("0.5", "1")


def test_a_label_past_max_train_examples_is_named_so(tmp_path):
    """A dev label that the training file has past the --max_train_examples cut used to be "not
    in the training file"; the message now names the cut."""
    rows = "text,label\nsad,10\nawful,10\ngood,2\nblue,1\n"
    (tmp_path / "train.csv").write_text(rows)
    (tmp_path / "dev.csv").write_text(rows)
    cfg = FinetuneConfig(max_train_examples=3)
    _one_line_error(lambda: classify.classify_job(tmp_path / "train.csv", tmp_path / "dev.csv",
                                                  None, cfg),
                    r"dev\.csv:5: label '1' is in the training file but not in its first 3 "
                    r"rows \(--max_train_examples 3\) \(expected one of '2', '10'\)$")


def test_a_multi_line_csv_row_is_named_by_its_first_line(tmp_path):
    """csv.reader's line_num is where a record ended: a row with a quoted newline on lines 3-5
    was named ':5' in predictions ids and errors (an extra field there was 'b.csv:4')."""
    (tmp_path / "a.csv").write_text('text,label\n"good movie",pos\n"a long\nreview\nspanning '
                                    'lines",neg\n"bad",neg\n\n"x",pos\n')
    got = classify.read_labelled(tmp_path / "a.csv", classify.Fields())
    assert [r[0] for r in got] == [2, 3, 6, 8]
    (tmp_path / "b.csv").write_text('text,label\n"good",pos\n"a long\nreview",neg,extra\n')
    _one_line_error(lambda: classify.read_labelled(tmp_path / "b.csv", classify.Fields()),
                    r"b\.csv:3: 3 fields, expected 2 as in the header$")


# --------------------------------------------------------------------------------------------
# Survivors of a mutation review: the job's score, the dev cut, label spelling, bad scores


def _tokenizer(tmp_path: Path):
    """The word-level tokenizer of tiny_init's folder, without building its model."""
    from bertgpu.data.tokenizer_folder import load_tokenizer

    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    (tok / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    return load_tokenizer(tok)


def test_score_is_the_mean_of_the_dev_metrics(tmp_path):
    """The module docstring: "a run's score is their mean". The end-to-end test cannot tell the
    mean from the first metric when accuracy happens to equal macro-F1."""
    train = write_csv(tmp_path / "train.csv", 12, 0)
    dev = write_csv(tmp_path / "dev.csv", 6, 1)
    tok = _tokenizer(tmp_path)
    job = classify.classify_job(train, dev, tok, FinetuneConfig())
    assert job.primary({"dev": {"accuracy": 80.0, "macro_f1": 60.0}}) == pytest.approx(70.0)
    assert job.primary({"dev": {"macro_f1": 60.0, "accuracy": 80.0}}) == pytest.approx(70.0)
    (tmp_path / "r.csv").write_text("text,label\napple,0.5\nriver,1.5\nstone,2\n")
    reg = classify.classify_job(tmp_path / "r.csv", tmp_path / "r.csv", tok, FinetuneConfig(),
                                regression=True)
    assert reg.primary({"dev": {"pearson": 90.0, "spearman": 50.0}}) == pytest.approx(70.0)


def test_max_eval_examples_cuts_the_dev_file(tmp_path):
    """--max_eval_examples cuts dev and --max_train_examples cuts train, each by its own
    number (the dev set was once cut by the training number)."""
    for name in ("train", "dev"):  # both labels in every prefix: the cut keeps them known
        (tmp_path / f"{name}.csv").write_text("text,label\n" + "".join(
            f"{WORDS[i % len(WORDS)]} {'good' if i % 2 else 'bad'},{'pos' if i % 2 else 'neg'}\n"
            for i in range(20)))
    train, dev = tmp_path / "train.csv", tmp_path / "dev.csv"
    tok = _tokenizer(tmp_path)
    job = classify.classify_job(train, dev, tok,
                                FinetuneConfig(max_train_examples=5, max_eval_examples=7))
    assert len(job.train) == 5 and len(job.evals[0].data) == 7
    whole = classify.classify_job(train, dev, tok, FinetuneConfig(max_train_examples=5))
    assert len(whole.train) == 5 and len(whole.evals[0].data) == 20


def test_labels_are_read_without_surrounding_spaces(tmp_path):
    """A CSV cell ", pos" (a space after the comma, as hand-written files have) is the label
    "pos", not a class of its own."""
    p = tmp_path / "s.csv"
    p.write_text("text,label\napple,pos\nriver, pos\nstone,neg \n")
    labels = [r[3] for r in classify.read_labelled(p, classify.Fields())]
    assert classify.discover_labels(p, labels) == ("neg", "pos")
    assert labels == ["pos", "pos", "neg"]
    assert classify.label_value(p, 2, " pos\t", "label") == "pos"


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf", "NaN", "Infinity"])
def test_regression_refuses_scores_that_are_not_finite(tmp_path, bad):
    """float() reads these; a NaN or infinite target would poison the loss and the metrics."""
    (tmp_path / "train.csv").write_text(f"text,label\napple,0.5\nriver,{bad}\n")
    tok = _tokenizer(tmp_path)  # a real one: a score let through is encoded, not refused
    _one_line_error(lambda: classify.classify_job(tmp_path / "train.csv", tmp_path / "train.csv",
                                                  tok, FinetuneConfig(), regression=True),
                    rf"train\.csv:3: label '{bad}' in 'label' is not a finite number")


def test_number_like_labels_stay_apart_and_sort_by_value():
    """float() reads "1_0" as 10, yet "1_0" is a name, not the number of "10"; numeric labels
    sort by value, negatives first (the module docstring's "sorted by value")."""
    p = Path("train.csv")
    assert classify.discover_labels(p, ["1_0", "10", "1_0"]) == ("10", "1_0")
    assert classify.discover_labels(p, ["1", "-1", "0"]) == ("-1", "0", "1")
    assert classify.discover_labels(p, ["-2", "1", "-10", "0"]) == ("-10", "-2", "0", "1")


def test_integer_labels_past_two_to_the_53_stay_apart():
    """Named through a float, 9007199254740993 and 9007199254740992 were one class, called
    "9007199254740992.0", a name no row has (ids such as product or user numbers)."""
    p = Path("train.csv")
    big = ["9007199254740993", "9007199254740992", "7", "9007199254740993"]
    assert classify.discover_labels(p, big) == ("7", "9007199254740992", "9007199254740993")
    assert classify.discover_labels(p, ["12345678901234567890", "12345678901234567891"]) == (
        "12345678901234567890", "12345678901234567891")
    assert classify.class_key("09007199254740993", True) == "9007199254740993"

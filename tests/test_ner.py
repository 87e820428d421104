"""`bertgpu finetune ner`: entity metric against seqeval, readers, sub-word alignment, end to end,
the export in a transformers pipeline, two processes, bad inputs.

The end-to-end fixture is tests/fixtures/ner (CoNLL style, three entity types, multi-word
entities, entities at sentence end); the tiny model's word-level vocabulary splits a few of its
words into two pieces, so the first-piece labelling is exercised too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import _tiny_init
import numpy as np
import pytest
from _tiny_init import SPECIAL

from bertgpu.batch import IGNORE_INDEX
from bertgpu.errors import BertgpuError
from bertgpu.finetune import finetune
from bertgpu.tasks import metrics, ner

FIXTURES = Path(__file__).parent / "fixtures" / "ner"
# Words the tiny vocabulary only has as two pieces each (word -> pieces).
SPLIT = {"london": ["lon", "##don"], "boston": ["bos", "##ton"], "microsoft": ["micro", "##soft"]}
FAST = ["--lr", "3e-3", "--hidden_dropout_prob", "0", "--global_batch_size", "16",
        "--max_seq_len", "32"]

pytestmark = pytest.mark.usefixtures("one_thread")


def fixture_vocab() -> list[str]:
    words = {line.split()[0].lower() for p in FIXTURES.glob("*.conll")
             for line in p.read_text(encoding="utf-8").splitlines() if line.strip()}
    words -= {"-docstart-", *SPLIT}
    return [*SPECIAL, *sorted(words), *(piece for pieces in SPLIT.values() for piece in pieces)]


@pytest.fixture
def init(tmp_path) -> Path:
    return _tiny_init.tiny_init(tmp_path, fixture_vocab())


# --------------------------------------------------------------------------------------------
# The entity metric


EDGE_CASES = [
    (["B-PER", "I-PER", "O"], ["B-PER", "I-PER", "O"]),              # exact
    (["O", "I-PER", "I-PER"], ["O", "B-PER", "I-PER"]),              # I- after O starts an entity
    (["I-LOC", "O"], ["B-LOC", "O"]),                                # I- at the sentence start
    (["B-PER", "I-LOC", "I-LOC"], ["B-PER", "I-PER", "I-PER"]),      # the type changes inside
    (["B-PER", "B-PER", "I-PER"], ["B-PER", "I-PER", "I-PER"]),      # B- after B- of the same type
    (["O", "B-ORG", "I-ORG"], ["O", "B-ORG", "O"]),                  # entity at the sentence end
    (["B-ORG"], ["B-LOC"]),                                          # one word, wrong type
    # no gold entity in the sentence
    (["O", "O"], ["B-PER", "O"]),
    (["I-MISC", "I-MISC", "B-MISC", "I-MISC"], ["B-MISC", "I-MISC", "I-MISC", "I-MISC"]),
]


def test_entity_spans_follow_conlleval():
    assert metrics.entities(["B-PER", "I-PER", "O", "I-LOC"]) == [("PER", 0, 2), ("LOC", 3, 4)]
    assert metrics.entities(["B-PER", "I-LOC", "I-LOC"]) == [("PER", 0, 1), ("LOC", 1, 3)]
    assert metrics.entities(["B-PER", "B-PER", "I-PER"]) == [("PER", 0, 1), ("PER", 1, 3)]
    assert metrics.entities(["O", "B-ORG", "I-ORG"]) == [("ORG", 1, 3)]
    assert metrics.entities(["O", "O"]) == [] and metrics.entities([]) == []


def test_entity_scores_match_seqeval():
    sq = pytest.importorskip("seqeval.metrics")

    def check(gold, pred):
        ours = metrics.entity_scores(gold, pred)
        ref = {"precision": sq.precision_score(gold, pred), "recall": sq.recall_score(gold, pred),
               "f1": sq.f1_score(gold, pred), "accuracy": sq.accuracy_score(gold, pred)}
        assert ours == pytest.approx({k: 100 * v for k, v in ref.items()}), (gold, pred)

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # seqeval warns on 0/0 precision or recall
        for gold, pred in EDGE_CASES:
            check([gold], [pred])
            check([pred], [gold])
        check([g for g, _ in EDGE_CASES], [p for _, p in EDGE_CASES])
        # Random tag soups (invalid sequences included), sentences of mixed lengths.
        rng = np.random.default_rng(0)
        tags = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "I-ORG"]
        for _ in range(200):
            lengths = rng.integers(1, 8, rng.integers(1, 5))
            gold = [[tags[i] for i in rng.integers(0, len(tags), n)] for n in lengths]
            pred = [[tags[i] for i in rng.integers(0, len(tags), n)] for n in lengths]
            check(gold, pred)


# --------------------------------------------------------------------------------------------
# Reading


def test_conll_jsonl_and_csv_read_the_same(tmp_path):
    (tmp_path / "a.conll").write_text("-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\n"
                                      "rejects VBZ B-VP O\n"
                                      "German JJ B-NP B-MISC\n\n\n-DOCSTART- -X- -X- O\n"
                                      "Peter\tB-PER\n"
                                      "Blackburn\tI-PER", encoding="utf-8")
    (tmp_path / "a.jsonl").write_text(
        json.dumps({"words": ["EU", "rejects", "German"], "ner": ["B-ORG", "O", "B-MISC"]}) + "\n\n"
        + json.dumps({"words": ["Peter", "Blackburn"], "ner": ["B-PER", "I-PER"]}) + "\n")
    (tmp_path / "a.csv").write_text("words,ner\nEU rejects German,B-ORG O B-MISC\n"
                                    "Peter Blackburn,B-PER I-PER\n")
    expected = [(["EU", "rejects", "German"], ["B-ORG", "O", "B-MISC"]),
                (["Peter", "Blackburn"], ["B-PER", "I-PER"])]
    conll = ner.read_sentences(tmp_path / "a.conll")
    assert [(s.tokens, s.tags) for s in conll] == expected and conll[1].lines == [9, 10]
    fields = ner.Fields(text="words", label="ner")
    for name in ("a.jsonl", "a.csv"):
        assert [(s.tokens, s.tags)
                for s in ner.read_sentences(tmp_path / name, fields)] == expected, name


def test_tag_set_and_dev_types(tmp_path):
    train = [ner.Sentence(["a", "b", "c"], ["B-PER", "O", "B-LOC"], [1, 2, 3])]
    labels = ner.tag_set(tmp_path / "train.conll", train)
    assert labels == ("O", "B-LOC", "I-LOC", "B-PER", "I-PER")
    ner.check_known(tmp_path / "dev.conll",
                    [ner.Sentence(["x", "y"], ["B-LOC", "I-LOC"], [4, 5])], labels)
    with pytest.raises(BertgpuError,
                       match=r"dev\.conll:7: tag 'B-ORG': entity type 'ORG' is not in the training "
                             r"file \(expected one of LOC, PER\)"):
        ner.check_known(tmp_path / "dev.conll",
                        [ner.Sentence(["x", "y"], ["O", "B-ORG"], [6, 7])], labels)
    with pytest.raises(BertgpuError, match="train.conll: every tag is O"):
        ner.tag_set(tmp_path / "train.conll", [ner.Sentence(["a"], ["O"], [1])])


@pytest.mark.parametrize("text, match", [
    ("EU B-ORG\nrejects PER\n",
     r"x\.conll:2: tag 'PER' is not O, B-TYPE or I-TYPE \(expected BIO / IOB2"),
    ("EU S-ORG\n", r"x\.conll:1: tag 'S-ORG' is not O, B-TYPE or I-TYPE"),
    ("\n\nEU B-\n", r"x\.conll:3: tag 'B-' is not O"),
    ("EU B-ORG\nrejects\n", r"x\.conll:2: one field 'rejects'; expected a token and its tag"),
    ("-DOCSTART- -X- O\n\n", r"x\.conll: no sentences"),
])
def test_bad_conll_lines(tmp_path, text, match):
    (tmp_path / "x.conll").write_text(text)
    with pytest.raises(BertgpuError, match=match) as e:
        ner.read_sentences(tmp_path / "x.conll")
    assert "\n" not in str(e.value)


def test_bad_jsonl_rows(tmp_path):
    cases = [('{"tokens": ["a", "b"], "tags": ["O"]}', r"x\.jsonl:1: 2 tokens but 1 tags"),
             ('{"tokens": ["a"], "tags": [""]}',
              r"x\.jsonl:1: 'tags' is empty or has an empty entry"),
             ('{"tokens": ["a"], "tags": ["E-PER"]}', r"x\.jsonl:1: tag 'E-PER' is not O"),
             ('{"tokens": ["a"]}', r"x\.jsonl:1: no field 'tags' .*expected --label-field"),
             ('{"tokens": "a b", "tags": [1, 2]}',
              r"x\.jsonl:1: 'tags' holds integer ids \(e\.g\. 1\); expected names"),
             ('{"tokens": "a b", "tags": [1, "O"]}',
              r"x\.jsonl:1: 'tags' is not a list of strings")]
    for text, match in cases:
        (tmp_path / "x.jsonl").write_text(text + "\n")
        with pytest.raises(BertgpuError, match=match):
            ner.read_sentences(tmp_path / "x.jsonl")


# --------------------------------------------------------------------------------------------
# Sub-word alignment


def test_first_piece_carries_the_tag(tmp_path, init):
    from bertgpu.data.tokenizer_folder import load_tokenizer

    tok = load_tokenizer(tmp_path / "tok")
    s = ner.Sentence(["Emma", "visited", "London", "."], ["B-PER", "O", "B-LOC", "O"], [1, 2, 3, 4])
    ids = {"O": 0, "B-LOC": 1, "I-LOC": 2, "B-PER": 3, "I-PER": 4}
    enc, firsts = ner.encode_sentences(tok, [s], ids, 32)
    pieces = [tok.id_to_token(i) for i in enc.ids[0]]
    assert pieces == ["[CLS]", "emma", "visited", "lon", "##don", ".", "[SEP]"]
    assert enc.token_targets["labels"][0].tolist() == [IGNORE_INDEX, 3, 0, 1, IGNORE_INDEX, 0,
                                                       IGNORE_INDEX]
    assert firsts[0].tolist() == [1, 2, 3, 5]
    # Predictions come back per word from the first piece; a word cut off by max_seq_len is O.
    labels = tuple(ids)
    logits = np.zeros((1, 7, 5))
    logits[0, [1, 2, 3, 4, 5], [3, 0, 1, 4, 0]] = 1.0  # the second piece's vote is ignored
    assert ner.word_predictions(logits, firsts, labels) == [["B-PER", "O", "B-LOC", "O"]]
    short, cut = ner.encode_sentences(tok, [s], ids, 5)
    assert len(short.ids[0]) == 5 and cut[0].tolist() == [1, 2, 3, -2]  # -2: cut off
    assert ner.word_predictions(logits[:, :5], cut, labels) == [["B-PER", "O", "B-LOC", "O"]]
    # The batch pads token labels with IGNORE_INDEX.
    batch = short.__class__(short.ids + enc.ids, short.types + enc.types,
                            token_targets={"labels": short.token_targets["labels"]
                                           + enc.token_targets["labels"]}
                            ).batch([0, 1], pad_id=0)
    assert batch["labels"].shape == (2, 7) and batch["labels"][0, 5:].tolist() == [IGNORE_INDEX] * 2


# --------------------------------------------------------------------------------------------
# End to end


def test_ner_learns_exports_and_runs_in_a_pipeline(tmp_path, init):
    out = tmp_path / "ft"
    res = finetune("ner", None, init, out, train_file=FIXTURES / "train.conll",
                   dev_file=FIXTURES / "dev.conll", overrides=[*FAST, "--epochs", "3"])
    assert res["task"] == "ner" and res["kind"] == "token_classification"
    assert res["labels"] == ["O", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "B-PER", "I-PER"]
    dev = res["metrics"]["dev"]
    assert set(dev) == {"precision", "recall", "f1", "accuracy"} and res["score"] == dev["f1"]
    assert dev["f1"] >= 90.0, dev  # chance: ~0
    # predictions.conll holds what was scored: seqeval on it gives the same F1.
    sq = pytest.importorskip("seqeval.metrics")
    blocks = [b.splitlines() for b in (out / "predictions.conll").read_text().split("\n\n")
              if b.strip()]
    gold = [[line.split()[1] for line in b] for b in blocks]
    pred = [[line.split()[2] for line in b] for b in blocks]
    assert len(blocks) == 60 and 100 * sq.f1_score(gold, pred) == pytest.approx(dev["f1"])
    # The report reads it like any fine-tuning run.
    from bertgpu.report import build_report

    page = (build_report([out], tmp_path / "report", "md") / "README.md").read_text()
    assert "| ft | ner |" in page and "dev: precision" in page
    cfg = json.loads((out / "model" / "config.json").read_text())
    assert cfg["architectures"] == ["BertForTokenClassification"]
    assert cfg["id2label"]["5"] == "B-PER" and cfg["label2id"]["I-LOC"] == 2

    transformers = pytest.importorskip("transformers")
    # "first": a word takes its first piece's label, as in training.
    nlp = transformers.pipeline("token-classification", model=str(out / "model"),
                                aggregation_strategy="first")
    found = {(e["entity_group"], e["word"]) for e in nlp("yesterday emma wilson flew to london .")}
    assert found == {("PER", "emma wilson"), ("LOC", "london")}
    words = transformers.pipeline("token-classification",
                                  model=str(out / "model"))("emma visited boston")
    assert [w["entity"] for w in words][:2] == ["B-PER", "B-LOC"]


@pytest.mark.timeout(150)
def test_two_processes_score_like_one(tmp_path, init):
    """`--nproc 2`: ranks split each step and the evaluation (per-token logits of two slices
    gathered on rank 0); DP=2 is the same run as DP=1, so the scores agree."""
    files = {"train_file": FIXTURES / "train.conll", "dev_file": FIXTURES / "dev.conll"}
    quick = ["--epochs", "1", "--max_train_examples", "96", *FAST]
    one = finetune("ner", None, init, tmp_path / "ft1", overrides=quick, **files)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, "-m", "bertgpu", "finetune", "ner",
         "--train-file", str(files["train_file"]), "--dev-file", str(files["dev_file"]),
         "--init", str(init), "--out", str(tmp_path / "ft2"), "--nproc", "2", *quick],
        capture_output=True, text=True, env=env, timeout=140, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    two = json.loads((tmp_path / "ft2" / "results.json").read_text())
    assert two["world_size"] == 2 and two["steps"] == one["steps"] == 6
    assert two["metrics"]["dev"] == pytest.approx(one["metrics"]["dev"], abs=1e-6)
    assert two["epochs"][0]["train_loss"] == pytest.approx(one["epochs"][0]["train_loss"], rel=1e-4)


def test_command_line_errors(tmp_path, init, capsys):
    from bertgpu.cli import main

    (tmp_path / "dev.conll").write_text("Emma B-PER\nvisited O\nMars B-PLANET\n")
    base = ["finetune", "ner", "--init", str(init), "--out", str(tmp_path / "o"),
            "--train-file", str(FIXTURES / "train.conll")]
    assert main([*base, "--dev-file", str(tmp_path / "dev.conll")]) == 2
    err = capsys.readouterr().err.strip()
    assert ("\n" not in err and "dev.conll:3: tag 'B-PLANET': entity type 'PLANET' is not in the "
                                "training file" in err)
    assert main([*base, "--dev-file", str(tmp_path / "dev.conll"), "--regression"]) == 2
    assert "--regression are for classify" in capsys.readouterr().err
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.tmp").exists()


def test_conll_tokens_keep_spaces_in_tab_files_and_no_break_spaces(tmp_path):
    """line.split() cut 'New York' (a tab-separated token) to 'New' and '10<NBSP>000' to '10',
    silently; predictions.conll then no longer matched the file. Tabs split a line that has
    one, ASCII spaces any other line; predictions.conll keeps three columns per word."""
    (tmp_path / "x.conll").write_text("Emma\tB-PER\nNew York\tB-LOC\n10\u00a0000\tO\n\n"
                                      "EU NNP B-ORG\n10\u00a0000  O\n \u00a0\n", encoding="utf-8")
    got = [(s.tokens, s.tags) for s in ner.read_sentences(tmp_path / "x.conll")]
    assert got == [(["Emma", "New York", "10\u00a0000"], ["B-PER", "B-LOC", "O"]),
                   (["EU", "10\u00a0000"], ["B-ORG", "O"])]
    dev = ner.read_sentences(tmp_path / "x.conll")
    ner._write_conll(tmp_path / "p.conll", dev, [s.tags for s in dev])
    rows = [line.split("\t") for line in (tmp_path / "p.conll").read_text().splitlines() if line]
    assert rows[1] == ["New York", "B-LOC", "B-LOC"] and all(len(r) == 3 for r in rows), rows


def test_a_tab_at_the_end_of_a_space_separated_line_is_whitespace(tmp_path):
    """'emma B-PER<TAB>' (spreadsheet exports leave a trailing tab) was split at the tab: "one
    field 'emma B-PER'; expected a token and its tag separated by whitespace"."""
    (tmp_path / "x.conll").write_text("emma B-PER\t\nflew O \t\n\nNew York\tB-LOC\t\n",
                                      encoding="utf-8")
    got = [(s.tokens, s.tags) for s in ner.read_sentences(tmp_path / "x.conll")]
    assert got == [(["emma", "flew"], ["B-PER", "O"]), (["New York"], ["B-LOC"])]


def test_a_type_past_max_train_examples_is_named_so(tmp_path):
    """A dev type that the training file has only past the --max_train_examples cut used to be
    "not in the training file"; the message now names the cut."""
    from bertgpu.config.finetune import FinetuneConfig

    (tmp_path / "train.conll").write_text("Emma B-PER\n\nAcme B-ORG\n")
    (tmp_path / "dev.conll").write_text("Emma B-PER\nAcme B-ORG\n")
    cfg = FinetuneConfig(max_train_examples=1)
    with pytest.raises(BertgpuError, match=r"dev\.conll:2: tag 'B-ORG': entity type 'ORG' is in "
                                           r"the training file but not in its first sentence "
                                           r"\(--max_train_examples 1\) \(expected one of PER\)$"):
        ner.ner_job(tmp_path / "train.conll", tmp_path / "dev.conll", None, cfg)


# --------------------------------------------------------------------------------------------
# Byte-level BPE (RoBERTa's, ModernBERT's kind) against transformers


BPE_TEXT = ["Hundreds of people have been forced to vacate their homes in London .",
            "Emma Smith works for Microsoft of Boston , said the people of London ."]


def _byte_level_folder(folder: Path) -> Path:
    """A tiny byte-level BPE tokenizer trained on BPE_TEXT with `[CLS] $A [SEP]` around each
    sequence (ModernBERT's layout), saved both as a PreTrainedTokenizerFast folder
    (tokenizer.json, ByteLevel with add_prefix_space false, as ModernBERT's) and as RoBERTa's
    vocab.json + merges.txt for transformers' reference tokenizer."""
    from tokenizers import ByteLevelBPETokenizer, processors
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(BPE_TEXT * 3, vocab_size=320, min_frequency=1, show_progress=False,
                            special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    tok = bpe._tokenizer
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", tok.token_to_id("[CLS]")),
                                                 ("[SEP]", tok.token_to_id("[SEP]"))])
    folder.mkdir()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", cls_token="[CLS]",
                            sep_token="[SEP]", pad_token="[PAD]", mask_token="[MASK]",
                            add_prefix_space=True).save_pretrained(folder)
    bpe.save_model(str(folder))
    return folder


def test_byte_level_bpe_words_encode_as_transformers_is_split_into_words(tmp_path):
    from transformers import RobertaTokenizerFast

    from bertgpu.data.tokenizer_folder import load_tokenizer

    folder = _byte_level_folder(tmp_path / "bpe")
    tok = load_tokenizer(folder)
    # RoBERTa's class applies add_prefix_space to its ByteLevel pre-tokenizer (the generic
    # PreTrainedTokenizerFast of transformers 5 keeps the file's add_prefix_space false).
    ref = RobertaTokenizerFast.from_pretrained(folder, add_prefix_space=True, cls_token="[CLS]",
                                               sep_token="[SEP]", pad_token="[PAD]",
                                               unk_token="[UNK]", mask_token="[MASK]")
    sentences = [ner.Sentence(t.split(), ["O"] * len(t.split()), list(range(len(t.split()))))
                 for t in [*BPE_TEXT, "vacate Boston"]]
    enc, firsts = ner.encode_sentences(tok, sentences, {"O": 0}, 64)
    for s, ids, first in zip(sentences, enc.ids, firsts, strict=True):
        want = ref(s.tokens, is_split_into_words=True)
        assert ids.tolist() == want["input_ids"]
        word_ids = want.word_ids()
        assert first.tolist() == [word_ids.index(w) for w in range(len(s.tokens))]
    # "of" is the one piece running text gives it, not the space-less "o", "f".
    pieces = [tok.id_to_token(i) for i in enc.ids[0]]
    assert pieces[firsts[0][1]] == "Ġof" and pieces == ["[CLS]", *(
        p for w in BPE_TEXT[0].split() for p in tok.encode(" " + w, add_special_tokens=False)
        .tokens), "[SEP]"]
    assert ner.is_byte_level(tok)


def test_wordpiece_words_encode_as_before(tmp_path, init):
    """A WordPiece tokenizer's encoding is the plain pre-tokenized one, byte for byte."""
    from bertgpu.data.tokenizer_folder import load_tokenizer

    tok = load_tokenizer(tmp_path / "tok")
    sentences = ner.read_sentences(FIXTURES / "train.conll")
    tags = {t: i for i, t in enumerate(ner.tag_set(FIXTURES / "train.conll", sentences))}
    enc, _ = ner.encode_sentences(tok, sentences, tags, 32)
    old = tok.encode_batch([s.tokens for s in sentences], is_pretokenized=True)
    assert [e.tolist() for e in enc.ids] == [e.ids for e in old]
    assert [e.tolist() for e in enc.types] == [e.type_ids for e in old]
    assert not ner.is_byte_level(tok)


# --------------------------------------------------------------------------------------------
# Survivors of a mutation review: the dev cut, the truncation warning, a padding tokenizer.json


def _tokenizer(tmp_path: Path):
    """The word-level tokenizer of the `init` fixture's folder, without building its model."""
    from bertgpu.data.tokenizer_folder import load_tokenizer

    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "vocab.txt").write_text("\n".join(fixture_vocab()) + "\n", encoding="utf-8")
    (tok / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    return load_tokenizer(tok)


def _conll(path: Path, n: int) -> Path:
    """n two-word sentences, each with a PER entity (so every prefix knows the one type)."""
    path.write_text("Emma B-PER\nvisited O\n\n" * n, encoding="utf-8")
    return path


def test_max_eval_examples_cuts_the_dev_file(tmp_path):
    """--max_eval_examples cuts dev and --max_train_examples cuts train, each by its own
    number (the dev set was once cut by the training number)."""
    from bertgpu.config.finetune import FinetuneConfig

    train, dev = _conll(tmp_path / "train.conll", 20), _conll(tmp_path / "dev.conll", 20)
    tok = _tokenizer(tmp_path)
    job = ner.ner_job(train, dev, tok, FinetuneConfig(max_train_examples=5, max_eval_examples=7))
    assert len(job.train) == 5 and len(job.evals[0].data) == 7
    whole = ner.ner_job(train, dev, tok, FinetuneConfig(max_train_examples=5))
    assert len(whole.train) == 5 and len(whole.evals[0].data) == 20


def test_a_partly_cut_sentence_warns(tmp_path):
    """A dev sentence whose last words fall past max_seq_len is counted in the warning, though
    its first words fit; a sentence that fits is not."""
    from bertgpu.config.finetune import FinetuneConfig

    train = _conll(tmp_path / "train.conll", 2)
    (tmp_path / "dev.conll").write_text("Emma B-PER\nvisited O\nBoston O\n. O\n\nEmma B-PER\n")
    # [CLS] emma visited bos ##ton . [SEP]: 7 pieces; 5 keep [CLS] emma visited bos [SEP],
    # so "." is cut while the first three words keep their first pieces.
    with pytest.warns(UserWarning, match=r"dev\.conll: 1 of 2 sentences are longer than "
                                         r"max_seq_len 5 tokens"):
        ner.ner_job(train, tmp_path / "dev.conll", _tokenizer(tmp_path),
                    FinetuneConfig(max_seq_len=5))


def test_a_tokenizer_json_that_pads_does_not_pad_sentences(tmp_path):
    """A Hugging Face tokenizer.json may carry a padding setting; the sentences are padded per
    batch later, so each one's ids must have its own length, not the longest sentence's."""
    from tokenizers import Tokenizer

    from bertgpu.data.tokenizer_folder import load_tokenizer

    plain = _tokenizer(tmp_path)
    padding = Tokenizer.from_str(plain.to_str())
    padding.enable_padding(pad_id=0, pad_token="[PAD]", length=16)
    folder = tmp_path / "padded"
    folder.mkdir()
    padding.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    tok = load_tokenizer(folder)
    assert tok.padding is not None  # the folder's setting survives loading: the test bites
    words = [["Emma", "visited", "London"], ["Emma"]]
    sentences = [ner.Sentence(w, ["O"] * len(w), list(range(len(w)))) for w in words]
    enc, firsts = ner.encode_sentences(tok, sentences, {"O": 0}, 32)
    want = [plain.encode(w, is_pretokenized=True).ids for w in words]
    assert [len(w) for w in want] == [6, 3]  # emma visited lon ##don, in [CLS] .. [SEP]
    assert [e.tolist() for e in enc.ids] == want
    assert [len(x) for x in enc.token_targets["labels"]] == [6, 3]
    assert [f.tolist() for f in firsts] == [[1, 2, 3], [1]]


def test_a_full_width_space_token_reads_in_json_lines_as_in_conll(tmp_path):
    """People's Daily-style sets hold U+3000 as a token: CoNLL read it, JSON lines refused it as
    "an empty entry". ASCII whitespace alone is still empty in both."""
    (tmp_path / "x.conll").write_text("人\tO\n\u3000\tO\n民\tO\n", encoding="utf-8")
    (tmp_path / "x.jsonl").write_text(json.dumps({"tokens": ["人", "\u3000", "民"],
                                                  "tags": ["O", "O", "O"]}) + "\n")
    conll, jsonl = (ner.read_sentences(tmp_path / f"x.{kind}") for kind in ("conll", "jsonl"))
    assert [(s.tokens, s.tags) for s in jsonl] == [(s.tokens, s.tags) for s in conll] == [
        (["人", "\u3000", "民"], ["O", "O", "O"])]
    (tmp_path / "y.jsonl").write_text(json.dumps({"tokens": ["人", " "], "tags": ["O", "O"]}))
    with pytest.raises(BertgpuError, match="y.jsonl:1: 'tokens' is empty or has an empty entry"):
        ner.read_sentences(tmp_path / "y.jsonl")


def test_tagged_words_the_tokenizer_drops_are_named_not_taken_for_long_sentences(tmp_path):
    """A full-width space (U+3000) has no token: tagged inside an entity, it can never be
    learned or predicted. It was counted as a sentence "longer than max_seq_len (or holding
    words the tokenizer drops)"; tagged O it said that too, though O is what it gets."""
    import warnings

    from bertgpu.config.finetune import FinetuneConfig

    (tmp_path / "train.conll").write_text("Emma B-PER\n\u3000\tI-PER\nvisited O\n\n"
                                          "Emma B-PER\n\u3000\tO\n", encoding="utf-8")
    (tmp_path / "dev.conll").write_text("Emma B-PER\n\u3000\tO\nvisited O\n", encoding="utf-8")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ner.ner_job(tmp_path / "train.conll", tmp_path / "dev.conll", _tokenizer(tmp_path),
                    FinetuneConfig(max_seq_len=64))
    messages = [str(w.message) for w in seen]
    assert not any("longer than max_seq_len" in m or "dev.conll" in m for m in messages), messages
    named = f"{tmp_path / 'train.conll'}: the tokenizer gives no token to 1 of the words tagged"
    assert any(m.startswith(named) and m.endswith("their tags go unlearned") for m in messages)


def test_a_sentence_that_just_fits_is_not_cut_and_its_tokenless_entity_is_named(tmp_path):
    """[CLS] emma visited [SEP] is exactly max_seq_len 4: "longer than max_seq_len" was said of
    it (any sentence of that length counted as cut), and its tokenless I-PER went unnamed."""
    import warnings

    from bertgpu.config.finetune import FinetuneConfig

    train = _conll(tmp_path / "train.conll", 2)
    (tmp_path / "dev.conll").write_text("Emma B-PER\n\u3000\tI-PER\nvisited O\n", encoding="utf-8")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ner.ner_job(train, tmp_path / "dev.conll", _tokenizer(tmp_path),
                    FinetuneConfig(max_seq_len=4))
    messages = [str(w.message) for w in seen]
    assert not any("longer than max_seq_len" in m for m in messages), messages
    assert any("dev.conll: the tokenizer gives no token to 1 of the words" in m for m in messages)

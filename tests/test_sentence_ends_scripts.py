"""The sentence splitter (``--format text`` / ``lines``, and mlm+nsp's sentences) on the full stops
of more scripts: the full-width ．and half-width ｡ of Japanese, Burmese ။ and Tibetan ། (scripts
that do not space their words: a sentence ends there with or without a space), Amharic ። ፧ and
Armenian ։ (spaced scripts: before a space, like . and the danda). Each such paragraph was one
sentence, and mlm+nsp on Amharic paragraphs labelled every pair random."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from bertgpu.data.textio import split_sentences


@pytest.mark.parametrize(("text", "sentences"), ids=[
    "full-width", "half-width", "amharic", "burmese", "armenian", "tibetan", "spaced"], argvalues=[
    ("これはペンです．あれは本です．", ["これはペンです．", "あれは本です．"]),
    ("半角です｡次の文です｡", ["半角です｡", "次の文です｡"]),
    ("ሰላም ነው። እንዴት ነህ፧ ደህና ነኝ።", ["ሰላም ነው።", "እንዴት ነህ፧", "ደህና ነኝ።"]),
    ("မင်္ဂလာပါ။နေကောင်းလား။ ကျေးဇူးပါ။", ["မင်္ဂလာပါ။", "နေကောင်းလား။", "ကျေးဇူးပါ။"]),
    ("Բարև։ Ինչպես ես։", ["Բարև։", "Ինչպես ես։"]),
    # a shad, a space and a shad close one sentence (the next starts after them)
    ("བཀྲ་ཤིས་བདེ་ལེགས། ཁྱེད་རང་བདེ་པོ་ཡིན་པས། །ང་བདེ་པོ་ཡིན།",
     ["བཀྲ་ཤིས་བདེ་ལེགས།", "ཁྱེད་རང་བདེ་པོ་ཡིན་པས། །", "ང་བདེ་པོ་ཡིན།"]),
    ("Armenian ։ needs a space: 10։30 stays whole.",
     ["Armenian ։ needs a space: 10։30 stays whole."]),
])
def test_full_stops_of_more_scripts_end_sentences(text, sentences):
    assert split_sentences(text) == sentences


def test_english_and_chinese_split_as_before():
    assert split_sentences("Dr. Smith came. He saw e.g. the cat! 你好。”然后呢？好的。") == [
        "Dr. Smith came.", "He saw e.g. the cat!", "你好。”", "然后呢？", "好的。"]


AMHARIC = ["ሰላም ነው።", "እንዴት ነህ፧", "ደህና ነኝ።", "ቤቱ ትልቅ ነው።", "ውሃ ጠጣ።", "መጽሐፉን አነበበ።"]


def test_amharic_paragraphs_give_sentence_pairs(tmp_path):
    """prepare --format text --objective mlm+nsp on six-sentence Amharic paragraphs warned that
    100% of the NSP labels are 1 ("documents of one sentence"): now half follow."""
    from bertgpu.data.prepare import prepare
    from bertgpu.data.tokenizer import train_tokenizer

    corpus = tmp_path / "am.txt"
    corpus.write_text("".join(" ".join(AMHARIC[i:] + AMHARIC[:i]) + "\n\n" for i in range(6)) * 5,
                      encoding="utf-8")
    tok = train_tokenizer([corpus], tmp_path / "tok", vocab_size=60, min_frequency=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        manifest = prepare([corpus], tok, tmp_path / "d", seq_len=32, objective="mlm+nsp",
                           fmt="text", workers=1, validation_fraction=0.0, short_seq_prob=0.0)
    assert not [w for w in caught if "NSP labels" in str(w.message)]
    labels = np.concatenate([np.load(tmp_path / "d" / f"{s['name']}.nsp_labels.npy")
                             for s in manifest["splits"]["train"]["shards"]])
    assert 0 < labels.mean() < 0.9


def test_the_full_width_full_stop_in_numbers_and_abbreviations_ends_no_sentence():
    """The full-width full stop also writes Japanese decimals and abbreviations: "１．５倍" was
    cut into "１．" and "５倍", "Ｕ．Ｓ．" into three sentences."""
    from bertgpu.data.textio import split_sentences

    assert split_sentences("売上は前年の１．５倍になった。次の文。") == [
        "売上は前年の１．５倍になった。", "次の文。"]
    assert split_sentences("Ｕ．Ｓ．の大統領。") == ["Ｕ．Ｓ．の大統領。"]
    assert split_sentences("第１．２節を見よ。") == ["第１．２節を見よ。"]
    assert split_sentences("これはペンです．あれは本です．") == [
        "これはペンです．", "あれは本です．"]

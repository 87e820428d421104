"""`bertgpu tokenizer`'s accent-stripping warning reads a sample spread over the whole corpus:
it read the first MiB alone, so 1.5 MB of Japanese, Korean and Hindi after 1.1 MB of English
went without a word, while the same files given the other way round warned."""

from __future__ import annotations

import warnings

import pytest
from _text_fixtures import pydoc_documents

from bertgpu.data.tokenizer import train_tokenizer

MIXED = ("がっこうへいきます。かっこういいですね。ぎんこうでおかねをおろします。\n"
         "한국어 문장을 여기에 씁니다. 서울은 대한민국의 수도입니다.\n"
         "हिन्दी भारत की राजभाषा है। यह देवनागरी लिपि में लिखी जाती है।\n")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("strip")
    english = "".join(s + "\n" for doc in pydoc_documents(30) for s in doc)
    a_en = folder / "a_en.txt"
    a_en.write_text(english * (1_100_000 // len(english.encode()) + 1), encoding="utf-8")
    b_ja = folder / "b_ja.txt"
    b_ja.write_text(MIXED * (1_500_000 // len(MIXED.encode()) + 1), encoding="utf-8")
    assert a_en.stat().st_size > 1 << 20
    return a_en, b_ja


@pytest.mark.parametrize("order", [1, -1], ids=["english_first", "japanese_first"])
def test_the_warning_does_not_depend_on_which_file_comes_first(corpus, tmp_path, order):
    with pytest.warns(UserWarning, match=r"stripping accents \(--strip-accents; the default "
                                         r"without --cased\) changes \d+% of the letters"):
        train_tokenizer(list(corpus)[::order], tmp_path / "tok", vocab_size=300)


def test_english_alone_is_no_warning(corpus, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message="--vocab-size")
        train_tokenizer([corpus[0]], tmp_path / "tok", vocab_size=300)

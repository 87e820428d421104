"""A TSV without a header line (CLUE's LCQMC and AFQMC: sentence1<TAB>sentence2<TAB>label) was
refused with its data offered as column names and a fix that cannot work: "no column 'text'
(found '喜欢打篮球的男生喜欢什么样的女生', ..., '1'); expected --text-field to name one". A first
line that looks like data now says the file needs a header line (found by a probe)."""

from __future__ import annotations

import _tiny_init
import pytest

from bertgpu.cli import main
from bertgpu.errors import BertgpuError
from bertgpu.tasks import classify

LCQMC = ("喜欢打篮球的男生喜欢什么样的女生\t爱打篮球的男生喜欢什么样的女生\t1\n"
         "我手机丢了，我想换个手机\t我想买个新手机，求推荐\t1\n")


def _error(path, fields):
    with pytest.raises(BertgpuError) as e:
        classify.read_labelled(path, fields)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_a_headerless_pair_file_is_told_to_add_a_header_line(tmp_path, capsys):
    path = tmp_path / "lcqmc.tsv"
    path.write_text(LCQMC, encoding="utf-8")
    err = _error(path, classify.Fields())
    assert err.startswith(f"{path}:1: no column 'text': the first line is read as the header")
    assert "looks like data ('1' is a number)" in err
    assert "'text<TAB>text_b<TAB>label' with --text-pair-field text_b" in err
    assert "--text-field to name one" not in err and "喜欢打篮球" not in err
    # asked for a pair already: the header of the three columns asked for
    err = _error(path, classify.Fields(text="s1", text_pair="s2"))
    assert "e.g. 's1<TAB>s2<TAB>label'" in err and "--text-pair-field" not in err

    init, out = _tiny_init.tiny_init(tmp_path, _tiny_init.SPECIAL + ["a"]), tmp_path / "ft"
    assert main(["finetune", "classify", "--train-file", str(path), "--dev-file", str(path),
                 "--init", str(init), "--out", str(out)]) == 2
    assert "the first line is read as the header" in capsys.readouterr().err
    assert not out.exists() and not out.with_name("ft.tmp").exists()


@pytest.mark.parametrize("first", ["这个酒店很好，下次还来,positive",  # sentence punctuation
                                   "the room was clean,pos",              # spaces
                                   "neg,0.5"])                            # a number
def test_a_csv_whose_first_line_is_a_row_says_so(tmp_path, first):
    path = tmp_path / "x.csv"
    path.write_text(first + "\n", encoding="utf-8")
    err = _error(path, classify.Fields())
    assert "looks like data" in err and "e.g. 'text,label'" in err


def test_a_real_header_without_the_column_keeps_naming_the_flag(tmp_path):
    path = tmp_path / "h.tsv"
    path.write_text("sentence\t标签\n喜欢打篮球\t1\n", encoding="utf-8")
    err = _error(path, classify.Fields())
    assert err == (f"{path}:1: no column 'text' (found 'sentence', '标签'); expected "
                   "--text-field to name one")

"""What a new user's walkthrough of the README ran into (a review, this round): a missing data
folder named as missing instead of by the files not found in it, `bertgpu glue`'s --data-dir
given to `finetune` or `pretrain` answered with the plain "unknown key data_dir", `watch` on a
glue folder naming its task folders instead of its runs, and "1 documents"."""

from __future__ import annotations

from pathlib import Path

import pytest

from bertgpu import cli
from bertgpu.data.manifest import Manifest
from bertgpu.errors import BertgpuError
from bertgpu.tasks.glue import find_split_file

ROOT = Path(__file__).resolve().parents[1]


def test_a_missing_shard_set_folder_is_named_as_missing(tmp_path):
    with pytest.raises(BertgpuError, match=rf"^{tmp_path / 'nodata'}: does not exist \(expected "
                                           r"a shard set"):
        Manifest.read(tmp_path / "nodata" / "manifest.json")
    (tmp_path / "empty").mkdir()  # a folder without the file still names the file
    with pytest.raises(BertgpuError, match="manifest.json: no manifest.json found"):
        Manifest.read(tmp_path / "empty" / "manifest.json")
    # `pretrain --data RUN` (a run folder given for the shards): said as what it is
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(BertgpuError, match=r"no manifest.json found: .*run is a run folder of "
                                           r"`bertgpu pretrain` or `finetune`, not a shard set"):
        Manifest.read(tmp_path / "run" / "manifest.json")


def test_a_missing_glue_folder_is_named_as_missing(tmp_path):
    with pytest.raises(BertgpuError, match=rf"^{tmp_path / 'nodata'}: does not exist \(expected "
                                           r"the GLUE data folder, with SST-2/train.tsv in it\)"):
        find_split_file(tmp_path / "nodata", "sst2", "train")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BertgpuError, match="no train file for GLUE task SST-2: looked in"):
        find_split_file(tmp_path / "empty", "sst2", "train")


@pytest.mark.parametrize("command", [
    ["finetune", "sst2", "--init", "runs/base", "--out", "ft"],
    ["pretrain", str(ROOT / "configs" / "tiny.toml"), "--out", "run"]])
def test_glues_data_dir_elsewhere_says_what_to_write(command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main([*command, "--data-dir", "glue"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("unknown key data_dir (--data-dir is bertgpu glue's option; here the "
                        "data folder is --data DIR)"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_watch_on_a_glue_folder_names_its_task_runs(tmp_path, capsys):
    # bertgpu glue's OUT holds TASK/seed_N runs and its results files: watch named the task
    # folders and "2 more" as what the folder held, none of them a run.
    glue = tmp_path / "glue"
    for task in ("CoLA", "SST-2"):
        for seed in (1, 2):
            (glue / task / f"seed_{seed}").mkdir(parents=True)
            (glue / task / f"seed_{seed}" / "results.json").write_text("{}")
    (glue / "glue_results.jsonl").write_text("")
    assert cli.main(["watch", str(glue), "--once"]) == 2
    err = capsys.readouterr().err
    assert (f"{glue}: not a run; it holds the runs CoLA/seed_1, CoLA/seed_2, SST-2/seed_1, "
            f"SST-2/seed_2 (watch one: bertgpu watch {glue / 'CoLA' / 'seed_1'})") in err


def test_prepare_counts_in_the_singular_for_one(tmp_path, capsys):
    corpus = tmp_path / "one.txt"
    corpus.write_text("a short document of a few words.\nand a second line of it.\n")
    tok = tmp_path / "tok"
    assert cli.main(["tokenizer", "--corpus", str(corpus), "--out", str(tok),
                     "--vocab-size", "60"]) == 0
    assert cli.main(["prepare", "--corpus", str(corpus), "--tokenizer", str(tok), "--out",
                     str(tmp_path / "data"), "--seq-len", "16", "--validation-docs", "0"]) == 0
    out = capsys.readouterr().out
    assert "prepare: 1 document -> " in out and "prepare: 1 work unit on the local engine" in out


def test_a_file_that_is_not_utf8_is_named_with_its_line(tmp_path):
    """A GBK-encoded CSV (common for Chinese text) said "not UTF-8 text (invalid start byte at
    byte 11)": an offset inside the decoder's chunk of 8 kB, neither the line nor the offset in
    the file. Now the line, the byte, its offset in the file and the way out, for classification
    tables, CoNLL files and SQuAD JSON alike."""
    import pytest

    from bertgpu.errors import BertgpuError
    from bertgpu.tasks import ner, squad_read, tables

    good = "".join(f"这是第{i}句话,label\n" for i in range(600)).encode("utf-8")  # > 8 kB
    bad = "不好,neg\n".encode("gbk")
    csv = tmp_path / "dev.csv"
    csv.write_bytes(b"text,label\n" + good + bad)
    offset = len(b"text,label\n") + len(good)
    expected = (f"{csv}:602: not UTF-8 text (byte 0x{bad[0]:02x} at offset {offset} of the "
                "file); expected UTF-8 (convert it first, e.g. iconv -f ITS_ENCODING -t UTF-8)")
    with pytest.raises(BertgpuError) as info:
        list(tables.read_rows(csv, {"text": "--text-field", "label": "--label-field"}))
    assert str(info.value) == expected
    conll = tmp_path / "dev.conll"
    conll.write_bytes(b"Emma B-PER\n\nCaf\xe9 O\n")  # latin-1
    with pytest.raises(BertgpuError, match=r"dev.conll:3: not UTF-8 text \(byte 0xe9 at offset "
                                           r"15 of the file\)"):
        ner.read_sentences(conll)
    squad_json = tmp_path / "dev.json"
    squad_json.write_bytes(b'{"data": [],\n "version": "caf\xe9"}')
    with pytest.raises(BertgpuError, match=r"dev.json:2: not UTF-8 text \(byte 0xe9"):
        squad_read._read_json(squad_json)


def test_glue_files_not_utf8_and_squad_flags_of_another_type_are_one_line(tmp_path, caplog):
    """A GLUE file with a byte that is not UTF-8 ended in a UnicodeDecodeError traceback (TSV,
    JSONL and CSV alike); SQuAD's `"is_impossible": "false"` (a string) read as true, training an
    answerable question as unanswerable; an answer whose text is nowhere in its context was
    counted with the starts that were merely off, though its question leaves training."""
    import json
    import logging
    import shutil

    import pytest

    from bertgpu.errors import BertgpuError
    from bertgpu.tasks import glue_files, squad

    fixtures = Path(__file__).parent / "fixtures"
    sst2 = tmp_path / "SST-2"
    shutil.copytree(fixtures / "glue" / "SST-2", sst2)
    with open(sst2 / "train.tsv", "ab") as f:
        f.write(b"bad \xff\xfe bytes\t1\n")
    lines = (sst2 / "train.tsv").read_bytes().count(b"\n")
    with pytest.raises(BertgpuError, match=rf"train.tsv:{lines}: not UTF-8 text \(byte 0xff"):
        glue_files.read_examples("sst2", sst2 / "train.tsv")
    hf = tmp_path / "train.jsonl"
    hf.write_bytes(b'{"sentence": "ok", "label": 1}\n{"sentence": "caf\xe9", "label": 0}\n')
    with pytest.raises(BertgpuError, match=r"train.jsonl:2: not UTF-8 text \(byte 0xe9"):
        glue_files.read_examples("sst2", hf)

    data = json.loads((fixtures / "squad" / "dev-v2.0-sample.json").read_text())
    qa = data["data"][0]["paragraphs"][0]["qas"][0]
    qa["is_impossible"] = "false"
    path = tmp_path / "v2.json"
    path.write_text(json.dumps(data))
    flag = r'qas\[0\].is_impossible: expected true or false, found "false"'
    with pytest.raises(BertgpuError, match=r"v2.json: data\[0\].paragraphs\[0\]." + flag):
        squad.read_squad(path, version_2=True)

    data = json.loads((fixtures / "squad" / "dev-v1.1-sample.json").read_text())
    data["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["text"] = "Zebra Unicorns"
    path.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING):
        squad.read_squad(path)
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "1 answers whose text is nowhere in their context; 1 questions whose first answer " \
           "is one of them have no training target and are left out of training" in said, said
    assert "does not point at their text" not in said, said

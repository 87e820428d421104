"""Classification outputs escaped non-ASCII labels: predictions.jsonl held
``"label": "\\u6b63\\u9762"`` and results.json its labels likewise (SQuAD's predictions.json and
the tokenizer files were UTF-8 already). Now they are UTF-8 text, and a results.json of the
escaped form, as older runs wrote it, is still this run's: the same command again does nothing
(found by a probe)."""

from __future__ import annotations

import json
import random

import _tiny_init
import pytest
from _tiny_init import SPECIAL

from bertgpu.finetune import finetune
from bertgpu.tasks.finetune_output import json_text

WORDS = "apple river stone cloud table green quiet music paper window".split()
VOCAB = SPECIAL + ["good", "bad"] + WORDS
LABELS = {"正面": "good", "负面": "bad"}
FAST = ["--lr", "3e-3", "--hidden_dropout_prob", "0", "--global_batch_size", "16",
        "--max_seq_len", "16", "--epochs", "1"]

pytestmark = pytest.mark.usefixtures("one_thread")


def _csv(path, n, seed):
    rng = random.Random(seed)
    rows = ["text,label"]
    for _ in range(n):
        label = rng.choice(sorted(LABELS))
        rows.append(" ".join([*rng.sample(WORDS, 4), LABELS[label]]) + f",{label}")
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def test_chinese_labels_are_written_as_utf8_and_old_escaped_results_still_match(tmp_path,
                                                                             capsys):
    train, dev = _csv(tmp_path / "训练.csv", 48, 0), _csv(tmp_path / "验证.csv", 16, 1)
    init = _tiny_init.tiny_init(tmp_path, VOCAB)
    out = tmp_path / "ft"

    def again():
        return finetune("classify", None, init, out, train_file=train, dev_file=dev,
                        overrides=FAST)

    res = again()
    assert res["labels"] == ["正面", "负面"]
    preds = (out / "predictions.jsonl").read_text(encoding="utf-8")
    assert "\\u" not in preds and '"id": "验证.csv:2"' in preds
    assert any(json.loads(line)["label"] in LABELS for line in preds.splitlines())
    assert '"label": "正面"' in preds or '"label": "负面"' in preds
    text = (out / "results.json").read_text(encoding="utf-8")
    assert "\\u" not in text and '"正面"' in text and "训练.csv" in text
    assert json.loads(text)["labels"] == ["正面", "负面"]

    # a results.json written escaped (an older bertgpu) is the same run: nothing to do
    (out / "results.json").write_text(json.dumps(json.loads(text), indent=2) + "\n",
                                      encoding="utf-8")
    capsys.readouterr()
    assert again()["run_key"] == res["run_key"]
    assert "nothing to do" in capsys.readouterr().out


def test_what_utf8_cannot_encode_stays_escaped():
    assert json_text({"label": "正面"}) == '{"label": "正面"}'
    # a file name's undecodable byte (surrogateescape): escaped, as before, not a crash
    assert json_text({"id": "b\udcff.csv:2"}) == '{"id": "b\\udcff.csv:2"}'

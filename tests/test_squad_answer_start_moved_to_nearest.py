"""An answer whose answer_start is off (by a character or two in some files) is moved onto the
occurrence of its text nearest to the given start, as squad_read's docstring says; training then
targets the span the annotator marked, not an earlier copy of the same words.

A mutation probe found no test failing when the first occurrence in the context was taken
instead of the nearest."""

from __future__ import annotations

import json
from pathlib import Path

from bertgpu.tasks.squad_read import read_squad_counted

CONTEXT = "The river rose in May. In June the river fell. By July the river was dry."


def _file(path: Path, starts: list[int]) -> Path:
    qas = [{"id": f"q{k}", "question": "Which river?",
            "answers": [{"text": "the river", "answer_start": s}]} for k, s in enumerate(starts)]
    path.write_text(json.dumps({"version": "1.1", "data": [
        {"title": "t", "paragraphs": [{"context": CONTEXT, "qas": qas}]}]}), encoding="utf-8")
    return path


def test_an_off_answer_start_moves_to_the_nearest_occurrence(tmp_path: Path) -> None:
    second, third = CONTEXT.index("the river"), CONTEXT.rindex("the river")
    assert second < third  # two lower-case copies of "the river"
    # exact, one after the third copy, two before the third, one before the second
    examples, moved = read_squad_counted(_file(tmp_path / "s.json",
                                               [third, third + 1, third - 2, second - 1]))
    assert [e.answer_starts for e in examples] == [(third,), (third,), (third,), (second,)]
    assert moved == 3
    for e in examples:
        s, end = e.train_span
        assert CONTEXT[s:end] == "the river"

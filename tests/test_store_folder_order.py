"""A folder read from a store lists its files in the order the same folder read from disk does.
Local paths sort by part ("a/x.jsonl" before "a-b.jsonl": "a" < "a-b"), a store's listing was
sorted as strings ("-" and "." sort before "/"), so the same corpus made other shards and another
--validation-docs set when read from a URL."""

from __future__ import annotations

import fsspec
import pytest

from bertgpu.data.sources import resolve_inputs

NAMES = ["a/x.jsonl", "a/x2.jsonl", "a-b.jsonl", "a.jsonl", "B/y.jsonl", "b.jsonl", "Z.jsonl"]


@pytest.fixture
def store():
    fs = fsspec.filesystem("memory")
    for name in NAMES:
        with fs.open(f"/order-probe/ordc/{name}", "w") as f:
            f.write('{"text": "x"}\n')
    yield "memory://order-probe/ordc"
    fs.rm("/order-probe", recursive=True)


def _relative(found) -> list[str]:
    return [str(p).split("/ordc/", 1)[1] for p in found]


def test_a_folder_from_a_store_is_in_the_local_order(tmp_path, store):
    for name in NAMES:
        (tmp_path / "ordc" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "ordc" / name).write_text('{"text": "x"}\n')
    local = _relative(resolve_inputs([tmp_path / "ordc"]))
    assert local == ["B/y.jsonl", "Z.jsonl", "a/x.jsonl", "a/x2.jsonl", "a-b.jsonl",
                     "a.jsonl", "b.jsonl"]
    remote = _relative(resolve_inputs([store]))
    assert remote == local  # old code: a-b.jsonl and a.jsonl before a/x.jsonl
    pattern = _relative(resolve_inputs([store + "/**/*.jsonl"]))
    assert pattern == local

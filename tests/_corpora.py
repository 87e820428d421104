"""One real corpus (Python's reference topics, 79 documents) written in every input format, and
a corpus that `prepare` cuts into several work units, for the format, engine and URL tests."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from _text_fixtures import pydoc_documents


def documents() -> list[str]:
    """The 79 documents, each one line of text (so every format holds the same documents)."""
    return [" ".join(d) for d in pydoc_documents()]


def write_parquet(path: Path, docs: list[str], row_group_size: int) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"id": list(range(len(docs))), "text": docs})
    pq.write_table(table, path, row_group_size=row_group_size, compression="none")
    return path


def write_formats(folder: Path, docs: list[str]) -> dict[str, tuple[Path, str]]:
    """name -> (file, --format) of the same documents as text, lines, JSONL (plain, gzip,
    zstd in two frames), Parquet with several row groups and a saved Arrow dataset (zstd,
    Parquet and Arrow only when installed)."""
    folder.mkdir(parents=True, exist_ok=True)
    jsonl = "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()
    out = {}
    (folder / "docs.txt").write_text("".join(d + "\n\n" for d in docs))
    out["text"] = (folder / "docs.txt", "text")
    (folder / "docs.lines").write_text("".join(d + "\n" for d in docs))
    out["lines"] = (folder / "docs.lines", "lines")
    (folder / "docs.jsonl").write_bytes(jsonl)
    out["jsonl"] = (folder / "docs.jsonl", "auto")
    (folder / "docs.jsonl.gz").write_bytes(gzip.compress(jsonl, mtime=0))
    out["jsonl.gz"] = (folder / "docs.jsonl.gz", "auto")
    try:
        import zstandard

        half = jsonl.index(b"\n", len(jsonl) // 2) + 1  # two frames, as pzstd and streams write
        frames = [zstandard.ZstdCompressor().compress(x) for x in (jsonl[:half], jsonl[half:])]
        (folder / "docs.jsonl.zst").write_bytes(b"".join(frames))
        out["jsonl.zst"] = (folder / "docs.jsonl.zst", "auto")
    except ImportError:
        pass
    try:
        out["parquet"] = (write_parquet(folder / "docs.parquet", docs, row_group_size=8), "auto")
        out["arrow folder"] = (write_saved_dataset(folder / "saved", docs), "auto")
    except ImportError:
        pass
    return out


def write_saved_dataset(folder: Path, docs: list[str]) -> Path:
    """What `datasets.Dataset.save_to_disk` writes: Arrow IPC streams of record batches of
    1000 rows (here 10) and two JSON metadata files."""
    import pyarrow as pa

    folder.mkdir(parents=True, exist_ok=True)
    table = pa.table({"text": docs, "id": list(range(len(docs)))})
    with pa.OSFile(str(folder / "data-00000-of-00001.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=10):
                writer.write_batch(batch)
    (folder / "dataset_info.json").write_text(json.dumps({"features": {"text": {}}}, indent=2))
    (folder / "state.json").write_text(json.dumps(
        {"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}, indent=2))
    return folder


def write_mixed(folder: Path, docs: list[str]) -> list[Path]:
    """Files that `prepare --unit-bytes 60000` cuts into 10 work units: a JSONL file in byte
    ranges, a Parquet file in ranges of row groups, a text file in byte ranges, a small file."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "a.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[:35]))
    write_parquet(folder / "b.parquet", docs[35:60], row_group_size=3)
    (folder / "c.txt").write_text("".join(d + "\n\n" for d in docs[60:78]))
    (folder / "d.txt").write_text(docs[78] + "\n")
    return [folder / n for n in ("a.jsonl", "b.parquet", "c.txt", "d.txt")]


MIXED_UNIT_BYTES = 60_000


def tree_bytes(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder``: relative path -> bytes."""
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}

"""Parquet and Arrow corpora: the text column of each row is a document, read a batch at a time.

    groups = parquet_row_groups(src)                 # [(rows, bytes, offset)] from the footer
    for text in read_parquet(src, "text", 2, 5): ...  # row groups 2, 3 and 4 (None: a null)
    for text in read_arrow(src, "text"): ...          # a dataset saved by `datasets`

Parquet is read with pyarrow, the text column only, in batches of about BATCH_BYTES
(`ParquetFile.iter_batches`), never the whole file; a work unit reads a range of row groups
(`units`). The reader holds one data page of the text column at a time (read through a buffer of
READ_BUFFER bytes) and one batch, so its memory depends on the file's page size (at most its row
group's text column) and never on the file's or the unit's size. Arrow
files (Hugging Face `datasets`' save_to_disk: IPC streams of record batches) are read one
record batch at a time and not split. Both need pyarrow (`pip install 'bertgpu[parquet]'`).
"""

from __future__ import annotations

from collections.abc import Iterator

from bertgpu.data.sources import Source, open_raw
from bertgpu.errors import BertgpuError

BATCH_BYTES = 1 << 20
"""Text per batch: the batch's rows follow from the row groups' bytes per row, so a corpus of
books holds no more in memory than one of tweets."""
MAX_BATCH_ROWS = 1024
READ_BUFFER = 1 << 20
"""Column chunks are read through a buffer of this size, page by page: unbuffered, pyarrow reads
a row group's whole text column chunk (64 MB for a row group of 64 MB of text) at once."""


def _pyarrow(src: Source):
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401 - the submodule is used through `pyarrow`
    except ImportError:
        raise BertgpuError(f"{src}: Parquet/Arrow; reading it needs pyarrow, expected `pip "
                           "install 'bertgpu[parquet]'`") from None
    return pyarrow


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _text_column(src: Source, schema, field: str) -> None:
    """Refuse a table without ``field`` or whose ``field`` does not hold strings."""
    pa = _pyarrow(src)
    if field not in schema.names:
        raise BertgpuError(f"{src}: no column {field!r} (found columns {schema.names[:8]}); "
                           "expected a string column with the text (choose it with --text-field)")
    kind = schema.field(field).type
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)
            or getattr(pa.types, "is_string_view", lambda _: False)(kind)):
        raise BertgpuError(f"{src}: column {field!r} holds {kind}; expected strings (choose the "
                           "text column with --text-field)")


def _strings(src: Source, field: str, column, first_row: int) -> list[str | None]:
    """The values of a batch's text column; bytes that are not UTF-8 (a string column may hold
    any bytes: Spark writes such) are an error naming the row (``first_row``: the batch's first
    row in the file)."""
    try:
        return column.to_pylist()
    except UnicodeDecodeError as exc:
        reason = f"{exc.reason}: byte 0x{exc.object[exc.start]:02x}"
    where = f"one of rows {first_row}-{first_row + len(column) - 1}"
    for i in range(len(column)):  # only after a failure: find the row
        try:
            column[i].as_py()
        except UnicodeDecodeError:
            where = f"row {first_row + i}"
            break
    raise BertgpuError(f"{src}: {where} (counting from 0) of column {field!r} is not UTF-8 "
                       f"text ({reason}); expected UTF-8 strings (the writer stored other "
                       "bytes in a string column)")


def _parquet_file(src: Source, f):
    pa = _pyarrow(src)
    try:
        # pre_buffer (pyarrow's default) reads every requested row group's chunks before the
        # first batch: a work unit's whole text column (64 MiB) held until the unit is read.
        return pa.parquet.ParquetFile(f, pre_buffer=False, buffer_size=READ_BUFFER)
    except (pa.ArrowException, OSError) as exc:
        _check_not_compressed(src, f, "Parquet")
        raise BertgpuError(f"{src}: not a readable Parquet file ({_one_line(exc)})") from None


def _check_not_compressed(src: Source, f, kind: str) -> None:
    """Refuse a Parquet or Arrow file put through gzip / bzip2 / zstd as a whole (pyarrow only
    said "magic bytes not found"): these formats are read in place, by their footer and row
    groups, and compress their own columns."""
    from bertgpu.data.compressed import sniff_compression

    try:
        f.seek(0)
        compression = sniff_compression(f.read(10))
    except (OSError, ValueError):
        return
    if compression is not None:
        article = "an" if kind[0] in "AEIOU" else "a"
        raise BertgpuError(f"{src}: a {compression} stream, not {article} {kind} file ({kind} is "
                           "read in place and compresses its own columns); expected the file "
                           "itself (decompress it first)")


def parquet_row_groups(src: Source) -> list[tuple[int, int, int]]:
    """(rows, compressed bytes, first byte) of each row group, from the file's footer only."""
    with open_raw(src) as f:
        meta = _parquet_file(src, f).metadata
        out = []
        for i in range(meta.num_row_groups):
            group = meta.row_group(i)
            columns = [group.column(c) for c in range(group.num_columns)]
            first = min((c.dictionary_page_offset or c.data_page_offset for c in columns),
                        default=0)
            size = sum(c.total_compressed_size for c in columns)
            out.append((group.num_rows, size, first))
    return out


def read_parquet(src: Source, field: str, start: int = 0,
                 stop: int | None = None) -> Iterator[str | None]:
    """The ``field`` value of each row of row groups ``[start, stop)`` (None: to the last)."""
    pa = _pyarrow(src)
    with open_raw(src) as f:
        pf = _parquet_file(src, f)
        _text_column(src, pf.schema_arrow, field)
        groups = list(range(start, pf.num_row_groups if stop is None else stop))
        if not groups:
            return
        column = pf.schema_arrow.get_field_index(field)
        meta = [pf.metadata.row_group(g) for g in groups]
        rows = sum(m.num_rows for m in meta)
        text = sum(m.column(column).total_uncompressed_size for m in meta)
        batch_rows = max(1, min(MAX_BATCH_ROWS, rows * BATCH_BYTES // max(text, 1)))
        row = sum(pf.metadata.row_group(g).num_rows for g in range(start))  # the file's rows
        try:
            for batch in pf.iter_batches(batch_size=batch_rows, row_groups=groups,
                                         columns=[field], use_threads=False):
                yield from _strings(src, field, batch.column(0), row)
                row += batch.num_rows
        except (pa.ArrowException, OSError) as exc:
            raise BertgpuError(f"{src}: cannot read Parquet ({_one_line(exc)})") from None


def read_arrow(src: Source, field: str) -> Iterator[str | None]:
    """The ``field`` value of each row of an Arrow IPC file or stream, a record batch at a
    time."""
    pa = _pyarrow(src)
    with open_raw(src) as f:
        try:
            head = f.read(6)
            f.seek(0)
            reader = pa.ipc.open_file(f) if head == b"ARROW1" else pa.ipc.open_stream(f)
            _text_column(src, reader.schema, field)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches)) \
                if head == b"ARROW1" else reader
            row = 0
            for batch in batches:
                yield from _strings(src, field, batch.column(field), row)
                row += batch.num_rows
        except (pa.ArrowException, OSError) as exc:
            _check_not_compressed(src, f, "Arrow")
            raise BertgpuError(f"{src}: not a readable Arrow file ({_one_line(exc)})") from None

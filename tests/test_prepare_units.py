"""prepare in work units (issue 27), on the local engine: every format gives the same shards, a
corpus cut into units gives the same bytes for any --workers, URLs (memory://, file://) in and
out, a run killed midway resumed by the same command, bad input as one line with nothing left,
the progress line, and `bertgpu tokenizer --sample-bytes`."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _corpora import (
    MIXED_UNIT_BYTES,
    documents,
    tree_bytes,
    write_formats,
    write_mixed,
    write_parquet,
)
from _text_fixtures import train_small_tokenizer

from bertgpu.cli import main as cli_main
from bertgpu.data.prepare import prepare

KW = dict(seq_len=64, shard_size=40, unit_bytes=MIXED_UNIT_BYTES)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_small_tokenizer(tmp_path_factory.mktemp("tok") / "tok", vocab_size=1000)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    pytest.importorskip("pyarrow")
    return write_mixed(tmp_path_factory.mktemp("mixed"), documents())


@pytest.fixture(scope="module")
def reference(tok, mixed, tmp_path_factory):
    """The mixed corpus prepared by one local worker: what every other way must match."""
    out = tmp_path_factory.mktemp("reference") / "data"
    return out, prepare(mixed, tok, out, workers=1, **KW)


def npy_files(folder: Path) -> dict[str, bytes]:
    return {k: v for k, v in tree_bytes(folder).items() if k.endswith(".npy")}


@pytest.mark.parametrize("objective", ["mlm", "mlm+nsp"])
def test_same_corpus_in_every_format_gives_identical_shards(tok, tmp_path, objective):
    """text, lines, JSONL (plain, gzip, zstd), Parquet in several row groups and a saved Arrow
    dataset: the same documents, so the same token shards (split by documents: a fraction's
    unit size comes from the stored bytes, which differ between formats)."""
    from bertgpu.data.columnar import parquet_row_groups

    formats = write_formats(tmp_path / "in", documents()[:30])
    assert {"jsonl.zst", "parquet", "arrow folder"} <= set(formats)
    assert len(parquet_row_groups(formats["parquet"][0])) == 4
    shards = {}
    for name, (path, fmt) in formats.items():
        out = tmp_path / name.replace(" ", "_")
        m = prepare([path], tok, out, seq_len=64, workers=1, fmt=fmt, validation_docs=3,
                    objective=objective)
        assert m["counts"]["documents"] == 30 and m["splits"]["validation"]["documents"] == 3
        shards[name] = npy_files(out)
    assert all(files == shards["jsonl"] for files in shards.values()), [
        n for n, f in shards.items() if f != shards["jsonl"]]


def test_work_units_give_the_same_bytes_for_any_workers(tok, mixed, reference, tmp_path):
    ref_dir, m = reference
    two = prepare(mixed, tok, tmp_path / "w2", workers=2, **KW)
    assert two == m and tree_bytes(tmp_path / "w2") == tree_bytes(ref_dir)
    # 10 units, each with its own shards, in corpus order; every document read once
    names = [s["name"] for s in m["splits"]["train"]["shards"]]
    assert names[0] == "train-00000-00000" and {n[6:11] for n in names} == {
        f"{u:05d}" for u in range(10)}
    assert m["counts"]["documents"] == 79
    assert abs(m["validation_share"] - 0.01) <= 0.002 * 5  # tiny corpus: min units of 64 tokens
    by_path = {i["path"]: i for i in m["inputs"]}
    a = by_path[str(mixed[0])]  # a.jsonl, read in 3 byte ranges by 3 units
    data = mixed[0].read_bytes()
    assert a["bytes"] == len(data) and [(p["start"], p["end"]) for p in a["parts"]] == [
        (0, 55050), (55050, 110100), (110100, len(data))]
    assert all(p["sha256"] == hashlib.sha256(data[p["start"]:p["end"]]).hexdigest()
               for p in a["parts"])
    d = by_path[str(mixed[3])]
    assert d["sha256"] == hashlib.sha256(mixed[3].read_bytes()).hexdigest()


def test_a_process_that_skips_atexit_leaves_nothing_in_the_temp_folder(tok, tmp_path):
    """A Ray worker or a pool's child ends without running atexit handlers; the tokenizer once
    went to a temp folder removed only at exit, so each such process left one behind (138 of
    them in /tmp on the machine that found it). Workers now load it from memory."""
    import multiprocessing
    import tempfile

    path, fmt = write_formats(tmp_path / "in", documents()[:10])["jsonl"]
    temp = tmp_path / "temp"
    temp.mkdir()

    def child() -> None:  # a multiprocessing child exits with os._exit: no atexit
        tempfile.tempdir = str(temp)
        prepare([path], tok, tmp_path / "out", seq_len=64, workers=1, fmt=fmt)

    proc = multiprocessing.get_context("fork").Process(target=child)
    proc.start()
    proc.join(120)
    assert proc.exitcode == 0 and (tmp_path / "out" / "manifest.json").is_file()
    assert sorted(p.name for p in temp.iterdir()) == []


@pytest.mark.parametrize("fmt", ["lines", "sentences", "jsonl"])
def test_parts_of_a_file_read_every_document_exactly_once(tmp_path, fmt):
    """Cut anywhere, the parts of a file together hold its documents: one per line, or between
    blank lines (runs of blank and whitespace-only lines, CRLF, a document spanning parts, no
    final newline)."""
    from bertgpu.data.corpus import Piece, convert_item, iter_document_parts, settle_parts
    from bertgpu.data.corpus import iter_piece_items as items
    from bertgpu.data.units import split_file

    docs = [f"Document {i} says {'many words ' * (i * 7 % 50)}here." for i in range(60)]
    if fmt == "jsonl":
        text = "".join(json.dumps({"text": d}) + ("\r\n" if i % 3 else "\n")
                       for i, d in enumerate(docs))
    elif fmt == "lines":
        text = "".join(d + ("\n" if i % 4 else "\n\n") for i, d in enumerate(docs))
    else:
        seps = ["\n\n", "\n \n\n", "\r\n\r\n", "\n\t\n"]
        text = "".join(d.replace(" says ", ".\nIt says ") + seps[i % 4]
                       for i, d in enumerate(docs))
    path = tmp_path / "corpus.txt"
    path.write_text(text.rstrip("\n"), newline="")
    whole = list(iter_document_parts([path], fmt=fmt))
    for part_bytes in (97, 500, 1499, 4000):
        pieces = split_file(path, path.stat().st_size, fmt, part_bytes)
        assert len(pieces) > 1 and all(isinstance(p, Piece) for p in pieces)
        parts = []
        for piece in pieces:  # each part on its own, as separate work units read them
            parts += settle_parts(convert_item(i) for i in items([piece], fmt=fmt))
        assert parts == whole, part_bytes


def test_parquet_reader_holds_a_page_not_its_row_groups(tmp_path, monkeypatch):
    """Reading Parquet holds one data page and one batch of the text column, not the row groups
    of the range read (pyarrow's pre_buffer) nor a row group's column chunk (unbuffered reads):
    the reader's memory does not grow with a unit's or a row group's size. Measured with
    tracemalloc, which sees the chunks pyarrow reads from a Python file object."""
    pytest.importorskip("pyarrow")
    import tracemalloc

    import pyarrow as pa
    import pyarrow.parquet as pq

    from bertgpu.data import columnar

    docs = documents()
    rows = [f"{i}. {docs[i % len(docs)]}" for i in range(2000)]  # 10 MiB of text
    path = tmp_path / "pages.parquet"
    pq.write_table(pa.table({"id": list(range(len(rows))), "text": rows}), path,
                   row_group_size=1000, data_page_size=64 << 10, write_batch_size=16,
                   use_dictionary=False, compression="none")  # 2 row groups, pages of ~64 KiB
    monkeypatch.setattr(columnar, "BATCH_BYTES", 64 << 10)
    tracemalloc.start()
    try:
        for got, want in zip(columnar.read_parquet(path, "text"), rows, strict=True):
            assert got == want
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # a page, a batch and a read of READ_BUFFER (1 MiB): 1.1 MiB; the row groups take 5 MiB each
    assert peak < 3 << 20, f"{peak / 2**20:.1f} MiB"


def test_url_round_trips_memory_and_file(tok, mixed, reference, tmp_path):
    """A corpus read from memory:// and file:// URLs, the shard set written to memory:// and
    file://: the same bytes as local paths."""
    fsspec = pytest.importorskip("fsspec")
    ref_dir, m = reference
    memory = fsspec.filesystem("memory")
    for path in mixed:
        memory.pipe_file(f"/corpus27/{path.name}", path.read_bytes())
    try:
        got = prepare(["memory://corpus27/"], tok, "memory://out27/data", workers=2, **KW)
        assert got["inputs"][0]["path"] == "memory:///corpus27/a.jsonl"
        assert got["splits"] == m["splits"] and got["counts"] == m["counts"]
        remote = {p.split("/out27/data/", 1)[1]: memory.cat_file(p)
                  for p in memory.find("/out27/data")}
        assert remote == tree_bytes(ref_dir) | {"manifest.json": remote["manifest.json"],
                                                "prepared-from.json": remote["prepared-from.json"]}
        assert "prepare-plan.json" not in remote and not any(k.startswith("units/")
                                                              for k in remote)
        # a sealed URL output is refused unless --overwrite, which replaces it
        with pytest.raises(Exception, match="holds a shard set prepared from another corpus: "):
            prepare(["memory://corpus27/d.txt"], tok, "memory://out27/data", **KW)
        prepare(["memory://corpus27/d.txt"], tok, "memory://out27/data", overwrite=True, **KW)
        assert not memory.exists("/out27/data/train-00009-00000.lengths.npy")
    finally:
        memory.rm("/corpus27", recursive=True)
        memory.rm("/out27", recursive=True)
    urls = [f"file://{p}" for p in mixed]
    got = prepare(urls, tok, f"file://{tmp_path}/data", workers=1, **KW)
    assert got["splits"] == m["splits"] and npy_files(tmp_path / "data") == npy_files(ref_dir)


def test_killed_run_is_finished_by_the_same_command(tok, mixed, reference, tmp_path, capsys):
    """The local engine's process is killed while writing unit 5 (BERTGPU_FAULTS kill_unit):
    the finished units stay in DATA.tmp, nothing is sealed, and the same command redoes units
    5 to 9 only, giving the same bytes."""
    ref_dir, _ = reference
    out = tmp_path / "data"
    cmd = [sys.executable, "-m", "bertgpu", "prepare", "--corpus", *map(str, mixed),
           "--tokenizer", str(tok), "--out", str(out), "--seq-len", "64", "--shard-size", "40",
           "--unit-bytes", str(MIXED_UNIT_BYTES), "--workers", "1"]
    env = dict(os.environ, BERTGPU_FAULTS="kill_unit=5")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9 and "while preparing work unit 5" in proc.stderr
    assert not out.exists()
    kept = sorted(p.name for p in (tmp_path / "data.tmp" / "units").iterdir())
    assert kept == [f"{u:05d}.json" for u in range(5)]
    assert cli_main(cmd[3:]) == 0
    assert "10 work units on the local engine, 5 of them finished by an earlier run and kept" in (
        capsys.readouterr().out)
    assert tree_bytes(out) == tree_bytes(ref_dir) and not (tmp_path / "data.tmp").exists()


def _bad_inputs(tmp_path: Path) -> list[tuple[list[str], str]]:
    """(--corpus arguments, what the one-line error says) of each kind of bad input."""
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps({"text": d}) + "\n" for d in documents()[:20]))
    no_column = write_parquet(tmp_path / "rows.parquet", documents()[:5], row_group_size=2)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["x"] * 3}), no_column)
    ints = tmp_path / "ints.parquet"
    pq.write_table(pa.table({"text": [1, 2, 3]}), ints)
    zst = tmp_path / "broken.jsonl.zst"
    import zstandard

    data = zstandard.ZstdCompressor().compress(good.read_bytes() * 3)
    zst.write_bytes(data[:40] + bytes(b ^ 0x5A for b in data[40:400]) + data[400:])
    fake_gz = tmp_path / "fake.jsonl.gz"
    fake_gz.write_bytes(good.read_bytes())
    return [
        ([str(good), str(no_column)], r"rows.parquet: no column 'text' \(found columns \['body'\]"),
        ([str(ints)], r"ints.parquet: column 'text' holds int64; expected strings"),
        ([str(good), str(zst)], r"broken.jsonl.zst: cannot read \(zstd decompress error"),
        ([str(fake_gz)], r"fake.jsonl.gz: named .gz but not a gzip stream"),
        (["http://127.0.0.1:9/corpus.jsonl"], r"http://127.0.0.1:9/corpus.jsonl: cannot reach"),
    ]


def test_bad_input_is_one_line_and_leaves_nothing(tok, tmp_path, capsys):
    """Parquet without the text column (or not strings), a corrupt zstd stream after a good
    unit, a .gz that is not gzip, a host that does not answer: exit 2, one line naming the file
    or URL, no output and no DATA.tmp (the finished units of bad input are not kept)."""
    pytest.importorskip("zstandard")
    pytest.importorskip("pyarrow")
    pytest.importorskip("aiohttp")
    for k, (corpus, message) in enumerate(_bad_inputs(tmp_path)):
        out = tmp_path / f"out{k}"
        code = cli_main(["prepare", "--corpus", *corpus, "--tokenizer", str(tok), "--out",
                         str(out), "--unit-bytes", "20000", "--workers", "1"])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1, err
        assert __import__("re").search(message, err), err
        assert not out.exists() and not (tmp_path / f"out{k}.tmp").exists()


def test_protocol_without_its_package_is_one_line(tok, tmp_path):
    pytest.importorskip("fsspec")
    if __import__("importlib").util.find_spec("s3fs") is not None:
        pytest.skip("s3fs is installed")
    with pytest.raises(Exception, match=r"s3://bucket/corpus/: no filesystem for this protocol"):
        prepare(["s3://bucket/corpus/"], tok, tmp_path / "data")


def test_progress_line_counts_units_tokens_and_bytes(tok, mixed, tmp_path, capsys):
    prepare(mixed, tok, tmp_path / "data", workers=1, progress=True, **KW)
    err = capsys.readouterr().err
    last = err.replace("\r", "\n").strip().splitlines()[-1]
    assert "prepare: 100%" in last and "10/10 units" in last, last
    assert "tokens/s" in last and "B/s" in last and "183k/" not in last


def test_tokenizer_trains_on_a_sample_spread_over_the_corpus(mixed, tmp_path, capsys):
    """--sample-bytes reads a share of each file, spread over it: some documents of every file,
    far fewer than all; the same from a memory:// URL."""
    from bertgpu.data.corpus import CorpusStats
    from bertgpu.data.tokenizer import train_tokenizer
    from bertgpu.data.tokenizer_folder import load_tokenizer

    stats = CorpusStats()
    out = train_tokenizer(mixed, tmp_path / "tok", vocab_size=300, min_frequency=1,
                          stats=stats, sample_bytes=20_000)
    assert load_tokenizer(out).get_vocab_size() == 300
    assert stats.files == 4 and 4 <= stats.documents < 20
    fsspec = pytest.importorskip("fsspec")
    memory = fsspec.filesystem("memory")
    memory.pipe_file("/tok27/a.jsonl", mixed[0].read_bytes())
    try:
        code = cli_main(["tokenizer", "--corpus", "memory://tok27/", "--vocab-size", "200",
                         "--min-frequency", "1", "--sample-bytes", "5000",
                         "--out", str(tmp_path / "tok2")])
    finally:
        memory.rm("/tok27", recursive=True)
    assert code == 0 and "tokenizer: vocab 200" in capsys.readouterr().out


def test_compression_and_format_by_magic_bytes(tmp_path):
    """A gzip stream named like plain text, zstd without a suffix and a Parquet file named like
    Spark's part files are read for what they are; a folder skips a saved dataset's metadata."""
    pytest.importorskip("zstandard")
    pytest.importorskip("pyarrow")
    import gzip

    import zstandard

    from bertgpu.data.corpus import detect_format, iter_documents

    (tmp_path / "news.txt").write_bytes(gzip.compress(b"One sentence.\nTwo.\n\nOther doc.\n"))
    (tmp_path / "blob").write_bytes(zstandard.ZstdCompressor().compress(b"Zstd text here.\n"))
    write_parquet(tmp_path / "part-00000", ["Parquet row one.", "Row two."], row_group_size=1)
    assert detect_format(tmp_path / "part-00000") == "parquet"
    assert detect_format(tmp_path / "blob") == "sentences"
    docs = list(iter_documents([tmp_path / n for n in ("news.txt", "blob", "part-00000")]))
    assert docs == [["One sentence.", "Two."], ["Other doc."], ["Zstd text here."],
                    ["Parquet row one."], ["Row two."]]
    saved = tmp_path / "saved"
    from _corpora import write_saved_dataset

    write_saved_dataset(saved, ["Saved row."])
    assert list(iter_documents([saved])) == [["Saved row."]]


def test_a_reader_that_fails_after_the_consumer_stopped_does_not_hang_it():
    """Ctrl-C on `prepare --workers 2` printed "interrupted" and then hung for good (3 times in 9):
    the reader thread, failing after the consumer had stopped, put its exception on a full queue
    without a timeout, and the consumer's join waited for it for ever."""
    import threading

    from bertgpu.data.pipeline import prefetch

    failed = threading.Event()

    def items():
        yield from range(3)  # fills the queue (depth 2) while the consumer is gone
        failed.set()
        raise KeyboardInterrupt  # the pool's workers got the same SIGINT

    it = prefetch(items(), depth=2)
    assert next(it) == 0
    failed.wait(5)
    closer = threading.Thread(target=it.close, daemon=True)  # the consumer stops
    closer.start()
    closer.join(5)
    assert not closer.is_alive(), "the consumer hung waiting for the reader"


def _alive(pid: int) -> bool:
    """`pid` runs (a zombie that no one reaped, in a container without init, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except (OSError, IndexError):
        return False


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc")
@pytest.mark.parametrize("to", ["command", "group", "a worker"])
def test_a_stop_signal_or_a_dead_worker_ends_prepare_in_one_line(tok, tmp_path, to):
    """SIGTERM (`kill`, or a scheduler's to the whole job) ended `prepare` by the default action:
    no line, and pool workers writing to a parent that was gone printed tracebacks; a pool worker
    that died (the out-of-memory killer) lost its task, and prepare waited for it for ever. Each
    ends in one line now (exit 143 for SIGTERM, 2 for the dead worker), no worker left, the
    finished units kept for a re-run."""
    import random
    import signal
    import time

    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 8)))
             for _ in range(2000)]
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(" ".join(rng.choices(words, k=15)) + ".\n"
                              + ("\n" if i % 10 == 9 else "") for i in range(60_000)))
    out = tmp_path / "data"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bertgpu", "prepare", "--corpus", str(corpus), "--tokenizer",
         str(tok), "--out", str(out), "--seq-len", "64", "--unit-bytes", "150000",
         "--workers", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    units = tmp_path / "data.tmp" / "units"
    deadline = time.monotonic() + 120
    while not (units.is_dir() and any(units.iterdir())):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1]
        time.sleep(0.01)
    workers = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text()
               .split()]
    assert len(workers) == 2
    if to == "group":
        os.killpg(proc.pid, signal.SIGTERM)
    elif to == "command":
        proc.send_signal(signal.SIGTERM)
    else:
        os.kill(workers[0], signal.SIGKILL)
    try:
        err = proc.communicate(timeout=60)[1]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    last = err.strip().splitlines()[-1]
    if to == "a worker":
        assert proc.returncode == 2, err
        assert last.startswith("bertgpu prepare: error: unit ") and last.endswith(
            "a worker process of the pool died (killed by a signal or for lack of memory); the "
            "finished units are kept: re-run the same command to do the rest"), err
    else:
        assert proc.returncode == 128 + signal.SIGTERM, err
        assert last == "bertgpu prepare: stopped by SIGTERM", err
    assert "Traceback" not in err, err
    deadline = time.monotonic() + 10
    while any(map(_alive, workers)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(map(_alive, workers))
    assert not out.exists() and any(units.iterdir())


def _processes_in_group(pgid: int) -> list[int]:
    """The pids of live (not zombie) processes in process group `pgid`, from /proc."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads /proc")
def test_the_pool_workers_of_a_killed_prepare_end_with_it(tok, mixed, tmp_path):
    """SIGKILL to `prepare --workers 2` itself (the out-of-memory killer picks the largest
    process): its pool workers, forked and holding both ends of their task pipe, used to wait
    for ever, orphaned; they now end within a second or so."""
    import signal
    import time

    cmd = [sys.executable, "-m", "bertgpu", "prepare", "--corpus", *map(str, mixed),
           "--tokenizer", str(tok), "--out", str(tmp_path / "data"), "--seq-len", "64",
           "--shard-size", "40", "--unit-bytes", str(MIXED_UNIT_BYTES), "--workers", "2"]
    env = dict(os.environ, BERTGPU_FAULTS="kill_unit=5")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        assert proc.wait(timeout=300) == -9
        deadline = time.monotonic() + 15
        while _processes_in_group(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _processes_in_group(proc.pid) == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

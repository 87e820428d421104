"""The parallel, ordered, bounded-memory pipeline behind `bertgpu prepare`.

    main: read (decompress, decode, parse XML)  -> batches of raw parts (a reader thread)
    workers: strip wiki markup, split sentences  (`corpus.convert_items`)
    main: drop empty parts, count documents, cut units and split them (`split.SplitPlan`),
          group their pieces into chunks
    workers: tokenize, build sequences  (`packing.process_chunk`)
    main: pack rows / write shards  (`writer`)

The per-part text work runs on the workers because it costs as much as tokenizing (wiki markup)
and the main process is a single core. Both worker stages run in order with a bounded number of
tasks in flight, so memory does not grow with the corpus or with a document; chunk boundaries
depend on the text alone, so the output is byte-identical for any number of workers. With one
worker, reading and text work run in a thread of the one process while it tokenizes.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator

from bertgpu.data.corpus import (
    CorpusStats,
    convert_item,
    convert_items,
    needs_conversion,
    settle_parts,
)
from bertgpu.data.packing import init_worker, process_chunk
from bertgpu.data.split import SplitPlan

CHUNK_CHARS = 500_000  # a chunk closes at this many characters (after MIN_CHUNK_DOCS pieces): spreads work
MIN_CHUNK_DOCS = 16  # so that a random NSP segment can come from another document even for books
MAX_CHUNK_CHARS = 1_000_000  # ... and at this many whatever its pieces: bounds memory
RAW_BATCH_CHARS = 1 << 19  # raw parts per conversion task: at most this many characters ...
RAW_BATCH_ITEMS = 512  # ... or this many items


def work_chunks(pieces: Iterator[tuple], chunk_docs: int) -> Iterator[tuple[int, list[tuple]]]:
    """(chunk index, pieces): at most ``chunk_docs`` pieces, closed early by size."""
    index = chars = 0
    batch: list[tuple] = []
    for piece in pieces:
        batch.append(piece)
        chars += piece[3]
        if len(batch) >= chunk_docs or (chars >= CHUNK_CHARS and (len(batch) >= MIN_CHUNK_DOCS
                                                                  or chars >= MAX_CHUNK_CHARS)):
            yield index, batch
            index += 1
            batch, chars = [], 0
    if batch:
        yield index, batch


def _raw_batches(items: Iterator[tuple]) -> Iterator[list[tuple]]:
    """Raw items grouped into conversion tasks of bounded size (events travel with the parts)."""
    batch: list[tuple] = []
    chars = 0
    for item in items:
        batch.append(item)
        kind, payload = item[0], item[1]
        chars += len(payload) if isinstance(payload, str) else sum(map(len, payload)) if kind == "lines" else 0
        if chars >= RAW_BATCH_CHARS or len(batch) >= RAW_BATCH_ITEMS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


class _Done:
    """A result computed in-process, queued like an AsyncResult."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def get(self):
        return self.value


def _ordered_map(pool, fn: Callable, items: Iterator, window: int, local: Callable | None = None) -> Iterator:
    """``fn(item)`` for each item, in order, on ``pool``, with at most ``window`` tasks in flight.

    Pool.imap would pull the whole input into its task queue when the workers lag behind the
    reader; a bounded window of apply_async keeps memory flat. ``local(item)`` true: run ``fn``
    here instead (work too small to be worth pickling), still in order.
    """
    pending: deque = deque()
    for item in items:
        if local is not None and local(item):
            pending.append(_Done(fn(item)))
        else:
            pending.append(pool.apply_async(fn, (item,)))
        while len(pending) >= window or (pending and isinstance(pending[0], _Done)):
            yield pending.popleft().get()
    while pending:
        yield pending.popleft().get()


def _make_pool(workers: int, tokenizer_dir: str, settings: dict):
    method = "fork" if sys.platform.startswith("linux") else "spawn"
    ctx = multiprocessing.get_context(method)
    # Each worker tokenizes single-threaded: processes already use the cores, and a forked child
    # of a process that used Rust threads would otherwise warn and disable them anyway.
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        return ctx.Pool(workers, initializer=init_worker, initargs=(tokenizer_dir, settings))
    finally:
        if saved is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved


def prefetch(items: Iterator, depth: int) -> Iterator:
    """Iterate ``items`` in a background thread, at most ``depth`` ahead; re-raise its errors here."""
    done = object()
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(done)
        except BaseException as exc:  # handed to the consumer, which raises it
            q.put(exc)

    thread = threading.Thread(target=produce, daemon=True, name="bertgpu-reader")
    thread.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()  # the consumer stopped early (an error downstream): let the reader end
        thread.join()


def run(raw: Iterator[tuple], plan: SplitPlan, chunk_docs: int, workers: int, tokenizer_dir: str,
        settings: dict, skip_bad: bool, stats: CorpusStats) -> Iterator[dict]:
    """Results of `packing.process_chunk` in corpus order (see the module docstring for the stages)."""
    if workers <= 1:
        init_worker(tokenizer_dir, settings)  # in-process; encode_batch uses Rust threads itself
        parts = settle_parts((convert_item(item) for item in raw), skip_bad, stats)
        # Reading and text work run in a thread meanwhile: encode_batch releases the GIL.
        for task in prefetch(work_chunks(plan.pieces(parts), chunk_docs), depth=2):
            yield process_chunk(task)
        return
    with _make_pool(workers, tokenizer_dir, settings) as pool:
        batches = prefetch(_raw_batches(raw), depth=2)  # decompression overlaps the rest of main
        converted = _ordered_map(pool, convert_items, batches, 2 * workers,
                                 local=lambda b: not needs_conversion(b))
        parts = settle_parts((item for batch in converted for item in batch), skip_bad, stats)
        yield from _ordered_map(pool, process_chunk, work_chunks(plan.pieces(parts), chunk_docs), 2 * workers)

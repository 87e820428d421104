"""The parallel, ordered, bounded-memory pipeline behind `bertgpu prepare`.

    main: read (decompress, decode, parse XML)  -> batches of raw parts (a reader thread)
    workers: strip wiki markup, split sentences, tokenize  (`packing.encode_items`)
    main: drop empty parts, count documents, cut units and split them by their exact token
          counts (`split`); mlm: the units go to the row packer (`writer`)
    main (mlm+nsp): chunks of pieces, with random-B candidates of earlier ones (`nsp_candidates`)
    workers (mlm+nsp): sentence pairs from chunks of pieces  (`packing.nsp_chunk`)
    main: write shards  (`writer`)

The per-part text work runs on the workers with the tokenizing because markup stripping costs
as much (wiki) and the main process is a single core. Worker stages run in order with a bounded
number of tasks in flight, so memory does not grow with the corpus or with a document; the
split and the chunk boundaries depend on the text alone, so the output is byte-identical for
any number of workers. With one worker, the first stage runs in a thread of the one process.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from typing import Any

from bertgpu.data.corpus import CorpusStats, settle_parts
from bertgpu.data.nsp_candidates import Candidates
from bertgpu.data.prepare_worker import encode_items, init_worker, nsp_chunk
from bertgpu.data.split import SplitPlan, mlm_units, nsp_pieces

# a chunk closes at this many characters (after MIN_CHUNK_DOCS pieces): spreads work
CHUNK_CHARS = 500_000
MIN_CHUNK_DOCS = 16  # so that a random NSP segment can come from another document even for books
MAX_CHUNK_CHARS = 1_000_000  # ... and at this many whatever its pieces: bounds memory
FEW_DOCS = 4  # a chunk of fewer documents, of CHUNK_CHARS / FEW_DOCS or more on average (books),
#               also draws random B segments from the unit's earlier documents (nsp_candidates)
# (so a chunk of long documents holds few; its random Bs also come from earlier chunks' documents:
# `nsp_candidates`)
RAW_BATCH_CHARS = 1 << 19  # raw parts per first-stage task: at most this many characters ...
RAW_BATCH_ITEMS = 512  # ... or this many items
SIGNAL_CHECK_S = 0.2  # the longest the main thread sleeps in a wait for a worker (see _wait)


def work_chunks(pieces: Iterator[tuple], chunk_docs: int,
                first: int = 0) -> Iterator[tuple[int, list[tuple]]]:
    """(chunk index, pieces from `split.nsp_pieces`): at most ``chunk_docs`` pieces, closed early
    by their characters. Indices count from ``first`` (work unit u: ``u << 32``)."""
    index, chars = first, 0
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
        chars += (len(payload) if isinstance(payload, str) else sum(map(len, payload))
                  if kind == "lines" else 0)
        if chars >= RAW_BATCH_CHARS or len(batch) >= RAW_BATCH_ITEMS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def _ordered_map(pool: ProcessPoolExecutor, fn: Callable, items: Iterator,
                 window: int) -> Iterator:
    """``fn(item)`` for each item, in order, on ``pool``, with at most ``window`` tasks in flight.

    Executor.map would submit the whole input at once when the workers lag behind the reader; a
    bounded window of submits keeps memory flat.
    """
    pending: deque = deque()
    for item in items:
        pending.append(pool.submit(fn, item))
        if len(pending) >= window:
            yield _wait(pending.popleft())
    while pending:
        yield _wait(pending.popleft())


def _wait(future: Future) -> Any:
    """The task's value, waited for in slices: the main thread runs Python's signal handlers
    only when it wakes, and a SIGTERM that the kernel handed to one of the pool's own threads
    left it asleep in an endless wait."""
    while True:
        try:
            return future.result(timeout=SIGNAL_CHECK_S)
        except FuturesTimeout:
            continue


@contextlib.contextmanager
def make_pool(workers: int, tokenizer_json: str, settings: dict) -> Iterator[ProcessPoolExecutor]:
    """A pool of ``workers`` processes with the tokenizer loaded (`prepare_worker.init_worker`),
    shut down on leaving: tasks not started are cancelled, running ones end.

    A process pool executor, not multiprocessing.Pool: a worker that dies (SIGTERM to the whole
    job, the out-of-memory killer) fails the tasks in flight with BrokenProcessPool, where Pool
    replaced the worker, lost its task and waited for it for ever, and its terminate() could wait
    for ever on a queue lock the dead worker held."""
    method = "fork" if sys.platform.startswith("linux") else "spawn"
    ctx = multiprocessing.get_context(method)
    # Each worker tokenizes single-threaded: processes already use the cores, and a forked child
    # of a process that used Rust threads would otherwise warn and disable them anyway.
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_pool_worker,
                                   initargs=(tokenizer_json, settings))
    finally:
        if saved is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved
    try:
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _init_pool_worker(tokenizer_json: str, settings: dict) -> None:
    """A pool worker: SIGTERM ends it quietly (a forked worker inherits the command's handler,
    cli._sigterm_stops, whose exception printed a traceback in every worker when a scheduler
    signalled the whole job), Ctrl-C is left to the parent, which shuts the pool down (a
    KeyboardInterrupt traceback in every worker otherwise); then the tokenizer, as in-process."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _end_with_parent()
    init_worker(tokenizer_json, settings)


def _end_with_parent(every_s: float = 0.5) -> None:
    """End this pool worker when the command that made it is gone (SIGKILL, the out-of-memory
    killer): a forked worker holds both ends of its task pipe, so it never reads an end of file
    and used to wait, orphaned, for ever. A daemon thread watches the parent's pid (a parent-death
    signal would fire when the thread that forked the worker ends, not the process)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        os._exit(1)

    threading.Thread(target=watch, name="bertgpu-parent-watch", daemon=True).start()


def prefetch(items: Iterator, depth: int) -> Iterator:
    """Iterate ``items`` in a background thread, at most ``depth`` ahead;
    re-raise its errors here."""
    done = object()
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def hand_over(item: object) -> bool:
        """Put `item` in the queue unless the consumer stopped (then False). Every put waits in
        slices: a put without a timeout on a full queue, after the consumer stopped (Ctrl-C),
        kept the reader alive and the consumer's join waiting for ever."""
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not hand_over(item):
                    return
            hand_over(done)
        except BaseException as exc:  # handed to the consumer, which raises it
            hand_over(exc)

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


def nsp_tasks(parts: Iterator[tuple], plan: SplitPlan, chunk_docs: int,
              settings: dict) -> Iterator[tuple]:
    """The mlm+nsp tasks of a work unit for `prepare_worker.nsp_chunk`: its chunks, numbered
    from ``unit << 32`` (their random generator's seed), each with the random-B candidates from
    the unit's earlier documents that it needs (`nsp_candidates`)."""
    carried = Candidates(settings["seed"], plan.work_unit, settings["seq_len"] - 3,
                         long_chars=CHUNK_CHARS // FEW_DOCS, min_docs=min(FEW_DOCS, chunk_docs))
    return carried.attach(work_chunks(nsp_pieces(parts, plan), chunk_docs,
                                      plan.work_unit << 32))


def run(raw: Iterator[tuple], plan: SplitPlan, chunk_docs: int, workers: int, tokenizer_json: str,
        settings: dict, skip_bad: bool, stats: CorpusStats, pool=None) -> Iterator:
    """In corpus order: mlm, ``(is_validation, tokens, word_starts, joins)`` of each unit;
    mlm+nsp, the rows of each chunk (`packing.nsp_chunk`). See the module docstring.

    ``pool``: a pool from `make_pool` to reuse (work unit after work unit); else one is made.
    """
    nsp = settings["objective"] != "mlm"
    if pool is not None:
        yield from _run_pool(pool, raw, plan, chunk_docs, workers, skip_bad, stats, settings)
        return
    if workers <= 1:
        init_worker(tokenizer_json, settings)  # in-process; encode_batch uses Rust threads itself
        # Reading, text work and tokenizing run in a thread meanwhile: encode_batch releases the
        # GIL.
        encoded = prefetch((encode_items(batch) for batch in _raw_batches(raw)), depth=2)
        parts = settle_parts((item for batch in encoded for item in batch), skip_bad, stats)
        if not nsp:
            yield from mlm_units(parts, plan)
            return
        for task in nsp_tasks(parts, plan, chunk_docs, settings):
            yield nsp_chunk(task)
        return
    with make_pool(workers, tokenizer_json, settings) as pool:
        yield from _run_pool(pool, raw, plan, chunk_docs, workers, skip_bad, stats, settings)


def _run_pool(pool, raw: Iterator[tuple], plan: SplitPlan, chunk_docs: int, workers: int,
              skip_bad: bool, stats: CorpusStats, settings: dict) -> Iterator:
    batches = prefetch(_raw_batches(raw), depth=2)  # decompression overlaps the rest of main
    encoded = _ordered_map(pool, encode_items, batches, 2 * workers)
    parts = settle_parts((item for batch in encoded for item in batch), skip_bad, stats)
    if settings["objective"] == "mlm":
        yield from mlm_units(parts, plan)
        return
    yield from _ordered_map(pool, nsp_chunk, nsp_tasks(parts, plan, chunk_docs, settings),
                            2 * workers)

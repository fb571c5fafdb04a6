"""Running the pieces of a profile: in this process, in a pool of local processes, or on a Dask
cluster; saving each finished piece so that an interrupted run resumes; merging in order.

The map step is :func:`~autoshard.stats.scan.scan_piece` (one piece to a partial profile, sent
back as the bytes of its ``.npz`` file, or kept as it is when the pieces run in this process and
nothing is saved); the reduce step adds the partial profiles in the order of the pieces, so every
engine and every number of workers gives the same result. Scheduling is the engine's: the
standard library's process pool on one machine, Dask's distributed scheduler on a cluster (the
workers must see the input files at the same paths).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoshard.errors import InputError
from autoshard.stats.inputs import Piece
from autoshard.stats.partial import Merger, PartialProfile, from_arrays, load_partial
from autoshard.stats.scan import ScanPlan, scan_piece

ENGINES = ("local", "dask")
#: Called with (bytes, lookups) of each piece as it finishes.
Advance = Callable[[int, int], None]


@dataclass(frozen=True)
class EngineOptions:
    """Where the pieces run.

    Args:
        engine: ``local`` (this machine's processes) or ``dask``.
        jobs: Processes (local), or workers of the local Dask cluster started when no address
            is given.
        address: A running Dask scheduler (``tcp://host:8786``); None starts a local cluster.
        parts: Folder for the finished pieces' partial profiles (None: keep them in memory,
            no resume).
        keep_parts: Keep the parts after a successful run (else they are removed).
    """

    engine: str = "local"
    jobs: int = 1
    address: str | None = None
    parts: Path | None = None
    keep_parts: bool = False


def piece_bytes_of(plan: ScanPlan, piece: Piece, target: str | None = None
                   ) -> tuple[bytes | None, int]:
    """The map step as a worker runs it: one piece's partial profile as ``.npz`` bytes, or
    saved straight to ``target`` by a worker that sees the parts folder (then None), and its
    lookups (one thread: the parallelism is the workers')."""
    import pyarrow as pa

    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    part = scan_piece(plan, piece)
    data = part.to_bytes()
    if target is None:
        return data, lookups_of(part)
    from autoshard.fileio import write_output

    write_output(target, lambda fh: fh.write(data))
    return None, lookups_of(part)


def _count_here(plan: ScanPlan, piece: Piece, store: PartStore
                ) -> tuple[PartialProfile | bytes | None, int]:
    """The map step in this process: with no parts folder, the piece's profile itself (no round
    trip through its file's bytes), else as :func:`piece_bytes_of` gives it."""
    if store.folder is None:
        part = scan_piece(plan, piece)
        return part, lookups_of(part)
    return piece_bytes_of(plan, piece, store.target(piece))


def _from_bytes(data: bytes, source: str) -> PartialProfile:
    import io

    import numpy as np

    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        return from_arrays({k: npz[k] for k in npz.files}, source)


def lookups_of(part: PartialProfile) -> int:
    return sum(t.lookups for t in part.tables)


class PartStore:
    """The finished pieces of one run, saved under ``folder`` (or held in memory)."""

    def __init__(self, plan: ScanPlan, folder: Path | None) -> None:
        self.plan, self.folder = plan, folder
        self.memory: dict[str, PartialProfile] = {}
        #: Folders above the parts that this run creates (removed again when empty).
        self.created = [] if folder is None else [
            p for p in (folder, *folder.parents) if not p.exists()]

    def path(self, piece: Piece) -> Path:
        assert self.folder is not None
        return self.folder / f"{self.plan.digest}-{piece.digest}.npz"

    def done(self, piece: Piece) -> PartialProfile | None:
        """The saved profile of a finished piece, if a readable one matches this run."""
        if piece.digest in self.memory:
            return self.memory[piece.digest]
        if self.folder is None or not self.path(piece).is_file():
            return None
        try:
            part = load_partial(self.path(piece))
            self.plan.schema.check_mergeable(part.schema, str(self.path(piece)))
        except InputError:
            return None
        return part if [p.digest for p in part.pieces] == [piece.digest] else None

    def finished(self, piece: Piece) -> PartialProfile:
        """The profile of a piece this run has finished (one held in memory is handed over, so
        that the merge holds it alone).

        Raises:
            InputError: Its saved profile has gone missing or is unreadable.
        """
        part = self.memory.pop(piece.digest, None)
        if part is None:
            part = self.done(piece)
        if part is None:
            raise InputError("a finished piece's saved profile is missing or unreadable",
                             source=str(self.path(piece)) if self.folder else piece.label)
        return part

    def target(self, piece: Piece) -> str | None:
        """Where a worker on this machine saves the piece (None: send it back)."""
        return None if self.folder is None else str(self.path(piece))

    def put(self, piece: Piece, data: PartialProfile | bytes | None) -> None:
        """Keeps a finished piece's profile, given as it is or as its file's bytes (``data``
        None: its worker saved it already)."""
        if data is None:
            return
        if isinstance(data, PartialProfile):
            assert self.folder is None, "a profile counted here is kept in memory"
            self.memory[piece.digest] = data
            return
        if self.folder is None:
            self.memory[piece.digest] = _from_bytes(data, piece.label)
            return
        from autoshard.fileio import write_output

        write_output(self.path(piece), lambda fh: fh.write(data))

    def clear(self) -> None:
        """Removes this run's saved parts (and the folder, when that leaves it empty)."""
        if self.folder is None:
            return
        for piece in self.plan.pieces:
            self.path(piece).unlink(missing_ok=True)
        mine = self.created or ([self.folder] if self.folder.name == self.plan.digest else [])
        with contextlib.suppress(OSError):
            for folder in mine:
                folder.rmdir()


def run_plan(plan: ScanPlan, options: EngineOptions, advance: Advance | None = None,
             log: Callable[[str], None] | None = None) -> PartialProfile:
    """Counts every piece of ``plan`` (resuming from saved parts) and merges them in order.

    Raises:
        InputError: Bad data in a piece (the finished pieces stay saved for a rerun).
    """
    store = PartStore(plan, options.parts)
    todo = [p for p in plan.pieces if store.done(p) is None]
    if log is not None and len(todo) < len(plan.pieces):
        log(f"resumed {len(plan.pieces) - len(todo)} of {len(plan.pieces)} pieces from "
            f"{options.parts}")
    reduce = _InOrder(plan.pieces, store, {p.digest for p in todo})
    reduce.drain()
    failure: BaseException | None = None
    with _runner(options, len(todo), store) as run:
        for piece, result in run(plan, todo):
            if isinstance(result, BaseException):
                failure = failure or result  # the pieces already running still finish
                continue
            store.put(piece, result[0])
            if advance is not None:
                advance(piece.nbytes, result[1])
            reduce.finish(piece)
    if failure is not None:
        raise failure
    merged = reduce.result()
    if not options.keep_parts:
        store.clear()
    return merged


#: What a piece gives: its profile (counted here), its profile's bytes (None: saved by its
#: worker) and lookups, or the error it raised.
Result = tuple[PartialProfile | bytes | None, int] | BaseException


class _InOrder:
    """Merges finished pieces in the plan's order as soon as each one's turn comes, while the
    later pieces are still being counted (the same order, so the same result, on any engine)."""

    def __init__(self, pieces: Sequence[Piece], store: PartStore, pending: set[str]) -> None:
        self.pieces, self.store, self.pending = pieces, store, pending
        self.merger = Merger()
        self.next = 0

    def finish(self, piece: Piece) -> None:
        self.pending.discard(piece.digest)
        self.drain()

    def drain(self) -> None:
        while self.next < len(self.pieces) and self.pieces[self.next].digest not in self.pending:
            piece = self.pieces[self.next]
            self.merger.add(self.store.finished(piece), piece.label)
            self.next += 1

    def result(self) -> PartialProfile:
        self.drain()
        return self.merger.result()


#: Maps pieces to their results as they finish; after an error it starts no new piece.
Runner = Callable[[ScanPlan, Sequence[Piece]], Iterator[tuple[Piece, Result]]]


@contextlib.contextmanager
def _runner(options: EngineOptions, count: int, store: PartStore) -> Iterator[Runner]:
    """A function mapping pieces to their profiles' bytes, as they finish."""
    if options.engine == "dask":
        with _dask_client(options) as client:
            yield lambda plan, pieces: _run_dask(client, plan, pieces)
    elif options.jobs <= 1 or count <= 1:
        yield lambda plan, pieces: ((p, _count_here(plan, p, store)) for p in pieces)
    else:
        yield lambda plan, pieces: _run_pool(min(options.jobs, count), plan, pieces, store)


def _run_pool(jobs: int, plan: ScanPlan, pieces: Sequence[Piece], store: PartStore
              ) -> Iterator[tuple[Piece, Result]]:
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    context = multiprocessing.get_context("spawn")  # no fork of a process holding threads
    with ProcessPoolExecutor(jobs, mp_context=context, initializer=_one_thread) as pool:
        pending = {pool.submit(piece_bytes_of, plan, p, store.target(p)): p for p in pieces}
        try:
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    piece = pending.pop(future)
                    if future.cancelled():
                        continue
                    error = future.exception()
                    if error is not None:
                        for other in pending:
                            other.cancel()  # those not started; running ones finish
                    yield piece, error or future.result()
        finally:
            for future in pending:
                future.cancel()


def _one_thread() -> None:
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"


@contextlib.contextmanager
def _dask_client(options: EngineOptions) -> Iterator[Any]:
    """A client of the cluster at ``options.address``, or of a local cluster of ``jobs``
    single-threaded worker processes started (and stopped) here."""
    import logging

    try:
        from distributed import Client, LocalCluster
    except ImportError as exc:
        raise InputError("the dask engine needs dask[distributed] installed",
                         source="command line", field="--engine", value="dask") from exc
    if options.address is not None:
        try:
            client = Client(options.address, timeout=30)
        except (OSError, TimeoutError) as exc:
            raise InputError(f"cannot reach the Dask scheduler ({exc})".splitlines()[0],
                             source="command line", field="--address",
                             value=options.address) from exc
        with client:
            yield client
        return
    with (LocalCluster(n_workers=max(options.jobs, 1), threads_per_worker=1, processes=True,
                       dashboard_address=None, silence_logs=logging.CRITICAL) as cluster,
          Client(cluster) as client):
        yield client


def _run_dask(client: Any, plan: ScanPlan, pieces: Sequence[Piece]
              ) -> Iterator[tuple[Piece, Result]]:
    from distributed import as_completed

    if not pieces:
        return
    shared = client.scatter(plan, broadcast=True)
    futures = {client.submit(piece_bytes_of, shared, p, pure=False): p for p in pieces}
    try:
        for future in as_completed(futures):
            error = future.exception() if future.status == "error" else None
            yield futures[future], error or future.result()
            if error is not None:
                return
    finally:
        client.cancel(list(futures))

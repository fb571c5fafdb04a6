"""Counting a dataset of many files: one schema for all of them, then one piece at a time.

:func:`plan_scan` reads only headers and metadata: it detects each file's format, finds its
tables, checks that every file has the same tables (a file of another schema is an error naming
it and the field), decides per table whether its exact counts fit the memory given (the
smallest tables first; the rest are sketched) and cuts the files into pieces. :func:`scan_piece`
then counts one piece into a :class:`~autoshard.stats.partial.PartialProfile`; any worker can
run it, in any order, and the pieces' profiles add up to the profile of the whole.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autoshard.errors import InputError
from autoshard.limits import MAX_THREADS, Range
from autoshard.stats.inputs import Piece, fingerprint, parquet_pieces, text_pieces
from autoshard.stats.partial import PartialProfile, ProfileSchema, TableSchema, TableState
from autoshard.stats.readers_columnar import (
    ColumnPlan,
    CsvLayout,
    ExactDistinct,
    column_plan,
    csv_batches,
    is_parquet,
    iter_lookups,
    parquet_batches,
)
from autoshard.stats.sketch import SKETCH_BYTES, DistinctSketch, TableSketch
from autoshard.stats.table_stats import SparseCounts

#: Memory per process for exact counts, GB (``--memory-gb``): from 1 MB to 1 PB.
MEMORY_GB = Range(0.001, 1e6)
#: Input per piece of work, MB (``--piece-mb``).
PIECE_MB = Range(1, 1e6)
#: Processes or local workers (``--jobs``); 0: one per core.
JOBS = Range(0, MAX_THREADS, integer=True)


@dataclass(frozen=True)
class ScanOptions:
    """How to read the inputs (the ``profile`` command's options).

    Args:
        fmt: dlrm, criteo or columnar; detected per file when None.
        hash_size: Criteo/columnar: ``N``, ``COL=N,...`` or both; DLRM: one global ``N``.
        hash_sizes: DLRM: rows per table (from a table file).
        names: DLRM: table names (from a table file).
        columns: Criteo/columnar: the categorical columns.
        memory_bytes: Memory for exact counts per process; larger tables are sketched.
        piece_bytes: About how many bytes of input one piece covers.
    """

    fmt: str | None = None
    hash_size: str | None = None
    hash_sizes: tuple[int, ...] | None = None
    names: tuple[str, ...] | None = None
    columns: tuple[str, ...] | None = None
    memory_bytes: int = 8 << 30
    piece_bytes: int = 256 << 20


@dataclass(frozen=True)
class FilePlan:
    """How one input file is read.

    Args:
        path: The file.
        fmt: Its format.
        delimiter: CSV delimiter.
        csv_names: CSV column names when the file has no header line (else None).
    """

    path: str
    fmt: str
    delimiter: str = ","
    csv_names: tuple[str, ...] | None = None

    @property
    def layout(self) -> CsvLayout:
        return CsvLayout(self.delimiter, self.csv_names)


@dataclass(frozen=True)
class ScanPlan:
    """Everything a worker needs to count any piece (small, sent to every worker)."""

    schema: ProfileSchema
    files: tuple[FilePlan, ...]
    pieces: tuple[Piece, ...]
    options: ScanOptions

    def file(self, path: str) -> FilePlan:
        return next(f for f in self.files if f.path == path)

    @property
    def digest(self) -> str:
        """Identifies what is counted and how (names a run's saved parts)."""
        doc = {"schema": self.schema.to_dict(), "files": [vars(f) for f in self.files],
               "options": [self.options.fmt, self.options.hash_size, self.options.hash_sizes]}
        return hashlib.sha256(json.dumps(doc, sort_keys=True, default=list).encode()
                              ).hexdigest()[:12]


def plan_scan(paths: Sequence[Path], options: ScanOptions) -> ScanPlan:
    """The schema, file plans and pieces of a dataset (headers and metadata only).

    Raises:
        InputError: An unreadable file, or one whose tables differ from the first file's
            (names the file and the field).
    """
    from autoshard.stats import detect_format

    formats = [options.fmt or detect_format(p) for p in paths]
    list_sep = "" if "criteo" in formats else "|"
    files, schema = [], None
    traces: tuple[TableSchema, ...] | None = None  # a trace's tables are read from the first
    for path, fmt in zip(paths, formats, strict=True):
        if fmt == "dlrm" and traces is not None:
            plan, tables = FilePlan(str(path), fmt), traces  # checked when counted
        else:
            plan, tables = _file_tables(path, fmt, options, list_sep)
            traces = tables if fmt == "dlrm" else traces
        found = ProfileSchema(tables, list_sep)
        if schema is None:
            schema = found
        schema.check_mergeable(found, str(path))
        files.append(plan)
    assert schema is not None
    schema = ProfileSchema(_choose_modes(schema.tables, options.memory_bytes), list_sep)
    pieces = [piece for f in files for piece in _pieces(f, options.piece_bytes)]
    return ScanPlan(schema, tuple(files), tuple(pieces), options)


def _file_tables(path: Path, fmt: str, options: ScanOptions,
                 list_sep: str) -> tuple[FilePlan, tuple[TableSchema, ...]]:
    """A file's plan and its tables (modes not decided yet)."""
    if fmt == "dlrm":
        return FilePlan(str(path), fmt), _dlrm_tables(path, options)
    if fmt == "criteo":
        from autoshard.stats.readers_criteo import CATEGORICAL, criteo_layout

        layout = criteo_layout(path)
        cols = column_plan(path, options.columns or CATEGORICAL, options.hash_size,
                           list_sep=list_sep, layout=layout)
    elif fmt == "columnar":
        layout = CsvLayout()
        cols = column_plan(path, options.columns, options.hash_size, list_sep=list_sep)
    else:
        raise InputError("unknown format (known: dlrm, criteo, columnar)", field="format",
                         value=fmt)
    plan = FilePlan(str(path), fmt, layout.delimiter, layout.names)
    return plan, tuple(TableSchema(n, s, h, False) for n, s, h in
                       zip(cols.names, cols.hash_sizes, cols.hashed, strict=True))


def _dlrm_tables(path: Path, options: ScanOptions) -> tuple[TableSchema, ...]:
    """A trace's tables: from the table file, else ``t0``, ``t1``, ... of the trace."""
    sizes: Sequence[int | None]
    if options.hash_sizes is not None:
        sizes = options.hash_sizes
    else:
        from autoshard.stats.readers_dlrm import load_trace

        count = load_trace(path).num_tables
        size = _global_size(options.hash_size)
        sizes = [size] * count
    names = options.names or tuple(f"t{t}" for t in range(len(sizes)))
    return tuple(TableSchema(n, s, False, False) for n, s in zip(names, sizes, strict=True))


def _global_size(spec: str | None) -> int | None:
    if spec is None:
        return None
    try:
        return int(spec)
    except ValueError:
        raise InputError("a DLRM trace takes one global hash size (or a table file)",
                         source="command line", field="--hash-size", value=spec) from None


def _choose_modes(tables: Sequence[TableSchema], memory_bytes: int) -> tuple[TableSchema, ...]:
    """Counts exactly the smallest tables whose counts (8 bytes a row) fit the memory left
    after the larger tables' sketches; a table whose counts take less than a sketch, or of
    undeclared size, is always exact."""
    order = sorted(range(len(tables)), key=lambda i: (tables[i].hash_size or 0, i))
    sketched: set[int] = set()
    for i in reversed(order):
        exact = sum(8 * (tables[j].hash_size or 0) for j in order if j not in sketched)
        if exact + SKETCH_BYTES * len(sketched) <= memory_bytes:
            break
        if 8 * (tables[i].hash_size or 0) <= SKETCH_BYTES:
            break
        sketched.add(i)
    return tuple(TableSchema(t.name, t.hash_size, t.hashed, i in sketched)
                 for i, t in enumerate(tables))


def _pieces(plan: FilePlan, piece_bytes: int) -> list[Piece]:
    path = Path(plan.path)
    file_id = fingerprint(path)
    if plan.fmt == "dlrm":
        return [Piece(plan.path, 0, -1, path.stat().st_size, file_id)]
    if is_parquet(path):
        return parquet_pieces(path, piece_bytes, file_id)
    header = 0
    if plan.csv_names is None:
        with path.open("rb") as fh:
            header = len(fh.readline())
    return text_pieces(path, header, piece_bytes, file_id)


class PartialAccumulator:
    """Counts the lookups of one piece, table by table, as its schema says.

    Args:
        schema: The tables and how each is counted.
    """

    def __init__(self, schema: ProfileSchema) -> None:
        self.schema = schema
        self.states = [TableState(counts=None if t.sketched else SparseCounts(
            hash_size=t.hash_size), sketch=TableSketch() if t.sketched else None)
                       for t in schema.tables]
        self.distinct: list[Any] = [(DistinctSketch() if t.sketched else ExactDistinct())
                                    if t.hashed else None for t in schema.tables]

    def add(self, table: int, indices: np.ndarray, lengths: np.ndarray) -> None:
        """Adds a chunk of a table: its checked row ids and its lookups per sample."""
        state = self.states[table]
        lengths = np.asarray(lengths, dtype=np.int64)
        state.samples += int(lengths.size)
        state.present += int(np.count_nonzero(lengths))
        state.pooling_sq += int(np.dot(lengths, lengths))
        state.lookups += int(indices.size)
        if indices.size == 0:
            return
        state.seen = max(state.seen, int(indices.max()) + 1)
        if state.sketch is not None:
            state.sketch.add(indices)
        else:
            assert isinstance(state.counts, SparseCounts)
            state.counts.add(indices)

    def result(self, piece: Piece, fmt: str) -> PartialProfile:
        for state, distinct in zip(self.states, self.distinct, strict=True):
            if isinstance(distinct, ExactDistinct):
                state.distinct = distinct
            elif isinstance(distinct, DistinctSketch):
                state.draws = distinct
        return PartialProfile(self.schema, (piece,), tuple(self.states), (fmt,))


def scan_piece(plan: ScanPlan, piece: Piece) -> PartialProfile:
    """Counts one piece of the data.

    Raises:
        InputError: Bad data in the piece (names the file, the table or column and the row).
    """
    file = plan.file(piece.path)
    acc = PartialAccumulator(plan.schema)
    if file.fmt == "dlrm":
        _scan_trace(Path(piece.path), plan.schema, acc)
    else:
        _scan_columns(file, piece, plan.schema, acc)
    return acc.result(piece, file.fmt)


def _scan_columns(file: FilePlan, piece: Piece, schema: ProfileSchema,
                  acc: PartialAccumulator) -> None:
    path = Path(file.path)
    names = [t.name for t in schema.tables]
    columns = ColumnPlan(tuple(names), tuple(t.hashed for t in schema.tables),
                         tuple(t.hash_size for t in schema.tables), schema.list_sep)
    batches: Iterator[Any]
    if is_parquet(path):
        groups = None if piece.whole else list(range(piece.start, piece.stop))
        batches = parquet_batches(path, names, groups)
    else:
        span = None if piece.whole else (piece.start, piece.stop)
        batches = csv_batches(path, names, file.layout, span)
    rows = 0
    for table, idx, lengths in iter_lookups(batches, columns, piece.label, acc.distinct):
        acc.add(table, idx, lengths)
        rows += lengths.size if table == 0 else 0
    if rows == 0:
        raise InputError("no data rows", source=piece.label)


def _scan_trace(path: Path, schema: ProfileSchema, acc: PartialAccumulator) -> None:
    from autoshard.stats.readers_dlrm import iter_tables, load_trace

    trace = load_trace(path)
    if trace.batch_size == 0 or trace.indices.size == 0:
        what = "no samples" if trace.batch_size == 0 else "no lookups"
        raise InputError(f"trace has {what}: nothing to measure", source=str(path),
                         field="lengths", value=tuple(trace.lengths.shape))
    if trace.num_tables != len(schema.tables):
        raise InputError(f"{trace.num_tables} tables, expected {len(schema.tables)} (as the "
                         "table file or the first trace)", source=str(path), field="lengths",
                         value=trace.num_tables)
    sizes = [t.hash_size for t in schema.tables]
    declared = None if any(s is None for s in sizes) else [int(s or 0) for s in sizes]
    for t, indices, lengths, _ in iter_tables(trace, declared):
        acc.add(t, np.asarray(indices, dtype=np.int64), lengths)
